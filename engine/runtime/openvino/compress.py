"""Weight-compressed OpenVINO profiles of a built IR: int8 and int4, names kept.

The OpenVINO default is built as an F16 IR (`build.py`, the *exact* profile). From it
this module makes the compressed profiles with OpenVINO's own compression tool, NNCF's
`compress_weights`, data-free:

- `fast` (int4): every decoder projection INT4_ASYM in groups of 32, the embedding
  INT8_ASYM (NNCF's backup mode). When the source GGUF stores a projection as Q4_1
  (the embedded model does), NNCF's int4 codes are then replaced by the source's own:
  Q4_1 is already a 4-bit asymmetric code in blocks of 32 along the input dimension,
  which is NNCF's INT4_ASYM group-32 layout except for the zero point, which Q4_1 keeps
  as a float (`m`, the block minimum). We write its codes, its scale `d` and the zero
  point `-m/d` as f16 (OpenVINO's decompression subgraph `(codes - zp) * scale` takes
  a float zero point). Re-quantizing the Q4_1 values with NNCF instead rounds each
  block's offset to an integer zero point and moved the model far from the source
  (KL up to 1.9 nats against llama.cpp, top-1 0.6, measured; docs/performance.md).
  Every replaced layer is checked against the F16 IR's weights before it is saved.
- `fast-int8`: where every projection of the source is Q4_1, the same layout with the
  source's codes as 8-bit codes `16·q + o`, scale `d/16` and an integer (u8) zero point
  `o + round(-16·m/d)`: the source's values but for the zero point's rounding (at most
  d/32, a sixteenth of a Q4_1 step), and integer zero points, which let OpenVINO
  quantize the activations to int8 and multiply on integers, as llama.cpp does
  (`DYNAMIC_QUANTIZATION`, about 1.2x faster per token). Other sources: every projection
  and the (tied) embedding INT8_ASYM, per output channel.

The MatMuls keep their structural names (`__module.model.layers.N.self_attn.q_proj/...`):
NNCF puts a decompression subgraph on the weight input and leaves the MatMul and its
(out, in) weight port as they were, so PEFT adapters attach as on the F16 IR, and our
dynamic LoRA branches (on activations) apply unchanged.

Each profile is cached beside the F16 build under a key with its recipe, the OpenVINO
and NNCF versions (`profile_key`); building one is a step of the engine's
`BuildOpenVino` request, with progress and cancel between layers. Engine process
only: OpenVINO and NNCF are imported inside the functions that need them.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import Cancelled, EngineError, RefusedError
from engine.formats import architecture, gguf_file, naming
from engine.runtime.openvino.common import RECIPE as EXACT_RECIPE
from engine.runtime.openvino.common import version_token, weight_constant
from engine.state.statefile import write_json_atomic

Progress = Callable[[str, float], None]
CancelCheck = Callable[[], bool]

EXACT = "exact"
FAST = "fast"
FAST_INT8 = "fast-int8"
# Profile name -> (weights, recipe). The exact profile is the F16 build itself.
COMPRESSED = {FAST: ("int4", "int4-q4_1-g32-v1"), FAST_INT8: ("int8", "int8-q4_1x16-g32-v1")}
# OpenVINO's dynamic quantization of activations (int8, groups of this many) per profile:
# it needs integer zero points, which the int8 profile has and the int4 one (whose f16
# zero points keep the source's values exactly) has not (docs/formats.md, "Profiles").
DYNAMIC_QUANTIZATION = {FAST: 0, FAST_INT8: 32}
# The compressed profiles keep a f16 KV cache (half the memory, no measurable change:
# docs/performance.md); the precision they compute at is this machine's, chosen when the
# profile is registered (`probe`).
FAST_KV_CACHE = "f16"
MANIFEST = "build.json"
IR_FOLDER = "ir"
GROUP = 32  # Q4_1 block size = NNCF's group size for int4
# |Q4_1 rebuilt - F16 IR weight| / max|weight| above this refuses the build (f16
# rounding of the scale and zero point gives about 7e-4 on the default).
SNAP_TOLERANCE = 4e-3
_NAME = re.compile(r"__module\.(model\.layers\.\d{1,5}\.(?:self_attn|mlp)\.[a-z_]+)"
                   r"/aten::linear/MatMul")


def nncf_version() -> str:
    try:
        return metadata.version("nncf")
    except metadata.PackageNotFoundError:
        return "missing"


def profile_key(source_sha256: str, profile: str, openvino_version: str) -> str:
    """The cache folder of a profile: its source, its recipe and the F16 IR's (a profile
    is made from that IR: a new exact recipe is a new profile), OpenVINO's and NNCF's
    versions."""
    weights, recipe = COMPRESSED[profile]
    ov = version_token(openvino_version, 40)
    nncf = version_token(nncf_version(), 20)
    return f"{source_sha256[:16]}-{recipe}-{EXACT_RECIPE}-ov{ov}-nncf{nncf}"


@dataclass(frozen=True)
class ProfileBuild:
    """One compressed profile in the cache (the manifest of its folder)."""

    name: str
    weights: str
    recipe: str
    folder: str  # the IR folder to serve
    kv_cache: str
    nncf: str
    seconds: float
    layers: dict[str, int]  # how many layers got which format, and how many were snapped
    size: int  # bytes of openvino_model.bin

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cached_profile(root: Path, source_sha256: str, profile: str,
                   openvino_version: str) -> ProfileBuild | None:
    """A finished build of `profile` in the cache, or None (reads only, no OpenVINO)."""
    folder = root / profile_key(source_sha256, profile, openvino_version)
    try:
        data = json.loads((folder / MANIFEST).read_text())
        data.pop("precision", None)  # kept by older builds: chosen per machine now
        found = ProfileBuild(**data)
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    ir = folder / IR_FOLDER
    if found.name != profile or not (ir / "openvino_model.xml").is_file() or not (
            ir / "openvino_model.bin").is_file():
        return None
    return ProfileBuild(**{**asdict(found), "folder": str(ir)})


def ensure_profiles(root: Path, source: Path, source_sha256: str, exact_ir: Path,
                    openvino_version: str, report: Progress, stop: CancelCheck
                    ) -> dict[str, ProfileBuild]:
    """Every compressed profile of the F16 IR at `exact_ir`, from the cache or built."""
    import filelock

    out: dict[str, ProfileBuild] = {}
    for profile in COMPRESSED:
        hit = cached_profile(root, source_sha256, profile, openvino_version)
        if hit is None:
            key = profile_key(source_sha256, profile, openvino_version)
            with filelock.FileLock(str(root / f".{key}.lock")):
                hit = cached_profile(root, source_sha256, profile, openvino_version)
                if hit is None:
                    hit = _build_profile(root / key, profile, source, exact_ir, report, stop)
        out[profile] = hit
    return out


def _build_profile(final: Path, profile: str, source: Path, exact_ir: Path,
                   report: Progress, stop: CancelCheck) -> ProfileBuild:
    weights, recipe = COMPRESSED[profile]
    stage = f"compressing to {weights}"
    report(stage, 0.0)
    started = time.monotonic()
    staging = Path(tempfile.mkdtemp(prefix=f".build-{final.name}-", dir=final.parent))
    try:
        ir = staging / IR_FOLDER
        ir.mkdir()
        layers = compress_ir(exact_ir, ir, weights, source,
                             lambda f: report(stage, f), stop)
        for item in exact_ir.iterdir():  # tokenizer, detokenizer, descriptions
            if not item.name.startswith("openvino_model."):
                shutil.copy2(item, ir / item.name)
        result = ProfileBuild(
            name=profile, weights=weights, recipe=recipe, folder=str(final / IR_FOLDER),
            kv_cache=FAST_KV_CACHE, nncf=nncf_version(),
            seconds=round(time.monotonic() - started, 2), layers=layers,
            size=(ir / "openvino_model.bin").stat().st_size)
        write_json_atomic(staging / MANIFEST, result.to_dict())
        if final.exists():
            shutil.rmtree(final)  # an incomplete leftover: no valid manifest
        staging.rename(final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    report(stage, 1.0)
    return result


def compress_ir(exact_ir: Path, target: Path, weights: str, source: Path,
                progress: Callable[[float], None], stop: CancelCheck) -> dict[str, int]:
    """Write `target`/openvino_model.xml: the IR at `exact_ir` with `weights` compression."""
    import nncf
    import openvino as ov

    logging.getLogger("nncf").setLevel(logging.WARNING)  # no progress bars in the log
    core = ov.Core()
    model = core.read_model(str(exact_ir / "openvino_model.xml"))
    if weights not in ("int4", "int8"):
        raise EngineError(f"unknown weight format {weights!r}")
    # The F16 weights each replaced layer is checked against (NNCF edits `model`).
    reference = _f16_weights(model)
    header = gguf_file.read_header(source)
    # int8 from a source whose projections are all Q4_1: NNCF's int4 layout (groups of
    # 32 along the input), its codes then replaced by the source's as 8-bit codes.
    grouped = weights == "int4" or _all_q4_1(header, reference)
    _check(stop)
    if grouped:
        compressed = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT4_ASYM,
                                           group_size=GROUP, ratio=1.0)
    else:
        compressed = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_ASYM)
    progress(0.5)
    _check(stop)
    keep: list[np.ndarray] = []  # the new constants' memory, alive until saved
    snapped = 0
    if grouped:
        snapped = snap_to_source(compressed, header, reference, keep,
                                 lambda f: progress(0.5 + 0.4 * f), stop,
                                 bits=4 if weights == "int4" else 8)
    layers = _count_formats(compressed)
    if grouped:
        layers["snapped_to_source"] = snapped
    compressed.validate_nodes_and_infer_types()
    _check(stop)
    ov.save_model(compressed, str(target / "openvino_model.xml"), compress_to_fp16=False)
    progress(1.0)
    return layers


def _count_formats(model: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for op in model.get_ordered_ops():
        # Weight codes only (NNCF names the zero points `<weight>/zero_point`).
        if (op.get_type_name() == "Constant" and len(op.get_output_shape(0)) >= 2
                and not op.get_friendly_name().endswith("/zero_point")):
            kind = str(op.get_output_element_type(0).get_type_name())
            if kind in ("u4", "i4", "u8", "i8"):
                key = "int4" if "4" in kind else "int8"
                counts[key] = counts.get(key, 0) + 1
    return counts


# --------------------------------------------------------------------------- snapping


def _f16_weights(model: Any) -> dict[str, np.ndarray]:
    """The weight of each structurally named projection of an F16 IR, by MatMul name."""
    out = {}
    for op in model.get_ordered_ops():
        if op.get_type_name() == "MatMul" and _NAME.fullmatch(op.get_friendly_name()):
            const = weight_constant(op.input_value(1).get_node())
            if const is not None:
                out[op.get_friendly_name()] = const.get_data()
    return out


def snap_to_source(model: Any, header: Any, reference: dict[str, np.ndarray],
                   keep: list[np.ndarray], progress: Callable[[float], None],
                   stop: CancelCheck, bits: int = 4) -> int:
    """Replace each int4 projection's codes by the source GGUF's own Q4_1 blocks
    (`header`: the source's, `gguf_file.read_header`).

    `bits` 4: the Q4_1 codes, scale `d` and a f16 zero point `-m/d` (exact). `bits` 8:
    8-bit codes `16·q + o` with scale `d/16` and an integer (u8) zero point, which
    OpenVINO's dynamic quantization of activations needs (docs/formats.md); exact but
    for the zero point's rounding, at most d/32.

    Returns how many layers were replaced; 0 when the source has no Q4_1 projections
    (then NNCF's own int4 codes stay). `keep` holds the arrays behind the new constants
    (OpenVINO's constants share their memory) until the model is saved.
    """
    from engine.formats.lora_io import unpermute_rows

    description = architecture.describe(header)
    projections = [op for op in model.get_ordered_ops()
                   if op.get_type_name() == "MatMul" and _NAME.fullmatch(op.get_friendly_name())]
    snapped = 0
    for index, op in enumerate(projections):
        _check(stop)
        match = _NAME.fullmatch(op.get_friendly_name())
        assert match is not None
        tensor = _gguf_tensor(match)
        info = header.tensors.get(tensor)
        if info is None or info.type_id != _Q4_1:
            continue
        chain = _decompression(op)
        if chain is None:
            raise RefusedError(f"{op.get_friendly_name()}: NNCF did not give the int4 "
                               "decompression subgraph this build expects")
        convert, subtract, multiply = chain
        expected = reference.get(op.get_friendly_name())
        if expected is None:
            raise RefusedError(f"{op.get_friendly_name()}: no F16 weight to check it against")
        expected = expected.astype(np.float32)
        codes, scale, minimum = _q4_1_blocks(header, tensor)
        rows = codes.shape[0]
        # GGUF keeps q/k rows permuted per head where the family's RoPE needs it (the
        # description says); the IR has them in Hugging Face order.
        n_head = description.heads_for(naming.role_of(match.group(1)) or "")
        if n_head:
            codes = unpermute_rows(codes.reshape(rows, -1), n_head).reshape(codes.shape)
            scale, minimum = unpermute_rows(scale, n_head), unpermute_rows(minimum, n_head)
        d = scale.astype(np.float32)
        m = minimum.astype(np.float32)
        if bits == 4:
            codes, zero_point, step = _q4_1_as_int4(codes, d, m)
        else:
            codes, zero_point, step = _q4_1_as_int8(codes, d, m)
        rebuilt = ((codes.astype(np.float32) - zero_point.astype(np.float32)[..., None])
                   * step.astype(np.float32)[..., None]).reshape(expected.shape)
        error = float(np.abs(rebuilt - expected).max() / max(np.abs(expected).max(), 1e-12))
        if error > SNAP_TOLERANCE:
            raise RefusedError(f"{op.get_friendly_name()}: the source's Q4_1 blocks differ "
                               f"from the F16 IR's weights (relative {error:.2g})")
        packed = codes if bits == 8 else (
            codes.reshape(-1, 2)[:, 0] | (codes.reshape(-1, 2)[:, 1] << 4)).astype(np.uint8)
        zp = zero_point[..., None]
        sc = step[..., None]
        keep.extend((packed, zp, sc))
        _replace(convert, subtract, multiply, packed, list(codes.shape), zp, sc,
                 op.get_friendly_name(), bits)
        snapped += 1
        progress((index + 1) / len(projections))
    return snapped


_Q4_1 = 3  # GGMLQuantizationType.Q4_1


def _q4_1_blocks(header: Any, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes (rows, blocks, 32) u8, scale d and minimum m (rows, blocks) f16 of a Q4_1
    tensor, read raw from the GGUF (block: d f16, m f16, 16 bytes: element j in the low
    nibble of byte j, element j + 16 in its high nibble)."""
    from engine.formats.safeio import open_regular

    info = header.tensors[name]
    cols, rows = int(info.shape[0]), int(info.shape[1])
    handle, _ = open_regular(header.path)
    with handle:
        handle.seek(info.offset)
        raw = np.frombuffer(handle.read(info.nbytes), dtype=np.uint8)
    blocks = raw.reshape(rows, cols // GROUP, 20)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0]
    nibbles = blocks[..., 4:]
    codes = np.concatenate([nibbles & 15, nibbles >> 4], axis=-1)
    return codes, d, m


def _decompression(op: Any) -> tuple[Any, Any, Any] | None:
    """(codes Convert, Subtract, Multiply) of an int4-compressed MatMul's weight.

    NNCF's int4 group subgraph: Convert(u4 codes) - Convert(u4 zero point), times the
    f16 scale, reshaped to (out, in), converted to f32 for the MatMul.
    """
    node = op.input_value(1).get_node()
    while node.get_type_name() == "Convert":
        node = node.input_value(0).get_node()
    if node.get_type_name() != "Reshape":
        return None
    multiply = node.input_value(0).get_node()
    if multiply.get_type_name() != "Multiply":
        return None
    subtract = multiply.input_value(0).get_node()
    if subtract.get_type_name() != "Subtract":
        return None
    convert = subtract.input_value(0).get_node()
    codes = convert.input_value(0).get_node()
    if convert.get_type_name() != "Convert" or codes.get_type_name() != "Constant":
        return None
    if multiply.input_value(1).get_node().get_type_name() != "Constant":
        return None
    return convert, subtract, multiply


def _q4_1_as_int4(codes: np.ndarray, d: np.ndarray, m: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_1 blocks as u4 codes, f16 zero points and f16 scales: `(q - (-m/d)) · d`."""
    flat = d == 0  # a constant block: w = m, written as (0 - (-1)) * m
    zero_point = np.where(flat, -1.0, -m / np.where(flat, 1.0, d)).astype(np.float16)
    step = np.where(flat, m, d).astype(np.float16)
    return np.where(flat[..., None], 0, codes).astype(np.uint8), zero_point, step


def _q4_1_as_int8(codes: np.ndarray, d: np.ndarray, m: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_1 blocks as u8 codes `16·q + o`, u8 zero points `o + round(-16·m/d)` and f16
    scales `d/16`: `w = d·q + m` but for the zero point's rounding (at most d/32). The
    offset `o` lifts a negative zero point (a block of positive weights) into range; a
    block whose zero point still does not fit takes the largest of k = 8, 4, 2, 1 that
    does (a coarser zero point, at most d/2k off; the ≤ 4e-3 check still applies)."""
    flat = d == 0
    safe_d = np.where(flat, 1.0, d)
    out_codes = np.zeros(codes.shape, np.uint8)
    zero_point = np.zeros(d.shape, np.uint8)
    step = np.zeros(d.shape, np.float16)
    todo = ~flat
    for k in (16, 8, 4, 2, 1):
        zero = np.round(-k * m / safe_d)
        offset = np.clip(-zero, 0, 255 - 15 * k)
        fits = todo & (zero + offset >= 0) & (zero + offset <= 255)
        out_codes[fits] = (k * codes[fits].astype(np.int32) + offset[fits, None]).astype(np.uint8)
        zero_point[fits] = (zero + offset)[fits].astype(np.uint8)
        step[fits] = (d / k)[fits].astype(np.float16)
        todo &= ~fits
    if todo.any():
        raise RefusedError("a Q4_1 block's zero point does not fit 8 bits")
    # A constant block: w = m, written as (1 - 0) * m.
    out_codes[flat] = 1
    step[flat] = m[flat].astype(np.float16)
    return out_codes, zero_point, step


def _gguf_tensor(match: re.Match[str]) -> str:
    """The GGUF tensor of a projection whose MatMul name `_NAME` matched."""
    return naming.module_to_gguf(match.group(1)) or f"{match.group(1)}?"


def _all_q4_1(header: Any, reference: dict[str, np.ndarray]) -> bool:
    """Every structurally named projection of the model is a Q4_1 tensor in the source."""
    infos = [header.tensors.get(_gguf_tensor(_NAME.fullmatch(name))) for name in reference]
    return bool(infos) and all(i is not None and i.type_id == _Q4_1 for i in infos)


def _replace(convert: Any, subtract: Any, multiply: Any, packed: np.ndarray,
             shape: list[int], zero_point: np.ndarray, scale: np.ndarray, name: str,
             bits: int) -> None:
    """Put new codes (u4 packed, or u8), zero point and scale into NNCF's decompression
    subgraph. The int8 profile's integer zero point goes through a Convert (the pattern OpenVINO's
    dynamic quantization recognizes) and is named like NNCF's own."""
    import openvino as ov
    from openvino import opset13 as ops

    codes = ops.constant(ov.Tensor(packed, shape, ov.Type.u8 if bits == 8 else ov.Type.u4))
    convert.input(0).replace_source_output(codes.output(0))
    if bits == 8:
        constant = ops.constant(ov.Tensor(zero_point))
        constant.set_friendly_name(f"{name}/zero_point")
        point = ops.convert(constant, subtract.get_output_element_type(0)).output(0)
    else:
        point = ops.constant(zero_point).output(0)
    subtract.input(1).replace_source_output(point)
    multiply.input(1).replace_source_output(ops.constant(scale).output(0))


def _check(stop: CancelCheck) -> None:
    if stop():
        raise Cancelled("building the OpenVINO model was cancelled")
