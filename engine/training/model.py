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

The frozen base stays in the file's own blocks (`FrozenWeights`: the memory-mapped GGUF,
engine.training.quantized): each matrix is dequantized just in time for its product, by
ggml's own dequantizer (the same float32 bits the `gguf` package gives), and again in the
backward pass, which needs only the gradient with respect to the input (the base has no
weight gradient). Autograd's saved copy of a weight is replaced by a handle
(`saved_tensors_hooks`), so the backward pass is autograd's own, operation for
operation. Each decoder layer is checkpointed (torch.utils.checkpoint, non-reentrant: the
autograd graph is the same one, only its saved tensors are recomputed), so what is kept
for the backward pass is one tensor per layer, not every activation of every layer. The
output matrix is multiplied in row slices of at most `OUTPUT_SLICE_BYTES` of float32
(the embedded model's fits in one, as before), and the targets' log-probabilities are
scored in checkpointed chunks of positions when the logits would be large
(`target_logps`). Peak memory is the file's mapped pages,
the LoRA parameters and optimizer state, the checkpoints, and one layer's working set
(engine.training.memory estimates it). Every number is the same as when the whole base
was dequantized at load: the products, their order and their shapes are unchanged, and
the recomputation is deterministic (no RNG in the forward pass).

q/k rows stay in the file's order and RoPE runs in the mode that order expects, so a LoRA
delta trained here is in llama.cpp's layout and is written to GGUF unchanged (the PEFT
export moves llama's q/k B rows back to Hugging Face order).

Numerics: "float" multiplies the dequantized weights with float32 activations (the
trainer before served numerics, December 2026, kept so older records retrain to their
bytes: on a llama file it computes exactly what the llama-only class did, operation for
operation); "served"
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
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
    noop_context_fn,
)

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
from engine.training.memory import LOGIT_CHUNK_BYTES, OUTPUT_SLICE_BYTES
from engine.training.quantized import QuantizedFile

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values (batch, kv heads, seq, dim)


class _Handle:
    """What autograd keeps of a dequantized weight it saved for the backward pass: the
    rows of the tensor and the view's geometry, to dequantize it again when needed."""

    __slots__ = ("name", "start", "stop", "size", "stride", "offset")

    def __init__(self, name: str, start: int, stop: int, view: torch.Tensor) -> None:
        self.name, self.start, self.stop = name, start, stop
        self.size, self.stride, self.offset = view.size(), view.stride(), view.storage_offset()


