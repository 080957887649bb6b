"""The trainer's forward pass: llama.cpp's decoder graphs in PyTorch, over the GGUF file's
own tensors, for every family the architecture description knows.

Torch-only: imported by the training worker, never by the rest of the engine.

One class, `DecoderTorch`, computes llama, qwen2, qwen3, gemma2, gemma3 and phi3 files:
everything that differs between them comes from `engine.formats.architecture.Model`
(read by `engine.training.support.describe`, which refuses what we do not reproduce), as
llama.cpp's src/models/<family>.cpp and src/llama-graph.cpp compute it:

- the token embedding, times sqrt(n_embd) in float32 (Gemma);
- per layer: RMSNorm; q, k, v from three matrices or one fused attn_qkv, each plus its
  bias where the file has one (Qwen2), after the LoRA delta as llama.cpp adds it; q/k
  RMSNorm per head (Qwen3, Gemma 3); RoPE in llama.cpp's NORMAL mode (adjacent pairs,
  llama, whose q/k rows the converter permuted) or NEOX mode (halves, the others), with
  the layer's base and linear scale (Gemma's sliding-window layers have their own) and
  Llama 3's frequency factors (theta_i / rope_freqs[i]); grouped-query attention with the
  attention scale applied where llama.cpp applies it (on q for Gemma and Phi-3, inside the
  softmax otherwise), the tanh soft-cap (Gemma 2), the causal mask and, on sliding-window
  layers, llama.cpp's window (a key p0 is hidden from a query p1 when p1 - p0 >= n_swa);
  the post-attention norm (Gemma); SwiGLU or GELU-tanh gated FFN from gate and up, or
  SwiGLU from Phi-3's fused gate|up (first half gate); the post-FFN norm (Gemma);
- the output norm, the output matrix (token_embd when tied) plus its bias, and the final
  tanh soft-cap (Gemma 2, Gemma 3 when the file says).

The frozen weights are the file's tensors, dequantized in memory with the `gguf` package
when the model loads (no full-precision copy is ever written). q/k rows stay in the
file's order and RoPE runs in the mode that order expects, so a LoRA delta trained here is
in llama.cpp's layout and is written to GGUF unchanged (the PEFT export moves llama's q/k
B rows back to Hugging Face order).

Numerics: "float" multiplies the dequantized weights with float32 activations (the
trainer before issue 16, kept so older records retrain to their bytes: on a llama file
it computes exactly what the llama-only class did, operation for operation); "served"
(engine.training.served_math) rounds where llama.cpp's CPU backend does: activations
quantized to 8 bits before each quantized product, keys, values, queries and attention
probabilities in fp16, RMSNorm summed in double, RoPE angles built in float as ggml
builds them, GELU through ggml's fp16 table. The LoRA path multiplies the unquantized
activations in both, as llama.cpp does with an F32 adapter.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from engine.formats import architecture, capabilities, gguf_file, naming
from engine.formats.architecture import (
    ATTN_K,
    ATTN_K_NORM,
    ATTN_POST_NORM,
    ATTN_Q,
    ATTN_Q_NORM,
    ATTN_QKV,
    ATTN_V,
    FFN_POST_NORM,
    GELU_TANH,
    NEOX,
)
from engine.training import served_math, support

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values (batch, kv heads, seq, dim)


class Lora(torch.nn.Module):
    """Trainable A (rank, in) and B (out, rank) for one projection."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor) -> None:
        super().__init__()
        self.a = torch.nn.Parameter(a)
        self.b = torch.nn.Parameter(b)


def _f32(value: float) -> float:
    """`value` rounded to float32, as llama.cpp holds its hyper-parameters."""
    return float(np.float32(value))


