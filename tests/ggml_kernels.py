"""ggml's own quantizers and dot products, from the library llama-cpp-python ships.

Why: served numerics (engine/training/served_math.py) claim to compute what llama.cpp's
CPU backend computes. The strongest check of that claim is the library itself, so the
tests hand the same numbers to ggml's functions through ctypes: the activation quantizers
of `type_traits_cpu` (`from_float`: quantize_row_q8_0, quantize_row_q8_1,
quantize_row_q8_K), the repacked paths' 4-row quantizers (ggml_quantize_mat_q8_0_4x8,
ggml_quantize_mat_q8_K_4x8, which AVX2 takes for Q4_0, IQ4_NL and Q4_K weights), the
weight quantizer (`ggml_quantize_chunk`, what llama.cpp's quantizer writes into files),
`to_float` (dequantization) and `vec_dot` (the integer dot product of one weight row with
one quantized activation row).

The library runs in a child process (`python -m tests.ggml_kernels`, requests and answers
pickled over stdin and stdout), as every other native call of the tests does: a failed
assertion in ggml aborts the whole process.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]

# ggml's block layouts the answers are decoded from (ggml-common.h).
Q8_K_BYTES = 4 + 256 + 2 * 16  # f32 d, 256 int8 q, 16 int16 bsums
Q8_KX4_BYTES = 4 * 4 + 4 * 256 + 2 * 64  # block_q8_Kx4: d[4], qs[1024], bsums[64]
Q8_0X4_BYTES = 4 * 2 + 4 * 32  # block_q8_0x4: fp16 d[4], qs[128]


def call(ops: list[dict[str, Any]], timeout: float = 120) -> list[dict[str, np.ndarray]]:
    """Run `ops` (see `_run`) in one child process; one dict of arrays per op."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-m", "tests.ggml_kernels"],
                          input=pickle.dumps(ops), capture_output=True, cwd=REPO, env=env,
                          timeout=timeout, check=False)
    if proc.returncode != 0:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-15:]
        raise RuntimeError(f"tests.ggml_kernels failed (exit {proc.returncode}):\n"
                           + "\n".join(tail))
    answer: list[dict[str, np.ndarray]] = pickle.loads(proc.stdout)
    return answer


def decode_q8_k(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q8_K blocks (rows, blocks * 292 bytes) -> d (rows, blocks), q (rows, blocks, 256),
    bsums (rows, blocks, 16)."""
    blocks = raw.reshape(raw.shape[0], -1, Q8_K_BYTES)
    d = np.ascontiguousarray(blocks[..., :4]).view(np.float32)[..., 0]
    q = np.ascontiguousarray(blocks[..., 4:260]).view(np.int8)
    bsums = np.ascontiguousarray(blocks[..., 260:]).view(np.int16)
    return d, q, bsums


def decode_q8_32(raw: np.ndarray, with_sum: bool) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 (fp16 d, 32 q) or Q8_1 (fp16 d, fp16 s, 32 q) blocks -> d as float32
    (rows, blocks) and q (rows, blocks, 32)."""
    size = 36 if with_sum else 34
    blocks = raw.reshape(raw.shape[0], -1, size)
    d = np.ascontiguousarray(blocks[..., :2]).view(np.float16)[..., 0].astype(np.float32)
    return d, np.ascontiguousarray(blocks[..., size - 32:]).view(np.int8)


def decode_mat_4x8(raw: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """The 4-row interleaved blocks of ggml_quantize_mat_q8_{0,K}_4x8 -> d (4, blocks) and
    q (4, blocks * block size): each block stores, per chunk of 8 values, the 8 of row 0,
    then of rows 1, 2 and 3."""
    if kind == "Q8_K":
        blocks = raw.reshape(-1, Q8_KX4_BYTES)
        d = np.ascontiguousarray(blocks[:, :16]).view(np.float32)
        qs = np.ascontiguousarray(blocks[:, 16:16 + 1024]).view(np.int8)
    else:
        blocks = raw.reshape(-1, Q8_0X4_BYTES)
        d = np.ascontiguousarray(blocks[:, :8]).view(np.float16).astype(np.float32)
        qs = np.ascontiguousarray(blocks[:, 8:]).view(np.int8)
    # qs: (blocks, chunks, row, 8) -> (row, blocks, chunks * 8)
    q = qs.reshape(qs.shape[0], -1, 4, 8).transpose(2, 0, 1, 3).reshape(4, -1)
    return d.T, q


# ------------------------------------------------------------------------------ the child

_FromFloat = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
_ToFloat = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
_VecDot = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t,
                           ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                           ctypes.c_size_t, ctypes.c_int)


class _Traits(ctypes.Structure):
    """ggml.h `struct ggml_type_traits`."""

    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                ("from_float_ref", ctypes.c_void_p)]


class _TraitsCpu(ctypes.Structure):
    """ggml-cpu.h `struct ggml_type_traits_cpu`."""

    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p),
                ("vec_dot_type", ctypes.c_int), ("nrows", ctypes.c_int64)]


