"""Folding a variant's LoRA adapters into a standalone GGUF, and measuring what survived.

A merge writes `W + Σ scale_i · alpha_i / rank_i · B_i·A_i` for every adapted tensor.
Everything here is numpy and the `gguf` package: the native quantizer (llama.cpp's
`llama_model_quantize`, or ggml's per-tensor quantizer) is passed in by the caller,
which runs it in the engine process or a child of it (`engine.runtime.merge.work`).

- `write_merged(..., mode="f16")` writes the intermediate file llama.cpp's quantizer
  reads: each adapted tensor dequantized exactly to float32, the delta added, written
  as F16; every other tensor copied byte for byte in its own type; metadata copied.
- `write_merged(..., mode="base")` writes the final file in the base's own types: each
  adapted tensor requantized to its original type (by the `quantize` given), every
  other tensor copied byte for byte.
- `measure_weights` compares the adapted tensors of a merged file with the base's
  values *on the same grid* (the base's tensor quantized the same way to the type the
  merged file holds): the share of weights whose quantization code did not move
  ("rounded back"), and how much of the intended delta the stored change carries.

Row order: the B halves of a GGUF LoRA are already in llama.cpp's row order (q/k
permuted per head like the base's weights), so B·A is added to the GGUF tensor as it
is; nothing is permuted here.

`SURVIVAL_THRESHOLD` is the behaviour survival below which a merge is refused
(docs/merge.md explains the figure; `survival` computes it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, QK_K, GGMLQuantizationType

from engine.errors import Cancelled, RefusedError, UsageError
from engine.formats import gguf_file, lora_io, naming
from engine.formats.lora_io import LoraWeights
from engine.formats.safeio import open_regular, printable

Q = GGMLQuantizationType
# `--type` name -> the suffix of llama.cpp's LLAMA_FTYPE_MOSTLY_* (None: the base's own
# types, requantized tensor by tensor). Only types whose codes `codes()` can read are
# offered, so every merge reports its weight figures the same way.
MERGE_TYPES: dict[str, str | None] = {
    "f16": "F16", "bf16": "BF16", "q8_0": "Q8_0", "q6_k": "Q6_K",
    "q5_k_m": "Q5_K_M", "q5_k_s": "Q5_K_S", "q5_1": "Q5_1", "q5_0": "Q5_0",
    "q4_k_m": "Q4_K_M", "q4_k_s": "Q4_K_S", "q4_1": "Q4_1", "q4_0": "Q4_0",
    "base": None,
}
# What the OpenVINO export accepts: 8 bits or more per weight.
EIGHT_BIT_OR_BETTER = ("f16", "bf16", "q8_0")
# Behaviour survival (1 - KL(variant||merged) / KL(variant||base)) below this: refused
# unless the user allows an erased merge. Measured on the demo (docs/merge.md,
# benchmarks/bench_merge.py): every merge that kept the held-out accuracy scored 0.995 or
# more (F16, Q8_0, Q4_K_M), the base's own Q4_1 grid 0.14 / 0.43 / 0.47 at scales 0.5 / 1
# / 2 (accuracy erased) and 0.88 at scale 4 (partial); 0.9 refuses all of those.
SURVIVAL_THRESHOLD = 0.9
FORMAT = "variant-studio-merge/1"
METADATA_KEY = "variant_studio.merged_from"

CancelCheck = Callable[[], bool]
Progress = Callable[[float], None]
# (float32 values (rows, n_per_row), ggml type) -> the quantized rows, uint8 (rows, bytes)
Quantizer = Callable[[np.ndarray, int], np.ndarray]


def check_type(name: str) -> str:
    """A valid `--type` value (lower case), or a one-line UsageError."""
    if not isinstance(name, str) or name.lower() not in MERGE_TYPES:
        raise UsageError(f"unknown merge type {printable(str(name))!r} (one of "
                         f"{', '.join(MERGE_TYPES)})")
    return name.lower()


@dataclass
class MergePart:
    """One adapter of the variant: its weights (GGUF row order) and its scale."""

    name: str
    weights: LoraWeights
    scale: float

    @property
    def factor(self) -> float:
        """What llama.cpp multiplies B·A by: scale · alpha / rank (alpha 0: scale)."""
        return lora_io.multiplier(self.scale, self.weights.alpha, self.weights.rank)


def plan(header: gguf_file.GgufHeader, parts: Sequence[MergePart]
         ) -> dict[str, list[tuple[np.ndarray, np.ndarray, float]]]:
    """Per base tensor, the (A, B, factor) terms to add; every shape checked first
    (llama.cpp's own checks: base.ne[0] == A's in, base.ne[1] == B's out)."""
    if not parts:
        raise RefusedError("a merge needs at least one adapter")
    arch = header.get("general.architecture")
    terms: dict[str, list[tuple[np.ndarray, np.ndarray, float]]] = {}
    for part in parts:
        w = part.weights
        if w.architecture and arch and w.architecture != arch:
            raise RefusedError(f"adapter {part.name} is for {printable(w.architecture)}, the "
                               f"base is {printable(str(arch))}")
        for module, (a, b) in w.layers.items():
            tensor = naming.module_to_gguf(module)
            info = header.tensors.get(tensor or "")
            if tensor is None or info is None:
                raise RefusedError(f"adapter {part.name}: the base has no tensor for "
                                   f"{printable(module)}")
            if len(info.shape) != 2 or a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1] \
                    or a.shape[1] != info.shape[0] or b.shape[0] != info.shape[1]:
                raise RefusedError(f"adapter {part.name}: {tensor} is {list(info.shape)} "
                                   f"(ggml order), the adapter's A is {list(a.shape)} and B "
                                   f"{list(b.shape)}")
            if not (np.isfinite(a).all() and np.isfinite(b).all()):
                raise RefusedError(f"adapter {part.name}: {tensor} has NaN or infinite "
                                   "values")
            terms.setdefault(tensor, []).append((a, b, part.factor))
    return terms