class DecoderTorch(torch.nn.Module):
    """The frozen base (plain tensors) plus LoRA parameters keyed by module path."""

    def __init__(self, path: Path, progress: Callable[[int, int], None] | None = None,
                 numerics: str = "served") -> None:
        super().__init__()
        served_math.check_numerics(numerics)
        header = gguf_file.read_header(path)
        self.header = header
        # Refuses, with the reason, a file the trainer cannot compute as llama.cpp does.
        self.arch: architecture.Model = support.describe(header)
        m = self.arch
        names = m.required_tensors()
        self.frozen: dict[str, torch.Tensor] = {}
        for done, name in enumerate(names):
            array = gguf_file.read_tensor(header, name)
            self.frozen[name] = torch.from_numpy(np.ascontiguousarray(array, np.float32))
            if progress:
                progress(done + 1, len(names))
        # Tied (no output.weight, or Gemma 2, which ignores one): token_embd multiplies.
        self.frozen.setdefault("output.weight", self.frozen["token_embd.weight"])
        # The stored type of every matrix that is multiplied (the output is token_embd
        # when tied), and the block mins of those whose products add a min term (Q4_1).
        self.types: dict[str, str] = capabilities.matrix_types(m, header)
        self.mins: dict[str, torch.Tensor] = {}
        for used, kind in self.types.items():
            stored = "token_embd.weight" if used == "output.weight" and m.tied_output \
                else used
            if kind in served_math.BLOCK_BYTES:
                self.mins[used] = served_math.block_mins(
                    gguf_file.read_tensor_bytes(header, stored), kind,
                    *self.frozen[stored].shape)
        self.numerics = "float"
        self.set_numerics(numerics)
        for tensor in self.frozen.values():
            tensor.requires_grad_(False)
        self.loras = torch.nn.ModuleDict()  # "blk_3_attn_q" -> Lora
        self.active: dict[str, Lora] = {}  # the same, as a plain dict for lookups
        self.lora_scale = 0.0
        self.lora_enabled = True
        self.check: Callable[[], None] = lambda: None  # called per layer (cancellation)
        # Scalars llama.cpp holds as float32 (ggml_scale's factor, the soft-caps).
        self._embed_scale = _f32(math.sqrt(m.n_embd))
        self._q_scale = _f32(m.attention_scale)
        self._attn_cap = _f32(m.attn_softcap)
        self._attn_inv_cap = float(np.float32(1.0) / np.float32(m.attn_softcap)) \
            if m.attn_softcap else 0.0
        self._final_cap = _f32(m.final_softcap)
        self._final_inv_cap = float(np.float32(1.0) / np.float32(m.final_softcap)) \
            if m.final_softcap else 0.0
        self._inv_freq: dict[float, torch.Tensor] = {}
        norms = m.layer_norms()
        self._qk_norm = ATTN_Q_NORM in norms and ATTN_K_NORM in norms
        self._post_attn_norm = ATTN_POST_NORM in norms
        self._post_ffn_norm = FFN_POST_NORM in norms

    # ------------------------------------------------------------------ LoRA

    @staticmethod
    def key(module: str) -> str:
        return naming.module_to_gguf(module).removesuffix(".weight").replace(".", "_")

    def module(self, layer: int, role: str) -> str:
        """The Hugging Face module path of a projection of this file (`model.layers.3.
        self_attn.q_proj`, Phi-3's `...qkv_proj`): what LoRA weights are keyed by."""
        module = naming.gguf_to_module(self.arch.tensor(layer, role), self.arch.name)
        assert module is not None, (layer, role)
        return module

    def shape_of(self, module: str) -> tuple[int, int]:
        tensor = naming.module_to_gguf(module)
        out_f, in_f = self.frozen[tensor].shape
        return int(out_f), int(in_f)

    def add_lora(self, module: str, a: torch.Tensor, b: torch.Tensor) -> None:
        self.loras[self.key(module)] = Lora(a, b)
        self.active[self.key(module)] = self.loras[self.key(module)]

    def clear_loras(self) -> None:
        self.loras.clear()
        self.active.clear()

    def set_lora_scale(self, scale: float) -> None:
        self.lora_scale = float(scale)

    def set_numerics(self, numerics: str) -> None:
        """"served" or "float" (module docstring); "served" refuses a weight type whose
        activation arithmetic served_math does not simulate."""
        served_math.check_numerics(numerics)
        if numerics == "served":
            for name, kind in self.types.items():
                served_math.require_supported(name, kind)
        self.numerics = numerics

    @property
    def served(self) -> bool:
        return self.numerics == "served"

    def _matmul(self, x: torch.Tensor, name: str) -> torch.Tensor:
        if self.served:
            return served_math.matmul(x, self.frozen[name], self.types[name],
                                      self.mins.get(name))
        return x @ self.frozen[name].T

    # ------------------------------------------------------------------ pieces

    def _linear(self, x: torch.Tensor, layer: int, role: str) -> torch.Tensor:
        y = self._matmul(x, f"blk.{layer}.{role}.weight")
        # The LoRA path takes the unquantized activations: llama.cpp multiplies an F32
        # adapter's A with the f32 input (ggml_mul_mat F32 x F32), then B, then scales.
        lora = self.active.get(f"blk_{layer}_{role}")
        if lora is not None and self.lora_enabled:
            y = y + ((x @ lora.a.T) @ lora.b.T) * self.lora_scale
        # build_qkv / build_attn add a bias after the product and its LoRA delta (f32).
        if role in self.arch.biases:
            y = y + self.frozen[f"blk.{layer}.{role}.bias"]
        return y

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        eps = self.arch.rms_eps
        if self.served:
            return x * served_math.rms_scale(x, eps) * weight
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: (batch, heads, seq, head_dim); pair i turns by angle i.
        if self.arch.rope.mode == NEOX:
            # NEOX: (i, i + d/2) rotate together (Hugging Face's rotate_half layout).
            x0, x1 = x.chunk(2, dim=-1)
            return torch.cat((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
        # NORMAL: (2i, 2i+1) rotate together.
        pairs = x.unflatten(-1, (-1, 2))
        x0, x1 = pairs[..., 0], pairs[..., 1]
        return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)

    def _angles(self, start: int, total: int, layer: int,
                cache: dict[tuple[float, float], tuple[torch.Tensor, torch.Tensor]]
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (seq, dims / 2) of the positions start..total-1 for `layer`'s RoPE
        (its base and linear factor; Llama 3's frequency factors), cached per call."""
        m = self.arch
        base, factor = m.rope_base_for(layer), m.rope_factor_for(layer)
        if (base, factor) in cache:
            return cache[(base, factor)]
        factors = self.frozen.get("rope_freqs.weight") if m.rope.freq_factors else None
        if self.served:
            # ggml holds freq_scale as the float 1.0f / factor.
            freq_scale = float(np.float32(1.0) / np.float32(factor))
            angles32 = served_math.rope_angles(torch.arange(start, total), base,
                                               m.rope.dims, freq_scale, factors)
            cos, sin = torch.cos(angles32), torch.sin(angles32)
        else:
            if base not in self._inv_freq:
                self._inv_freq[base] = 1.0 / (base ** (
                    torch.arange(0, m.rope.dims // 2, dtype=torch.float64) * 2.0 / m.rope.dims))
            pos = torch.arange(start, total, dtype=torch.float64)
            angles = pos[:, None] * self._inv_freq[base][None, :]
            # In ggml's order: theta / freq_factor, then times freq_scale.
            if factors is not None:
                angles = angles / factors.double()[None, :]
            if factor != 1.0:
                angles = angles * (1.0 / factor)
            cos = torch.cos(angles).to(torch.float32)
            sin = torch.sin(angles).to(torch.float32)
        cache[(base, factor)] = (cos, sin)
        return cos, sin

    def _gelu(self, x: torch.Tensor) -> torch.Tensor:
        if self.served:
            return served_math.gelu(x)
        return torch.nn.functional.gelu(x, approximate="tanh")

    # ------------------------------------------------------------------ forward

    def hidden(self, tokens: torch.Tensor, past: KV | None = None, keep: bool = False
               ) -> tuple[torch.Tensor, KV]:
        """Final normalised hidden states, (batch, seq, n_embd), for right-padded ids.

        `past` holds a shared prefix's keys and values (batch 1) computed by an earlier
        call with `keep=True`; the tokens then continue that prefix, in every row.
        Returns the hidden states and (with `keep`) this call's keys and values.
        """
        m = self.arch
        fam = m.family
        batch, seq = tokens.shape
        start = 0 if past is None else past[0][0].shape[2]
        total = start + seq
        x = self.frozen["token_embd.weight"][tokens]
        if fam.embed_scale:
            x = x * self._embed_scale  # ggml_scale(inpL, sqrtf(n_embd))
        angles: dict[tuple[float, float], tuple[torch.Tensor, torch.Tensor]] = {}
        mask = torch.full((seq, total), float("-inf")).triu(start + 1)
        swa_mask = None
        if m.swa_window:
            # llama.cpp's is_masked_swa (STANDARD): query p1 does not see key p0 when
            # p1 - p0 >= n_swa; the prefix's keys are positions 0..start-1.
            distance = (torch.arange(start, total)[:, None] - torch.arange(total)[None, :])
            swa_mask = mask.masked_fill(distance >= m.swa_window, float("-inf"))
        group = m.n_head // m.n_head_kv
        scale = m.attention_scale
        kept: KV = []
        for i in range(m.n_layer):
            self.check()
            a = self._rms(x, self.frozen[f"blk.{i}.attn_norm.weight"])
            if m.fused_qkv:
                qkv = self._linear(a, i, ATTN_QKV)
                q, k, v = qkv.split((m.q_width, m.kv_width, m.kv_width), dim=-1)
                q = q.reshape(batch, seq, m.n_head, m.head_dim)
                k = k.reshape(batch, seq, m.n_head_kv, m.head_dim)
                v = v.reshape(batch, seq, m.n_head_kv, m.head_dim)
            else:
                q = self._linear(a, i, ATTN_Q).view(batch, seq, m.n_head, m.head_dim)
                k = self._linear(a, i, ATTN_K).view(batch, seq, m.n_head_kv, m.head_dim)
                v = self._linear(a, i, ATTN_V).view(batch, seq, m.n_head_kv, m.head_dim)
            if self._qk_norm:
                # Qwen3, Gemma 3: RMSNorm over each head's vector, before RoPE.
                q = self._rms(q, self.frozen[f"blk.{i}.{ATTN_Q_NORM}.weight"])
                k = self._rms(k, self.frozen[f"blk.{i}.{ATTN_K_NORM}.weight"])
            cos, sin = self._angles(start, total, i, angles)
            q = self._rope(q.transpose(1, 2), cos, sin)
            k = self._rope(k.transpose(1, 2), cos, sin)
            v = v.transpose(1, 2)
            if fam.scale_q_first:
                q = q * self._q_scale  # ggml_scale(Qcur, f_attention_scale); kq_scale 1
            if self.served:
                # The KV cache is F16; ggml converts q to F16 to multiply it with K.
                q, k, v = served_math.fp16(q), served_math.fp16(k), served_math.fp16(v)
            if keep:
                kept.append((k, v))
            if past is not None:
                pk, pv = past[i]
                k = torch.cat((pk.expand(batch, -1, -1, -1), k), dim=2)
                v = torch.cat((pv.expand(batch, -1, -1, -1), v), dim=2)
            # Grouped-query attention: query head j uses key/value head j // group.
            q = q.reshape(batch, m.n_head_kv, group * seq, m.head_dim)
            scores = q @ k.transpose(-1, -2)
            if m.attn_softcap:
                # build_attn_mha: scale by 1/cap, tanh, scale by cap (before the softmax).
                scores = torch.tanh(scores * self._attn_inv_cap) * self._attn_cap
            if not fam.scale_q_first:
                scores = scores * scale  # soft_max_ext's kq_scale
            layer_mask = swa_mask if swa_mask is not None and m.is_swa(i) else mask
            scores = scores.view(batch, m.n_head_kv, group, seq, total) + layer_mask
            probs = torch.softmax(scores, dim=-1).view(batch, m.n_head_kv, group * seq, total)
            if self.served:
                probs = served_math.fp16(probs)  # converted to F16 to multiply with V
            att = (probs @ v).view(batch, m.n_head, seq, m.head_dim)
            att = att.transpose(1, 2).reshape(batch, seq, m.q_width)
            out = self._linear(att, i, "attn_output")
            if self._post_attn_norm:
                out = self._rms(out, self.frozen[f"blk.{i}.{ATTN_POST_NORM}.weight"])
            x = x + out
            f = self._rms(x, self.frozen[f"blk.{i}.ffn_norm.weight"])
            if fam.fused_gate_up:
                # Phi-3: ffn_up holds gate and up stacked; ggml_swiglu: silu(first) * second.
                gate, up = self._linear(f, i, "ffn_up").chunk(2, dim=-1)
                hidden = torch.nn.functional.silu(gate) * up
            else:
                gate = self._linear(f, i, "ffn_gate")
                gate = (self._gelu(gate) if fam.activation == GELU_TANH
                        else torch.nn.functional.silu(gate))
                hidden = gate * self._linear(f, i, "ffn_up")
            down = self._linear(hidden, i, "ffn_down")
            if self._post_ffn_norm:
                down = self._rms(down, self.frozen[f"blk.{i}.{FFN_POST_NORM}.weight"])
            x = x + down
        return self._rms(x, self.frozen["output_norm.weight"]), kept

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        y = self._matmul(hidden, "output.weight")
        if self.arch.output_bias:
            y = y + self.frozen["output.bias"]
        if self.arch.final_softcap:
            y = torch.tanh(y * self._final_inv_cap) * self._final_cap
        return y
