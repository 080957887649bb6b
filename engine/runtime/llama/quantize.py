"""llama.cpp's own quantizers, for merges: a whole file and one tensor at a time.

- `quantize_file` runs `llama_model_quantize` (every llama.cpp type, K-quants included)
  in a child process of its own, `python -m engine.runtime.llama.quantize`: the call
  cannot be interrupted and llama.cpp aborts the process on some bad inputs, so a
  cancel kills that child and a crash there fails the merge, never the engine. Its
  progress is read from llama.cpp's per-tensor log lines (`[  12/ 272] blk.0...`).
- `quantize_rows` runs ggml's `ggml_quantize_chunk` (the function llama_model_quantize
  calls per tensor, without an importance matrix) on one float32 tensor, in this
  process: it requantizes a tensor to the base's own type and gives the reference grid
  the weight figures compare against. It is given finite values of a valid shape only.
"""

from __future__ import annotations

import ctypes
import os
import queue
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import Cancelled, EngineError, RefusedError
from engine.runtime.worker import ChildChannel, ChildProcess, describe_exit

MODULE = "engine.runtime.llama.quantize"
_PROGRESS = re.compile(r"\[\s*(\d+)/\s*(\d+)\]")
_ggml: Any = None


def ftype_of(name: str) -> int:
    """LLAMA_FTYPE_MOSTLY_<name> (e.g. "Q4_K_M")."""
    import llama_cpp

    value = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{name}", None)
    if not isinstance(value, int):
        raise RefusedError(f"this llama.cpp has no file type {name}")
    return value


# ------------------------------------------------------------------------ parent side


def quantize_file(source: Path, target: Path, ftype: str, n_threads: int,
                  progress: Callable[[float], None] | None = None,
                  cancelled: Callable[[], bool] = lambda: False) -> dict[str, Any]:
    """`llama_model_quantize(source -> target, ftype)` in a child process.

    Requantizing already quantized tensors is allowed (the merge's unadapted tensors
    keep the base's types in the F16 intermediate). A cancel kills the child; any
    failure removes `target`.
    """
    events: queue.Queue[dict[str, Any]] = queue.Queue()
    child = ChildProcess(MODULE, dict(os.environ), events.put,
                         lambda code: events.put({"event": "exit", "code": code}),
                         name="quantize")
    try:
        child.write({"source": str(source), "target": str(target), "ftype": ftype,
                     "threads": max(1, int(n_threads))})
        while True:
            if cancelled():
                child.kill()
                raise Cancelled("the merge was cancelled while quantizing")
            try:
                event = events.get(timeout=0.1)
            except queue.Empty:
                continue
            kind = event.get("event")
            if kind == "progress" and progress:
                progress(float(event.get("fraction", 0.0)))
            elif kind == "finished":
                result = event.get("result") or {}
                if result.get("rc") != 0:
                    raise EngineError(f"llama.cpp could not quantize to {ftype} (code "
                                      f"{result.get('rc')}): {_last(child)}",
                                      details=tuple(child.tail(12)))
                if not Path(target).is_file():
                    raise EngineError("llama.cpp reported success but wrote no file")
                return result
            elif kind == "failed":
                raise EngineError(f"quantizing failed: {event.get('message')}",
                                  details=tuple(child.tail(12)))
            elif kind == "exit":
                raise EngineError(f"{describe_exit(int(event['code']), 'the quantizer')} "
                                  f"while quantizing to {ftype}: {_last(child)}",
                                  details=tuple(child.tail(12)))
    except BaseException:
        Path(target).unlink(missing_ok=True)
        raise
    finally:
        child.finish(timeout=10)


def _last(child: ChildProcess) -> str:
    lines = [line for line in child.tail(20) if line.strip()]
    return lines[-1].strip()[:300] if lines else "no log"


# ------------------------------------------------------------------------ one tensor


def _library() -> Any:
    """ggml's quantizer functions, from the library llama-cpp-python ships."""
    global _ggml
    if _ggml is None:
        from llama_cpp import _ggml as bundled

        lib = bundled.libggml
        lib.ggml_quantize_chunk.restype = ctypes.c_size_t
        lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                            ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                            ctypes.c_void_p]
        lib.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
        lib.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]
        lib.ggml_row_size.restype = ctypes.c_size_t
        lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
        _ggml = lib
    return _ggml


def quantize_rows(rows: np.ndarray, type_id: int) -> np.ndarray:
    """float32 (rows, n_per_row) -> ggml type `type_id`, uint8 (rows, row bytes)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    kind = GGMLQuantizationType(type_id)
    block, size = GGML_QUANT_SIZES[kind]
    values = np.ascontiguousarray(rows, dtype=np.float32)
    if values.ndim != 2 or values.shape[1] % block:
        raise RefusedError(f"cannot quantize a {list(values.shape)} tensor to {kind.name} "
                           f"(rows must be a multiple of {block})")
    if not np.isfinite(values).all():
        raise RefusedError(f"refusing to quantize non-finite values to {kind.name}")
    lib = _library()
    if lib.ggml_quantize_requires_imatrix(int(kind)):
        raise RefusedError(f"{kind.name} needs an importance matrix; not supported for merges")
    n_rows, n_per_row = values.shape
    row_bytes = n_per_row // block * size
    if lib.ggml_row_size(int(kind), n_per_row) != row_bytes:
        raise EngineError(f"ggml and gguf disagree on the row size of {kind.name}")
    out = np.empty((n_rows, row_bytes), dtype=np.uint8)
    written = lib.ggml_quantize_chunk(int(kind), values.ctypes.data, out.ctypes.data, 0,
                                      n_rows, n_per_row, None)
    if written != out.nbytes:
        raise EngineError(f"ggml wrote {written} bytes quantizing to {kind.name}, expected "
                          f"{out.nbytes}")
    return out


# ------------------------------------------------------------------------- child side


def main() -> None:
    """The child: read one request from stdin, quantize, report, exit."""
    import json

    import llama_cpp

    channel = ChildChannel()
    line = sys.stdin.buffer.readline()
    try:
        request = json.loads(line)
        source, target = str(request["source"]), str(request["target"])
        ftype, threads = str(request["ftype"]), int(request["threads"])
    except (ValueError, KeyError, TypeError) as exc:
        channel.send({"event": "failed", "message": f"malformed request: {exc}"})
        return

    @llama_cpp.llama_log_callback
    def on_log(level: int, text: bytes | None, user: ctypes.c_void_p) -> None:
        if not text:
            return
        os.write(2, text)
        match = _PROGRESS.search(text.decode("utf-8", "replace"))
        if match and int(match.group(2)) > 0:
            channel.send({"event": "progress",
                          "fraction": int(match.group(1)) / int(match.group(2))})

    llama_cpp.llama_log_set(on_log, None)
    llama_cpp.llama_backend_init()
    try:
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = ftype_of(ftype)
        params.nthread = threads
        params.allow_requantize = True
        rc = llama_cpp.llama_model_quantize(source.encode(), target.encode(),
                                            ctypes.byref(params))
    except Exception as exc:  # reported, then the child ends
        channel.send({"event": "failed", "message": f"{type(exc).__name__}: {exc}"})
        return
    channel.send({"event": "finished", "result": {"rc": int(rc), "ftype": ftype}})


if __name__ == "__main__":
    main()
