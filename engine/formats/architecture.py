"""What each model family is: the one description every reader and writer of a model uses.

A GGUF file says which family it belongs to (`general.architecture`) and gives that
family's numbers under its own metadata prefix (`qwen3.block_count`, ...). What the
numbers *mean* (which tensors a layer has, how RoPE rotates, how norms and activations
are computed, what the Hugging Face layout calls each weight, which layers a LoRA can
adapt) is llama.cpp's knowledge, written in C++ per family. This module is that
knowledge as data, read by the trainer's forward pass, the GGUF<->PEFT conversion, the
Hugging Face/vLLM export, validation and the OpenVINO builder, so that no other room
names a family.

`FAMILIES` is the registry (llama, qwen2, qwen3, gemma2, gemma3, phi3; Mistral's 7B
files are llama files). `describe(header)` resolves one file against its family into a
`Model`: the hyper-parameters, which optional tensors it has, its RoPE (mode, base,
linear scaling, Llama 3's frequency factors), its sliding-window layers and its
soft-caps, read exactly as llama.cpp reads them (src/llama-model.cpp and
src/models/<family>.cpp of the llama.cpp that llama-cpp-python 0.3.36 vendors).
`capabilities(model, ...)` says, per feature, whether this file can use it, or exactly
why not, before any work starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from engine.errors import RefusedError
from engine.formats.safeio import printable

# llama.cpp's RoPE modes: "normal" rotates adjacent pairs (2i, 2i+1), for a family whose
# q/k rows were permuted per head at conversion; "neox" rotates the halves (i, i + d/2),
# the Hugging Face layout, kept as it is.
NORMAL, NEOX = "normal", "neox"
# Feed-forward activations: SiLU-gated (SwiGLU) or GELU-gated with the tanh approximation
# (llama.cpp's ggml_gelu, Hugging Face's gelu_pytorch_tanh).
SILU, GELU_TANH = "silu", "gelu_tanh"

PEFT_PREFIX = "base_model.model."

# The per-layer tensor roles llama.cpp names (LLM_TENSOR_*), every family's superset.
# Projections (matrices a LoRA may adapt):
ATTN_Q, ATTN_K, ATTN_V, ATTN_QKV = "attn_q", "attn_k", "attn_v", "attn_qkv"
ATTN_OUT = "attn_output"
FFN_GATE, FFN_UP, FFN_DOWN = "ffn_gate", "ffn_up", "ffn_down"
# Norms (vectors):
ATTN_NORM, ATTN_Q_NORM, ATTN_K_NORM = "attn_norm", "attn_q_norm", "attn_k_norm"
ATTN_POST_NORM, FFN_NORM, FFN_POST_NORM = "post_attention_norm", "ffn_norm", "post_ffw_norm"

# Short names a user may type for a LoRA target (`--targets q,v`).
SHORT_ROLES = {"q": ATTN_Q, "k": ATTN_K, "v": ATTN_V, "o": ATTN_OUT, "qkv": ATTN_QKV,
               "gate": FFN_GATE, "up": FFN_UP, "down": FFN_DOWN, "gate_up": FFN_UP}

# llama.cpp's byte-level BPE pre-tokenizers (`tokenizer.ggml.pre`, src/llama-vocab.cpp),
# grouped by how they split text; some are named after the family that brought them, so
# the names live here. The Hugging Face export writes each group's `tokenizers` form.
PRE_TOKENIZER_NAMES: dict[str, tuple[str, ...]] = {
    "gpt2": ("gpt-2",),  # GPT-2's expression
    "smollm": ("smollm",),  # each digit alone, then GPT-2's
    "llama3": ("llama-bpe", "llama3", "llama-v3"),  # numbers by three, whole words kept
    "single-digits": ("qwen2", "deepseek-r1-qwen"),  # Llama 3's, digits one at a time
}


@dataclass(frozen=True)
class Family:
    """One model family as llama.cpp computes it, and its Hugging Face counterpart."""

    name: str  # general.architecture
    title: str
    examples: str
    # Matrices of a decoder layer, in the order they are applied: (GGUF role, Hugging Face
    # module suffix). These are the LoRA targets.
    projections: tuple[tuple[str, str], ...]
    # Norm vectors of a decoder layer: (GGUF role, Hugging Face module suffix).
    norms: tuple[tuple[str, str], ...]
    hf_class: str
    hf_model_type: str
    default_targets: tuple[str, ...]
    rope_mode: str = NEOX
    # llama.cpp's converter permutes q/k rows per head for NORMAL RoPE (convert_hf_to_gguf's
    # `permute`): weights and LoRA B rows move between GGUF and Hugging Face order.
    qk_permuted: bool = False
    # Projections that may carry a bias (read when the file has it).
    biases: tuple[str, ...] = ()
    # Gemma: the GGUF stores 1 + w for every norm weight (Hugging Face stores w and adds 1
    # when it computes), so llama.cpp applies a plain RMSNorm.
    norm_shift: float = 0.0
    # Gemma: the token embedding is multiplied by sqrt(n_embd).
    embed_scale: bool = False
    activation: str = SILU
    # Phi-3: ffn_up holds gate and up stacked ({n_embd, 2·n_ff}); SwiGLU splits it in halves.
    fused_gate_up: bool = False
    # Gemma 2: attention scores soft-capped (tanh) by {arch}.attn_logit_softcapping.
    attn_softcap: bool = False
    # Gemma 2 soft-caps the final logits always (default 30), Gemma 3 when the file says.
    final_softcap_default: float = 0.0
    # Sliding-window attention: llama.cpp's default pattern (every n-th layer is global;
    # 0: the family has no sliding window), applied when the file declares a window.
    swa_pattern: int = 0
    swa_window_default: int = 0  # used when the file declares none (Gemma 2: 4096)
    # RoPE base of sliding-window layers when the file gives no {arch}.rope.freq_base_swa:
    # None means "the global base" (Gemma 2), a number is llama.cpp's default (Gemma 3).
    swa_rope_base_default: float | None = None
    # Gemma: q is scaled by 1/sqrt(head_dim), except at the 27B shapes (this many layers),
    # where it is 1/sqrt(n_embd / n_head) (llama.cpp copies gemma_pytorch's rule).
    attention_scale_width_layers: int = 0
    # Gemma 2/3 and Phi-3 multiply q by the attention scale before q·k (ggml_scale on
    # Qcur, kq_scale 1); the others scale q·k inside the softmax (soft_max_ext's
    # scale). The same number, rounded at another place (q is rounded to fp16 after).
    scale_q_first: bool = False
    # The output matrix is always token_embd (Gemma 2 ignores an output.weight).
    always_tied: bool = False
    # OpenVINO GenAI's own GGUF reader knows this family (its layers are then named by
    # structure so PEFT adapters attach); None: refused, with this reason otherwise.
    openvino_refusal: str | None = None
    # The Hugging Face class (transformers 5.24's config and modeling files), for the
    # export: projection biases it always has (Qwen2's q/k/v, whatever the file holds);
    # the config keys it reads beyond the common ones ("attention_bias" switches q, k, v
    # and o biases together); the RoPE types its config accepts (Phi3Config validates
    # "default" and "longrope" only).
    hf_fixed_biases: tuple[str, ...] = ()
    hf_config_keys: tuple[str, ...] = ()
    hf_rope_types: tuple[str, ...] = ("default", "linear", "llama3")

    @property
    def projection_roles(self) -> tuple[str, ...]:
        return tuple(role for role, _ in self.projections)

    def hf_suffix(self, role: str) -> str | None:
        for known, suffix in self.projections + self.norms:
            if known == role:
                return suffix
        return None

    def role_of_suffix(self, suffix: str) -> str | None:
        for role, known in self.projections + self.norms:
            if known == suffix:
                return role
        return None


_SEPARATE_QKV = ((ATTN_Q, "self_attn.q_proj"), (ATTN_K, "self_attn.k_proj"),
                 (ATTN_V, "self_attn.v_proj"), (ATTN_OUT, "self_attn.o_proj"),
                 (FFN_GATE, "mlp.gate_proj"), (FFN_UP, "mlp.up_proj"),
                 (FFN_DOWN, "mlp.down_proj"))
_LLAMA_NORMS = ((ATTN_NORM, "input_layernorm"), (FFN_NORM, "post_attention_layernorm"))
_QK_NORMS = ((ATTN_Q_NORM, "self_attn.q_norm"), (ATTN_K_NORM, "self_attn.k_norm"))
# Gemma's four norms: Hugging Face's "post_attention_layernorm" is the norm *after*
# attention (GGUF post_attention_norm); the FFN's input norm is "pre_feedforward".
_GEMMA_NORMS = ((ATTN_NORM, "input_layernorm"), (ATTN_POST_NORM, "post_attention_layernorm"),
                (FFN_NORM, "pre_feedforward_layernorm"),
                (FFN_POST_NORM, "post_feedforward_layernorm"))
# Gemma's Hugging Face configs: q scaled by query_pre_attn_scalar^-0.5, soft-caps, a
# window and the per-layer attention types, the GELU under its own key.
_GEMMA_HF_KEYS = ("attention_bias", "query_pre_attn_scalar", "attn_logit_softcapping",
                  "final_logit_softcapping", "sliding_window", "layer_types",
                  "hidden_activation")
_NO_OPENVINO_READER = ("OpenVINO GenAI's GGUF reader does not know the {name} architecture, "
                       "and OpenVINO cannot compute it from this file")

FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family(
        name="llama", title="Llama", examples="Llama 2, Llama 3.x, Mistral 7B, SmolLM2",
        projections=_SEPARATE_QKV, norms=_LLAMA_NORMS,
        hf_class="LlamaForCausalLM", hf_model_type="llama",
        default_targets=(ATTN_Q, ATTN_V), rope_mode=NORMAL, qk_permuted=True,
        biases=(ATTN_Q, ATTN_K, ATTN_V, ATTN_OUT),
        hf_config_keys=("attention_bias", "mlp_bias", "pretraining_tp")),
    Family(
        name="qwen2", title="Qwen2", examples="Qwen2, Qwen2.5",
        projections=_SEPARATE_QKV, norms=_LLAMA_NORMS,
        hf_class="Qwen2ForCausalLM", hf_model_type="qwen2",
        default_targets=(ATTN_Q, ATTN_V), biases=(ATTN_Q, ATTN_K, ATTN_V),
        hf_fixed_biases=(ATTN_Q, ATTN_K, ATTN_V), hf_config_keys=("use_sliding_window",)),
    Family(
        name="qwen3", title="Qwen3", examples="Qwen3 (dense)",
        projections=_SEPARATE_QKV, norms=_LLAMA_NORMS + _QK_NORMS,
        hf_class="Qwen3ForCausalLM", hf_model_type="qwen3",
        default_targets=(ATTN_Q, ATTN_V),
        hf_config_keys=("attention_bias", "use_sliding_window")),
    Family(
        name="gemma2", title="Gemma 2", examples="Gemma 2",
        projections=_SEPARATE_QKV, norms=_GEMMA_NORMS,
        hf_class="Gemma2ForCausalLM", hf_model_type="gemma2",
        default_targets=(ATTN_Q, ATTN_V), norm_shift=1.0, embed_scale=True,
        activation=GELU_TANH, attn_softcap=True, final_softcap_default=30.0,
        swa_pattern=2, swa_window_default=4096, attention_scale_width_layers=46,
        scale_q_first=True,
        always_tied=True, openvino_refusal=_NO_OPENVINO_READER.format(name="gemma2"),
        hf_config_keys=_GEMMA_HF_KEYS),
    Family(
        name="gemma3", title="Gemma 3", examples="Gemma 3 (text)",
        projections=_SEPARATE_QKV, norms=_GEMMA_NORMS + _QK_NORMS,
        hf_class="Gemma3ForCausalLM", hf_model_type="gemma3_text",
        default_targets=(ATTN_Q, ATTN_V), norm_shift=1.0, embed_scale=True,
        activation=GELU_TANH, swa_pattern=6, swa_rope_base_default=10000.0,
        attention_scale_width_layers=62,
        scale_q_first=True,
        openvino_refusal=_NO_OPENVINO_READER.format(name="gemma3"),
        hf_config_keys=_GEMMA_HF_KEYS + ("rope_local_base_freq",)),
    Family(
        name="phi3", title="Phi-3", examples="Phi-3, Phi-3.5, Phi-4-mini",
        projections=((ATTN_QKV, "self_attn.qkv_proj"), (ATTN_OUT, "self_attn.o_proj"),
                     (FFN_UP, "mlp.gate_up_proj"), (FFN_DOWN, "mlp.down_proj")),
        norms=_LLAMA_NORMS, hf_class="Phi3ForCausalLM", hf_model_type="phi3",
        default_targets=(ATTN_QKV,), fused_gate_up=True,
        scale_q_first=True,
        openvino_refusal=_NO_OPENVINO_READER.format(name="phi3"),
        hf_config_keys=("sliding_window",), hf_rope_types=("default",)),
)}

# Every Hugging Face projection suffix names one GGUF role in every family that has it
# ("up_proj" is ffn_up, and so is Phi-3's "gate_up_proj"), so a module path alone gives
# the GGUF tensor; the other way needs the family.
_SUFFIX_ROLE: dict[str, str] = {}
for _family in FAMILIES.values():
    for _role, _suffix in _family.projections:
        _SUFFIX_ROLE.setdefault(_suffix, _role)
PROJECTION_ROLES: tuple[str, ...] = (ATTN_Q, ATTN_K, ATTN_V, ATTN_QKV, ATTN_OUT, FFN_GATE,
                                     FFN_UP, FFN_DOWN)
# A file of a family we do not describe is named as llama.cpp names llama layers.
GENERIC = FAMILIES["llama"]


def family(name: str | None) -> Family:
    """The described family `name`, or a refusal naming the ones we know."""
    found = FAMILIES.get(name or "")
    if found is None:
        raise RefusedError(f"architecture {printable(str(name))!r} is not one Variant Studio "
                           f"describes ({', '.join(FAMILIES)}); llama.cpp may still serve it, "
                           "but training, conversion, export and OpenVINO need the description")
    return found


def naming_family(name: str | None) -> Family:
    """The family whose layer names a file uses: its own, or llama.cpp's llama names."""
    return FAMILIES.get(name or "", GENERIC)


