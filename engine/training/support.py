"""What the trainer computes, said before any work starts: torch-free.

The trainer's forward pass (`engine.training.model.DecoderTorch`) is one decoder over the
architecture description (`engine.formats.architecture`): every family the description
knows, in float and in served numerics. What it does not reproduce is refused here, with
the exact reason, both when a request is checked (`job.prepare`, in the CLI or the
window, before a process starts) and when the worker loads the weights:

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

# RoPE scalings the forward pass reproduces (Llama 3's frequency factors are a tensor,
# applied whatever the scaling type).
ROPE_SCALINGS = ("none", "linear")
# LongRoPE's factor tensors (llama.cpp LLM_TENSOR_ROPE_FACTORS_LONG / _SHORT).
LONGROPE_TENSORS = ("rope_factors_long.weight", "rope_factors_short.weight")
# vec_dot_type per weight type (ggml-cpu.c type_traits_cpu): the activation arithmetic
# llama.cpp's CPU backend uses before a product with a weight of that type, for the types
# served numerics simulate (engine.training.served_math).
ACTIVATION_TYPE = {"F32": "F32", "F16": "F16", "Q8_0": "Q8_0", "Q4_0": "Q8_0",
                   "Q5_0": "Q8_0", "Q4_1": "Q8_1", "Q5_1": "Q8_1"}


def refusal(model: Model, header: Any) -> str | None:
    """Why the trainer cannot compute this file as llama.cpp does (None: it can)."""
    if model.rope.scaling not in ROPE_SCALINGS:
        return (f"the trainer does not reproduce {model.rope.scaling} RoPE scaling (it "
                f"reproduces {', '.join(ROPE_SCALINGS)} and Llama 3's frequency factors)")
    longrope = [t for t in LONGROPE_TENSORS if t in header.tensors]
    if longrope:
        return (f"the file has LongRoPE factors ({', '.join(longrope)}), which llama.cpp "
                "chooses by the serving context's length; the trainer does not reproduce "
                "LongRoPE")
    key = f"{model.name}.rope.scaling.attn_factor"
    attn_factor = header.metadata.get(key, 1.0)
    if not isinstance(attn_factor, int | float) or float(attn_factor) != 1.0:
        shown = f"{float(attn_factor):g}" if isinstance(attn_factor, int | float) \
            else repr(attn_factor)
        return (f"{key} is {shown}: llama.cpp scales every RoPE cos and sin by it, which "
                "the trainer does not reproduce")
    unread = unread_tensors(model, header)
    if unread:
        more = f" (and {len(unread) - 3} more)" if len(unread) > 3 else ""
        return (f"the file has tensors the {model.family.title} description does not read "
                f"({', '.join(unread[:3])}{more}); llama.cpp would compute with them")
    return None


def unread_tensors(model: Model, header: Any) -> list[str]:
    """Tensors of the file that the forward pass would not use, in file order."""
    used = set(model.required_tensors())
    if model.family.always_tied:
        used.add("output.weight")  # ignored by llama.cpp too (Gemma 2)
    return [name for name in header.tensors if name not in used]


def served_refusal(model: Model, header: Any) -> str | None:
    """Why served numerics cannot run on this file's weight types (None: they can)."""
    for name, kind in matrix_types(model, header).items():
        if kind not in ACTIVATION_TYPE:
            return (f"served numerics are implemented for {', '.join(ACTIVATION_TYPE)} "
                    f"weights; {name} is {kind}: train with --numerics float")
    return None


def matrix_types(model: Model, header: Any) -> dict[str, str]:
    """The stored type of every matrix the forward pass multiplies with, by the name it
    is multiplied under ("output.weight" is token_embd's type when tied)."""
    types = {name: header.tensors[name].type_name for name in model.required_tensors()
             if name.startswith("blk.") and len(header.tensors[name].shape) == 2}
    output = "token_embd.weight" if model.tied_output else "output.weight"
    types["output.weight"] = header.tensors[output].type_name
    return types


def describe(header: Any, numerics: str | None = None) -> Model:
    """The file's description, or a refusal naming the file and the reason the trainer
    (with `numerics`, when given) cannot compute it."""
    model = architecture.describe(header)
    reason = refusal(model, header)
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