class FrozenWeights:
    """The frozen base: 1-D tensors (norms, biases, rope_freqs) resident as float32, every
    matrix left in the memory-mapped file and dequantized on request."""

    def __init__(self, file: QuantizedFile, names: list[str],
                 progress: Callable[[int, int], None] | None = None) -> None:
        self.file = file
        self.small: dict[str, torch.Tensor] = {}
        for done, name in enumerate(names):
            if len(file.shape(name)) == 1:
                self.small[name] = torch.from_numpy(file.dequantize(name))
            if progress:
                progress(done + 1, len(names))

    def shape(self, name: str) -> tuple[int, ...]:
        return self.file.shape(name)

    def matrix(self, name: str, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Rows start..stop-1 of a matrix, float32 (rows, columns), dequantized now."""
        rows, columns = self.file.shape(name)
        stop = rows if stop is None else stop
        out = torch.empty(stop - start, columns)
        self.file.dequantize(name, start, stop, out.numpy())
        return out

    def rows(self, name: str, ids: torch.Tensor) -> torch.Tensor:
        """matrix[ids] (ids of any shape): only the rows looked up are dequantized."""
        columns = self.file.shape(name)[1]
        out = torch.empty(ids.numel(), columns)
        self.file.rows(name, ids.reshape(-1).numpy(), out.numpy())
        return out.view(*ids.shape, columns)

    def mins(self, name: str, start: int, stop: int) -> torch.Tensor:
        """The block mins of rows start..stop-1 of a Q4_1/Q5_1 matrix (served numerics)."""
        raw = self.file.raw(name)[start:stop]
        return served_math.block_mins(raw, self.file.type_name(name), stop - start,
                                      self.file.shape(name)[1])

    def __contains__(self, name: str) -> bool:
        return name in self.small or name in self.file.header.tensors

    def close(self) -> None:
        self.file.close()


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
    """The frozen base (`FrozenWeights`: the mapped file) plus LoRA parameters keyed by
    module path."""

    def __init__(self, path: Path, progress: Callable[[int, int], None] | None = None,
                 numerics: str = "served", threads: int | None = None) -> None:
        super().__init__()
        served_math.check_numerics(numerics)
        header = gguf_file.read_header(path)
        self.header = header
        # Refuses, with the reason, a file the trainer cannot compute as llama.cpp does.
        self.arch: architecture.Model = support.describe(header)
        m = self.arch
        # Dequantization uses the run's threads (torch's, set by the trainer from them).
        file = QuantizedFile(header, threads or torch.get_num_threads())
        self.weights = FrozenWeights(file, m.required_tensors(), progress)
        # Tied (no output.weight, or Gemma 2, which ignores one): token_embd multiplies.
        self.stored = {"output.weight": "token_embd.weight" if m.tied_output
                       else "output.weight"}
        # The stored type of every matrix that is multiplied (the output is token_embd
        # when tied); the block mins of those whose products add a min term (Q4_1) are
        # read from the blocks at each product.
        self.types: dict[str, str] = capabilities.matrix_types(m, header)
        self.numerics = "float"
        self.set_numerics(numerics)
        # Whether a checkpointed layer keeps its frozen products' outputs for the backward
        # pass (selective checkpointing: the recomputation then skips the products, the
        # larger part of its time) or recomputes them too (the least memory). The same
        # numbers either way; `engine.training.memory` says what each costs.
        self.keep_products = False
        self._weight_pointer: int | None = None  # the weight of the product being computed
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
        out_f, in_f = self.weights.shape(tensor)
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

    def close(self) -> None:
        """Unmap the file (the model computes nothing afterwards)."""
        self.weights.close()

    def _matmul(self, x: torch.Tensor, name: str, start: int = 0,
                stop: int | None = None) -> torch.Tensor:
        """x @ W.T for rows start..stop-1 of the matrix multiplied as `name`, W
        dequantized just in time: in float or served numerics, as before.

        Autograd saves W (as W.T, a view) for the input's gradient; the hooks swap it for
        a `_Handle` and dequantize it again when the backward pass reaches this product,
        so no dequantized weight outlives its product. They are the innermost hooks (also
        inside a checkpointed layer), and only W is saved inside them: a product of a
        weight that needs no gradient saves nothing else.
        """
        stored = self.stored.get(name, name)
        rows = self.weights.shape(stored)[0]
        stop = rows if stop is None else stop
        weight = self.weights.matrix(stored, start, stop)
        pointer = weight.untyped_storage().data_ptr()

        def pack(tensor: torch.Tensor) -> torch.Tensor | _Handle:
            if tensor.untyped_storage().data_ptr() == pointer:
                return _Handle(stored, start, stop, tensor)
            return tensor

        def unpack(saved: torch.Tensor | _Handle) -> torch.Tensor:
            if isinstance(saved, _Handle):
                again = self.weights.matrix(saved.name, saved.start, saved.stop)
                return again.as_strided(saved.size, saved.stride, saved.offset)
            return saved

        self._weight_pointer = pointer  # for `_keep_policy`
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                if self.served:
                    kind = self.types[name]
                    mins = self.weights.mins(stored, start, stop) \
                        if kind in served_math.BLOCK_BYTES else None
                    return served_math.matmul(x, weight, kind, mins)
                return x @ weight.T
        finally:
            self._weight_pointer = None

    def _keep_policy(self, _ctx: object, op: object, *args: object, **_kwargs: object
                     ) -> CheckpointPolicy:
        """Selective checkpointing's rule (with `keep_products`): save the output of the
        matrix product with the frozen weight being multiplied, recompute the rest. It
        decides alike in the forward pass and in the recomputation, which is what lets the
        recomputation take the saved outputs in order."""
        if op is torch.ops.aten.mm.default and self._weight_pointer is not None \
                and isinstance(args[1], torch.Tensor) \
                and args[1].untyped_storage().data_ptr() == self._weight_pointer:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    def _checkpoint_context(self) -> tuple[object, object]:
        if self.keep_products:
            return create_selective_checkpoint_contexts(self._keep_policy)
        return noop_context_fn()

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
            y = y + self.weights.small[f"blk.{layer}.{role}.bias"]
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
        factors = self.weights.small.get("rope_freqs.weight") if m.rope.freq_factors else None
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

        With gradients on, every layer is checkpointed: only its input is kept, and the
        backward pass computes the layer again (the same numbers) before going through it.
        """
        m = self.arch
        batch, seq = tokens.shape
        start = 0 if past is None else past[0][0].shape[2]
        total = start + seq
        x = self.weights.rows("token_embd.weight", tokens)
        if m.family.embed_scale:
            x = x * self._embed_scale  # ggml_scale(inpL, sqrtf(n_embd))
        angles: dict[tuple[float, float], tuple[torch.Tensor, torch.Tensor]] = {}
        mask = torch.full((seq, total), float("-inf")).triu(start + 1)
        swa_mask = None
        if m.swa_window:
            # llama.cpp's is_masked_swa (STANDARD): query p1 does not see key p0 when
            # p1 - p0 >= n_swa; the prefix's keys are positions 0..start-1.
            distance = (torch.arange(start, total)[:, None] - torch.arange(total)[None, :])
            swa_mask = mask.masked_fill(distance >= m.swa_window, float("-inf"))
        kept: KV = []
        for i in range(m.n_layer):
            cos, sin = self._angles(start, total, i, angles)
            layer_mask = swa_mask if swa_mask is not None and m.is_swa(i) else mask
            layer_past = None if past is None else past[i]
            if torch.is_grad_enabled():
                # Non-reentrant: the autograd graph is the one an unchecked forward pass
                # records (so gradients are summed in the same order, to the bit); only
                # its saved tensors are dropped and recomputed. No RNG runs in a layer.
                x, k, v = checkpoint(
                    self._layer, i, x, cos, sin, layer_mask, layer_past,
                    use_reentrant=False, preserve_rng_state=False,
                    context_fn=self._checkpoint_context)
            else:
                x, k, v = self._layer(i, x, cos, sin, layer_mask, layer_past)
            if keep:
                kept.append((k, v))
        return self._rms(x, self.weights.small["output_norm.weight"]), kept

    def _layer(self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               mask: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Layer `i` on x (batch, seq, n_embd): the new x and this call's keys and values
        (as the F16 cache holds them in served numerics), before any `past` is joined."""
        self.check()  # also while the backward pass recomputes the layer
        m = self.arch
        fam = m.family
        small = self.weights.small
        batch, seq, _ = x.shape
        total = mask.shape[-1]
        group = m.n_head // m.n_head_kv
        a = self._rms(x, small[f"blk.{i}.attn_norm.weight"])
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
            q = self._rms(q, small[f"blk.{i}.{ATTN_Q_NORM}.weight"])
            k = self._rms(k, small[f"blk.{i}.{ATTN_K_NORM}.weight"])
        q = self._rope(q.transpose(1, 2), cos, sin)
        k = self._rope(k.transpose(1, 2), cos, sin)
        v = v.transpose(1, 2)
        if fam.scale_q_first:
            q = q * self._q_scale  # ggml_scale(Qcur, f_attention_scale); kq_scale 1
        if self.served:
            # The KV cache is F16; ggml converts q to F16 to multiply it with K.
            q, k, v = served_math.fp16(q), served_math.fp16(k), served_math.fp16(v)
        own_k, own_v = k, v
        if past is not None:
            pk, pv = past
            k = torch.cat((pk.expand(batch, -1, -1, -1), k), dim=2)
            v = torch.cat((pv.expand(batch, -1, -1, -1), v), dim=2)
        # Grouped-query attention: query head j uses key/value head j // group.
        q = q.reshape(batch, m.n_head_kv, group * seq, m.head_dim)
        scores = q @ k.transpose(-1, -2)
        if m.attn_softcap:
            # build_attn_mha: scale by 1/cap, tanh, scale by cap (before the softmax).
            scores = torch.tanh(scores * self._attn_inv_cap) * self._attn_cap
        if not fam.scale_q_first:
            scores = scores * m.attention_scale  # soft_max_ext's kq_scale
        scores = scores.view(batch, m.n_head_kv, group, seq, total) + mask
        probs = torch.softmax(scores, dim=-1).view(batch, m.n_head_kv, group * seq, total)
        if self.served:
            probs = served_math.fp16(probs)  # converted to F16 to multiply with V
        att = (probs @ v).view(batch, m.n_head, seq, m.head_dim)
        att = att.transpose(1, 2).reshape(batch, seq, m.q_width)
        out = self._linear(att, i, "attn_output")
        if self._post_attn_norm:
            out = self._rms(out, small[f"blk.{i}.{ATTN_POST_NORM}.weight"])
        x = x + out
        f = self._rms(x, small[f"blk.{i}.ffn_norm.weight"])
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
            down = self._rms(down, small[f"blk.{i}.{FFN_POST_NORM}.weight"])
        return x + down, own_k, own_v

    def output_slices(self) -> list[tuple[int, int]]:
        """Row ranges of the output matrix multiplied one at a time (one when it fits in
        `OUTPUT_SLICE_BYTES` of float32)."""
        rows, columns = self.weights.shape(self.stored["output.weight"])
        step = max(1, OUTPUT_SLICE_BYTES // (4 * columns))
        return [(a, min(a + step, rows)) for a in range(0, rows, step)]

    def target_logps(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """log p(targets[i]) after the final hidden state hidden[i] (positions, n_embd).

        With a sliced output matrix, positions whose logits would exceed
        `LOGIT_CHUNK_BYTES` go in chunks, each checkpointed (the backward pass multiplies
        that chunk's logits again: one more product with the output matrix, against three
        copies of every position's logits not kept)."""
        vocab = self.weights.shape(self.stored["output.weight"])[0]
        per = max(1, LOGIT_CHUNK_BYTES // (4 * vocab))
        if len(hidden) <= per or len(self.output_slices()) == 1:
            return self._target_logps(hidden, targets)
        parts = []
        for start in range(0, len(hidden), per):
            chunk, chosen = hidden[start:start + per], targets[start:start + per]
            if torch.is_grad_enabled():
                parts.append(checkpoint(self._target_logps, chunk, chosen,
                                        use_reentrant=False, preserve_rng_state=False))
            else:
                parts.append(self._target_logps(chunk, chosen))
        return torch.cat(parts)

    def _target_logps(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(self.logits(hidden), dim=-1)
        return logp.gather(1, targets[:, None])[:, 0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        slices = self.output_slices()
        if len(slices) == 1:
            y = self._matmul(hidden, "output.weight")
        else:
            y = torch.cat([self._matmul(hidden, "output.weight", a, b) for a, b in slices],
                          dim=-1)
        if self.arch.output_bias:
            y = y + self.weights.small["output.bias"]
        if self.arch.final_softcap:
            y = torch.tanh(y * self._final_inv_cap) * self._final_cap
        return y
