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
from engine.formats import architecture
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

# The RoPE scalings each feature reproduces exactly as llama.cpp computes them (Llama 3's
# frequency factors are a tensor, not a scaling type: every feature below applies them).
ROPE_SCALINGS = {
    TRAIN: ("none", "linear"),
    SERVE_OPENVINO: ("none", "linear"),
    EXPORT_VLLM: ("none", "linear"),
    EXPORT_OVMS: ("none", "linear"),
}
# The activation arithmetic llama.cpp's CPU backend uses before a product with a weight
# of each type (ggml-cpu.c `type_traits_cpu[type].vec_dot_type`), for the types the
# trainer's served numerics simulate (engine/training/served_math.py).
SERVED_ACTIVATIONS = {"F32": "F32", "F16": "F16", "Q8_0": "Q8_0", "Q4_0": "Q8_0",
                      "Q5_0": "Q8_0", "Q4_1": "Q8_1", "Q5_1": "Q8_1"}
# Tokenizers the Hugging Face export writes: llama.cpp's GPT-2-style BPE with one of these
# pre-tokenizers (engine/formats/hf_export.py `PRE_TOKENIZERS`).
EXPORT_TOKENIZER_MODEL = "gpt2"


@dataclass(frozen=True)
class Capability:
    """One feature for one file: supported (and with what) or refused (and why)."""

    name: str
    ok: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "reason": self.reason}


def _rope(model: Model, feature: str, what: str) -> str | None:
    allowed = ROPE_SCALINGS[feature]
    if model.rope.scaling not in allowed:
        return (f"{what} does not reproduce {model.rope.scaling} RoPE scaling (it reproduces "
                f"{', '.join(allowed)} and Llama 3's frequency factors)")
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


def _served_types(model: Model, header: Any) -> str | None:
    """Why served numerics cannot run on this file's weight types (None: they can)."""
    matrices = [t for t in model.required_tensors() if t.endswith(".weight")
                and len(header.tensors[t].shape) == 2 and t != "token_embd.weight"]
    if model.tied_output:
        matrices.append("token_embd.weight")  # multiplied as the output matrix
    for tensor in matrices:
        kind = header.tensors[tensor].type_name
        if kind not in SERVED_ACTIVATIONS:
            return (f"served numerics simulate {', '.join(SERVED_ACTIVATIONS)} weights; "
                    f"{tensor} is {kind} (train with --numerics float)")
    return None


def _tokenizer(header: Any) -> str | None:
    from engine.formats.hf_export import PRE_TOKENIZERS

    model = header.get("tokenizer.ggml.model")
    pre = header.get("tokenizer.ggml.pre", "default")
    if model != EXPORT_TOKENIZER_MODEL or pre not in PRE_TOKENIZERS:
        return (f"the Hugging Face export writes GPT-2-style BPE tokenizers with the "
                f"{', '.join(sorted(PRE_TOKENIZERS))} pre-tokenizers; this file's is "
                f"{printable(str(model))}/{printable(str(pre))}")
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
        openvino = (model.family.openvino_refusal or _rope(model, SERVE_OPENVINO, "OpenVINO")
                    or _openvino_layout(model))
        reasons[SERVE_OPENVINO] = openvino
        reasons[EXPORT_OVMS] = openvino
        reasons[TRAIN] = _rope(model, TRAIN, "the trainer")
        reasons[TRAIN_SERVED] = reasons[TRAIN] or _served_types(model, header)
        reasons[CONVERT] = None
        reasons[EXPORT_VLLM] = _rope(model, EXPORT_VLLM, "the Hugging Face export") or \
            _tokenizer(header)
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
