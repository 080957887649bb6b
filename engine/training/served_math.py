"""llama.cpp's CPU arithmetic on the served file, simulated in the trainer's forward pass.

Torch-only: imported by engine.training.model.

The trainer's "float" numerics multiply the dequantized weights with float32
activations. llama.cpp (ggml's CPU backend, x86 with AVX2, as vendored by
llama-cpp-python 0.3.x) does not: before a quantized matrix product it quantizes each
activation row to 8 bits in blocks of 32 (the weight type's `vec_dot_type` in ggml's
`type_traits_cpu`), and it keeps attention's keys and values in an F16 cache, so the
queries and the softmax probabilities are rounded to F16 when they are multiplied with
them. "served" numerics reproduce those roundings, so the trainer computes (up to the
order of float sums) what llama.cpp computes on the same file:

- Q8_0 / Q4_0 / Q5_0 weights: activations as Q8_0 blocks (`quantize_row_q8_0`):
  d = max|x| / 127 (f32) stored as fp16, q = round(x · (1 / d)) with the f32 d, half to
  even as torch.round; the product is Σ d_w d_x Σ q_w q_x = W · (d_x q). (The library
  llama-cpp-python 0.3.36 ships rounds x · fl(127 / max|x|), as ggml's source says: its
  own quantize_row_q8_0/q8_1, called through ctypes, differ from x · (1 / d) on 7 of
  400,000 random blocks, more often on layer 0's inputs. Kept as it is because changing
  it changes the embedded model's served numbers, for no measurable gain in parity:
  docs/training.md, "Every family".)
- Q4_1 / Q5_1 weights: activations as Q8_1 blocks (`quantize_row_q8_1`): the same
  d and q, plus s = fp16(d · Σq) with the *unrounded* d; the weights' min term is
  m_w · s instead of m_w · d_x Σq, which we add as a (detached) correction per block.
- K-quant weights (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and IQ4_XS: activations as Q8_K
  blocks of 256 (`quantize_row_q8_K`, which x86 takes from the reference C, and the
  repacked Q4_K path's `ggml_quantize_mat_q8_K_4x8`, which gives the same values): the
  f32 scale is iscale = -127 / m with m the element of largest magnitude (so d = 1 /
  iscale carries m's sign: a convention of the sign that changes no product),
  q = round(x · iscale) half to even, d = 1 / iscale in f32, *not* rounded to fp16. Every
  kernel (vec_dot, the repacked gemm/gemv, the tiled path taken from 8 rows) works on
  exact integers: the per-16 sums (bsums) are exact, so the min terms (Q2_K, Q4_K, Q5_K)
  and the -32 / -4 offsets (Q6_K, Q3_K) are the dequantized product's, with no rounding
  to correct as Q4_1's fp16 s needs; the product is W · (d q) up to float summation
  order (`quantize_q8_k`). IQ4_NL: Q8_0 blocks, as Q4_0.
- F16 weights: activations rounded to fp16; F32: unchanged.
- The embedding lookup (get_rows) dequantizes exactly: nothing to simulate.
- RoPE angles (`rope_angles`): built in float as ggml_rope_cache_init builds them,
  with Llama 3's frequency factors and linear scaling's freq_scale where the file has
  them.
- GELU (Gemma's gated FFN, `gelu`): ggml's CPU backend looks it up in an fp16 table
  (GGML_GELU_FP16, on by default): x rounded to fp16, the table's fp16 result; on the
  Gemma fixtures this halves the remaining gap to llama.cpp (mean |Δ log p| 0.0008 ->
  0.0004). The soft-caps, biases, q/k norms and scales are float32 operations in ggml
  as in PyTorch: nothing to simulate beyond holding the constants as float32.

Every rounding is applied with a straight-through gradient, x + (round(x) - x).detach(),
so training still gets the float gradient. A weight type not listed above is refused
(RefusedError naming the tensor and its type): its activations would be quantized some
other way (BF16 rounds them to bf16; the IQ2/IQ3/IQ1 and ternary types have kernels of
their own), and a silent float fallback would make "served" mean something else per
file. docs/training.md, "Parity gate" and "Every family", has the measurements.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from engine.errors import RefusedError
from engine.formats.capabilities import ACTIVATION_TYPE

NUMERICS = ("served", "float")
BLOCK = 32  # QK8_0 == QK8_1 == QK4_1 == 32
BLOCK_K = 256  # QK_K: a Q8_K block (and every K-quant's super-block)
# GELU's table bounds (ggml_vec_gelu_f32 / ggml_vec_geglu_f32 under GGML_GELU_FP16).
GELU_LOW, GELU_HIGH = -10.0, 10.0
# Block layouts with a min: fp16 d, fp16 m, then the codes (ggml-common.h).
BLOCK_BYTES = {"Q4_1": 20, "Q5_1": 24}


def check_numerics(value: str) -> None:
    if value not in NUMERICS:
        raise RefusedError(f"numerics must be one of {', '.join(NUMERICS)}, got {value!r}")


def require_supported(name: str, type_name: str) -> None:
    """Refuse a weight whose activation arithmetic we do not simulate."""
    if type_name not in ACTIVATION_TYPE:
        raise RefusedError(
            f"served numerics are implemented for {', '.join(ACTIVATION_TYPE)} weights; "
            f"{name} is {type_name}: train with --numerics float")


def block_mins(raw: np.ndarray, type_name: str, rows: int, cols: int) -> torch.Tensor:
    """The fp16 min m of every block of a Q4_1/Q5_1 tensor, (rows, cols / 32) float32."""
    size = BLOCK_BYTES[type_name]
    blocks = raw.reshape(rows, cols // BLOCK, size)
    mins = np.ascontiguousarray(blocks[:, :, 2:4]).view(np.float16)[..., 0]
    return torch.from_numpy(mins.astype(np.float32))


def straight_through(x: torch.Tensor, rounded: torch.Tensor) -> torch.Tensor:
    """`rounded` in the forward pass, the identity in the backward pass."""
    return x + (rounded - x).detach()


def fp16(x: torch.Tensor) -> torch.Tensor:
    """Round to fp16 (nearest even, as F16C and ggml_cpu_fp32_to_fp16 do), straight-through."""
    return straight_through(x, x.detach().half().float())


def quantize_q8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ggml's AVX2 quantize_row_q8_0/q8_1 on the last dimension (a multiple of 32).

    Returns the dequantized blocks d16 · q (same shape as x), the unrounded d and Σq
    per block (..., n / 32). No gradient: callers wrap it straight-through.
    """
    with torch.no_grad():
        blocks = x.detach().unflatten(-1, (-1, BLOCK))
        amax = blocks.abs().amax(-1, keepdim=True)
        d = amax / 127.0
        inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
        q = torch.round(blocks * inv)  # _mm256_round_ps(_MM_ROUND_NEAREST): half to even
        dequantized = (q * d.half().float()).flatten(-2)
        return dequantized, d[..., 0], q.sum(-1)


