"""Reading, writing and converting LoRA weights: GGUF (llama.cpp) and PEFT safetensors.

Both forms hold, per adapted layer, A with shape (rank, in) and B with shape
(out, rank) in numpy order, keyed here by the Hugging Face module path. How the two
forms differ is the base's family's (`engine.formats.architecture`):

- names: `blk.N.attn_q.weight` <-> `model.layers.N.self_attn.q_proj`, and a family
  whose layers are fused keeps them fused in both (`attn_qkv` <-> `self_attn.qkv_proj`,
  `ffn_up` <-> `mlp.gate_up_proj`, the same rows in the same order); a projection the
  other layout does not have (a fused `attn_qkv` in a family whose Hugging Face class
  has separate q/k/v) is refused, never guessed;
- row order: llama.cpp's converter permutes q and k rows per head for the families
  whose RoPE it computes in its "normal" mode (llama, whose files' `heads_for` names
  the head count), so a q/k adapter's B rows move the same way when it crosses
  formats, or it changes the two backends' models differently; every other family's
  rows are already in Hugging Face order and are copied.

The architecture travels with the adapter (`general.architecture` in a GGUF, the
safetensors metadata `architecture` in our PEFT files) and is checked against the
base it is converted for.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from engine.errors import InspectionError, RefusedError
from engine.formats import architecture, gguf_file, naming, safetensors_file
from engine.formats.architecture import ATTN_QKV, Family
from engine.formats.safeio import printable
from engine.state.statefile import write_json_atomic

_MODULE_RE = re.compile(r"^model\.layers\.\d{1,5}\.((?:self_attn|mlp)\.[a-z_]+)$")


@dataclass
class LoraWeights:
    """An adapter's values, keyed by HF module path (`model.layers.0.self_attn.q_proj`)."""

    alpha: float
    rank: int
    layers: dict[str, tuple[np.ndarray, np.ndarray]]  # module -> (A (r, in), B (out, r))
    architecture: str | None = None  # general.architecture of the base (None: unknown)
    base_name: str | None = None
    base_sha256: str | None = None


class BaseLayout(Protocol):
    """What a conversion needs of the base: its family and, per projection role, the
    head count whose rows a GGUF<->Hugging Face move permutes (`architecture.Model`
    and `Layout` both answer it)."""

    @property
    def family(self) -> Family: ...

    def heads_for(self, role: str) -> int | None: ...


@dataclass(frozen=True)
class Layout:
    """A base as a catalog record describes it (family and head counts), for callers that
    have no GGUF header to describe (`architecture.describe` gives a full `Model`)."""

    family: Family
    n_head: int
    n_head_kv: int

    @staticmethod
    def of(arch: str | None, n_head: int, n_head_kv: int) -> Layout:
        """Refuses a family we do not describe and head counts that cannot be a model's."""
        family = architecture.family(arch)
        if n_head <= 0 or n_head_kv <= 0 or n_head % n_head_kv:
            raise RefusedError(f"implausible head counts {n_head}/{n_head_kv} for a "
                               f"{family.name} base")
        return Layout(family, n_head, n_head_kv)

    def heads_for(self, role: str) -> int | None:
        """As `architecture.Model.heads_for` (the same rule; a test holds them equal)."""
        if not self.family.qk_permuted:
            return None
        return {architecture.ATTN_Q: self.n_head,
                architecture.ATTN_K: self.n_head_kv}.get(role)


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


def write_gguf(path: Path, weights: LoraWeights, dtype: str = "F32") -> None:
    """Write a GGUF LoRA in llama.cpp's naming (B rows already in llama.cpp order)."""
    import gguf

    if not weights.architecture:
        raise RefusedError(f"{path.name}: the adapter's architecture is unknown; a GGUF "
                           "LoRA must name its base's (convert it for a base)")
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
    arch = header.get("general.architecture")
    layers: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name in header.tensors:
        if not name.endswith(".lora_a"):
            continue
        target = name.removesuffix(".lora_a")
        module = naming.gguf_to_module(target, arch)
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
                       arch if isinstance(arch, str) else None,
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
    # The base's architecture rides in the safetensors metadata (PEFT's adapter_config has
    # no field for it), so a conversion back can check it against the base.
    metadata = {"format": "pt"}
    if weights.architecture:
        metadata["architecture"] = weights.architecture
    target.write_bytes(safetensors_bytes(tensors, metadata))
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
        if f"{stem}.lora_B.weight" not in arrays:
            raise InspectionError(f"{weights_path.name}: {printable(stem)} has no lora_B")
        layers[module] = (a, arrays[f"{stem}.lora_B.weight"])
    if not layers:
        raise InspectionError(f"{weights_path.name}: no LoRA tensors")
    rank = next(iter(layers.values()))[0].shape[0]
    alpha = config.get("lora_alpha", rank)
    # Written by `write_peft`; a PEFT folder from elsewhere says nothing (None), and the
    # base it is converted for decides.
    arch = header.metadata.get("architecture")
    return LoraWeights(float(alpha), rank, layers, arch or None,
                       config.get("base_model_name_or_path"), config.get("base_model_sha256"))


