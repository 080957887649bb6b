"""The llama.cpp backend (llama-cpp-python's low-level bindings)."""
