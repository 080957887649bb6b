"""Training LoRA adapters through the quantized GGUF file that is served.

The package is split so that the engine still imports without PyTorch: only the
modules in `TORCH_MODULES` import torch, and only the training worker process
(`python -m engine.training.worker`) imports them. Everything else here (the
configuration, data loading, the llama.cpp tokenizer, the output writers, the job
client, the demo task) is plain Python and numpy.
"""

from __future__ import annotations

import importlib.util

# Modules that import torch at the top; nothing outside the worker imports them.
TORCH_MODULES = frozenset({
    "engine.training.model",
    "engine.training.trainer",
    "engine.training.parity",
    "engine.training.served_math",
})

ENABLE_HINT = ("training needs PyTorch (CPU build), which is not installed: "
               "pip install 'variant-studio[train]' (or: pip install torch==2.13.0)")


def torch_available() -> bool:
    """Is PyTorch importable? (Checked without importing it.)"""
    return importlib.util.find_spec("torch") is not None
