"""A strict, bounded reader for GGUF headers (metadata and tensor directory).

We parse GGUF ourselves before any native library opens a file: llama.cpp has had a
run of parser bugs and aborts on malformed metadata. Every count and length is checked
against what the rest of the file can possibly hold, so a header that claims 2^64
strings fails at once instead of allocating or looping. Tensor data is never read
here, except on request for one tensor at a time.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from engine.errors import InspectionError
from engine.formats.safeio import FileStat, open_regular, printable

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
MAX_TENSORS = 1 << 20
MAX_KV = 1 << 20
MAX_KEY_LEN = 1 << 16
MAX_STRING_LEN = 64 << 20
MAX_ARRAY_LEN = 1 << 26
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_HEADER_BYTES = 1 << 30
# Arrays longer than this keep only their length and type (tokenizer vocabularies).
KEEP_ARRAY_VALUES = 64
STRING_BLOCK = 1 << 20  # bytes read at a time while walking a string array

# GGUF value types.
_SCALARS: dict[int, tuple[str, str]] = {
    0: ("<B", "uint8"),
    1: ("<b", "int8"),
    2: ("<H", "uint16"),
    3: ("<h", "int16"),
    4: ("<I", "uint32"),
    5: ("<i", "int32"),
    6: ("<f", "float32"),
    7: ("<?", "bool"),
    10: ("<Q", "uint64"),
    11: ("<q", "int64"),
    12: ("<d", "float64"),
}
T_STRING = 8
T_ARRAY = 9
TYPE_NAMES = {**{k: v[1] for k, v in _SCALARS.items()}, T_STRING: "string", T_ARRAY: "array"}


@dataclass(frozen=True)
class GgufArray:
    """A metadata array; long arrays keep only their element type and length."""

    item_type: str
    length: int
    values: tuple[Any, ...] | None


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: ne[0] (fastest varying) first
    type_id: int
    type_name: str
    offset: int  # absolute offset in the file
    nbytes: int


@dataclass
class GgufHeader:
    path: Path
    stat: FileStat
    version: int
    metadata: dict[str, Any]
    value_types: dict[str, str]
    tensors: dict[str, TensorInfo]
    alignment: int
    data_offset: int
    warnings: list[str] = field(default_factory=list)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def typed(self, key: str, kinds: tuple[str, ...], what: str) -> Any:
        """A metadata value that must have one of `kinds` as its GGUF type, or None."""
        if key not in self.metadata:
            return None
        if self.value_types[key] not in kinds:
            raise InspectionError(
                f"{self.path.name}: metadata {key} has type {self.value_types[key]}, "
                f"expected {what}"
            )
        return self.metadata[key]


def _type_name(type_id: int) -> str:
    try:
        return GGMLQuantizationType(type_id).name
    except ValueError:
        return f"unknown({type_id})"


class _Reader:
    """Sequential reads over the header with bounds derived from the file size."""

    def __init__(self, handle: BinaryIO, size: int, name: str,
                 keep_arrays: frozenset[str] | None = frozenset()) -> None:
        self.handle = handle
        self.size = size
        self.pos = 0
        self.name = name
        self.keep_arrays = keep_arrays  # None: every array keeps its values

    def fail(self, reason: str) -> InspectionError:
        return InspectionError(f"{self.name}: {reason}")

    def remaining(self) -> int:
        return self.size - self.pos

    def read(self, n: int, what: str) -> bytes:
        if n > self.remaining() or self.pos + n > MAX_HEADER_BYTES:
            raise self.fail(f"truncated GGUF: file ends inside {what}")
        data = self.handle.read(n)
        if len(data) != n:
            raise self.fail(f"truncated GGUF: file ends inside {what} (changed while reading?)")
        self.pos += n
        return data

    def u32(self, what: str) -> int:
        return struct.unpack("<I", self.read(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack("<Q", self.read(8, what))[0]

    def string(self, what: str, limit: int = MAX_STRING_LEN) -> str:
        length = self.u64(f"the length of {what}")
        if length > limit:
            raise self.fail(f"{what} claims a length of {length} bytes (limit {limit})")
        if length > self.remaining():
            raise self.fail(f"truncated GGUF: {what} claims {length} bytes past the end")
        raw = self.read(length, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"{what} is not valid UTF-8") from exc

    def strings(self, count: int, key: str, keep: bool) -> list[str]:
        """The `count` strings of an array, each checked as `string` checks it.

        A tokenizer's vocabulary is 50k-150k strings, and reading them one `string` call
        at a time took most of a header's parse (0.2 s of Python for SmolLM2's, 0.13 s
        now). So whole blocks are read and walked here; anything unusual (a string past
        the block, which every length over the limit is, invalid UTF-8, the file's end)
        is left to `string` from that item on, which reads it or refuses it with its own
        message.
        """
        items: list[str] = []
        done = 0
        while done < count:
            start = self.pos
            block = self.handle.read(max(0, min(STRING_BLOCK, self.remaining(),
                                                MAX_HEADER_BYTES - self.pos)))
            at, end = 0, len(block)
            while done < count and at + 8 <= end:
                length = int.from_bytes(block[at:at + 8], "little")
                if at + 8 + length > end:  # also every length over the limit
                    break
                try:
                    text = block[at + 8:at + 8 + length].decode("utf-8")
                except UnicodeDecodeError:
                    break
                if keep:
                    items.append(text)
                at += 8 + length
                done += 1
            self.handle.seek(start + at)  # back to the first item not taken
            self.pos = start + at
            if done < count and at == 0:  # no progress in a whole block: one at a time
                text = self.string(f"item {done} of {key}")
                if keep:
                    items.append(text)
                done += 1
        return items

    def scalar(self, type_id: int, what: str) -> Any:
        fmt, _ = _SCALARS[type_id]
        return struct.unpack(fmt, self.read(struct.calcsize(fmt), what))[0]

    def value(self, type_id: int, key: str) -> Any:
        if type_id in _SCALARS:
            return self.scalar(type_id, f"the value of {key}")
        if type_id == T_STRING:
            return self.string(f"the value of {key}")
        if type_id == T_ARRAY:
            item_type = self.u32(f"the array type of {key}")
            length = self.u64(f"the array length of {key}")
            if item_type == T_ARRAY:
                raise self.fail(f"metadata {printable(key)}: nested arrays are not supported")
            if item_type not in _SCALARS and item_type != T_STRING:
                raise self.fail(f"metadata {printable(key)}: unknown array type {item_type}")
            min_item = 8 if item_type == T_STRING else struct.calcsize(_SCALARS[item_type][0])
            if length > MAX_ARRAY_LEN or length * min_item > self.remaining():
                raise self.fail(
                    f"metadata {printable(key)}: array claims {length} items, "
                    "more than the file can hold"
                )
            keep = (length <= KEEP_ARRAY_VALUES or self.keep_arrays is None
                    or key in self.keep_arrays)
            if item_type in _SCALARS:
                raw = self.read(length * min_item, f"the array {key}")
                if not keep:
                    return GgufArray(TYPE_NAMES[item_type], length, None)
                values = struct.unpack(f"<{length}{_SCALARS[item_type][0][1:]}", raw)
                return GgufArray(TYPE_NAMES[item_type], length, tuple(values))
            items = self.strings(length, key, keep)
            return GgufArray("string", length, tuple(items) if keep else None)
        raise self.fail(f"metadata {printable(key)}: unknown value type {type_id}")


def read_header(path: Path, keep_arrays: tuple[str, ...] | bool = ()) -> GgufHeader:
    """Parse and check a GGUF file's header and tensor directory.

    Long arrays keep only their length, except the keys in `keep_arrays` (True: every
    key), which keep every value (a vocabulary, for the Hugging Face export; all of the
    metadata, to write it again into an OpenVINO build's F16 copy: the same bounded
    walk, a fraction of a second where the gguf package's reader takes seconds)."""
    path = Path(path)
    handle, st = open_regular(path)
    with handle:
        return _parse(handle, st, path, None if keep_arrays is True
                      else frozenset(keep_arrays or ()))


def _parse(handle: BinaryIO, st: FileStat, path: Path,
           keep_arrays: frozenset[str] | None = frozenset()) -> GgufHeader:
    r = _Reader(handle, st.size, path.name, keep_arrays)
    if st.size == 0:
        raise r.fail("empty file")
    if st.size < 24:
        raise r.fail(f"too small to be a GGUF file ({st.size} bytes)")
    magic = r.read(4, "the magic")
    if magic != MAGIC:
        raise r.fail("not a GGUF file (bad magic)")
    version = r.u32("the version")
    if version not in SUPPORTED_VERSIONS:
        raise r.fail(f"unsupported GGUF version {version} (supported: 2 and 3)")
    n_tensors = r.u64("the tensor count")
    n_kv = r.u64("the metadata count")
    # Each tensor record takes at least 8+4+8+4+8 bytes; each key/value at least 8+4+1.
    if n_tensors > MAX_TENSORS or n_tensors * 32 > r.remaining():
        raise r.fail(f"claims {n_tensors} tensors, more than the file can hold")
    if n_kv > MAX_KV or n_kv * 13 > r.remaining():
        raise r.fail(f"claims {n_kv} metadata entries, more than the file can hold")

    metadata: dict[str, Any] = {}
    value_types: dict[str, str] = {}
    for i in range(n_kv):
        key = r.string(f"metadata key {i}", MAX_KEY_LEN)
        if not key:
            raise r.fail(f"metadata key {i} is empty")
        if key in metadata:
            raise r.fail(f"duplicate metadata key {printable(key)}")
        type_id = r.u32(f"the type of {key}")
        metadata[key] = r.value(type_id, key)
        value_types[key] = TYPE_NAMES.get(type_id, str(type_id))

    alignment = 32
    if "general.alignment" in metadata:
        align = metadata["general.alignment"]
        if value_types["general.alignment"] != "uint32" or align <= 0 or align & (align - 1):
            raise r.fail(f"general.alignment must be a power-of-two uint32, got {align!r}")
        alignment = align

    raw_tensors = []
    names: set[str] = set()
    for i in range(n_tensors):
        name = r.string(f"tensor name {i}", 256)
        if not name:
            raise r.fail(f"tensor {i} has an empty name")
        if name in names:
            raise r.fail(f"duplicate tensor name {printable(name)}")
        names.add(name)
        n_dims = r.u32(f"the dimension count of {name}")
        if n_dims == 0 or n_dims > MAX_DIMS:
            raise r.fail(f"tensor {printable(name)} has {n_dims} dimensions (1 to {MAX_DIMS})")
        dims = tuple(r.u64(f"a dimension of {name}") for _ in range(n_dims))
        type_id = r.u32(f"the type of {name}")
        offset = r.u64(f"the offset of {name}")
        raw_tensors.append((name, dims, type_id, offset))

    data_offset = -(-r.pos // alignment) * alignment
    data_size = st.size - data_offset
    if data_size < 0:
        raise r.fail("truncated GGUF: file ends before the tensor data")
    tensors: dict[str, TensorInfo] = {}
    spans = []
    for name, dims, type_id, offset in raw_tensors:
        shown = printable(name)
        if any(d <= 0 or d >= 1 << 40 for d in dims):
            raise r.fail(f"tensor {shown} has an invalid dimension {list(dims)}")
        elements = 1
        for d in dims:
            elements *= d
        if elements >= 1 << 50:
            raise r.fail(f"tensor {shown} claims {elements} elements (overflow)")
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
        except (ValueError, KeyError):
            raise r.fail(f"tensor {shown} has unknown type {type_id}") from None
        if dims[0] % block:
            raise r.fail(f"tensor {shown}: row of {dims[0]} is not a multiple of block {block}")
        nbytes = elements // block * type_size
        if offset % alignment:
            raise r.fail(f"tensor {shown} is not aligned to {alignment} bytes")
        if offset + nbytes > data_size:
            raise r.fail(f"tensor {shown} lies past the end of the file (truncated data?)")
        spans.append((offset, offset + nbytes, name))
        tensors[name] = TensorInfo(name, dims, type_id, _type_name(type_id),
                                   data_offset + offset, nbytes)
    spans.sort()
    for (_, end_a, name_a), (start_b, _, name_b) in zip(spans, spans[1:], strict=False):
        if start_b < end_a:
            raise r.fail(f"tensors {printable(name_a)} and {printable(name_b)} overlap")
    return GgufHeader(path, st, version, metadata, value_types, tensors, alignment, data_offset)


def read_tensor_bytes(header: GgufHeader, name: str) -> np.ndarray:
    """One tensor's stored bytes (uint8), e.g. to read a quantized block's own fields."""
    info = header.tensors[name]
    handle, st = open_regular(header.path)
    with handle:
        if (st.size, st.mtime_ns, st.inode) != (
            header.stat.size, header.stat.mtime_ns, header.stat.inode
        ):
            raise InspectionError(f"{header.path.name}: file changed since it was inspected")
        handle.seek(info.offset)
        return np.frombuffer(handle.read(info.nbytes), dtype=np.uint8)


def read_tensor(header: GgufHeader, name: str) -> np.ndarray:
    """Read one tensor as float32 in numpy order (reversed ggml dims)."""
    from gguf.quants import dequantize

    info = header.tensors[name]
    raw = read_tensor_bytes(header, name)
    qtype = GGMLQuantizationType(info.type_id)
    shape = tuple(reversed(info.shape))
    if qtype == GGMLQuantizationType.F32:
        return raw.view(np.float32).reshape(shape).copy()
    if qtype == GGMLQuantizationType.F16:
        return raw.view(np.float16).reshape(shape).astype(np.float32)
    # Quantized rows: dequantize expects (rows, row bytes) and returns (rows, row elems).
    block, type_size = GGML_QUANT_SIZES[qtype]
    rows = raw.reshape(-1, info.shape[0] // block * type_size)
    return dequantize(rows, qtype).reshape(shape).astype(np.float32)
