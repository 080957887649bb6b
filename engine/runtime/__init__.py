"""Inference: the engine process (host), its client and wire protocol, the typed
messages, sessions keyed by identity, the sampler, and the backends behind one
interface (llama.cpp in `runtime.llama`, OpenVINO in `runtime.openvino`)."""