def delta_of(terms: Sequence[tuple[np.ndarray, np.ndarray, float]]) -> np.ndarray:
    """Σ factor · B·A in float32, numpy order (out, in)."""
    total: np.ndarray | None = None
    for a, b, factor in terms:
        part = (b.astype(np.float32) * np.float32(factor)) @ a.astype(np.float32)
        total = part if total is None else total + part
    assert total is not None
    return total


# ----------------------------------------------------------------------------- writing


@dataclass(frozen=True)
class Written:
    path: str
    mode: str
    tensors: int
    adapted: tuple[str, ...]
    tensor_types: dict[str, int]  # type name -> tensors of that type in the file

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def write_merged(base: Path, parts: Sequence[MergePart], target: Path, mode: str,
                 quantize: Quantizer | None = None, provenance: dict[str, Any] | None = None,
                 progress: Progress | None = None, cancelled: CancelCheck | None = None
                 ) -> Written:
    """Write the merge of `parts` into `base` as `target` (see the module docstring).

    `mode` "f16": adapted tensors F16 (the input of llama.cpp's quantizer); "base":
    adapted tensors requantized to their own type with `quantize` (default: the gguf
    package's, which has no K-quants). Unadapted tensors are copied byte for byte in
    both. `provenance` is stored as JSON under `variant_studio.merged_from`.
    """
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    if mode not in ("f16", "base"):
        raise ValueError(mode)
    header = gguf_file.read_header(Path(base))  # our strict parse before anything else
    terms = plan(header, parts)
    quantize = quantize or gguf_quantize
    reader = GGUFReader(str(base))
    writer = GGUFWriter(str(target), str(header.get("general.architecture")))
    if header.alignment != 32:
        writer.add_custom_alignment(header.alignment)
    for key, value in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.alignment",
                                              METADATA_KEY):
            continue
        kind = value.types[0]
        if kind == GGUFValueType.ARRAY:
            writer.add_array(key, value.contents())
        else:
            writer.add_key_value(key, value.contents(), kind)
    if provenance is not None:
        writer.add_string(METADATA_KEY, json.dumps(provenance, sort_keys=True))
    out_types: dict[str, int] = {}
    for name, info in header.tensors.items():
        shape = tuple(reversed(info.shape))
        if name in terms:
            if mode == "f16":
                kind, nbytes = Q.F16, int(np.prod(shape)) * 2
            else:
                kind = Q(info.type_id)
                nbytes = info.nbytes
        else:
            kind, nbytes = Q(info.type_id), info.nbytes
        writer.add_tensor_info(name, shape, np.dtype(np.float32), nbytes, raw_dtype=kind)
        out_types[kind.name] = out_types.get(kind.name, 0) + 1
    total = sum(i.nbytes for i in header.tensors.values()) or 1
    done = 0
    try:  # from the header on: the writer opens the file with it
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for name, info in header.tensors.items():
            _check(cancelled)
            if name in terms:
                values = merged_values(header, name, terms[name])
                if mode == "f16":
                    data = values.astype(np.float16).view(np.uint8).reshape(-1)
                else:
                    data = encode(values, info.type_id, quantize).reshape(-1)
            else:
                data = np.frombuffer(read_raw(header, name), dtype=np.uint8)
            writer.write_tensor_data(data)
            done += info.nbytes
            if progress:
                progress(done / total)
    finally:
        writer.close()
    return Written(str(target), mode, len(header.tensors), tuple(terms), out_types)


