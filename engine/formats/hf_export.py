"""Hugging Face forms of a llama.cpp variant: a GGUF base as a Hugging Face model
folder, and a variant's scaled adapters as one PEFT adapter.

Serving engines that load Hugging Face formats (vLLM) need the base as `config.json`,
tokenizer files and safetensors weights, and each LoRA as a PEFT folder. Both are made
here from the GGUF files the variant is served from, with numpy and the `gguf`
package only (no torch, no transformers: an export needs neither). What the folder says
comes from the file's description (`architecture.describe`), for every family it knows:

- `config.json` names the family's Hugging Face class and model type and every field
  its transformers config class reads for what llama.cpp computes from this file (head
  size, biases, soft-caps, the sliding window and which layers slide, the query scale,
  tied embeddings); what that class cannot express (a scale it does not have, YaRN or
  LongRoPE, a bias it has no place for) is refused with the reason, never approximated;
- RoPE: linear scaling is `{"rope_type": "linear", "factor"}`; Llama 3's `rope_freqs`
  tensor becomes `{"rope_type": "llama3", ...}`, its parameters derived from the tensor
  and the base and checked to reproduce every frequency (`llama3_rope`);
- every weight is dequantized exactly to float32 (a Q4_1 block is `d * q + m` with f16
  `d` and `m`, which float32 holds exactly), q/k rows are un-permuted where the family's
  files permute them (`Model.heads_for`, k with the KV head count), norms lose the 1
  llama.cpp's converter added where the family's norms compute 1 + w
  (`Family.norm_shift`), fused projections stay fused where the Hugging Face class fuses
  them (qkv_proj and gate_up_proj);
- the tokenizer is written as a `tokenizers` byte-level BPE (`tokenizer.json`) from the
  GGUF vocabulary and merges, with llama.cpp's pre-tokenizer for that file; only the
  GPT-2 style BPE tokenizers whose pre-tokenizers are listed in `PRE_TOKENIZERS` are
  written (anything else is refused, never guessed; `tokenizer_refusal` says why);
- the adapters of a variant become one PEFT adapter whose `B·A · lora_alpha / r`
  equals what llama.cpp applies, `Σ scale_i · alpha_i / rank_i · B_i·A_i`
  (`fold_adapters`).

File names are fixed here; nothing in a model's metadata becomes a path.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import Cancelled, RefusedError
from engine.formats import architecture, gguf_file
from engine.formats.architecture import (
    ATTN_K,
    ATTN_OUT,
    ATTN_Q,
    ATTN_QKV,
    ATTN_V,
    GELU_TANH,
    Model,
)
from engine.formats.lora_io import LoraWeights, unpermute_rows
from engine.formats.safeio import printable

CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
WEIGHTS = "model.safetensors"
TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
BASE_FILES = (CONFIG, GENERATION_CONFIG, WEIGHTS, TOKENIZER, TOKENIZER_CONFIG)

# The projections Hugging Face's `attention_bias` switches on together.
_ATTENTION_BIASES = (ATTN_Q, ATTN_K, ATTN_V, ATTN_OUT)
# A Llama 3 frequency is reproduced when HF's value is within this relative distance of
# llama.cpp's base^(-2i/d) / rope_freqs[i] (the tensor is float32: ~6e-8 apart at best).
LLAMA3_TOLERANCE = 1e-5


# --------------------------------------------------------------------------- tokenizers


@dataclass(frozen=True)
class PreTokenizer:
    """llama.cpp's handling of one `tokenizer.ggml.pre` value (src/llama-vocab.cpp:
    `llm_tokenizer_bpe`'s regular expressions and `llama_vocab::impl::load`'s flags) and
    the `tokenizers` pre-tokenizer that splits text the same way."""

    spec: dict[str, Any]
    ignore_merges: bool = False  # a pre-token that is a whole vocabulary entry stays one
    add_bos: bool = False  # llama.cpp's default when the file has no add_bos_token
    clean_spaces: bool = True  # clean_up_tokenization_spaces (BPE's default: true)


# GPT-2's expression is what ByteLevel's use_regex applies.
_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
               "use_regex": True}
_BYTES_ONLY = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
               "use_regex": False}


def _split(regex: str) -> dict[str, Any]:
    """llama.cpp's one expression, each match (and each gap between matches) a piece."""
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated",
         "invert": False}, _BYTES_ONLY]}