def gguf_to_peft(weights: LoraWeights, base: BaseLayout | int,
                 n_head_kv: int | None = None) -> LoraWeights:
    """GGUF-ordered weights -> Hugging Face order: q/k B rows un-permuted where the base's
    family permutes them (`heads_for`), everything else as it is.

    `base` is the base's `architecture.Model` or a `Layout`; the older form
    `(weights, n_head, n_head_kv)` takes the family from `weights.architecture`.
    """
    return _convert(weights, _layout(weights, base, n_head_kv), unpermute_rows)


def peft_to_gguf(weights: LoraWeights, base: BaseLayout | int,
                 n_head_kv: int | None = None) -> LoraWeights:
    """Hugging Face-ordered weights -> llama.cpp order (the inverse of `gguf_to_peft`)."""
    return _convert(weights, _layout(weights, base, n_head_kv), permute_rows)


def _layout(weights: LoraWeights, base: BaseLayout | int, n_head_kv: int | None
            ) -> BaseLayout:
    if isinstance(base, int):  # the older call with bare head counts
        if weights.architecture is None:
            raise RefusedError("the adapter does not say its architecture; convert it with "
                               "its base's description")
        return Layout.of(weights.architecture, base, n_head_kv or base)
    return base


def _convert(weights: LoraWeights, base: BaseLayout,
             move: Callable[[np.ndarray, int], np.ndarray]) -> LoraWeights:
    """Every layer checked against the base's family first (nothing half converted)."""
    family = base.family
    if weights.architecture and weights.architecture != family.name:
        raise RefusedError(f"the adapter is for {printable(weights.architecture)}, the base "
                           f"is {family.name}")
    layers = {}
    for module, (a, b) in weights.layers.items():
        role = _family_role(module, family)
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
            raise RefusedError(f"{printable(module)}: A {list(a.shape)} and B "
                               f"{list(b.shape)} are not a LoRA pair")
        heads = base.heads_for(role)
        if heads:
            if b.shape[0] % (2 * heads):
                raise RefusedError(f"{printable(module)}: B has {b.shape[0]} rows, not "
                                   f"{heads} heads of an even size")
            b = move(b, heads)
        layers[module] = (a, b)
    return LoraWeights(weights.alpha, weights.rank, layers, family.name,
                       weights.base_name, weights.base_sha256)


def layout_refusal(model: BaseLayout) -> str | None:
    """Why adapters of this base cannot move between GGUF and PEFT (None: they can): a
    file that fuses q, k and v where its family's Hugging Face layout has them apart."""
    family = model.family
    if getattr(model, "fused_qkv", False) and ATTN_QKV not in family.projection_roles:
        return (f"the file fuses q, k and v (attn_qkv); {family.hf_class}'s PEFT adapters "
                "target q, k and v apart, so its attention adapters have no counterpart")
    return None


def _family_role(module: str, family: Family) -> str:
    """The GGUF role of `module` in `family`'s Hugging Face layout, or a refusal: a fused
    q/k/v where the Hugging Face class has separate projections (or the other way
    round) has no counterpart in the other format."""
    match = _MODULE_RE.match(module)
    role = family.role_of_suffix(match.group(1)) if match else None
    if match is None or role is None or role not in family.projection_roles:
        names = ", ".join(suffix.rsplit(".", 1)[-1] for _, suffix in family.projections)
        fused = " (a fused q/k/v projection)" if module.endswith(".qkv_proj") else ""
        raise RefusedError(f"{printable(module)}{fused} has no counterpart in "
                           f"{family.hf_class}'s layout, whose layers have {names}: "
                           "this adapter cannot be converted for that family")
    return role


def convert_file(source: Path, target: Path, base: BaseLayout,
                 rebase: tuple[str, str] | None = None) -> Path:
    """GGUF LoRA -> PEFT folder, or PEFT -> GGUF LoRA file, by the source's format.

    `base` describes the base the adapter is for (`architecture.Model`, or a `Layout`
    from the catalog's record): its family decides the names and whether q/k rows move,
    and an adapter that says another architecture is refused. The source is inspected
    (and, for safetensors, checked by the safetensors library) first; a structurally
    broken adapter is refused, never half converted. Values are kept exactly: only the
    q/k B rows move, where the family permutes them (see `gguf_to_peft`). `rebase`
    (old, new) replaces a declared base digest: the converted file is for the other
    backend's copy of the same weights.
    """
    from engine.formats import artifacts

    info = artifacts.inspect_path(Path(source))
    if not isinstance(info, artifacts.AdapterInfo):
        raise RefusedError(f"{Path(source).name} is a base model, not an adapter")
    if info.problems:
        raise RefusedError(f"{Path(source).name}: {info.problems[0]}")
    if info.format == "gguf":
        weights = gguf_to_peft(read_gguf(Path(info.path)), base)
        if rebase and weights.base_sha256 == rebase[0]:
            weights.base_sha256 = rebase[1]
        write_peft(Path(target), weights)
        return Path(target)
    weights = peft_to_gguf(read_peft(Path(info.path)), base)
    if rebase and weights.base_sha256 == rebase[0]:
        weights.base_sha256 = rebase[1]
    write_gguf(Path(target), weights)
    return Path(target)


def _module_order(module: str) -> tuple[int, int]:
    layer = naming.layer_of(module) or 0
    role = naming.role_of(module) or ""
    order = list(naming.PROJECTION_ROLES)
    return layer, order.index(role) if role in order else len(order)