def merged_values(header: gguf_file.GgufHeader, name: str,
                  terms: Sequence[tuple[np.ndarray, np.ndarray, float]]) -> np.ndarray:
    """The base tensor dequantized exactly (float32) plus its delta; refuses a result
    that is not finite (a huge scale), which no quantizer could store."""
    values = gguf_file.read_tensor(header, name) + delta_of(terms)
    if not np.isfinite(values).all():
        raise RefusedError(f"merging {name} gives NaN or infinite weights (is a scale "
                           "too large?)")
    return values


def read_raw(header: gguf_file.GgufHeader, name: str) -> bytes:
    """One tensor's stored bytes, from a file that must not have changed since its
    header was read."""
    info = header.tensors[name]
    handle, st = open_regular(header.path)
    with handle:
        if (st.size, st.mtime_ns, st.inode) != (header.stat.size, header.stat.mtime_ns,
                                                 header.stat.inode):
            raise RefusedError(f"{header.path.name}: file changed since it was inspected")
        handle.seek(info.offset)
        raw = handle.read(info.nbytes)
    if len(raw) != info.nbytes:
        raise RefusedError(f"{header.path.name}: truncated tensor {printable(name)}")
    return raw


def encode(values: np.ndarray, type_id: int, quantize: Quantizer) -> np.ndarray:
    """float32 (rows, n) -> the bytes of ggml type `type_id` (rows, row bytes)."""
    kind = Q(type_id)
    rows = values.reshape(-1, values.shape[-1]).astype(np.float32)
    if kind == Q.F32:
        return rows.view(np.uint8)
    if kind == Q.F16:
        return rows.astype(np.float16).view(np.uint8)
    return quantize(np.ascontiguousarray(rows), int(kind))


def gguf_quantize(rows: np.ndarray, type_id: int) -> np.ndarray:
    """The gguf package's quantizers (bit-exact with ggml's reference ones; no K-quants)."""
    from gguf.quants import QuantError, quantize

    try:
        return quantize(rows, Q(type_id))
    except (QuantError, NotImplementedError) as exc:
        raise RefusedError(f"no quantizer for {Q(type_id).name} here: {exc}") from None


def _check(cancelled: CancelCheck | None) -> None:
    if cancelled and cancelled():
        raise Cancelled("the merge was cancelled")


# ------------------------------------------------------------------------- measuring