# LLAMA_VOCAB_PRE_TYPE_LLAMA3's expression as llama.cpp writes it (the case-insensitive
# contractions of Llama 3's tokenizer.json spelled out); the single-digit group's differs
# only in taking digits one at a time.
_LLAMA3_REGEX = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
                 r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_SINGLE_DIGITS_REGEX = _LLAMA3_REGEX.replace(r"\p{N}{1,3}", r"\p{N}")
# Each group of llama.cpp's names (`architecture.PRE_TOKENIZER_NAMES`) -> how it splits,
# with the flags llama.cpp sets for it.
_GROUPS: dict[str, PreTokenizer] = {
    "gpt2": PreTokenizer(_BYTE_LEVEL),
    "smollm": PreTokenizer({"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, _BYTE_LEVEL]}, clean_spaces=False),
    "llama3": PreTokenizer(_split(_LLAMA3_REGEX), ignore_merges=True, add_bos=True),
    "single-digits": PreTokenizer(_split(_SINGLE_DIGITS_REGEX), clean_spaces=False),
}
# `tokenizer.ggml.pre` values (llama.cpp's names, aliases included) -> how to split.
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    name: _GROUPS[group] for group, names in architecture.PRE_TOKENIZER_NAMES.items()
    for name in names}
# GGUF token types (llama.cpp's llama_token_type).
_NORMAL, _CONTROL, _USER_DEFINED = 1, 3, 4
_VOCABULARY_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                    "tokenizer.ggml.merges")
# Why a SentencePiece vocabulary (tokenizer model "llama": Llama 2, Mistral 7B and the
# SentencePiece vocabularies of other families) is not
# written: `tokenizers` has no SentencePiece model, only a BPE whose merges would have to
# be rebuilt from the pieces' scores (transformers' SentencePieceExtractor), with
# llama.cpp's own rules around it (a space prefix or none per file, spaces as U+2581,
# byte fallback <0xNN>, score ties broken by position); none of that can be checked here
# without such a vocabulary, so it is refused rather than written unverified.
_SENTENCEPIECE_REFUSAL = (
    "its tokenizer is SentencePiece (tokenizer.ggml.model 'llama'); the export writes "
    "byte-level BPE tokenizers only (a SentencePiece vocabulary would need its merges "
    "rebuilt from the pieces' scores and llama.cpp's space-prefix and byte-fallback "
    "rules reproduced, which this export does not do); export the tokenizer from the "
    "model's original Hugging Face repository instead")

CancelCheck = Callable[[], bool]


def tokenizer_refusal(header: gguf_file.GgufHeader) -> str | None:
    """Why this file's tokenizer cannot be written (None: it can)."""
    model = header.get("tokenizer.ggml.model")
    pre = header.get("tokenizer.ggml.pre", "default")
    if model == "llama":
        return _SENTENCEPIECE_REFUSAL
    if model != "gpt2" or pre not in PRE_TOKENIZERS:
        return (f"tokenizer {printable(str(model))}/{printable(str(pre))} is not written "
                f"by the export (gpt2 BPE with the pre-tokenizers "
                f"{', '.join(sorted(PRE_TOKENIZERS))})")
    if header.get("tokenizer.ggml.add_eos_token"):
        return "the file asks for an EOS token after every text, which the export does not write"
    return None


# ----------------------------------------------------------------------------- config


def _f32(value: float) -> float:
    """A float32 metadata value as the shortest decimal that reads back the same
    (`9.999999747378752e-06` is written as `1e-05`)."""
    return float(str(np.float32(value)))


def _close(a: float, b: float, rel: float = 1e-6) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b))


def describe(header: gguf_file.GgufHeader) -> Model:
    """The file's description, refused where the export would get anything wrong."""
    model = architecture.describe(header)
    problem = model_refusal(model)
    if problem:
        raise RefusedError(f"{header.path.name}: cannot export for Hugging Face: {problem}")
    return model


