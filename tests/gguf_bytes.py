"""The one GGUF byte builder of the tests and benchmarks: strings, typed values,
metadata entries, tensor records and whole files, written byte by byte so a test can
also write what no library would (a wrong magic, an absurd count, a truncated string).

Everything here writes little-endian GGUF version 3 unless told otherwise; `skip_value`
walks a value the same way, for the fixtures that copy a file with some entries changed.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

STRING, ARRAY = 8, 9
SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q",
                  11: "q", 12: "d"}
SCALAR_SIZES = {kind: struct.calcsize("<" + fmt) for kind, fmt in SCALAR_FORMATS.items()}
ALIGNMENT = 32


def align(n: int, alignment: int = ALIGNMENT) -> int:
    """`n` rounded up to a multiple of `alignment` (GGUF's data and tensor offsets)."""
    return n + (-n) % alignment


def string(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def value(kind: int, item: Any) -> bytes:
    """A typed value as a metadata entry holds it (type id, then the value): a scalar or
    a string."""
    if kind == STRING:
        return struct.pack("<I", STRING) + string(item)
    return struct.pack(f"<I{SCALAR_FORMATS[kind]}", kind, item)


def string_array(items: Sequence[str | bytes]) -> bytes:
    """An array of strings as a metadata entry holds it (a tokenizer's tokens)."""
    return struct.pack("<IIQ", ARRAY, STRING, len(items)) + b"".join(string(i) for i in items)


def kv(key: str | bytes, type_id: int, payload: bytes) -> bytes:
    """A metadata entry of any type id, `payload` as given (a hostile one, too)."""
    return string(key) + struct.pack("<I", type_id) + payload


def kv_str(key: str | bytes, item: str | bytes) -> bytes:
    return kv(key, STRING, string(item))


def kv_u32(key: str, item: int) -> bytes:
    return kv(key, 4, struct.pack("<I", item))


def kv_f32(key: str, item: float) -> bytes:
    return kv(key, 6, struct.pack("<f", item))


def tensor_info(name: str | bytes, dims: Sequence[int], type_id: int, offset: int) -> bytes:
    """A tensor record: name, dims (ggml order), type and offset in the data section."""
    return (string(name) + struct.pack(f"<I{len(dims)}Q", len(dims), *dims)
            + struct.pack("<IQ", type_id, offset))


def head(kvs: Sequence[bytes] | Mapping[str, bytes], infos: Sequence[bytes], *,
         version: int = 3, n_tensors: int | None = None, n_kv: int | None = None,
         magic: bytes = b"GGUF") -> bytes:
    """Everything before the data: `kvs` as entries, or as key -> typed value (what
    `value` writes and a reader's raw entries hold); the counts may lie."""
    entries = [string(k) + v for k, v in kvs.items()] if isinstance(kvs, Mapping) \
        else list(kvs)
    return (magic + struct.pack("<IQQ", version, len(infos) if n_tensors is None else n_tensors,
                                len(entries) if n_kv is None else n_kv)
            + b"".join(entries) + b"".join(infos))


def raw(kvs: Sequence[bytes] | Mapping[str, bytes], infos: Sequence[bytes] = (),
        data: bytes = b"", *, alignment: int = ALIGNMENT, **counts: Any) -> bytes:
    """A whole file: the head, padding to `alignment`, then `data`."""
    front = head(kvs, infos, **counts)
    return front + bytes(align(len(front), alignment) - len(front)) + data


@dataclass(frozen=True)
class T:
    """A tensor record: offset None = next aligned slot, data None = zeros of its size."""

    name: str | bytes
    dims: tuple[int, ...]
    type_id: int = 0  # F32
    data: bytes | None = None
    offset: int | None = None


def f32(count: int, fill: float = 0.01) -> bytes:
    return np.full(count, fill, dtype=np.float32).tobytes()


def assemble(kvs: list[bytes], tensors: list[T], **counts: Any) -> bytes:
    """A file of entries and `T` records, each tensor's data in its aligned slot."""
    infos, blob = [], b""
    for t in tensors:
        data = t.data if t.data is not None else f32(math.prod(t.dims))
        offset = len(blob) if t.offset is None else t.offset
        if t.offset is None:
            blob += data + bytes(align(len(data)) - len(data))
        infos.append(tensor_info(t.name, t.dims, t.type_id, offset))
    return raw(kvs, infos, blob, **counts)


def skip_value(buf: Any, pos: int, type_id: int) -> int:
    """The position after the value of `type_id` at `pos` (a trusted file's)."""
    if type_id in SCALAR_SIZES:
        return pos + SCALAR_SIZES[type_id]
    if type_id == STRING:
        return pos + 8 + struct.unpack_from("<Q", buf, pos)[0]
    item, count = struct.unpack_from("<IQ", buf, pos)
    pos += 12
    if item in SCALAR_SIZES:
        return pos + count * SCALAR_SIZES[item]
    unpack = struct.Struct("<Q").unpack_from  # a tokenizer's 100k strings: lengths only
    for _ in range(count):
        pos = pos + 8 + unpack(buf, pos)[0] if item == STRING else skip_value(buf, pos, item)
    return pos
