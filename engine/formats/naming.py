"""Layer names across formats: llama.cpp's GGUF tensor names and Hugging Face/PEFT
module paths for the llama architecture family.

GGUF: `blk.N.attn_q.weight` with LoRA halves `blk.N.attn_q.weight.lora_a` / `.lora_b`.
PEFT: `base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight` / `lora_B`.
"""

from __future__ import annotations

import re

# GGUF role -> Hugging Face module suffix inside a decoder layer.
ROLES: dict[str, str] = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
HF_TO_ROLE = {v.split(".")[-1]: k for k, v in ROLES.items()}  # "q_proj" -> "attn_q"
SHORT_ROLES = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output",
               "gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down"}

_GGUF_RE = re.compile(r"^blk\.(\d{1,5})\.([a-z_]+)\.weight$")
_HF_RE = re.compile(r"^model\.layers\.(\d{1,5})\.(self_attn|mlp)\.([a-z_]+)$")
PEFT_PREFIX = "base_model.model."


def gguf_to_module(tensor: str) -> str | None:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj` (None if not a projection)."""
    match = _GGUF_RE.match(tensor)
    if not match or match.group(2) not in ROLES:
        return None
    return f"model.layers.{int(match.group(1))}.{ROLES[match.group(2)]}"


def module_to_gguf(module: str) -> str | None:
    """`model.layers.3.self_attn.q_proj` -> `blk.3.attn_q.weight` (None if unknown)."""
    match = _HF_RE.match(module)
    if not match:
        return None
    role = HF_TO_ROLE.get(match.group(3))
    if role is None or ROLES[role].split(".")[0] != match.group(2):
        return None
    return f"blk.{int(match.group(1))}.{role}.weight"


def role_of(tensor_or_module: str) -> str | None:
    """The GGUF role (`attn_q`, ...) of a GGUF tensor name or HF module path."""
    match = _GGUF_RE.match(tensor_or_module)
    if match:
        return match.group(2) if match.group(2) in ROLES else None
    gguf = module_to_gguf(tensor_or_module)
    return role_of(gguf) if gguf else None


def layer_of(tensor_or_module: str) -> int | None:
    match = _GGUF_RE.match(tensor_or_module) or _HF_RE.match(tensor_or_module)
    return int(match.group(1)) if match else None


def parse_targets(text: str) -> tuple[str, ...]:
    """`q,v` or `attn_q,v_proj` -> ('attn_q', 'attn_v'), in a canonical order."""
    roles = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        role = SHORT_ROLES.get(part) or HF_TO_ROLE.get(part) or (part if part in ROLES else None)
        if role is None:
            raise ValueError(f"unknown target {part!r} (use q, k, v, o, gate, up, down)")
        roles.append(role)
    if not roles:
        raise ValueError("no targets given")
    return tuple(r for r in ROLES if r in roles)