def model_refusal(model: Model) -> str | None:
    """Why `model` cannot be written as its family's Hugging Face model (None: it can);
    the rest (the rope_freqs values, the tokenizer) is checked as the folder is made."""
    family, rope = model.family, model.rope
    keys = family.hf_config_keys
    if rope.scaling in ("yarn", "longrope"):
        return (f"{rope.scaling} RoPE scaling is not reproduced (llama.cpp computes it "
                "from the context it runs with; only none, linear and Llama 3's "
                "frequency factors are exported)")
    if rope.scaling == "linear" and "linear" not in family.hf_rope_types:
        return (f"{family.hf_class}'s config accepts RoPE types "
                f"{', '.join(family.hf_rope_types)}, not linear scaling")
    if rope.freq_factors and rope.scaling != "none":
        return "rope_freqs together with RoPE scaling has no Hugging Face form"
    if rope.freq_factors and "llama3" not in family.hf_rope_types:
        return (f"{family.hf_class}'s config accepts RoPE types "
                f"{', '.join(family.hf_rope_types)}, not Llama 3's frequency factors")
    if model.fused_qkv and ATTN_QKV not in family.projection_roles:
        return (f"the file fuses q, k and v (attn_qkv); {family.hf_class} has separate "
                "q_proj, k_proj and v_proj")
    if model.output_bias:
        return f"output.bias has no place in {family.hf_class}"
    for role in model.biases:
        if role not in family.hf_fixed_biases and not (
                role in _ATTENTION_BIASES and "attention_bias" in keys):
            return f"{family.hf_class} has no bias for {role}"
    scale = 1.0 / model.attention_scale ** 2
    if "query_pre_attn_scalar" in keys:
        if not _close(scale, round(scale)):
            return (f"the attention scale {model.attention_scale:g} is not "
                    "query_pre_attn_scalar^-0.5 for an integer query_pre_attn_scalar")
    elif not _close(scale, model.head_dim):
        return (f"the attention scale {model.attention_scale:g} is not "
                f"1/sqrt(head_dim), the only one {family.hf_class} computes")
    if model.attn_softcap and "attn_logit_softcapping" not in keys:
        return f"{family.hf_class} has no attention soft-cap"
    if model.final_softcap and "final_logit_softcapping" not in keys:
        return f"{family.hf_class} has no final logit soft-cap"
    if model.swa_window:
        if "layer_types" not in keys:
            return f"{family.hf_class} has no sliding-window layers"
        if "rope_local_base_freq" in keys:  # sliding layers: their own base, unscaled
            if model.swa_rope_factor != 1.0:
                return "sliding-window layers with scaled RoPE have no Hugging Face form"
        elif not (_close(model.swa_rope_base, rope.base)
                  and model.swa_rope_factor == rope.factor):
            return (f"{family.hf_class} rotates sliding-window layers as the others; this "
                    "file gives them another RoPE base or scale")
    return None


