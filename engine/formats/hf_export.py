"""Hugging Face forms of a llama.cpp variant: a GGUF base as a Hugging Face model
folder, and a variant's scaled adapters as one PEFT adapter.

Serving engines that load Hugging Face formats (vLLM) need the base as `config.json`,
tokenizer files and safetensors weights, and each LoRA as a PEFT folder. Both are made
here from the GGUF files the variant is served from, with numpy and the `gguf`
package only (no torch, no transformers: an export needs neither):

- every weight is dequantized exactly to float32 (a Q4_1 block is `d * q + m` with
  f16 `d` and `m`, which float32 holds exactly), and llama.cpp's per-head row
  permutation of q and k is undone (`lora_io.unpermute_rows`, k with the KV head
  count), so the rows are in Hugging Face order;
- the tokenizer is written as a `tokenizers` byte-level BPE (`tokenizer.json`) from the
  GGUF vocabulary and merges, with llama.cpp's pre-tokenizer for that model; only the
  GPT-2 style BPE tokenizers whose pre-tokenizers are listed in `PRE_TOKENIZERS` are
  written (anything else is refused, never guessed);
- the adapters of a variant become one PEFT adapter whose `B·A · lora_alpha / r`
  equals what llama.cpp applies, `Σ scale_i · alpha_i / rank_i · B_i·A_i`
  (`fold_adapters`).

File names are fixed here; nothing in a model's metadata becomes a path.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import Cancelled, RefusedError
from engine.formats import gguf_file, naming
from engine.formats.lora_io import LoraWeights, unpermute_rows
from engine.formats.safeio import printable

CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
WEIGHTS = "model.safetensors"
TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
BASE_FILES = (CONFIG, GENERATION_CONFIG, WEIGHTS, TOKENIZER, TOKENIZER_CONFIG)

# llama.cpp's pre-tokenizer types -> the `tokenizers` pre-tokenizer that splits text the
# same way. "smollm" is `\p{N}` (each digit alone) then GPT-2's expression; "gpt2" is
# GPT-2's expression alone (what ByteLevel's use_regex applies).
_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
               "use_regex": True}
PRE_TOKENIZERS: dict[str, dict[str, Any]] = {
    "smollm": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, _BYTE_LEVEL]},
    "gpt2": _BYTE_LEVEL,
}
# GGUF token types (llama.cpp's llama_token_type).
_NORMAL, _CONTROL, _USER_DEFINED = 1, 3, 4

CancelCheck = Callable[[], bool]


@dataclass(frozen=True)
class LlamaShape:
    """What a llama GGUF says about its structure (the config.json fields)."""

    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ctx_train: int
    rope_theta: float
    rms_eps: float
    vocab_size: int
    tied_embeddings: bool


def _f32(value: float) -> float:
    """A float32 metadata value as the shortest decimal that reads back the same
    (`9.999999747378752e-06` is written as `1e-05`)."""
    return float(str(np.float32(value)))


def _int(header: gguf_file.GgufHeader, key: str, default: int | None = None) -> int:
    value = header.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise RefusedError(f"{header.path.name}: {key} is missing or not a positive integer")
    return value


def llama_shape(header: gguf_file.GgufHeader) -> LlamaShape:
    """The structure of a llama-architecture GGUF; anything this converter would get
    wrong (another architecture, RoPE scaling, partial rotary, biases) is refused."""
    name = header.path.name
    arch = header.get("general.architecture")
    if arch != "llama":
        raise RefusedError(f"{name}: architecture {printable(str(arch))!r} is not supported "
                           "for a Hugging Face export (llama only)")
    scaling = header.get("llama.rope.scaling.type")
    if scaling not in (None, "none"):
        raise RefusedError(f"{name}: RoPE scaling {printable(str(scaling))!r} is not "
                           "supported for a Hugging Face export")
    n_embd, n_head = _int(header, "llama.embedding_length"), _int(header,
                                                                  "llama.attention.head_count")
    n_head_kv = _int(header, "llama.attention.head_count_kv", n_head)
    head_dim = _int(header, "llama.attention.key_length", n_embd // n_head)
    rot = _int(header, "llama.rope.dimension_count", head_dim)
    if rot != head_dim or n_head % n_head_kv:
        raise RefusedError(f"{name}: partial rotary or uneven head groups are not supported "
                           "for a Hugging Face export")
    tokens = header.get("tokenizer.ggml.tokens")
    vocab = header.get("llama.vocab_size") or (tokens.length if tokens is not None else None)
    if not isinstance(vocab, int) or vocab <= 0:
        raise RefusedError(f"{name}: no vocabulary size")
    for tensor in header.tensors:
        if tensor.endswith(".bias"):
            raise RefusedError(f"{name}: bias tensor {printable(tensor)} is not supported "
                               "for a Hugging Face export")
    eps = header.get("llama.attention.layer_norm_rms_epsilon", 1e-5)
    theta = header.get("llama.rope.freq_base", 10000.0)
    return LlamaShape(
        n_layer=_int(header, "llama.block_count"), n_embd=n_embd,
        n_ff=_int(header, "llama.feed_forward_length"), n_head=n_head, n_head_kv=n_head_kv,
        head_dim=head_dim, n_ctx_train=_int(header, "llama.context_length", 4096),
        rope_theta=_f32(float(theta)), rms_eps=_f32(float(eps)), vocab_size=vocab,
        tied_embeddings="output.weight" not in header.tensors)


def hf_tensor_name(tensor: str) -> str | None:
    """GGUF tensor name -> Hugging Face state-dict key (None if not a llama weight)."""
    fixed = {"token_embd.weight": "model.embed_tokens.weight",
             "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
    if tensor in fixed:
        return fixed[tensor]
    layer = naming.layer_of(tensor)
    if layer is not None:
        for role, suffix in (("attn_norm", "input_layernorm"),
                             ("ffn_norm", "post_attention_layernorm")):
            if tensor == f"blk.{layer}.{role}.weight":
                return f"model.layers.{layer}.{suffix}.weight"
    module = naming.gguf_to_module(tensor)
    return f"{module}.weight" if module else None


def config_dict(shape: LlamaShape, header: gguf_file.GgufHeader) -> dict[str, Any]:
    """config.json for transformers' and vLLM's LlamaForCausalLM (float32 weights)."""
    special = _special_ids(header)
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": shape.n_embd, "intermediate_size": shape.n_ff,
        "num_hidden_layers": shape.n_layer, "num_attention_heads": shape.n_head,
        "num_key_value_heads": shape.n_head_kv, "head_dim": shape.head_dim,
        "max_position_embeddings": shape.n_ctx_train, "rms_norm_eps": shape.rms_eps,
        "rope_theta": shape.rope_theta, "rope_scaling": None,
        "vocab_size": shape.vocab_size, "tie_word_embeddings": shape.tied_embeddings,
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        "attention_dropout": 0.0, "pretraining_tp": 1, "use_cache": True,
        # The values are float32 exactly; `torch_dtype` for older readers.
        "dtype": "float32", "torch_dtype": "float32",
        **{k: v for k, v in special.items() if k != "unk_token_id"},
    }


def _special_ids(header: gguf_file.GgufHeader) -> dict[str, int]:
    out = {}
    for key, name in (("bos", "bos_token_id"), ("eos", "eos_token_id"),
                      ("padding", "pad_token_id"), ("unknown", "unk_token_id")):
        value = header.get(f"tokenizer.ggml.{key}_token_id")
        if isinstance(value, int) and not isinstance(value, bool):
            out[name] = value
    return out


# ----------------------------------------------------------------------------- weights


def write_base(gguf_path: Path, folder: Path, cancelled: CancelCheck | None = None
               ) -> list[Path]:
    """Write the Hugging Face folder of a llama GGUF base into `folder` (which must be
    empty or absent); returns the files written, in `BASE_FILES` order."""
    header = gguf_file.read_header(Path(gguf_path))  # strict checks before any read
    shape = llama_shape(header)
    vocab = read_vocabulary(Path(gguf_path), header)
    plan: list[tuple[str, str, tuple[int, ...]]] = []  # (gguf name, hf name, numpy shape)
    for tensor, info in header.tensors.items():
        key = hf_tensor_name(tensor)
        if key is None:
            raise RefusedError(f"{header.path.name}: tensor {printable(tensor)} has no "
                               "Hugging Face counterpart")
        plan.append((tensor, key, tuple(reversed(info.shape))))
    folder.mkdir(parents=True, exist_ok=True)
    _write_json(folder / CONFIG, config_dict(shape, header))
    special = _special_ids(header)
    _write_json(folder / GENERATION_CONFIG,
                {k: v for k, v in special.items() if k != "unk_token_id"})

    def load(tensor: str) -> np.ndarray:
        if cancelled and cancelled():
            raise Cancelled("export cancelled")
        values = gguf_file.read_tensor(header, tensor)
        role = naming.role_of(tensor)
        if role == "attn_q":
            values = unpermute_rows(values, shape.n_head)
        elif role == "attn_k":
            values = unpermute_rows(values, shape.n_head_kv)
        return values

    write_safetensors(folder / WEIGHTS, [(key, dims, (lambda t=tensor: load(t)))
                                         for tensor, key, dims in plan],
                      {"format": "pt"})
    _write_json(folder / TOKENIZER, tokenizer_json(vocab))
    _write_json(folder / TOKENIZER_CONFIG, tokenizer_config(vocab, shape))
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
    lengths), read with the gguf package once `header` has checked the file."""
    import gguf

    name = header.path.name
    model = header.get("tokenizer.ggml.model")
    pre = header.get("tokenizer.ggml.pre", "default")
    if model != "gpt2" or pre not in PRE_TOKENIZERS:
        raise RefusedError(f"{name}: tokenizer {printable(str(model))}/"
                           f"{printable(str(pre))} is not supported for a Hugging Face "
                           f"export (gpt2 BPE with pre-tokenizer "
                           f"{' or '.join(sorted(PRE_TOKENIZERS))})")
    reader = gguf.GGUFReader(str(path))

    def strings(key: str) -> list[str]:
        field = reader.fields.get(key)
        if field is None:
            raise RefusedError(f"{name}: no {key}")
        return [bytes(field.parts[i]).decode("utf-8") for i in field.data]

    tokens = strings("tokenizer.ggml.tokens")
    field = reader.fields.get("tokenizer.ggml.token_type")
    types = ([int(field.parts[i][0]) for i in field.data] if field is not None
             else [_NORMAL] * len(tokens))
    merges = []
    for merge in strings("tokenizer.ggml.merges"):
        parts = merge.split(" ")
        if len(parts) != 2:
            raise RefusedError(f"{name}: merge {printable(merge)!r} is not two tokens")
        merges.append((parts[0], parts[1]))
    if len(types) != len(tokens) or len(set(tokens)) != len(tokens):
        raise RefusedError(f"{name}: the token list has duplicates or no type per token")
    special = _special_ids(header)
    if any(not 0 <= v < len(tokens) for v in special.values()):
        raise RefusedError(f"{name}: a special token id is outside the vocabulary")
    template = header.get("tokenizer.chat_template")
    return Vocabulary(tuple(tokens), tuple(types), tuple(merges), pre,
                      bool(header.get("tokenizer.ggml.add_bos_token", False)), special,
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
        "normalizer": None, "pre_tokenizer": PRE_TOKENIZERS[vocab.pre],
        "post_processor": post,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {token: i for i, token in enumerate(vocab.tokens)},
                  "merges": [list(pair) for pair in vocab.merges]},
    }


def tokenizer_config(vocab: Vocabulary, shape: LlamaShape) -> dict[str, Any]:
    """`tokenizer_config.json`: the special tokens by text, the BOS policy, the GGUF's
    chat template (transformers and vLLM render it in a sandboxed Jinja environment)."""
    names = {"bos_token_id": "bos_token", "eos_token_id": "eos_token",
             "pad_token_id": "pad_token", "unk_token_id": "unk_token"}
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": vocab.add_bos,
        "add_eos_token": False, "clean_up_tokenization_spaces": False,
        "model_max_length": shape.n_ctx_train,
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
