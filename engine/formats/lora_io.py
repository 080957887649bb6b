"""Reading, writing and converting LoRA weights: GGUF (llama.cpp) and PEFT safetensors.

Both forms hold, per adapted layer, A with shape (rank, in) and B with shape
(out, rank) in numpy order. llama.cpp stores llama q/k weights with their rows
permuted per head relative to Hugging Face, so a q/k adapter's B rows must be
permuted the same way when it crosses formats, or it changes the two backends'
models differently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import InspectionError
from engine.formats import gguf_file, naming, safetensors_file
from engine.state.statefile import write_json_atomic


@dataclass
class LoraWeights:
    """An adapter's values, keyed by HF module path (`model.layers.0.self_attn.q_proj`)."""

    alpha: float
    rank: int
    layers: dict[str, tuple[np.ndarray, np.ndarray]]  # module -> (A (r, in), B (out, r))
    architecture: str = "llama"
    base_name: str | None = None
    base_sha256: str | None = None


def multiplier(scale: float, alpha: float | None, rank: int | None) -> float:
    """What B·A is multiplied by: scale · alpha / rank (alpha or rank absent or 0: just
    scale), as llama.cpp computes it from a GGUF's adapter.lora.alpha."""
    return scale * alpha / rank if alpha and rank else scale