@dataclass(frozen=True)
class WeightReport:
    """What the merged file's adapted tensors kept of the adapters' deltas.

    `rounded_back`: the share of adapted weights whose quantization code in the merged
    file equals the base's code on the same grid (the weight did not move);
    `delta_retained`: <stored change, intended delta> / <delta, delta> (1: the whole
    delta is there, 0: none of it; grid noise that is not in the delta's direction
    does not count); `error`: |stored change - delta| / |delta|.
    """

    tensors: int
    weights: int
    rounded_back: float
    delta_retained: float
    error: float
    types: dict[str, int]
    method: str  # "codes", or "values" when a type's codes are not readable here

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Tally:
    same: int = 0
    count: int = 0
    dot: float = 0.0
    dd: float = 0.0
    err: float = 0.0
    types: dict[str, int] = field(default_factory=dict)
    method: str = "codes"


def measure_weights(base: Path, merged: Path, parts: Sequence[MergePart], mode: str,
                    quantize: Quantizer | None = None, progress: Progress | None = None,
                    cancelled: CancelCheck | None = None) -> WeightReport:
    """Compare each adapted tensor of `merged` with the base on the merged file's grid.

    The reference is what the same pipeline stores with a zero delta: for `mode`
    "base", the base's own bytes; otherwise the base's values as the F16 intermediate
    holds them (`f16(W)`), quantized with `quantize` to the type the merged file has
    for that tensor (llama.cpp picks per tensor: Q4_K_M mixes types, and rows that
    are not a multiple of 256 fall back to Q5_0/Q5_1/Q8_0).
    """
    quantize = quantize or gguf_quantize
    head_b = gguf_file.read_header(Path(base))
    head_m = gguf_file.read_header(Path(merged))
    terms = plan(head_b, parts)
    tally = _Tally()
    for index, name in enumerate(terms):
        _check(cancelled)
        info = head_m.tensors.get(name)
        if info is None or info.shape != head_b.tensors[name].shape:
            raise RefusedError(f"the merged file has no tensor {name} of the base's shape")
        kind = Q(info.type_id)
        tally.types[kind.name] = tally.types.get(kind.name, 0) + 1
        rows = info.shape[1] if len(info.shape) > 1 else 1
        got = np.frombuffer(read_raw(head_m, name), np.uint8).reshape(rows, -1)
        if mode == "base":
            ref = np.frombuffer(read_raw(head_b, name), np.uint8).reshape(rows, -1)
            if head_b.tensors[name].type_id != info.type_id:
                raise RefusedError(f"{name}: the merge changed its type")
        else:
            base_values = gguf_file.read_tensor(head_b, name).astype(np.float16)
            ref = encode(base_values.astype(np.float32), info.type_id, quantize)
        delta = delta_of(terms[name]).reshape(rows, -1)
        codes_got, codes_ref = codes(got, kind), codes(ref, kind)
        if codes_got is None or codes_ref is None:
            tally.method = "values"
            same = dequantize(got, kind) == dequantize(ref, kind)
        else:
            same = codes_got == codes_ref
        change = dequantize(got, kind) - dequantize(ref, kind)
        tally.same += int(np.count_nonzero(same))
        tally.count += same.size
        tally.dot += float(np.vdot(change.astype(np.float64), delta.astype(np.float64)))
        tally.dd += float(np.vdot(delta.astype(np.float64), delta.astype(np.float64)))
        tally.err += float(np.sum((change.astype(np.float64) - delta) ** 2))
        if progress:
            progress((index + 1) / len(terms))
    dd = tally.dd or 1.0
    return WeightReport(len(terms), tally.count, tally.same / max(tally.count, 1),
                        tally.dot / dd, float(np.sqrt(tally.err / dd)), tally.types,
                        tally.method)


