"""Layer names across formats: llama.cpp's GGUF tensor names and Hugging Face/PEFT
module paths, for every family the architecture description knows.

GGUF: `blk.N.attn_q.weight` with LoRA halves `blk.N.attn_q.weight.lora_a` / `.lora_b`.
PEFT: `base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight` / `lora_B`.

A module path alone names its GGUF tensor (every family calls a projection the same or
a name no other family uses); a GGUF tensor needs its family to name its module (Phi-3's
`ffn_up` is `mlp.gate_up_proj`, everyone else's is `mlp.up_proj`).
"""

from __future__ import annotations

import re

from engine.formats import architecture
from engine.formats.architecture import PEFT_PREFIX, PROJECTION_ROLES, SHORT_ROLES, short_name

__all__ = ["PEFT_PREFIX", "PROJECTION_ROLES", "SHORT_ROLES", "gguf_to_module",
           "module_to_gguf", "role_of", "layer_of", "parse_targets", "short_name"]

_GGUF_RE = re.compile(r"^blk\.(\d{1,5})\.([a-z_]+)\.weight$")
_HF_RE = re.compile(r"^model\.layers\.(\d{1,5})\.((?:self_attn|mlp)\.[a-z_]+)$")


def gguf_to_module(tensor: str, arch: str | None) -> str | None:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj` in `arch`'s naming
    (a family we do not describe is named like llama); None if not a projection."""
    match = _GGUF_RE.match(tensor)
    if not match:
        return None
    family = architecture.naming_family(arch)
    suffix = family.hf_suffix(match.group(2))
    if suffix is None or match.group(2) not in PROJECTION_ROLES:
        # A fused attn_qkv in a family whose layers are normally separate.
        suffix = "self_attn.qkv_proj" if match.group(2) == architecture.ATTN_QKV else None
    return f"model.layers.{int(match.group(1))}.{suffix}" if suffix else None


def module_to_gguf(module: str) -> str | None:
    """`model.layers.3.self_attn.q_proj` -> `blk.3.attn_q.weight` (None if unknown)."""
    match = _HF_RE.match(module)
    if not match:
        return None
    role = architecture.suffix_role(match.group(2))
    return f"blk.{int(match.group(1))}.{role}.weight" if role else None


def role_of(tensor_or_module: str) -> str | None:
    """The GGUF role (`attn_q`, ...) of a GGUF tensor name or HF module path."""
    match = _GGUF_RE.match(tensor_or_module)
    if match:
        return match.group(2) if match.group(2) in PROJECTION_ROLES else None
    gguf = module_to_gguf(tensor_or_module)
    return role_of(gguf) if gguf else None


def layer_of(tensor_or_module: str) -> int | None:
    match = _GGUF_RE.match(tensor_or_module) or _HF_RE.match(tensor_or_module)
    return int(match.group(1)) if match else None


def parse_targets(text: str, arch: str | None = None) -> tuple[str, ...]:
    """`q,v` or `attn_q,v_proj` -> ('attn_q', 'attn_v'), in a canonical order; with `arch`,
    only the projections that family's layers have."""
    allowed = (architecture.naming_family(arch).projection_roles if arch
               else PROJECTION_ROLES)
    roles = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        role = (SHORT_ROLES.get(part) or architecture.suffix_role(part)
                or (part if part in PROJECTION_ROLES else None))
        if role is None or role not in allowed:
            names = ", ".join(short_name(r) for r in allowed)
            raise ValueError(f"unknown target {part!r} (use {names})")
        roles.append(role)
    if not roles:
        raise ValueError("no targets given")
    return tuple(r for r in PROJECTION_ROLES if r in roles)