def permute_rows(weights: np.ndarray, n_head: int) -> np.ndarray:
    """Hugging Face row order -> llama.cpp row order (convert_hf_to_gguf's permute)."""
    rows = weights.shape[0]
    return (weights.reshape(n_head, 2, rows // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def unpermute_rows(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp row order -> Hugging Face row order (inverse of `permute_rows`)."""
    rows = weights.shape[0]
    return (weights.reshape(n_head, rows // n_head // 2, 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def _heads_for(module: str, n_head: int, n_head_kv: int) -> int | None:
    role = naming.role_of(module)
    return n_head if role == "attn_q" else n_head_kv if role == "attn_k" else None


def write_gguf(path: Path, weights: LoraWeights, dtype: str = "F32") -> None:
    """Write a GGUF LoRA in llama.cpp's naming (B rows already in llama.cpp order)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), weights.architecture)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(weights.alpha))
    if weights.base_name:
        writer.add_uint32("general.base_model.count", 1)
        writer.add_string("general.base_model.0.name", weights.base_name)
    if weights.base_sha256:
        writer.add_string("adapter.base.sha256", weights.base_sha256)
    np_type = np.float16 if dtype == "F16" else np.float32
    for module in sorted(weights.layers, key=_module_order):
        a, b = weights.layers[module]
        tensor = naming.module_to_gguf(module)
        if tensor is None:
            raise ValueError(f"no GGUF name for module {module}")
        writer.add_tensor(f"{tensor}.lora_a", np.ascontiguousarray(a, dtype=np_type))
        writer.add_tensor(f"{tensor}.lora_b", np.ascontiguousarray(b, dtype=np_type))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def read_gguf(path: Path) -> LoraWeights:
    header = gguf_file.read_header(path)
    layers: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name in header.tensors:
        if not name.endswith(".lora_a"):
            continue
        target = name.removesuffix(".lora_a")
        module = naming.gguf_to_module(target)
        if module is None or f"{target}.lora_b" not in header.tensors:
            raise InspectionError(f"{path.name}: cannot convert tensor {target}")
        layers[module] = (gguf_file.read_tensor(header, name),
                          gguf_file.read_tensor(header, f"{target}.lora_b"))
    if not layers:
        raise InspectionError(f"{path.name}: no LoRA tensors")
    alpha = header.get("adapter.lora.alpha")
    rank = next(iter(layers.values()))[0].shape[0]
    base_sha = header.get("adapter.base.sha256")
    return LoraWeights(float(alpha) if alpha is not None else 0.0, rank, layers,
                       header.get("general.architecture", "llama"),
                       header.get("general.base_model.0.name"),
                       base_sha if isinstance(base_sha, str) else None)


def write_peft(folder: Path, weights: LoraWeights) -> Path:
    """Write `adapter_model.safetensors` and `adapter_config.json` in canonical PEFT form."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for module, (a, b) in weights.layers.items():
        key = f"{naming.PEFT_PREFIX}{module}"
        tensors[f"{key}.lora_A.weight"] = np.ascontiguousarray(a, dtype=np.float32)
        tensors[f"{key}.lora_B.weight"] = np.ascontiguousarray(b, dtype=np.float32)
    target = folder / "adapter_model.safetensors"
    target.write_bytes(safetensors_bytes(tensors, {"format": "pt",
                                                   "architecture": weights.architecture}))
    roles = sorted({module.rsplit(".", 1)[-1] for module in weights.layers})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": weights.rank,
        "lora_alpha": weights.alpha,
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "target_modules": roles,
        "base_model_name_or_path": weights.base_name,
    }
    if weights.base_sha256:
        config["base_model_sha256"] = weights.base_sha256
    write_json_atomic(folder / "adapter_config.json", config)
    return target


def safetensors_bytes(tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> bytes:
    """A safetensors file (F32 tensors) with a byte-for-byte reproducible header.

    The safetensors library writes `__metadata__` in hash-map order, which changes from
    process to process once there is more than one key; the same adapter must always
    be the same bytes, so the header is written here: metadata keys sorted, tensors by
    name, padded with spaces to 8 bytes as the format asks.
    """
    import struct

    header: dict[str, Any] = {"__metadata__": dict(sorted(metadata.items()))}
    blobs, offset = [], 0
    for name in sorted(tensors):
        raw = np.ascontiguousarray(tensors[name], dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def read_peft(path: Path) -> LoraWeights:
    weights_path = path / "adapter_model.safetensors" if path.is_dir() else path
    config_path = weights_path.with_name("adapter_config.json")
    header = safetensors_file.read_header(weights_path)
    arrays = safetensors_file.load_tensors(header)
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    layers: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for key, a in arrays.items():
        if not key.endswith(".lora_A.weight"):
            continue
        stem = key.removesuffix(".lora_A.weight")
        module = stem.removeprefix(naming.PEFT_PREFIX)
        layers[module] = (a, arrays[f"{stem}.lora_B.weight"])
    if not layers:
        raise InspectionError(f"{weights_path.name}: no LoRA tensors")
    rank = next(iter(layers.values()))[0].shape[0]
    alpha = config.get("lora_alpha", rank)
    return LoraWeights(float(alpha), rank, layers, "llama",
                       config.get("base_model_name_or_path"), config.get("base_model_sha256"))


def gguf_to_peft(weights: LoraWeights, n_head: int, n_head_kv: int) -> LoraWeights:
    """GGUF-ordered weights -> Hugging Face order (q/k B rows un-permuted)."""
    return _convert(weights, n_head, n_head_kv, unpermute_rows)


def peft_to_gguf(weights: LoraWeights, n_head: int, n_head_kv: int) -> LoraWeights:
    """Hugging Face-ordered weights -> llama.cpp order (q/k B rows permuted)."""
    return _convert(weights, n_head, n_head_kv, permute_rows)


def _convert(weights: LoraWeights, n_head: int, n_head_kv: int, move) -> LoraWeights:
    layers = {}
    for module, (a, b) in weights.layers.items():
        heads = _heads_for(module, n_head, n_head_kv)
        layers[module] = (a, move(b, heads) if heads else b)
    return LoraWeights(weights.alpha, weights.rank, layers, weights.architecture,
                       weights.base_name, weights.base_sha256)


def convert_file(source: Path, target: Path, n_head: int, n_head_kv: int,
                 architecture: str = "llama", rebase: tuple[str, str] | None = None) -> Path:
    """GGUF LoRA -> PEFT folder, or PEFT -> GGUF LoRA file, by the source's format.

    The source is inspected (and, for safetensors, checked by the safetensors library)
    first; a structurally broken adapter is refused, never half converted. Values are
    kept exactly: only the q/k B rows move (see `gguf_to_peft`). `rebase` (old, new)
    replaces a declared base digest: the converted file is for the other backend's copy
    of the same weights.
    """
    from engine.errors import RefusedError
    from engine.formats import artifacts

    info = artifacts.inspect_path(Path(source))
    if not isinstance(info, artifacts.AdapterInfo):
        raise RefusedError(f"{Path(source).name} is a base model, not an adapter")
    if info.problems:
        raise RefusedError(f"{Path(source).name}: {info.problems[0]}")
    if info.format == "gguf":
        weights = gguf_to_peft(read_gguf(Path(info.path)), n_head, n_head_kv)
        if rebase and weights.base_sha256 == rebase[0]:
            weights.base_sha256 = rebase[1]
        write_peft(Path(target), weights)
        return Path(target)
    weights = peft_to_gguf(read_peft(Path(info.path)), n_head, n_head_kv)
    if rebase and weights.base_sha256 == rebase[0]:
        weights.base_sha256 = rebase[1]
    weights.architecture = info.architecture or architecture
    write_gguf(Path(target), weights)
    return Path(target)


def _module_order(module: str) -> tuple[int, int]:
    layer = naming.layer_of(module) or 0
    role = naming.role_of(module) or ""
    order = list(naming.ROLES)
    return layer, order.index(role) if role in order else len(order)
