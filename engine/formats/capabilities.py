"""What a base model file can be used for, per feature, said before any work starts.

Every feature that reads a model beyond llama.cpp's own loader (training, adapter
conversion, the Hugging Face/vLLM export, OpenVINO with adapters) computes it from the
architecture description (`engine.formats.architecture`), and each has limits of its
own (which RoPE scalings it reproduces, which weight types its arithmetic simulates,
which tokenizers it can write). This module states those limits as data and answers,
for one GGUF header, "supported, using what" or "refused, exactly why" per feature.
`show` prints the table, the details pane renders it, and every command asks it
(`require`) before it loads anything, so an unsupported combination is refused up front
with the same reason the table gives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from engine.errors import RefusedError
from engine.formats import architecture, hf_export, lora_io
from engine.formats.architecture import Model
from engine.formats.safeio import printable

SERVE_LLAMA = "serve on llama.cpp"
SERVE_OPENVINO = "adapters on OpenVINO"
TRAIN = "train adapters"
TRAIN_SERVED = "train in served numerics"
MERGE = "merge adapters"
CONVERT = "convert adapters GGUF <-> PEFT"
EXPORT_LLAMA_SERVER = "export for llama-server"
EXPORT_VLLM = "export for vLLM"
EXPORT_OVMS = "export for OpenVINO Model Server"
NAMES = (SERVE_LLAMA, SERVE_OPENVINO, TRAIN, TRAIN_SERVED, MERGE, CONVERT,
         EXPORT_LLAMA_SERVER, EXPORT_VLLM, EXPORT_OVMS)

# The RoPE scalings OpenVINO reproduces exactly as llama.cpp computes them (our builder
# writes llama.cpp's rotary table, Llama 3's frequency factors and linear scaling
# included); the trainer's and the Hugging Face export's limits are below and in
# `hf_export.model_refusal`.
OPENVINO_ROPE_SCALINGS = ("none", "linear")
# The trainer's: RoPE scalings its forward pass reproduces (Llama 3's frequency factors
# are a tensor, applied whatever the scaling type), and LongRoPE's factor tensors
# (llama.cpp LLM_TENSOR_ROPE_FACTORS_LONG / _SHORT), which it does not.
TRAIN_ROPE_SCALINGS = ("none", "linear")
LONGROPE_TENSORS = ("rope_factors_long.weight", "rope_factors_short.weight")
# vec_dot_type per weight type (ggml-cpu.c type_traits_cpu): the activation arithmetic
# llama.cpp's CPU backend uses before a product with a weight of that type, for the types
# the trainer's served numerics simulate (engine.training.served_math). The K-quants and
# IQ4_XS take Q8_K blocks (256 values, f32 scale) on every x86 path (vec_dot, the
# repacked Q4_K gemm, the tiled path), IQ4_NL takes Q8_0 blocks as Q4_0 does.
ACTIVATION_TYPE = {"F32": "F32", "F16": "F16", "Q8_0": "Q8_0", "Q4_0": "Q8_0",
                   "Q5_0": "Q8_0", "Q4_1": "Q8_1", "Q5_1": "Q8_1", "Q2_K": "Q8_K",
                   "Q3_K": "Q8_K", "Q4_K": "Q8_K", "Q5_K": "Q8_K", "Q6_K": "Q8_K",
                   "IQ4_NL": "Q8_0", "IQ4_XS": "Q8_K"}


@dataclass(frozen=True)
class Capability:
    """One feature for one file: supported (and with what) or refused (and why)."""

    name: str
    ok: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "reason": self.reason}


def _openvino_rope(model: Model) -> str | None:
    if model.rope.scaling not in OPENVINO_ROPE_SCALINGS:
        return (f"OpenVINO does not reproduce {model.rope.scaling} RoPE scaling (it "
                f"reproduces {', '.join(OPENVINO_ROPE_SCALINGS)} and Llama 3's frequency "
                "factors)")
    return None


def _openvino_layout(model: Model) -> str | None:
    """What OpenVINO GenAI's GGUF reader (2026.4, src/cpp/src/gguf_utils) would build
    differently from llama.cpp for this file, beyond RoPE (which the builder corrects):
    None when its graph computes what llama.cpp computes."""
    if model.fused_qkv:
        return "OpenVINO GenAI's GGUF reader does not read a fused attn_qkv"
    if model.output_bias:
        return "OpenVINO GenAI's GGUF reader leaves out output.bias"
    if not math.isclose(model.attention_scale, 1.0 / math.sqrt(model.head_dim),
                        rel_tol=1e-6):
        return (f"OpenVINO's attention scales by 1/sqrt(head_dim), this file by "
                f"{model.attention_scale:g}")
    if any(model.heads_for(role) for role in model.biases):
        return ("OpenVINO GenAI's GGUF reader undoes llama.cpp's q/k row permutation on the "
                "weights but not on their biases")
    return None


def trainer_refusal(model: Model, header: Any) -> str | None:
    """Why the trainer cannot compute this file as llama.cpp does (None: it can)."""
    if model.rope.scaling not in TRAIN_ROPE_SCALINGS:
        return (f"the trainer does not reproduce {model.rope.scaling} RoPE scaling (it "
                f"reproduces {', '.join(TRAIN_ROPE_SCALINGS)} and Llama 3's frequency "
                "factors)")
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


def matrix_types(model: Model, header: Any) -> dict[str, str]:
    """The stored type of every matrix the forward pass multiplies with, by the name it
    is multiplied under ("output.weight" is token_embd's type when tied)."""
    types = {name: header.tensors[name].type_name for name in model.required_tensors()
             if name.startswith("blk.") and len(header.tensors[name].shape) == 2}
    output = "token_embd.weight" if model.tied_output else "output.weight"
    types["output.weight"] = header.tensors[output].type_name
    return types


def served_refusal(model: Model, header: Any) -> str | None:
    """Why served numerics cannot run on this file's weight types (None: they can)."""
    for name, kind in matrix_types(model, header).items():
        if kind not in ACTIVATION_TYPE:
            return (f"served numerics are implemented for {', '.join(ACTIVATION_TYPE)} "
                    f"weights; {name} is {kind}: train with --numerics float")
    return None


def for_header(header: Any) -> tuple[Capability, ...]:
    """Every feature for one GGUF base (`gguf_file.GgufHeader`), in `NAMES` order."""
    arch = printable(str(header.get("general.architecture")))
    try:
        model: Model | None = architecture.describe(header)
        problem = None
    except RefusedError as exc:
        model, problem = None, exc.message
    reasons: dict[str, str | None] = {SERVE_LLAMA: None, MERGE: None,
                                      EXPORT_LLAMA_SERVER: None}
    if model is None:
        for name in (SERVE_OPENVINO, TRAIN, TRAIN_SERVED, CONVERT, EXPORT_VLLM, EXPORT_OVMS):
            reasons[name] = problem
    else:
        openvino = (model.family.openvino_refusal or _openvino_rope(model)
                    or _openvino_layout(model))
        reasons[SERVE_OPENVINO] = openvino
        reasons[EXPORT_OVMS] = openvino
        reasons[TRAIN] = trainer_refusal(model, header)
        reasons[TRAIN_SERVED] = reasons[TRAIN] or served_refusal(model, header)
        reasons[CONVERT] = lora_io.layout_refusal(model)
        reasons[EXPORT_VLLM] = (hf_export.model_refusal(model)
                                or hf_export.tokenizer_refusal(header))
    what = {
        SERVE_LLAMA: f"llama.cpp reads {arch} files",
        SERVE_OPENVINO: "a named OpenVINO IR built from this file: PEFT adapters attach",
        TRAIN: "the trainer computes this family as llama.cpp does",
        TRAIN_SERVED: "llama.cpp's 8-bit activation arithmetic, simulated",
        MERGE: "adapters folded into a new GGUF",
        CONVERT: ("q/k rows permuted per head" if model and model.family.qk_permuted
                  else "the same row order in both formats"),
        EXPORT_LLAMA_SERVER: "the GGUF base and GGUF adapters as they are",
        EXPORT_VLLM: (f"{model.family.hf_class} with one folded PEFT adapter" if model
                      else ""),
        EXPORT_OVMS: "merged, then built into an OpenVINO IR",
    }
    return tuple(Capability(name, reasons[name] is None, reasons[name] or what[name])
                 for name in NAMES)


def require(header: Any, feature: str) -> Model | None:
    """Refuse `feature` on this file with the table's reason; the description when it
    has one (features that need none, like serving on llama.cpp, may return None)."""
    for found in for_header(header):
        if found.name == feature and not found.ok:
            raise RefusedError(f"{header.path.name}: cannot {feature}: {found.reason}")
    try:
        return architecture.describe(header)
    except RefusedError:
        return None
