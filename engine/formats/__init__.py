"""Reading, writing and converting model and adapter files: bounded, strict readers of
untrusted input (GGUF, safetensors, PEFT folders, OpenVINO IR), tensor naming, LoRA I/O
and chat templates. Depends on nothing else in the engine but `engine.errors`."""
