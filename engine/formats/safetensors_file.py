"""A strict reader for safetensors headers, applying safetensors' own rules.

OpenVINO's bundled reader checks little, so nothing reaches it before this module
and the `safetensors` library have both accepted the file: header at most 100 MB, a
UTF-8 JSON object without duplicate keys, known dtypes, offsets contiguous and in
bounds, shape x dtype size equal to the byte span, no trailing bytes.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.errors import InspectionError
from engine.formats.safeio import FileStat, open_regular, printable

MAX_HEADER = 100_000_000
DTYPE_SIZES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
    "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
}


@dataclass(frozen=True)
class StTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]  # numpy / PyTorch order
    begin: int  # absolute file offsets
    end: int


@dataclass
class SafetensorsHeader:
    path: Path
    stat: FileStat
    tensors: dict[str, StTensor]
    metadata: dict[str, str]


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    seen: dict = {}
    for key, value in pairs:
        if key in seen:
            raise InspectionError(f"duplicate JSON key {printable(key)} in the header")
        seen[key] = value
    return seen


def read_header(path: Path) -> SafetensorsHeader:
    path = Path(path)
    handle, st = open_regular(path)
    name = path.name
    with handle:
        if st.size < 8:
            raise InspectionError(f"{name}: too small to be a safetensors file ({st.size} bytes)")
        (n,) = struct.unpack("<Q", handle.read(8))
        if n > MAX_HEADER:
            raise InspectionError(f"{name}: header of {n} bytes exceeds the 100 MB limit")
        if n > st.size - 8:
            raise InspectionError(f"{name}: header length {n} is longer than the file")
        if n < 2:
            raise InspectionError(f"{name}: header is empty")
        raw = handle.read(n)
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except InspectionError as exc:
        raise InspectionError(f"{name}: {exc.message}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise InspectionError(f"{name}: header is not valid UTF-8 JSON ({exc})") from None
    except RecursionError:  # json's C decoder recurses once per nesting level
        raise InspectionError(f"{name}: header JSON is nested too deeply") from None
    if not isinstance(header, dict):
        raise InspectionError(f"{name}: header is not a JSON object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise InspectionError(f"{name}: __metadata__ must map strings to strings")
    data_start = 8 + n
    data_size = st.size - data_start
    tensors: dict[str, StTensor] = {}
    for key, info in header.items():
        shown = printable(key)
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise InspectionError(f"{name}: tensor {shown} has a malformed entry")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in DTYPE_SIZES:
            raise InspectionError(f"{name}: tensor {shown} has unsupported dtype {dtype!r}")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 40 for d in shape
        ) or len(shape) > 8:
            raise InspectionError(f"{name}: tensor {shown} has an invalid shape {shape!r}")
        if not (
            isinstance(offsets, list) and len(offsets) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            and 0 <= offsets[0] <= offsets[1]
        ):
            raise InspectionError(f"{name}: tensor {shown} has invalid data_offsets {offsets!r}")
        if offsets[1] > data_size:
            raise InspectionError(f"{name}: tensor {shown} lies past the end of the file")
        elements = int(np.prod(shape, dtype=object)) if shape else 1
        if elements * DTYPE_SIZES[dtype] != offsets[1] - offsets[0]:
            raise InspectionError(
                f"{name}: tensor {shown} shape {shape} x {dtype} does not match its "
                f"{offsets[1] - offsets[0]} bytes"
            )
        tensors[key] = StTensor(key, dtype, tuple(shape), data_start + offsets[0],
                                data_start + offsets[1])
    position = data_start
    for t in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if t.begin != position:
            kind = "overlap" if t.begin < position else "leave a gap"
            raise InspectionError(f"{name}: tensor data ranges {kind} at {printable(t.name)}")
        position = t.end
    if position != st.size:
        raise InspectionError(f"{name}: {st.size - position} trailing bytes after the data")
    _library_check(path)
    return SafetensorsHeader(path, st, tensors, dict(metadata))


def _library_check(path: Path) -> None:
    """Let the reference implementation agree before anything else reads the file."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as handle:
            handle.keys()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # its own error types, and pyo3's PanicException
        raise InspectionError(f"{path.name}: rejected by the safetensors library: "
                              f"{printable(str(exc))}") from None


def load_tensors(header: SafetensorsHeader) -> dict[str, np.ndarray]:
    """Read every tensor as float32 numpy arrays (BF16 widened by hand)."""
    out: dict[str, np.ndarray] = {}
    handle, _ = open_regular(header.path)
    with handle:
        for t in header.tensors.values():
            handle.seek(t.begin)
            raw = np.frombuffer(handle.read(t.end - t.begin), dtype=np.uint8)
            if t.dtype == "F32":
                arr = raw.view("<f4")
            elif t.dtype == "F16":
                arr = raw.view("<f2").astype(np.float32)
            elif t.dtype == "BF16":
                arr = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
            else:
                raise InspectionError(f"{header.path.name}: tensor {printable(t.name)} has "
                                      f"dtype {t.dtype}; adapters must be F32, F16 or BF16")
            out[t.name] = arr.reshape(t.shape).astype(np.float32)
    return out
