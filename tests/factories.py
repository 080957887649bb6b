"""Artifacts the tests write themselves: LoRA adapters for the embedded model,
hand-crafted GGUF/safetensors bytes and small training data (no binary blobs are
committed)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from engine.formats import lora_io, naming
from engine.formats.artifacts import BaseModelInfo

# The seven projections of a llama layer.
LLAMA_ROLES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def lora_weights(
    base: BaseModelInfo,
    roles: tuple[str, ...] = ("attn_q", "attn_v"),
    rank: int = 8,
    alpha: float = 16.0,
    seed: int = 0,
    strength: float = 0.05,
    layers: range | None = None,
) -> lora_io.LoraWeights:
    """Random LoRA weights shaped for `base` (HF module keys, GGUF row order)."""
    rng = np.random.default_rng(seed)
    modules = base.module_shapes()
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for layer in layers if layers is not None else range(base.block_count):
        for role in roles:
            module = naming.gguf_to_module(f"blk.{layer}.{role}.weight", base.architecture)
            out_f, in_f = modules[module]
            a = rng.normal(0, 1 / np.sqrt(in_f), (rank, in_f)).astype(np.float32)
            b = rng.normal(0, strength, (out_f, rank)).astype(np.float32)
            out[module] = (a, b)
    return lora_io.LoraWeights(alpha, rank, out, base.architecture, base.name)


def write_gguf_lora(path: Path, base: BaseModelInfo, **kwargs) -> Path:
    lora_io.write_gguf(path, lora_weights(base, **kwargs))
    return path


def write_peft_lora(folder: Path, base: BaseModelInfo, **kwargs) -> Path:
    weights = lora_io.gguf_to_peft(lora_weights(base, **kwargs), base.head_count,
                                   base.head_count_kv)
    lora_io.write_peft(folder, weights)
    return folder


def raw_safetensors(header: dict | str | bytes, data: bytes = b"", length: int | None = None
                    ) -> bytes:
    if isinstance(header, dict):
        header = json.dumps(header)
    raw = header.encode() if isinstance(header, str) else header
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


# --------------------------------------------------------------------------- training data


def sft_data(path: Path) -> Path:
    """Eleven SFT examples: ten prompt/completion sums and one weighted chat."""
    rows = [{"prompt": f"Q: what is {i} plus {i}?\nA:", "completion": f" {2 * i}"}
            for i in range(10)]
    rows.append({"messages": [{"role": "user", "content": "Name a colour."},
                              {"role": "assistant", "content": "Teal."}], "weight": 0.5})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