def suffix_role(suffix: str) -> str | None:
    """`q_proj` or `self_attn.q_proj` -> `attn_q` (a projection of any family)."""
    for known, role in _SUFFIX_ROLE.items():
        if suffix in (known, known.rsplit(".", 1)[-1]):
            return role
    return None


# ----------------------------------------------------------------------------- RoPE


@dataclass(frozen=True)
class Rope:
    """How a file rotates q and k (llama.cpp's ggml_rope_ext arguments)."""

    mode: str  # NORMAL | NEOX
    dims: int  # rotated dimensions per head (n_rot)
    base: float  # freq_base
    scaling: str  # "none" | "linear" | "yarn" | "longrope" (as the file declares it)
    factor: float  # the declared scaling factor (1.0: none); freq_scale = 1 / factor
    original_context: int  # rope.scaling.original_context_length (else the training context)
    freq_factors: bool  # the file has a rope_freqs tensor (Llama 3): theta_i /= rope_freqs[i]

    @property
    def freq_scale(self) -> float:
        return 1.0 / self.factor

    def inv_freq(self, base: float | None = None) -> list[float]:
        """theta_i = base^(-2i/dims) in float64, before scaling and frequency factors."""
        base = self.base if base is None else base
        return [base ** (-2.0 * i / self.dims) for i in range(self.dims // 2)]


# ---------------------------------------------------------------------------- a model


@dataclass(frozen=True)
class Model:
    """One GGUF file resolved against its family: everything a forward pass needs."""

    family: Family
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    rms_eps: float
    rope: Rope
    attention_scale: float  # q is multiplied by this before q·k
    attn_softcap: float  # 0: none
    final_softcap: float  # 0: none
    swa_window: int  # 0: no sliding-window layers
    swa_layers: tuple[bool, ...]
    swa_rope_base: float
    swa_rope_factor: float
    tied_output: bool  # the output matrix is token_embd
    fused_qkv: bool  # the layers hold attn_qkv (q, k, v stacked) instead of q, k and v
    biases: tuple[str, ...]  # projection roles that carry a bias in this file
    output_bias: bool
    tensors: tuple[str, ...] = field(default=(), repr=False)  # what describe() found

    @property
    def name(self) -> str:
        return self.family.name

    @property
    def q_width(self) -> int:
        return self.n_head * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.n_head_kv * self.head_dim

    def layer_roles(self) -> tuple[str, ...]:
        """The projection roles every layer of this file has, in the order applied."""
        roles = self.family.projection_roles
        if self.fused_qkv and ATTN_QKV not in roles:
            roles = (ATTN_QKV,) + tuple(r for r in roles if r not in (ATTN_Q, ATTN_K, ATTN_V))
        return roles

    def layer_norms(self) -> tuple[str, ...]:
        return tuple(role for role, _ in self.family.norms)

    def tensor(self, layer: int, role: str, kind: str = "weight") -> str:
        return f"blk.{layer}.{role}.{kind}"

    def required_tensors(self) -> list[str]:
        """Every tensor the forward pass reads, in file order of use."""
        names = ["token_embd.weight"]
        for i in range(self.n_layer):
            names += [self.tensor(i, r) for r in self.layer_norms()]
            names += [self.tensor(i, r) for r in self.layer_roles()]
            names += [self.tensor(i, r, "bias") for r in self.biases]
        names.append("output_norm.weight")
        if not self.tied_output:
            names.append("output.weight")
        if self.output_bias:
            names.append("output.bias")
        if self.rope.freq_factors:
            names.append("rope_freqs.weight")
        return names

    def is_swa(self, layer: int) -> bool:
        return bool(self.swa_window) and self.swa_layers[layer]

    def rope_base_for(self, layer: int) -> float:
        return self.swa_rope_base if self.is_swa(layer) else self.rope.base

    def rope_factor_for(self, layer: int) -> float:
        return self.swa_rope_factor if self.is_swa(layer) else self.rope.factor

    def projection_shape(self, role: str) -> tuple[int, int]:
        """(out_features, in_features) of a projection, in Hugging Face (numpy) order."""
        shapes = {
            ATTN_Q: (self.q_width, self.n_embd), ATTN_K: (self.kv_width, self.n_embd),
            ATTN_V: (self.kv_width, self.n_embd),
            ATTN_QKV: (self.q_width + 2 * self.kv_width, self.n_embd),
            ATTN_OUT: (self.n_embd, self.q_width), FFN_GATE: (self.n_ff, self.n_embd),
            FFN_UP: ((2 if self.family.fused_gate_up else 1) * self.n_ff, self.n_embd),
            FFN_DOWN: (self.n_embd, self.n_ff)}
        return shapes[role]

    # -------------------------------------------------------------- names

    def module(self, layer: int, role: str) -> str:
        """`model.layers.3.self_attn.q_proj` for (3, attn_q)."""
        suffix = self.family.hf_suffix(role)
        if suffix is None:
            raise RefusedError(f"{self.name} layers have no {role}")
        return f"model.layers.{layer}.{suffix}"

    def heads_for(self, role: str) -> int | None:
        """The head count whose rows a GGUF<->Hugging Face move permutes for `role`
        (None: the rows are in the same order in both)."""
        if not self.family.qk_permuted:
            return None
        return {ATTN_Q: self.n_head, ATTN_K: self.n_head_kv}.get(role)


# --------------------------------------------------------------------- from a header


def _meta(header: Any, arch: str):
    """Typed readers of `{arch}.key` metadata, refusing a value of the wrong type."""
    name = header.path.name
    ints = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64")
    floats = ("float32", "float64")

    def number(key: str, kinds: tuple[str, ...], default: float | None) -> float | None:
        full = f"{arch}.{key}"
        if full not in header.metadata:
            return default
        if header.value_types.get(full) not in kinds:
            raise RefusedError(f"{name}: metadata {full} has type "
                               f"{header.value_types.get(full)}, expected a number")
        return header.metadata[full]

    def integer(key: str, default: int | None = None, required: bool = False) -> int:
        value = number(key, ints, default)
        if value is None or isinstance(value, bool) or value < 0 or value > (1 << 24):
            if required or value is not None:
                raise RefusedError(f"{name}: metadata {arch}.{key} is missing or implausible")
            return 0
        return int(value)

    def real(key: str, default: float | None = None) -> float:
        value = number(key, floats + ints, default)
        if value is None:
            raise RefusedError(f"{name}: metadata {arch}.{key} is missing")
        value = float(value)
        if not math.isfinite(value):
            raise RefusedError(f"{name}: metadata {arch}.{key} is not finite")
        return value

    def text(key: str, default: str) -> str:
        value = header.metadata.get(f"{arch}.{key}", default)
        return value if isinstance(value, str) else default

    return integer, real, text


def describe(header: Any) -> Model:
    """Resolve a GGUF header (`gguf_file.GgufHeader`) against its family, as llama.cpp does.

    Refuses (RefusedError, naming the file and the reason) a family we do not describe, a
    per-layer array where we expect one number, missing tensors, and shapes that disagree
    with the numbers; every reader of the model can then trust the `Model`.
    """
    name = header.path.name
    arch = header.get("general.architecture")
    fam = family(arch)
    integer, real, text = _meta(header, fam.name)
    for key in ("attention.head_count", "attention.head_count_kv", "feed_forward_length"):
        if f"{fam.name}.{key}" in header.metadata and not isinstance(
                header.metadata[f"{fam.name}.{key}"], int):
            raise RefusedError(f"{name}: {fam.name}.{key} varies per layer; "
                               "such files are not described")
    n_layer = integer("block_count", required=True)
    n_embd = integer("embedding_length", required=True)
    n_head = integer("attention.head_count", required=True)
    n_head_kv = integer("attention.head_count_kv", n_head) or n_head
    if not (n_layer and n_embd and n_head) or n_head % n_head_kv:
        raise RefusedError(f"{name}: implausible attention shape ({n_head} heads, "
                           f"{n_head_kv} KV heads, width {n_embd}, {n_layer} layers)")
    head_dim = integer("attention.key_length", n_embd // n_head)
    value_dim = integer("attention.value_length", head_dim)
    rope_dims = integer("rope.dimension_count", head_dim)
    if value_dim != head_dim or rope_dims != head_dim or head_dim % 2:
        raise RefusedError(f"{name}: key length {head_dim}, value length {value_dim} and RoPE "
                           f"dimensions {rope_dims} differ; partial rotary or unequal heads "
                           "are not described")
    emb = header.tensors.get("token_embd.weight")
    if emb is None or len(emb.shape) != 2 or emb.shape[0] != n_embd:
        raise RefusedError(f"{name}: token_embd.weight is missing or not {n_embd} wide")
    n_ctx_train = integer("context_length", 4096) or 4096

    # llama.cpp: a missing type is "linear" (a factor alone scales); an explicit "none"
    # never scales, whatever factor the file also gives (llama-context.cpp).
    factor = real("rope.scaling.factor", 0.0) or real("rope.scale_linear", 0.0) or 1.0
    scaling = text("rope.scaling.type", "linear" if factor != 1.0 else "none")
    if scaling == "none":
        factor = 1.0
    if scaling not in ("none", "linear", "yarn", "longrope"):
        raise RefusedError(f"{name}: RoPE scaling {printable(scaling)!r} is not described")
    if factor <= 0:
        raise RefusedError(f"{name}: RoPE scaling factor {factor:g} is not positive")
    rope = Rope(mode=fam.rope_mode, dims=rope_dims, base=real("rope.freq_base", 10000.0),
                scaling=scaling, factor=factor if scaling != "none" else 1.0,
                original_context=integer("rope.scaling.original_context_length", n_ctx_train)
                or n_ctx_train,
                freq_factors="rope_freqs.weight" in header.tensors)

    swa_window = 0
    swa_layers: tuple[bool, ...] = (False,) * n_layer
    window = integer("attention.sliding_window", fam.swa_window_default)
    if fam.swa_pattern and window:
        pattern_key = f"{fam.name}.attention.sliding_window_pattern"
        pattern = header.metadata.get(pattern_key, fam.swa_pattern)
        swa_window = window
        values = getattr(pattern, "values", None)  # a gguf_file.GgufArray
        if values is not None and len(values) == n_layer and all(
                isinstance(v, bool) for v in values):
            # llama.cpp reads the per-layer form first: true where the layer slides.
            swa_layers = tuple(values)
        elif isinstance(pattern, int) and not isinstance(pattern, bool) and pattern >= 0:
            # set_swa_pattern: every `pattern`-th layer is global, the others slide.
            swa_layers = tuple(pattern == 0 or (i % pattern < pattern - 1)
                               for i in range(n_layer))
        else:
            raise RefusedError(f"{name}: {pattern_key} is neither one number nor one "
                               f"flag per layer ({n_layer})")
    swa_base = real("rope.freq_base_swa", fam.swa_rope_base_default or rope.base)
    # Gemma 2 slides with the global base and scale; Gemma 3 with its own base, unscaled.
    swa_factor = rope.factor if fam.swa_rope_base_default is None else 1.0

    # None of these families' llama.cpp loaders reads {arch}.attention.scale.
    width_rule = (fam.attention_scale_width_layers
                  and n_layer == fam.attention_scale_width_layers)
    scale = 1.0 / math.sqrt(n_embd // n_head if width_rule else head_dim)
    attn_softcap = real("attn_logit_softcapping", 50.0) if fam.attn_softcap else 0.0
    final_softcap = real("final_logit_softcapping", fam.final_softcap_default)

    tensors = set(header.tensors)
    # llama.cpp reads a fused attn_qkv in any family (create_tensor_qkv).
    fused = "blk.0.attn_qkv.weight" in tensors
    biases = tuple(r for r in fam.biases if "blk.0." + r + ".bias" in tensors)
    tied = fam.always_tied or "output.weight" not in tensors
    model = Model(
        family=fam, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
        head_dim=head_dim, n_ff=integer("feed_forward_length", required=True),
        n_vocab=int(emb.shape[1]), n_ctx_train=n_ctx_train,
        rms_eps=real("attention.layer_norm_rms_epsilon", 1e-5), rope=rope,
        attention_scale=scale, attn_softcap=attn_softcap, final_softcap=final_softcap,
        swa_window=swa_window, swa_layers=swa_layers, swa_rope_base=swa_base,
        swa_rope_factor=swa_factor, tied_output=tied, fused_qkv=fused, biases=biases,
        output_bias="output.bias" in tensors, tensors=tuple(header.tensors))
    _check_tensors(model, header)
    return model


def _check_tensors(model: Model, header: Any) -> None:
    """Every tensor the description expects is there, with the shape the numbers give."""
    name = header.path.name
    missing = [t for t in model.required_tensors() if t not in header.tensors]
    if missing:
        raise RefusedError(f"{name}: {model.name} file without {', '.join(missing[:3])}"
                           + (f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""))
    expected: dict[str, tuple[int, ...]] = {}
    for i in range(model.n_layer):
        for role in model.layer_roles():
            out_f, in_f = model.projection_shape(role)
            expected[model.tensor(i, role)] = (in_f, out_f)  # ggml order
        for role in model.layer_norms():
            width = model.head_dim if role in (ATTN_Q_NORM, ATTN_K_NORM) else model.n_embd
            expected[model.tensor(i, role)] = (width,)
    if model.rope.freq_factors:
        expected["rope_freqs.weight"] = (model.rope.dims // 2,)
    for tensor, shape in expected.items():
        found = tuple(header.tensors[tensor].shape)
        if found != shape:
            raise RefusedError(f"{name}: {tensor} has shape {list(found)}, the metadata "
                               f"says {list(shape)}")


def short_name(role: str) -> str:
    """`attn_q` -> `q`, `ffn_up` -> `up` (how `--targets` spells a role)."""
    for short, known in SHORT_ROLES.items():
        if known == role:
            return short
    return role


def default_targets_text() -> str:
    """Each family's default LoRA targets in `--targets` spelling, for help texts
    ("q,v for llama, qwen2, ...; qkv for phi3")."""
    groups: dict[str, list[str]] = {}
    for fam in FAMILIES.values():
        spelled = ",".join(short_name(t) for t in fam.default_targets)
        groups.setdefault(spelled, []).append(fam.name)
    return "; ".join(f"{targets} for {', '.join(names)}" for targets, names in groups.items())