def quantize_q8_k(x: torch.Tensor) -> torch.Tensor:
    """ggml's quantize_row_q8_K on the last dimension (a multiple of 256): the
    dequantized blocks d · q, float32, same shape as x. No gradient: callers wrap it
    straight-through.

    Bit for bit what llama-cpp-python 0.3.36's library stores (tests/ggml_kernels.py
    calls it): iscale = -127 / m (m: the block's element of largest magnitude, signed),
    q = nearest_int(x · iscale) (half to even), d = 1 / iscale. m's sign only flips
    both q and d, so |m| is used here. An all-zero block is d = 0, q = 0.
    """
    with torch.no_grad():
        blocks = x.detach().unflatten(-1, (-1, BLOCK_K))
        amax = blocks.abs().amax(-1, keepdim=True)
        nonzero = amax > 0
        # Tensor / tensor: torch computes `127.0 / amax` as 127 · (1 / amax), which
        # rounds twice; ggml divides once (-127.f / max).
        iscale = torch.where(nonzero, torch.full_like(amax, 127.0) / amax,
                             torch.zeros_like(amax))
        q = torch.round(blocks * iscale)  # nearest_int: the 1.5·2^23 trick, half to even
        d = torch.where(nonzero, torch.reciprocal(iscale), torch.zeros_like(amax))
        return (q * d).flatten(-2)