class _Ggml:
    def __init__(self) -> None:
        spec = importlib.util.find_spec("llama_cpp")
        assert spec is not None and spec.origin is not None, "llama_cpp is not installed"
        lib = Path(spec.origin).parent / "lib"
        mode = ctypes.RTLD_GLOBAL
        self.base = ctypes.CDLL(str(lib / "libggml-base.so"), mode=mode)
        self.cpu = ctypes.CDLL(str(lib / "libggml-cpu.so"), mode=mode)
        self.cpu.ggml_cpu_init()
        self.base.ggml_get_type_traits.restype = ctypes.POINTER(_Traits)
        self.base.ggml_get_type_traits.argtypes = [ctypes.c_int]
        self.cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(_TraitsCpu)
        self.cpu.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
        self.base.ggml_quantize_chunk.restype = ctypes.c_size_t
        self.base.ggml_quantize_chunk.argtypes = [
            ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
            ctypes.c_int64, ctypes.c_void_p]
        for name in ("ggml_quantize_mat_q8_0_4x8", "ggml_quantize_mat_q8_K_4x8"):
            getattr(self.cpu, name).argtypes = [ctypes.c_void_p, ctypes.c_void_p,
                                                ctypes.c_int64]

    @staticmethod
    def type_id(name: str) -> int:
        from gguf import GGMLQuantizationType

        return int(GGMLQuantizationType[name])

    @staticmethod
    def row_bytes(name: str, n: int) -> int:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        block, size = GGML_QUANT_SIZES[GGMLQuantizationType[name]]
        assert n % block == 0, (name, n)
        return n // block * size

    def traits_cpu(self, name: str) -> _TraitsCpu:
        return self.cpu.ggml_get_type_traits_cpu(self.type_id(name)).contents

    def quantize(self, name: str, weights: np.ndarray) -> np.ndarray:
        """llama.cpp's weight quantizer (no importance matrix), (rows, row bytes)."""
        src = np.ascontiguousarray(weights, np.float32)
        rows, cols = src.shape
        out = np.zeros((rows, self.row_bytes(name, cols)), np.uint8)
        self.base.ggml_quantize_chunk(self.type_id(name), src.ctypes.data, out.ctypes.data,
                                      0, rows, cols, None)
        return out

    def to_float(self, name: str, raw: np.ndarray, cols: int) -> np.ndarray:
        to_float = _ToFloat(self.base.ggml_get_type_traits(self.type_id(name)).contents
                            .to_float)
        src = np.ascontiguousarray(raw, np.uint8)
        out = np.zeros((src.shape[0], cols), np.float32)
        for r in range(src.shape[0]):
            to_float(src[r].ctypes.data, out[r].ctypes.data, cols)
        return out

    def from_float(self, name: str, x: np.ndarray) -> np.ndarray:
        """`type_traits_cpu[name].from_float` on every row: the activation quantizer."""
        from_float = _FromFloat(self.traits_cpu(name).from_float)
        src = np.ascontiguousarray(x, np.float32)
        out = np.zeros((src.shape[0], self.row_bytes(name, src.shape[1])), np.uint8)
        for r in range(src.shape[0]):
            from_float(src[r].ctypes.data, out[r].ctypes.data, src.shape[1])
        return out

    def mat_4x8(self, kind: str, x: np.ndarray) -> np.ndarray:
        """The repacked path's quantizer of 4 activation rows at once."""
        src = np.ascontiguousarray(x, np.float32)
        assert src.shape[0] == 4
        size = Q8_KX4_BYTES if kind == "Q8_K" else Q8_0X4_BYTES
        block = 256 if kind == "Q8_K" else 32
        out = np.zeros(src.shape[1] // block * size, np.uint8)
        name = "ggml_quantize_mat_q8_K_4x8" if kind == "Q8_K" else "ggml_quantize_mat_q8_0_4x8"
        getattr(self.cpu, name)(src.ctypes.data, out.ctypes.data, src.shape[1])
        return out

    def dot(self, name: str, raw: np.ndarray, x: np.ndarray) -> np.ndarray:
        """x @ W.T as ggml's vec_dot computes it: each row of x quantized by the weight
        type's vec_dot_type, then one vec_dot per (x row, weight row)."""
        traits = self.traits_cpu(name)
        vec_dot = _VecDot(traits.vec_dot)
        from gguf import GGMLQuantizationType

        activation = GGMLQuantizationType(traits.vec_dot_type).name
        quantized = self.from_float(activation, x) if activation != "F32" else \
            np.ascontiguousarray(x, np.float32).view(np.uint8)
        weights = np.ascontiguousarray(raw, np.uint8)
        out = np.zeros((x.shape[0], weights.shape[0]), np.float32)
        value = ctypes.c_float()
        for i in range(x.shape[0]):
            for j in range(weights.shape[0]):
                vec_dot(x.shape[1], ctypes.byref(value), 0, weights[j].ctypes.data, 0,
                        quantized[i].ctypes.data, 0, 1)
                out[i, j] = value.value
        return out


def _run(ggml: _Ggml, op: dict[str, Any]) -> dict[str, np.ndarray]:
    kind = op["op"]
    if kind == "quantize":
        return {"raw": ggml.quantize(op["type"], op["weights"])}
    if kind == "to_float":
        return {"values": ggml.to_float(op["type"], op["raw"], op["cols"])}
    if kind == "from_float":
        return {"raw": ggml.from_float(op["type"], op["x"])}
    if kind == "mat_4x8":
        return {"raw": ggml.mat_4x8(op["type"], op["x"])}
    if kind == "dot":
        return {"y": ggml.dot(op["type"], op["raw"], op["x"])}
    if kind == "vec_dot_type":
        from gguf import GGMLQuantizationType

        found = ggml.traits_cpu(op["type"]).vec_dot_type
        return {"name": np.array(GGMLQuantizationType(found).name)}
    raise ValueError(f"unknown op {kind!r}")


def _child_main() -> None:
    ops = pickle.loads(sys.stdin.buffer.read())
    ggml = _Ggml()
    answer = [_run(ggml, op) for op in ops]
    sys.stdout.buffer.write(pickle.dumps(answer))
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    _child_main()
