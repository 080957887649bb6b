"""The frozen base in its GGUF blocks: a read-only memory map and ggml's own dequantizers.

Torch-free (numpy and ctypes): imported by the trainer's forward pass
(`engine.training.model`), which dequantizes each weight just in time for its product.

The trainer used to dequantize every tensor to float32 when it loaded: 4 bytes per
parameter for the whole run, whatever the file's 0.5-1 byte. Here the file is mapped
read-only (its pages are the page cache's, shared with any llama.cpp process serving the
same file, and dropped by the kernel under pressure instead of swapped), and a tensor, a
range of its rows or a few chosen rows (an embedding lookup) are dequantized on request
into a float32 array.

Dequantization is ggml's own: `ggml_get_type_traits(type)->to_float` from the libggml
that llama-cpp-python ships, called through ctypes (which releases the GIL, so rows are
split over the run's threads). It is the code llama.cpp itself dequantizes with, and it
gives the same float32 bits as the `gguf` package's numpy dequantization for every type
both know (checked for all 25 on random blocks, tests/test_training_memory.py), 10-40x
faster. Where the library or a type's traits cannot be found, the `gguf` package's numpy
code is used instead (the same bits, slower).
"""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from engine.errors import InspectionError
from engine.formats.gguf_file import GgufHeader
from engine.formats.safeio import open_regular

F32 = int(GGMLQuantizationType.F32)
# Below this many values per thread a split costs more than it saves.
MIN_VALUES_PER_THREAD = 1 << 16
ToFloat = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


class _Traits(ctypes.Structure):
    """ggml.h's `struct ggml_type_traits` (ggml 0.25)."""

    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                ("from_float_ref", ctypes.c_void_p)]


@cache
def _ggml() -> ctypes.CDLL | None:
    """libggml-base from llama-cpp-python's package (None when it cannot be loaded)."""
    try:
        import llama_cpp
    except ImportError:
        return None
    folder = Path(llama_cpp.__file__).parent / "lib"
    for name in ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll"):
        if (folder / name).exists():
            try:
                lib = ctypes.CDLL(str(folder / name))
                lib.ggml_get_type_traits.restype = ctypes.POINTER(_Traits)
                lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
                return lib
            except (OSError, AttributeError):
                return None
    return None


@cache
def ggml_to_float(type_id: int) -> ToFloat | None:
    """ggml's row dequantizer for `type_id`, or None (no library, no such function, or
    traits that disagree with the gguf package's block layout: then numpy's is used)."""
    lib = _ggml()
    if lib is None or type_id == F32:
        return None
    try:
        kind = GGMLQuantizationType(type_id)
        block, size = GGML_QUANT_SIZES[kind]
    except (ValueError, KeyError):
        return None
    traits = lib.ggml_get_type_traits(type_id).contents
    if not traits.to_float or traits.blck_size != block or traits.type_size != size:
        return None
    return ToFloat(traits.to_float)


def _numpy_rows(raw: np.ndarray, type_id: int, out: np.ndarray) -> None:
    """The gguf package's dequantization of whole rows (raw: rows x row bytes)."""
    from gguf.quants import dequantize

    kind = GGMLQuantizationType(type_id)
    if kind == GGMLQuantizationType.F16:
        out[...] = raw.view(np.float16)
    else:
        out[...] = dequantize(raw, kind)


