"""The trainer's forward pass: llama.cpp's llama architecture in PyTorch, over the
GGUF file's own tensors.

Torch-only: imported by the training worker, never by the rest of the engine.

The frozen weights are the file's quantized tensors, dequantized in memory with the
`gguf` package when the model loads (no full-precision copy is ever written). Rows of
q and k stay in llama.cpp's order (permuted per head relative to Hugging Face), and
RoPE is applied the way llama.cpp does for this architecture (its "normal" mode:
adjacent pairs rotate together), which is what that row order expects. A LoRA delta
trained here is therefore in llama.cpp's layout and is written to GGUF unchanged; the
PEFT export permutes q/k B rows back (engine.lora_io.gguf_to_peft).

Numerics: "float" multiplies the dequantized weights with float32 activations (the
trainer before issue 16, kept so older records retrain to their bytes); "served"
(engine.training.served_math) rounds where llama.cpp's CPU backend does: activations
quantized to 8 bits before each quantized product, keys, values, queries and attention
probabilities in fp16, RMSNorm summed in double and RoPE angles built in float as ggml
builds them. The LoRA path multiplies the unquantized activations in both, as llama.cpp
does with an F32 adapter.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from engine.errors import RefusedError
from engine.formats import gguf_file, naming
from engine.training import served_math


@dataclass(frozen=True)
class Hyper:
    """The architecture numbers the forward pass needs, read from GGUF metadata."""

    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int
    rope_base: float
    rope_dims: int
    rms_eps: float

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


def read_hyper(header: gguf_file.GgufHeader) -> Hyper:
    arch = header.get("general.architecture")
    if arch != "llama":
        raise RefusedError(f"training supports the llama architecture, this file is {arch!r}")

    def number(key: str, kinds: tuple[str, ...], default: float | None = None) -> float:
        value = header.typed(f"llama.{key}", kinds, "a number")
        if value is None:
            if default is None:
                raise RefusedError(f"{header.path.name}: metadata llama.{key} is missing")
            return default
        return value

    ints = ("uint32", "int32", "uint64", "int64")
    n_embd = int(number("embedding_length", ints))
    n_head = int(number("attention.head_count", ints))
    emb = header.tensors.get("token_embd.weight")
    if emb is None:
        raise RefusedError(f"{header.path.name}: no token_embd.weight tensor")
    hyper = Hyper(
        n_layer=int(number("block_count", ints)),
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=int(number("attention.head_count_kv", ints, n_head)),
        n_ff=int(number("feed_forward_length", ints)),
        n_vocab=int(emb.shape[1]),
        rope_base=float(number("rope.freq_base", ("float32", "float64"), 10000.0)),
        rope_dims=int(number("rope.dimension_count", ints, n_embd // n_head)),
        rms_eps=float(number("attention.layer_norm_rms_epsilon", ("float32", "float64"))),
    )
    if (hyper.n_embd % hyper.n_head or hyper.n_head % hyper.n_head_kv
            or hyper.rope_dims != hyper.head_dim):
        raise RefusedError(f"{header.path.name}: unsupported attention shape {hyper}")
    if "rope.scaling.type" in {k.removeprefix("llama.") for k in header.metadata}:
        raise RefusedError(f"{header.path.name}: RoPE scaling is not supported by the trainer")
    return hyper


KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values (batch, kv heads, seq, dim)


class Lora(torch.nn.Module):
    """Trainable A (rank, in) and B (out, rank) for one projection."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor) -> None:
        super().__init__()
        self.a = torch.nn.Parameter(a)
        self.b = torch.nn.Parameter(b)