def matmul(x: torch.Tensor, weight: torch.Tensor, type_name: str,
           mins: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T as llama.cpp's CPU backend computes it for a weight of `type_name`."""
    kind = ACTIVATION_TYPE[type_name]
    if kind == "F32":
        return x @ weight.T
    if kind == "F16":
        return fp16(x) @ weight.T
    if kind == "Q8_K":
        return straight_through(x, quantize_q8_k(x)) @ weight.T
    dequantized, d, qsum = quantize_q8(x)
    y = straight_through(x, dequantized) @ weight.T
    if kind == "Q8_1":
        assert mins is not None, "a Q8_1 product needs the weight's block mins"
        # W = d_w q_w + m_w, so W·(d16 q) holds m_w · d16 Σq per block, where ggml
        # adds m_w · s with s = fp16(d Σq) (d unrounded): add the difference.
        with torch.no_grad():
            delta = (d * qsum).half().float() - d.half().float() * qsum
        y = y + delta @ mins.T
    return y


def rope_angles(positions: torch.Tensor, base: float, dims: int, freq_scale: float = 1.0,
                factors: torch.Tensor | None = None) -> torch.Tensor:
    """(seq, dims / 2) float32 angles as ggml_rope_cache_init builds them: theta starts
    at the position and is multiplied by powf(base, -2 / dims) once per pair, in float;
    each pair's angle is theta / freq_factors[i] (Llama 3's rope_freqs), times freq_scale
    (linear scaling: 1 / factor), in float (rope_yarn with ext_factor 0 and mscale 1).
    Dividing by a factor of 1 and multiplying by a scale of 1 are exact, so they are
    skipped when absent."""
    theta_scale = torch.tensor(np.float32(math.pow(base, -2.0 / dims)))
    scale = torch.tensor(np.float32(freq_scale))
    theta = positions.to(torch.float32)
    columns = []
    for i in range(dims // 2):
        angle = theta if factors is None else theta / factors[i]
        if freq_scale != 1.0:
            angle = angle * scale
        columns.append(angle)
        theta = theta * theta_scale
    return torch.stack(columns, dim=-1)


def _gelu_table() -> torch.Tensor:
    """ggml's `ggml_table_gelu_f16`: for every fp16 bit pattern h, fp16(gelu(h)) with
    ggml_gelu_f32's float expression (tanh approximation), as float32 (65536,)."""
    h = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        inner = np.float32(0.7978845608028654) * h * (np.float32(1.0)
                                                     + np.float32(0.044715) * h * h)
        g = np.float32(0.5) * h * (np.float32(1.0) + np.tanh(inner))
    return torch.from_numpy(g.astype(np.float16).astype(np.float32))


_GELU_TABLE: list[torch.Tensor] = []


def gelu(x: torch.Tensor) -> torch.Tensor:
    """GELU (tanh approximation) as ggml's CPU backend computes it on float32 input with
    GGML_GELU_FP16 (vec.h, on by default): x <= -10 gives 0, x >= 10 gives x, anything
    between is looked up in the fp16 table by x rounded to fp16 (so the result is an fp16
    value). Straight-through: the gradient is the float GELU's."""
    if not _GELU_TABLE:
        _GELU_TABLE.append(_gelu_table())
    exact = torch.nn.functional.gelu(x, approximate="tanh")
    with torch.no_grad():
        bits = x.detach().half().view(torch.int16).long() & 0xFFFF
        looked_up = _GELU_TABLE[0][bits]
        looked_up = torch.where(x <= GELU_LOW, torch.zeros_like(x),
                                torch.where(x >= GELU_HIGH, x.detach(), looked_up))
    return straight_through(exact, looked_up)


def rms_scale(x: torch.Tensor, eps: float) -> torch.Tensor:
    """1 / sqrt(mean(x²) + eps) as ggml's rms_norm: squares in float, summed in double,
    the mean rounded to float, the rest in float."""
    mean = (x * x).double().sum(-1, keepdim=True).div(x.shape[-1]).float()
    return 1.0 / torch.sqrt(mean + eps)