class QuantizedFile:
    """One GGUF's tensors as its stored bytes, memory-mapped; float32 on request."""

    def __init__(self, header: GgufHeader, threads: int = 1) -> None:
        self.header = header
        self.threads = max(1, int(threads))
        handle, st = open_regular(header.path)
        with handle:
            if (st.size, st.mtime_ns, st.inode) != (
                    header.stat.size, header.stat.mtime_ns, header.stat.inode):
                raise InspectionError(
                    f"{header.path.name}: file changed since it was inspected")
            self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        if hasattr(self._map, "madvise") and hasattr(mmap, "MADV_RANDOM"):
            # Layers are read in order, but a layer's matrices are each read whole, once
            # per pass: readahead across tensors would only evict what the next pass needs.
            self._map.madvise(mmap.MADV_RANDOM)
        self._bytes = np.frombuffer(self._map, dtype=np.uint8)
        self._pool: ThreadPoolExecutor | None = None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        # Views of the map may still be alive (numpy arrays handed out): leave the map to
        # the garbage collector then, rather than fail.
        self._bytes = np.zeros(0, np.uint8)
        try:
            self._map.close()
        except BufferError:
            pass

    # ------------------------------------------------------------------ layout

    def shape(self, name: str) -> tuple[int, ...]:
        """numpy order (rows, columns): ggml's ne reversed."""
        return tuple(reversed(self.header.tensors[name].shape))

    def type_name(self, name: str) -> str:
        return self.header.tensors[name].type_name

    def nbytes(self, name: str) -> int:
        return self.header.tensors[name].nbytes

    def raw(self, name: str) -> np.ndarray:
        """The tensor's stored bytes, (rows, bytes per row), a read-only view of the map."""
        info = self.header.tensors[name]
        rows = int(np.prod(info.shape[1:], dtype=np.int64)) if len(info.shape) > 1 else 1
        return self._bytes[info.offset:info.offset + info.nbytes].reshape(rows, -1)

    # ------------------------------------------------------------------ float32

    def dequantize(self, name: str, start: int = 0, stop: int | None = None,
                   out: np.ndarray | None = None) -> np.ndarray:
        """Rows start..stop-1 of `name` as float32, (rows, columns) (a 1-D tensor: its
        values), written into `out` when given (a C-contiguous float32 array)."""
        info = self.header.tensors[name]
        raw = self.raw(name)
        stop = raw.shape[0] if stop is None else stop
        columns = info.shape[0]
        if out is None:
            out = np.empty((stop - start, columns), np.float32)
        self._rows_into(raw[start:stop], info.type_id, out.reshape(stop - start, columns))
        return out.reshape(-1) if len(info.shape) == 1 else out

    def rows(self, name: str, ids: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The rows `ids` of a matrix as float32 (len(ids), columns): an embedding lookup
        dequantizes only the rows it reads (exactly what dequantizing all would give)."""
        info = self.header.tensors[name]
        picked = np.ascontiguousarray(self.raw(name)[np.asarray(ids, dtype=np.int64)])
        if out is None:
            out = np.empty((len(picked), info.shape[0]), np.float32)
        self._rows_into(picked, info.type_id, out)
        return out

    def _rows_into(self, raw: np.ndarray, type_id: int, out: np.ndarray) -> None:
        rows = raw.shape[0]
        if rows == 0:
            return
        if type_id == F32:
            out[...] = raw.view(np.float32)
            return
        to_float = ggml_to_float(type_id)
        if to_float is None:
            _numpy_rows(raw, type_id, out)
            return
        assert raw.flags.c_contiguous and out.flags.c_contiguous and out.dtype == np.float32
        columns = out.shape[1]
        parts = min(self.threads, max(1, rows * columns // MIN_VALUES_PER_THREAD), rows)
        if parts == 1:
            to_float(raw.ctypes.data, out.ctypes.data, rows * columns)
            return
        bounds = [rows * p // parts for p in range(parts + 1)]
        row_bytes, row_out = raw.strides[0], out.strides[0]

        def run(p: int) -> None:
            a, b = bounds[p], bounds[p + 1]
            to_float(raw.ctypes.data + a * row_bytes, out.ctypes.data + a * row_out,
                     (b - a) * columns)

        # ctypes releases the GIL for the call, so the parts run on the run's threads.
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="dequantize")
        list(self._pool.map(run, range(parts)))


@contextmanager
def opened(header: GgufHeader, threads: int = 1) -> Iterator[QuantizedFile]:
    file = QuantizedFile(header, threads)
    try:
        yield file
    finally:
        file.close()


def available_memory() -> int | None:
    """Bytes the kernel says a new allocation can get without swapping (MemAvailable of
    /proc/meminfo), None where it is not said."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if hasattr(os, "sysconf"):
        try:
            return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError):
            return None
    return None