class LlamaTorch(torch.nn.Module):
    """The frozen base (plain tensors) plus LoRA parameters keyed by module path."""

    def __init__(self, path: Path, progress: Callable[[int, int], None] | None = None,
                 numerics: str = "served") -> None:
        super().__init__()
        served_math.check_numerics(numerics)
        header = gguf_file.read_header(path)
        self.header = header
        self.hyper = read_hyper(header)
        h = self.hyper
        names = ["token_embd.weight", "output_norm.weight"]
        for i in range(h.n_layer):
            names += [f"blk.{i}.{t}.weight" for t in (
                "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
                "ffn_gate", "ffn_up", "ffn_down")]
        has_output = "output.weight" in header.tensors
        if has_output:
            names.append("output.weight")
        missing = [n for n in names if n not in header.tensors]
        if missing:
            raise RefusedError(f"{path.name}: missing tensors {missing[:4]}")
        self.frozen: dict[str, torch.Tensor] = {}
        for done, name in enumerate(names):
            array = gguf_file.read_tensor(header, name)
            self.frozen[name] = torch.from_numpy(np.ascontiguousarray(array, np.float32))
            if progress:
                progress(done + 1, len(names))
        self.frozen.setdefault("output.weight", self.frozen["token_embd.weight"])
        # The stored type of every matrix that is multiplied (the output is token_embd
        # when tied), and the block mins of those whose products add a min term (Q4_1).
        matrices = {n: n for n in names if n.startswith("blk.") and self.frozen[n].ndim == 2}
        matrices["output.weight"] = "output.weight" if has_output else "token_embd.weight"
        self.types: dict[str, str] = {}
        self.mins: dict[str, torch.Tensor] = {}
        for used, stored in matrices.items():
            kind = header.tensors[stored].type_name
            self.types[used] = kind
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
        half = h.rope_dims // 2
        self.inv_freq = 1.0 / (h.rope_base ** (torch.arange(0, half, dtype=torch.float64)
                                               * 2.0 / h.rope_dims))

    # ------------------------------------------------------------------ LoRA

    @staticmethod
    def key(module: str) -> str:
        return naming.module_to_gguf(module).removesuffix(".weight").replace(".", "_")

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

    # ------------------------------------------------------------------ forward

    def _linear(self, x: torch.Tensor, layer: int, role: str) -> torch.Tensor:
        y = self._matmul(x, f"blk.{layer}.{role}.weight")
        # The LoRA path takes the unquantized activations: llama.cpp multiplies an F32
        # adapter's A with the f32 input (ggml_mul_mat F32 x F32), then B, then scales.
        lora = self.active.get(f"blk_{layer}_{role}")
        if lora is not None and self.lora_enabled:
            y = y + ((x @ lora.a.T) @ lora.b.T) * self.lora_scale
        return y

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self.served:
            return x * served_math.rms_scale(x, self.hyper.rms_eps) * weight
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.hyper.rms_eps) * weight

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: (batch, heads, seq, head_dim); llama.cpp "normal" mode rotates (2i, 2i+1).
        pairs = x.unflatten(-1, (-1, 2))
        x0, x1 = pairs[..., 0], pairs[..., 1]
        return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)

    def hidden(self, tokens: torch.Tensor, past: KV | None = None, keep: bool = False
               ) -> tuple[torch.Tensor, KV]:
        """Final normalised hidden states, (batch, seq, n_embd), for right-padded ids.

        `past` holds a shared prefix's keys and values (batch 1) computed by an earlier
        call with `keep=True`; the tokens then continue that prefix, in every row.
        Returns the hidden states and (with `keep`) this call's keys and values.
        """
        h = self.hyper
        batch, seq = tokens.shape
        start = 0 if past is None else past[0][0].shape[2]
        total = start + seq
        x = self.frozen["token_embd.weight"][tokens]
        if self.served:
            angles32 = served_math.rope_angles(torch.arange(start, total), h.rope_base,
                                               h.rope_dims)
            cos, sin = torch.cos(angles32), torch.sin(angles32)
        else:
            pos = torch.arange(start, total, dtype=torch.float64)
            angles = pos[:, None] * self.inv_freq[None, :]
            cos = torch.cos(angles).to(torch.float32)
            sin = torch.sin(angles).to(torch.float32)
        mask = torch.full((seq, total), float("-inf")).triu(start + 1)
        group = h.n_head // h.n_head_kv
        scale = 1.0 / math.sqrt(h.head_dim)
        kept: KV = []
        for i in range(h.n_layer):
            self.check()
            a = self._rms(x, self.frozen[f"blk.{i}.attn_norm.weight"])
            q = self._linear(a, i, "attn_q").view(batch, seq, h.n_head, h.head_dim)
            k = self._linear(a, i, "attn_k").view(batch, seq, h.n_head_kv, h.head_dim)
            v = self._linear(a, i, "attn_v").view(batch, seq, h.n_head_kv, h.head_dim)
            q = self._rope(q.transpose(1, 2), cos, sin)
            k = self._rope(k.transpose(1, 2), cos, sin)
            v = v.transpose(1, 2)
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
            q = q.reshape(batch, h.n_head_kv, group * seq, h.head_dim)
            scores = (q @ k.transpose(-1, -2)) * scale
            scores = scores.view(batch, h.n_head_kv, group, seq, total) + mask
            probs = torch.softmax(scores, dim=-1).view(batch, h.n_head_kv, group * seq, total)
            if self.served:
                probs = served_math.fp16(probs)  # converted to F16 to multiply with V
            att = (probs @ v).view(batch, h.n_head, seq, h.head_dim)
            att = att.transpose(1, 2).reshape(batch, seq, h.n_embd)
            x = x + self._linear(att, i, "attn_output")
            f = self._rms(x, self.frozen[f"blk.{i}.ffn_norm.weight"])
            gate = torch.nn.functional.silu(self._linear(f, i, "ffn_gate"))
            x = x + self._linear(gate * self._linear(f, i, "ffn_up"), i, "ffn_down")
        return self._rms(x, self.frozen["output_norm.weight"]), kept

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._matmul(hidden, "output.weight")
