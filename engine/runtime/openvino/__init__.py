"""The OpenVINO backend, the builder of structurally named IRs, and the GenAI cross-check."""
