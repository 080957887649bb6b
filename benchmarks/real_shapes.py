"""Random-weight llama GGUFs at real model shapes, for the training benchmarks.

The trainer's memory and speed only mean something at the sizes people serve, and no
model can be downloaded on these machines. This writes llama files with the shapes of
Llama-3.2-1B, Llama-3.2-3B and Llama-3.1-8B (layers, widths, heads, FFN, the real
128,256-token vocabulary, tied embeddings where those models tie them) filled with random
weights (std 0.02, norms around 1), and quantizes them with llama.cpp's own quantizer
(Q4_K_M by default, ftype 15), so every tensor type is what `llama-quantize` gives a real
model of that shape: Q4_K and Q6_K matrices, a Q6_K output (or tied token embedding).

The vocabulary is the embedded SmolLM2 model's tokenizer (tokens, merges, ChatML
template) padded with `<|reserved_N|>` control tokens up to 128,256 ids, so llama.cpp
loads and tokenizes the files and the embedding and output matrices have their real
size. The source is written in F16 one tensor at a time (an 8B F32 source would be
32 GB; F16 is 16 GB) and deleted once quantized. Files are cached under
`.tmp/bench/` (ignored by git), keyed by shape and type; the quantizer runs in a child
process (llama.cpp aborts the process on a failed assertion).

Usage: .venv/bin/python -m benchmarks.real_shapes 1b [3b 8b] [--type Q4_K_M]
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the fixtures' GGUF builder and family layouts live in tests/
from tests import gguf_bytes as gb  # noqa: E402

CACHE = ROOT / ".tmp" / "bench"
FTYPES = {"Q4_K_M": 15, "Q4_1": 3, "Q8_0": 7, "Q6_K": 18, "F16": 1}
GGUF_ARRAY, GGUF_INT32, GGUF_UINT32 = 9, 5, 4
CONTROL = 3  # llama_token_type LLAMA_TOKEN_TYPE_CONTROL


@dataclass(frozen=True)
class Shape:
    """A llama model's shape (ggml's tensor names, numpy order (out, in))."""

    name: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    tied: bool
    n_vocab: int = 128256
    rope_base: float = 500000.0

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        """(name, numpy shape) of every tensor, in file order."""
        e, q, kv, ff = self.n_embd, self.n_embd, self.n_head_kv * self.head_dim, self.n_ff
        out = [("token_embd.weight", (self.n_vocab, e))]
        for i in range(self.n_layer):
            p = f"blk.{i}."
            out += [(p + "attn_norm.weight", (e,)), (p + "attn_q.weight", (q, e)),
                    (p + "attn_k.weight", (kv, e)), (p + "attn_v.weight", (kv, e)),
                    (p + "attn_output.weight", (e, q)), (p + "ffn_norm.weight", (e,)),
                    (p + "ffn_gate.weight", (ff, e)), (p + "ffn_up.weight", (ff, e)),
                    (p + "ffn_down.weight", (e, ff))]
        out.append(("output_norm.weight", (e,)))
        if not self.tied:
            out.append(("output.weight", (self.n_vocab, e)))
        return out

    @property
    def parameters(self) -> int:
        return sum(int(np.prod(s)) for _, s in self.tensors())


SHAPES = {
    # Llama-3.2-1B: 16 layers, 2048 wide, 32/8 heads, FFN 8192, tied embeddings.
    "1b": Shape("1b", 16, 2048, 32, 8, 8192, tied=True),
    # Llama-3.2-3B: 28 layers, 3072 wide, 24/8 heads, FFN 8192, tied embeddings.
    "3b": Shape("3b", 28, 3072, 24, 8, 8192, tied=True),
    # Llama-3.1-8B: 32 layers, 4096 wide, 32/8 heads, FFN 14336, its own output matrix.
    "8b": Shape("8b", 32, 4096, 32, 8, 14336, tied=False),
}


def _tokenizer_kv(n_vocab: int) -> dict[str, bytes]:
    """The embedded model's `tokenizer.*` entries as raw GGUF values, its token list and
    token types padded with control tokens up to `n_vocab`."""
    sys.path.insert(0, str(ROOT))
    from engine.formats import gguf_file
    from tests import families

    raw = dict(families.tokenizer_kv())
    header = gguf_file.read_header(families.embedded_path(), keep_arrays=(
        "tokenizer.ggml.tokens", "tokenizer.ggml.token_type"))
    tokens = list(header.metadata["tokenizer.ggml.tokens"].values)
    types = list(header.metadata["tokenizer.ggml.token_type"].values)
    extra = n_vocab - len(tokens)
    if extra < 0:
        raise ValueError(f"a vocabulary of {n_vocab} is smaller than the tokenizer's")
    tokens += [f"<|reserved_{i}|>" for i in range(extra)]
    types += [CONTROL] * extra
    raw["tokenizer.ggml.tokens"] = gb.string_array(tokens)
    raw["tokenizer.ggml.token_type"] = (struct.pack("<IIQ", GGUF_ARRAY, GGUF_INT32, len(types))
                                        + struct.pack(f"<{len(types)}i", *types))
    return raw


def _metadata(shape: Shape) -> dict[str, bytes]:
    sys.path.insert(0, str(ROOT))
    from tests import families

    spec = replace(families.SPECS["llama"], title=f"Variant Studio random llama {shape.name}",
                   n_layer=shape.n_layer, n_embd=shape.n_embd, n_head=shape.n_head,
                   n_head_kv=shape.n_head_kv, head_dim=shape.head_dim, n_ff=shape.n_ff,
                   n_vocab=shape.n_vocab, rope_base=shape.rope_base, context_length=8192,
                   tied=shape.tied)
    kv = {"general.architecture": gb.value(gb.STRING, "llama")}
    for key, (kind, value) in families.metadata(spec).items():
        if key == "general.file_type":
            value = 1  # LLAMA_FTYPE_MOSTLY_F16
        kv[key] = gb.value(kind, value)
    kv.update(_tokenizer_kv(shape.n_vocab))
    return kv


def write_f16(path: Path, shape: Shape, seed: int = 0) -> Path:
    """The F16 source, streamed: one tensor in memory at a time."""
    rng = np.random.default_rng(seed)
    kv = _metadata(shape)
    table, offsets, offset = [], [], 0
    for name, dims in shape.tensors():
        ggml_type = 0 if len(dims) == 1 else 1  # norms F32, matrices F16
        ne = tuple(reversed(dims))
        table.append(gb.tensor_info(name, ne, ggml_type, offset))
        offsets.append(offset)
        offset = gb.align(offset + int(np.prod(dims)) * (4 if ggml_type == 0 else 2))
    head = gb.head(kv, table)
    start = gb.align(len(head))
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as out:
        out.write(head + bytes(start - len(head)))
        for (_name, dims), at in zip(shape.tensors(), offsets, strict=True):
            out.seek(start + at)
            if len(dims) == 1:
                values = (1.0 + 0.1 * rng.standard_normal(dims, dtype=np.float32))
                out.write(values.astype(np.float32).tobytes())
                continue
            for row in range(0, dims[0], 4096):  # a slab at a time: bounded memory
                rows = min(4096, dims[0] - row)
                slab = rng.standard_normal((rows, dims[1]), dtype=np.float32)
                slab *= np.float32(0.02)
                out.write(slab.astype(np.float16).tobytes())
    tmp.replace(path)
    return path


def ensure(size: str, kind: str = "Q4_K_M", threads: int = 2) -> Path:
    """The cached file of `size` ("1b", "3b", "8b") and type, written when missing."""
    shape = SHAPES[size]
    CACHE.mkdir(parents=True, exist_ok=True)
    target = CACHE / f"llama-{size}-{kind}.gguf"
    if target.exists():
        return target
    source = CACHE / f"llama-{size}-F16.gguf"
    started = time.monotonic()
    if not source.exists():
        print(f"writing {source.name} ({shape.parameters / 1e9:.2f} B parameters)",
              file=sys.stderr)
        write_f16(source, shape)
    if kind == "F16":
        return source
    print(f"quantizing to {kind} with llama.cpp", file=sys.stderr)
    sys.path.insert(0, str(ROOT))
    from tests import families

    part = target.with_name(target.name + ".part")
    families._child("quantize", {"threads": threads,
                                 "jobs": [[str(source), str(part), FTYPES[kind]]]},
                    timeout=7200)
    part.replace(target)
    source.unlink()  # the F16 source is an intermediate (16 GB at 8B)
    print(f"{target.name}: {target.stat().st_size / 2**30:.2f} GiB in "
          f"{time.monotonic() - started:.0f} s", file=sys.stderr)
    return target


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("sizes", nargs="+", choices=sorted(SHAPES))
    parser.add_argument("--type", default="Q4_K_M", choices=sorted(FTYPES))
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    for size in args.sizes:
        print(ensure(size, args.type, args.threads))


if __name__ == "__main__":
    main()