def dequantize(rows: np.ndarray, kind: Q) -> np.ndarray:
    """Stored rows (uint8, rows x bytes) -> float32 (rows x elements)."""
    from gguf.quants import dequantize as gguf_dequantize

    if kind == Q.F32:
        return rows.view(np.float32)
    if kind == Q.F16:
        return rows.view(np.float16).astype(np.float32)
    return gguf_dequantize(rows, kind).astype(np.float32)


def codes(rows: np.ndarray, kind: Q) -> np.ndarray | None:
    """Each weight's quantization code (the integer it is stored as, without the
    block's scales), for comparing two tensors of the same type weight by weight;
    None for a type whose layout is not read here. Floats are their own bits."""
    if kind == Q.F32:
        return rows.view(np.uint32).copy()
    if kind in (Q.F16, Q.BF16):
        return rows.view(np.uint16).copy()
    _, size = GGML_QUANT_SIZES[kind]
    blocks = rows.reshape(-1, size)
    n = blocks.shape[0]

    def nibbles(qs: np.ndarray, width: int) -> np.ndarray:  # low nibbles, then high
        q = qs.reshape(n, -1, 1, width) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
        return (q & np.uint8(0x0F)).reshape(n, -1)

    def high_bits(qh: np.ndarray) -> np.ndarray:  # 32 bits, one per weight
        bits = qh.copy().view(np.uint32).reshape(n, 1) >> np.arange(32, dtype=np.uint32)
        return (bits & np.uint32(1)).astype(np.uint8)

    if kind == Q.Q8_0:
        return blocks[:, 2:].copy()
    if kind == Q.Q4_0:
        return nibbles(blocks[:, 2:], 16)
    if kind == Q.Q4_1:
        return nibbles(blocks[:, 4:], 16)
    if kind == Q.Q5_0:
        return nibbles(blocks[:, 6:], 16) | (high_bits(blocks[:, 2:6]) << np.uint8(4))
    if kind == Q.Q5_1:
        return nibbles(blocks[:, 8:], 16) | (high_bits(blocks[:, 4:8]) << np.uint8(4))
    if kind == Q.Q4_K:  # d, dmin (f16), 12 bytes of 6-bit scales, 128 bytes of nibbles
        return nibbles(blocks[:, 16:], 32)
    if kind == Q.Q5_K:  # d, dmin, scales, 32 bytes of high bits, 128 bytes of nibbles
        low = nibbles(blocks[:, 48:], 32).reshape(n, -1, 32)
        qh = blocks[:, 16:48].reshape(n, 1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(
            1, 1, 8, 1)
        high = (qh & np.uint8(1)).reshape(n, -1, 32)
        return (low | (high << np.uint8(4))).reshape(n, -1)
    if kind == Q.Q6_K:  # 128 bytes low nibbles, 64 bytes 2-bit highs, 16 scales, d
        ql, qh = blocks[:, :QK_K // 2], blocks[:, QK_K // 2:QK_K // 2 + QK_K // 4]
        low = nibbles(ql, 64).reshape(n, -1, 32)
        high = (qh.reshape(n, -1, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(
            1, 1, 4, 1)) & np.uint8(3)
        return (low | (high.reshape(n, -1, 32) << np.uint8(4))).reshape(n, -1)
    return None


# -------------------------------------------------------------------------- survival


def survival(kl_merged: float, kl_base: float) -> float | None:
    """1 - KL(variant||merged) / KL(variant||base): 1 when the merged model behaves
    like the variant, 0 when it behaves like the base (below 0: further than the base).
    None when the adapter changes nothing measurable on the prompts."""
    if not kl_base > 1e-6:
        return None
    return 1.0 - kl_merged / kl_base


def kl_rows(first: np.ndarray, second: np.ndarray) -> float:
    """KL(first||second) in nats between two next-token distributions given as logits."""
    a = first.astype(np.float64) - np.max(first)
    b = second.astype(np.float64) - np.max(second)
    la = a - np.log(np.sum(np.exp(a)))
    lb = b - np.log(np.sum(np.exp(b)))
    return float(np.sum(np.exp(la) * (la - lb)))
