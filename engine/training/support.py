"""What the trainer computes, said before any work starts: torch-free.

The trainer's forward pass (`engine.training.model.DecoderTorch`) is one decoder over the
architecture description (`engine.formats.architecture`): every family the description
knows, in float and in served numerics. What it does not reproduce is refused here, with
the exact reason, both when a request is checked (`job.prepare`, in the CLI or the
window, before a process starts) and when the worker loads the weights; the reasons are
the capability table's (`engine.formats.capabilities`: `trainer_refusal`,
`served_refusal`), so `show` gives the same one:

- RoPE scalings other than none and linear (YaRN, LongRoPE), and the two things a file can
  use to scale RoPE without declaring a scaling type: `rope.scaling.attn_factor` (llama.cpp
  multiplies every cos and sin by it) and LongRoPE's per-context factor tensors
  (`rope_factors_long` / `rope_factors_short`, which Phi-3/3.5/4-mini 128k files carry
  with no scaling type: llama.cpp picks one of the two by the *serving* context size, so
  no single training arithmetic matches every context);
- any tensor the description does not read (a bias, a norm bias, an extra head): llama.cpp
  would compute with it and we would not;
- served numerics on a weight type whose activation arithmetic is not simulated.

LoRA targets come from the family: its default targets when the user names none, and a
refusal for a projection its layers do not have.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.errors import RefusedError, UsageError
from engine.formats import architecture, gguf_file, naming
from engine.formats.architecture import ATTN_K, ATTN_Q, ATTN_QKV, ATTN_V, Model
from engine.formats.capabilities import served_refusal, trainer_refusal


def describe(header: Any, numerics: str | None = None) -> Model:
    """The file's description, or a refusal naming the file and the reason the trainer
    (with `numerics`, when given) cannot compute it."""
    model = architecture.describe(header)
    reason = trainer_refusal(model, header)
    if reason is None and numerics == "served":
        reason = served_refusal(model, header)
    if reason is not None:
        raise RefusedError(f"{header.path.name}: cannot train adapters: {reason}")
    return model


def describe_path(path: Path, numerics: str | None = None) -> Model:
    return describe(gguf_file.read_header(path), numerics)


# ----------------------------------------------------------------------------- targets


def default_targets(model: Model) -> tuple[str, ...]:
    """The family's default LoRA targets, as this file's layers hold them (a llama file
    with a fused attn_qkv adapts attn_qkv where the family would adapt q and v)."""
    roles = model.layer_roles()
    targets = [t for t in model.family.default_targets if t in roles]
    if model.fused_qkv and any(t in (ATTN_Q, ATTN_K, ATTN_V)
                               for t in model.family.default_targets):
        targets.insert(0, ATTN_QKV)
    return tuple(dict.fromkeys(targets)) or roles[:1]


def check_targets(model: Model, targets: tuple[str, ...]) -> None:
    """Refuse a target this file's layers do not have, naming the ones they do."""
    roles = model.layer_roles()
    for target in targets:
        if target not in roles:
            names = ", ".join(naming.short_name(r) for r in roles)
            raise UsageError(f"{model.family.title} layers have no "
                             f"{naming.short_name(target)} ({target}) to adapt; this "
                             f"file's projections are {names}")