def llama3_rope(base: float, dims: int, factors: np.ndarray) -> dict[str, Any] | None:
    """Hugging Face's `llama3` RoPE parameters that reproduce llama.cpp's frequencies
    `base^(-2i/dims) / factors[i]`, or None when every factor is 1 (nothing to scale).

    llama.cpp's converter made the factors from (factor, low_freq_factor,
    high_freq_factor, original_max_position_embeddings); the tensor fixes `factor` (its
    largest value) and the two wavelengths where smoothing starts and ends, not the
    three numbers that give them: any (L, lo, hi) with the same L/lo and L/hi is the
    same RoPE. L is taken as the low-frequency wavelength (so lo is 1, as in Llama 3.1's
    own config), rounded to an integer; lo and hi follow. With fewer than two smoothed
    frequencies the wavelengths are only bounded, and a point between the neighbours is
    taken. Whatever is chosen is then checked: HF's formula must give every frequency
    within `LLAMA3_TOLERANCE` (relative) of llama.cpp's, or the export is refused.
    """
    f = np.asarray(factors, dtype=np.float64)
    if f.shape != (dims // 2,) or not np.all(np.isfinite(f)) or np.any(f <= 0):
        raise RefusedError("rope_freqs holds values that are not positive frequency factors")
    if np.all(np.abs(f - 1.0) <= 1e-6):
        return None
    factor = float(f.max())
    x = _inv_freq(base, dims) / (2 * math.pi)  # 1 / wavelength, falling with i
    high = np.abs(f - 1.0) <= 1e-6
    low = np.abs(f - factor) <= 1e-6 * factor
    mid = ~(high | low)
    kinds = np.where(high, 0, np.where(mid, 1, 2))
    if factor < 1.0 or np.any(np.diff(kinds) < 0):
        raise RefusedError("rope_freqs is not Llama 3's shape (1 for short wavelengths, "
                           "the factor for long ones, smoothed between)")
    if not high.any() and not mid.any():  # every frequency divided by one factor
        return {"rope_type": "linear", "factor": factor}
    s = (1.0 / f[mid] - 1.0 / factor) / (1.0 - 1.0 / factor)  # smoothing, 1 -> 0
    first_low = x[low][0]
    if mid.sum() >= 2:
        slope, offset = np.polyfit(x[mid], s, 1)
        if slope <= 0:
            raise RefusedError("rope_freqs is not Llama 3's shape (its smoothing does not "
                               "fall with the wavelength)")
        v = -offset / slope
        u = v + 1.0 / slope
    elif mid.sum() == 1:
        v = math.sqrt(x[mid][0] * first_low)
        u = v + (x[mid][0] - v) / s[0]
    else:
        last_high = x[high][-1]
        v = first_low ** (2 / 3) * last_high ** (1 / 3)
        u = first_low ** (1 / 3) * last_high ** (2 / 3)
    if not (0 < v < u):
        raise RefusedError("rope_freqs is not Llama 3's shape")
    context = max(1, round(1.0 / v))
    candidates = [(round(context * v, 4), round(context * u, 4)), (context * v, context * u)]
    want = _inv_freq(base, dims) / f
    for lo, hi in candidates:
        params = {"rope_type": "llama3", "factor": factor, "low_freq_factor": lo,
                  "high_freq_factor": hi, "original_max_position_embeddings": context}
        got = hf_llama3_inv_freq(base, dims, params)
        if hi > lo and np.max(np.abs(got - want) / want) <= LLAMA3_TOLERANCE:
            return params
    raise RefusedError("no Llama 3 RoPE parameters reproduce this file's rope_freqs "
                       f"within {LLAMA3_TOLERANCE:g}")


def _inv_freq(base: float, dims: int) -> np.ndarray:
    return base ** (-np.arange(0, dims, 2, dtype=np.float64) / dims)


def hf_llama3_inv_freq(base: float, dims: int, params: dict[str, Any]) -> np.ndarray:
    """transformers' `_compute_llama3_parameters` (5.24), in float64."""
    inv = _inv_freq(base, dims)
    factor, lo, hi = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    context = params["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > context / lo, inv / factor, inv)
    smooth = (context / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < context / hi) & ~(wavelen > context / lo)
    return np.where(medium, smoothed, scaled)


def rope_config(model: Model, header: gguf_file.GgufHeader) -> dict[str, Any]:
    """The RoPE fields of config.json, in both forms readers take.

    transformers 5 keeps RoPE in `rope_parameters` (`rope_type`, `rope_theta` and the
    scaling's own keys; per layer type where sliding layers have their own base, as
    a family with `rope_local_base_freq` has) and converts the older `rope_theta` / `rope_scaling` /
    `rope_local_base_freq` keys into it when it loads (`convert_rope_params_to_dict`;
    `rope_scaling` wins when both are given). vLLM reads the config through transformers
    (with transformers 4 it moves `rope_scaling` into `rope_parameters` itself, older
    vLLM reads `rope_theta` and `rope_scaling` directly). Both forms are written, saying
    the same thing, so every one of those readers gets this file's RoPE.
    """
    rope = model.rope
    theta = _f32(rope.base)
    scaling: dict[str, Any] | None = None
    if rope.scaling == "linear":
        scaling = {"rope_type": "linear", "factor": _f32(rope.factor)}
    elif rope.freq_factors:
        values = gguf_file.read_tensor(header, "rope_freqs.weight")
        scaling = llama3_rope(rope.base, rope.dims, values)
    full = {"rope_type": "default", "rope_theta": theta, **(scaling or {})}
    out: dict[str, Any] = {"rope_theta": theta, "rope_scaling": scaling}
    if "rope_local_base_freq" in model.family.hf_config_keys:
        local = _f32(model.swa_rope_base)
        out["rope_local_base_freq"] = local
        out["rope_parameters"] = {"full_attention": full, "sliding_attention": {
            "rope_type": "default", "rope_theta": local}}
    else:
        out["rope_parameters"] = full
    return out


def config_dict(model: Model, header: gguf_file.GgufHeader) -> dict[str, Any]:
    """config.json for transformers' and vLLM's class of this family (float32 weights):
    the fields every config reads, then those the family's config class adds."""
    family, keys = model.family, model.family.hf_config_keys
    special = _special_ids(header)
    activation = "gelu_pytorch_tanh" if family.activation == GELU_TANH else "silu"
    config: dict[str, Any] = {
        "architectures": [family.hf_class], "model_type": family.hf_model_type,
        "hidden_size": model.n_embd, "intermediate_size": model.n_ff,
        "num_hidden_layers": model.n_layer, "num_attention_heads": model.n_head,
        "num_key_value_heads": model.n_head_kv, "head_dim": model.head_dim,
        "max_position_embeddings": model.n_ctx_train, "rms_norm_eps": _f32(model.rms_eps),
        "vocab_size": model.n_vocab, "tie_word_embeddings": model.tied_output,
        "hidden_act": activation, "attention_dropout": 0.0, "use_cache": True,
        **rope_config(model, header),
        "bos_token_id": special.get("bos_token_id"),
        "eos_token_id": special.get("eos_token_id"),
        "pad_token_id": special.get("pad_token_id"),
        # The values are float32 exactly; `torch_dtype` for older readers.
        "dtype": "float32", "torch_dtype": "float32",
    }
    if "hidden_activation" in keys:
        config["hidden_activation"] = activation
    if "attention_bias" in keys:  # q, k, v and o biases, all or none (zeros are exact)
        config["attention_bias"] = any(r in _ATTENTION_BIASES for r in model.biases)
    if "mlp_bias" in keys:
        config["mlp_bias"] = False
    if "pretraining_tp" in keys:
        config["pretraining_tp"] = 1
    if "use_sliding_window" in keys:  # llama.cpp computes no window for these families
        config["use_sliding_window"] = False
        config["sliding_window"] = None
    if "query_pre_attn_scalar" in keys:
        config["query_pre_attn_scalar"] = round(1.0 / model.attention_scale ** 2)
    if "attn_logit_softcapping" in keys:
        config["attn_logit_softcapping"] = _f32(model.attn_softcap) or None
    if "final_logit_softcapping" in keys:
        config["final_logit_softcapping"] = _f32(model.final_softcap) or None
    if "sliding_window" in keys:
        config["sliding_window"] = model.swa_window or None
    if "layer_types" in keys:
        types = ["sliding_attention" if model.is_swa(i) else "full_attention"
                 for i in range(model.n_layer)]
        config["layer_types"] = types
        # Older readers (transformers 4 before layer_types, older vLLM) take a period.
        for period in range(1, model.n_layer + 2):
            if types == ["full_attention" if (i + 1) % period == 0 else "sliding_attention"
                         for i in range(model.n_layer)]:
                config["sliding_window_pattern"] = period
                break
    return config


def _special_ids(header: gguf_file.GgufHeader) -> dict[str, int]:
    out = {}
    for key, name in (("bos", "bos_token_id"), ("eos", "eos_token_id"),
                      ("padding", "pad_token_id"), ("unknown", "unk_token_id")):
        value = header.get(f"tokenizer.ggml.{key}_token_id")
        if isinstance(value, int) and not isinstance(value, bool):
            out[name] = value
    return out


# ----------------------------------------------------------------------------- weights


@dataclass(frozen=True)
class _Tensor:
    """One Hugging Face tensor: its name, numpy shape and how its values are made."""

    key: str
    shape: tuple[int, ...]
    load: Callable[[], np.ndarray]


def weight_plan(model: Model, header: gguf_file.GgufHeader) -> list[_Tensor]:
    """Every tensor of the Hugging Face checkpoint, from the tensors llama.cpp reads.

    A tensor the file has but llama.cpp's forward pass does not read is refused (it
    would be lost), except an output matrix the family never uses (`always_tied`: the
    family always multiplies by token_embd). rope_freqs is in config.json, not among the weights.
    """
    family = model.family
    name = header.path.name
    needed = set(model.required_tensors())
    ignored = {"output.weight"} if family.always_tied else set()
    for tensor in header.tensors:
        if tensor not in needed and tensor not in ignored:
            raise RefusedError(f"{name}: tensor {printable(tensor)} has no counterpart in "
                               f"{family.hf_class}")

    def loader(tensor: str, heads: int | None = None, shift: float = 0.0
               ) -> Callable[[], np.ndarray]:
        def load() -> np.ndarray:
            values = gguf_file.read_tensor(header, tensor)
            if heads:
                values = unpermute_rows(values, heads)
            if shift:  # float32 (w + 1) - 1: exact for the weights near 1 norms hold
                values = (values - np.float32(shift)).astype(np.float32)
            return values
        return load

    def numpy_shape(tensor: str) -> tuple[int, ...]:
        return tuple(reversed(header.tensors[tensor].shape))

    plan = [_Tensor("model.embed_tokens.weight", numpy_shape("token_embd.weight"),
                    loader("token_embd.weight")),
            _Tensor("model.norm.weight", numpy_shape("output_norm.weight"),
                    loader("output_norm.weight", shift=family.norm_shift))]
    if not model.tied_output:
        plan.append(_Tensor("lm_head.weight", numpy_shape("output.weight"),
                            loader("output.weight")))
    hf_biases = set(family.hf_fixed_biases)
    if "attention_bias" in family.hf_config_keys and any(
            r in _ATTENTION_BIASES for r in model.biases):
        hf_biases |= set(_ATTENTION_BIASES)  # attention_bias: q, k, v and o together
    for layer in range(model.n_layer):
        for role in model.layer_norms():
            tensor = model.tensor(layer, role)
            plan.append(_Tensor(f"{model.module(layer, role)}.weight", numpy_shape(tensor),
                                loader(tensor, shift=family.norm_shift)))
        for role in model.layer_roles():
            tensor, module = model.tensor(layer, role), model.module(layer, role)
            heads = model.heads_for(role)
            plan.append(_Tensor(f"{module}.weight", numpy_shape(tensor),
                                loader(tensor, heads)))
            if role in model.biases:
                bias = model.tensor(layer, role, "bias")
                plan.append(_Tensor(f"{module}.bias", numpy_shape(bias), loader(bias, heads)))
            elif role in hf_biases:  # the class has one, the file none: zero is exact
                rows = model.projection_shape(role)[0]
                plan.append(_Tensor(f"{module}.bias", (rows,),
                                    lambda rows=rows: np.zeros(rows, np.float32)))
    return plan


def write_base(gguf_path: Path, folder: Path, cancelled: CancelCheck | None = None
               ) -> list[Path]:
    """Write the Hugging Face folder of a GGUF base into `folder` (which must be empty
    or absent); returns the files written, in `BASE_FILES` order. Everything is checked
    (description, RoPE, tensors, tokenizer) before the first file is written."""
    header = gguf_file.read_header(Path(gguf_path))  # strict checks before any read
    model = describe(header)
    config = config_dict(model, header)
    plan = weight_plan(model, header)
    vocab = read_vocabulary(Path(gguf_path), header)
    folder.mkdir(parents=True, exist_ok=True)
    _write_json(folder / CONFIG, config)
    special = _special_ids(header)
    _write_json(folder / GENERATION_CONFIG,
                {k: v for k, v in special.items() if k != "unk_token_id"})

    def checked(load: Callable[[], np.ndarray]) -> Callable[[], np.ndarray]:
        def run() -> np.ndarray:
            if cancelled and cancelled():
                raise Cancelled("export cancelled")
            return load()
        return run

    write_safetensors(folder / WEIGHTS, [(t.key, t.shape, checked(t.load)) for t in plan],
                      {"format": "pt"})
    _write_json(folder / TOKENIZER, tokenizer_json(vocab))
    _write_json(folder / TOKENIZER_CONFIG, tokenizer_config(vocab, model.n_ctx_train))
    return [folder / name for name in BASE_FILES]


def write_safetensors(path: Path, tensors: Sequence[tuple[str, tuple[int, ...],
                                                          Callable[[], np.ndarray]]],
                      metadata: dict[str, str]) -> None:
    """A float32 safetensors file written one tensor at a time (a model's weights need
    not fit in memory twice). Header as `lora_io.safetensors_bytes` writes it: keys
    sorted, padded with spaces to 8 bytes, so the same weights are the same bytes."""
    ordered = sorted(tensors, key=lambda t: t[0])
    header: dict[str, Any] = {"__metadata__": dict(sorted(metadata.items()))}
    offset = 0
    for name, dims, _ in ordered:
        size = int(np.prod(dims, dtype=np.int64)) * 4
        header[name] = {"dtype": "F32", "shape": list(dims),
                        "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(text)) + text)
        for name, dims, load in ordered:
            values = np.ascontiguousarray(load(), dtype="<f4")
            if values.shape != tuple(dims):
                raise RefusedError(f"tensor {name}: shape {values.shape}, expected {dims}")
            out.write(values.tobytes())


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
                    encoding="utf-8")


# --------------------------------------------------------------------------- tokenizer


@dataclass(frozen=True)
class Vocabulary:
    """A GGUF's tokenizer, as read from its metadata (after the strict header check)."""

    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[tuple[str, str], ...]
    pre: str
    add_bos: bool
    special: dict[str, int]
    chat_template: str | None


def read_vocabulary(path: Path, header: gguf_file.GgufHeader) -> Vocabulary:
    """The full token, type and merge arrays (the strict header reader keeps only their
    lengths unless asked), read again from `path`, which must be the file `header`
    checked (same size, inode and modification time)."""
    name = header.path.name
    problem = tokenizer_refusal(header)
    if problem:
        raise RefusedError(f"{name}: cannot export for Hugging Face: {problem}")
    pre = str(header.get("tokenizer.ggml.pre", "default"))
    full = gguf_file.read_header(Path(path), keep_arrays=_VOCABULARY_KEYS)
    if (full.stat.size, full.stat.inode, full.stat.mtime_ns) != (
            header.stat.size, header.stat.inode, header.stat.mtime_ns):
        raise RefusedError(f"{name}: file changed since it was inspected")

    def values(key: str, item_type: str) -> tuple[Any, ...]:
        array = full.metadata.get(key)
        if not isinstance(array, gguf_file.GgufArray) or array.item_type != item_type \
                or array.values is None:
            raise RefusedError(f"{name}: {key} is missing or not an array of {item_type}")
        return array.values

    tokens = [str(t) for t in values("tokenizer.ggml.tokens", "string")]
    types = ([int(t) for t in values("tokenizer.ggml.token_type", "int32")]
             if "tokenizer.ggml.token_type" in full.metadata else [_NORMAL] * len(tokens))
    merges = []
    for merge in values("tokenizer.ggml.merges", "string"):
        parts = str(merge).split(" ")
        if len(parts) != 2:
            raise RefusedError(f"{name}: merge {printable(str(merge))!r} is not two tokens")
        merges.append((parts[0], parts[1]))
    if len(types) != len(tokens) or len(set(tokens)) != len(tokens):
        raise RefusedError(f"{name}: the token list has duplicates or no type per token")
    special = _special_ids(header)
    if any(not 0 <= v < len(tokens) for v in special.values()):
        raise RefusedError(f"{name}: a special token id is outside the vocabulary")
    template = header.get("tokenizer.chat_template")
    # llama.cpp: the pre-tokenizer's default, unless the file says (llama-vocab.cpp).
    add_bos = header.get("tokenizer.ggml.add_bos_token", PRE_TOKENIZERS[pre].add_bos)
    return Vocabulary(tuple(tokens), tuple(types), tuple(merges), pre, bool(add_bos), special,
                      template if isinstance(template, str) else None)


def tokenizer_json(vocab: Vocabulary) -> dict[str, Any]:
    """`tokenizer.json` for the `tokenizers` library: byte-level BPE, the GGUF's control
    and user-defined tokens as added tokens (control tokens special), no normalizer."""
    added = [{"id": i, "content": token, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": kind == _CONTROL}
             for i, (token, kind) in enumerate(zip(vocab.tokens, vocab.token_types,
                                                   strict=True))
             if kind in (_CONTROL, _USER_DEFINED)]
    post: dict[str, Any] = {"type": "ByteLevel", "add_prefix_space": False,
                            "trim_offsets": False, "use_regex": True}
    bos = vocab.special.get("bos_token_id")
    if vocab.add_bos and bos is not None:
        token = vocab.tokens[bos]
        post = {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": token, "type_id": 0}},
                           {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": token, "type_id": 0}},
                         {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": token, "type_id": 1}},
                         {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {token: {"id": token, "ids": [bos], "tokens": [token]}}}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None, "pre_tokenizer": PRE_TOKENIZERS[vocab.pre].spec,
        "post_processor": post,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": PRE_TOKENIZERS[vocab.pre].ignore_merges,
                  "vocab": {token: i for i, token in enumerate(vocab.tokens)},
                  "merges": [list(pair) for pair in vocab.merges]},
    }


def tokenizer_config(vocab: Vocabulary, n_ctx: int) -> dict[str, Any]:
    """`tokenizer_config.json`: the special tokens by text, the BOS policy, the GGUF's
    chat template (transformers and vLLM render it in a sandboxed Jinja environment)."""
    names = {"bos_token_id": "bos_token", "eos_token_id": "eos_token",
             "pad_token_id": "pad_token", "unk_token_id": "unk_token"}
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": vocab.add_bos,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": PRE_TOKENIZERS[vocab.pre].clean_spaces,
        "model_max_length": n_ctx,
        **{names[k]: vocab.tokens[v] for k, v in vocab.special.items()},
    }
    if vocab.chat_template:
        config["chat_template"] = vocab.chat_template
    return config


# ---------------------------------------------------------------------------- adapters


def effective_factor(weights: LoraWeights, scale: float) -> float:
    """What llama.cpp multiplies B·A by: scale · alpha / rank (alpha 0 or absent: scale)."""
    return scale * weights.alpha / weights.rank if weights.alpha else scale


def fold_adapters(parts: Sequence[tuple[LoraWeights, float]]) -> LoraWeights:
    """One PEFT adapter (Hugging Face row order in, Hugging Face row order out) that
    changes every layer exactly as llama.cpp applies `parts` at their scales.

    One adapter keeps its rank and alpha, so PEFT's `lora_alpha / r` is llama.cpp's
    `alpha / rank`, and its scale is multiplied into B (a scale of 1 leaves B's values
    as they are; an alpha of 0, which llama.cpp reads as "no alpha/rank factor",
    becomes `lora_alpha = r`). Several adapters are stacked along the rank:
    A = [A_1; A_2; ...], B = [f_1·B_1, f_2·B_2, ...] with f_i each one's whole factor and
    `lora_alpha = r`, since B·A is then Σ f_i·B_i·A_i; a layer an adapter does not
    touch gets zeros in its block.
    """
    if not parts:
        raise RefusedError("a variant needs at least one adapter")
    if len(parts) == 1:
        weights, scale = parts[0]
        layers = {m: (a, b if scale == 1.0 else (b * np.float32(scale)).astype(np.float32))
                  for m, (a, b) in weights.layers.items()}
        alpha = weights.alpha if weights.alpha else float(weights.rank)
        return LoraWeights(alpha, weights.rank, layers, weights.architecture,
                           weights.base_name, weights.base_sha256)
    rank = sum(w.rank for w, _ in parts)
    modules = sorted({m for w, _ in parts for m in w.layers})
    layers: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for module in modules:
        dims = {(a.shape[1], b.shape[0]) for w, _ in parts if module in w.layers
                for a, b in (w.layers[module],)}
        if len(dims) != 1:
            raise RefusedError(f"the variant's adapters disagree on the shape of {module}")
        (n_in, n_out), = dims
        a_blocks, b_blocks = [], []
        for weights, scale in parts:
            if module in weights.layers:
                a, b = weights.layers[module]
                a_blocks.append(a.astype(np.float32))
                b_blocks.append((b.astype(np.float64)
                                 * effective_factor(weights, scale)).astype(np.float32))
            else:
                a_blocks.append(np.zeros((weights.rank, n_in), np.float32))
                b_blocks.append(np.zeros((n_out, weights.rank), np.float32))
        layers[module] = (np.concatenate(a_blocks, axis=0), np.concatenate(b_blocks, axis=1))
    first = parts[0][0]
    return LoraWeights(float(rank), rank, layers, first.architecture, first.base_name,
                       first.base_sha256)


def delta(weights: LoraWeights, module: str) -> np.ndarray:
    """The weight change PEFT applies to `module`: B·A · lora_alpha / r (float64)."""
    a, b = weights.layers[module]
    return b.astype(np.float64) @ a.astype(np.float64) * (weights.alpha / weights.rank)
