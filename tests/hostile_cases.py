"""The hostile-input table and its builders, shared by the suites that run it.

Every case is built here (no binary blobs are committed) and has its expected outcome
written down in `CASES` (and mirrored in docs/security.md). `test_hostile.py` runs the
table through the real CLI, `test_hostile_engine.py` through the engine process,
`test_hostile_openvino.py` its PEFT cases through an OpenVINO session, and
`test_hostile_bounds.py` measures the time and memory each inspection takes; the fuzz
suite and `scripts/fuzz.py` start from the same builders. This module holds no tests.

Outcomes: "refused: <reason substring>" means exit code 3, exactly one `error:` line
on stderr that names the reason and holds no control character, the catalog
byte-for-byte unchanged and nothing left in the data directory. "accepted-harmless"
means the import succeeds, nothing is created outside the store, and everything the
app shows about the entry is free of control characters.

Surfaces: `adapter` = `adapter add` for the embedded llama.cpp base; `peft` =
`adapter add` for a small OpenVINO model folder the test writes; `model` =
`model add`; `variant` = `variant add` with a scale.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.catalog import digest
from engine.catalog.store import Catalog
from engine.curated.embedded import DEFAULT_MODEL_NAME
from engine.errors import InspectionError
from engine.formats.artifacts import BaseModelInfo
from engine.runtime.client import EngineClient
from tests import factories as f
from tests.gguf_bytes import T, assemble, f32, kv, kv_f32, kv_str, kv_u32, skip_value, string

BASE = DEFAULT_MODEL_NAME
OV_BASE = "ov-base"
ACCEPTED = "accepted-harmless"
ROOT = Path(__file__).resolve().parent.parent
CASE_SECONDS = 20  # a case still running after this counts as a hang

# --------------------------------------------------------------------------- builders


class Unavailable(Exception):
    """The OS lacks what the case needs (a FIFO, /dev/zero, /proc); the test says so."""


@dataclass
class Workshop:
    tmp: Path
    base: BaseModelInfo
    embedded: Path

    def put(self, name: str, data: bytes, suffix: str = ".gguf") -> Path:
        path = self.tmp / f"{name}{suffix}"
        path.write_bytes(data)
        return path

    def folder(self, name: str) -> Path:
        path = self.tmp / name
        path.mkdir()
        return path


def lora_kvs(arch: str | None = "llama", alpha: float | None = 16.0,
             extra: tuple[bytes, ...] = ()) -> list[bytes]:
    kvs = [kv_str("general.type", "adapter"), kv_str("adapter.type", "lora")]
    if arch is not None:
        kvs.insert(0, kv_str("general.architecture", arch))
    if alpha is not None:
        kvs.append(kv_f32("adapter.lora.alpha", alpha))
    return kvs + list(extra)


def pair(target: str = "blk.0.attn_q.weight", rank: int = 8, n_in: int = 576,
         n_out: int = 576, value: float = 0.01) -> list[T]:
    """A LoRA pair in llama.cpp's layout: lora_a ne=(in, rank), lora_b ne=(rank, out)."""
    return [T(f"{target}.lora_a", (n_in, rank), data=f32(n_in * rank, value)),
            T(f"{target}.lora_b", (rank, n_out), data=f32(rank * n_out, value))]


def mini_lora(**kwargs: Any) -> bytes:
    """A valid one-layer adapter for the embedded base (the control for every case)."""
    return assemble(lora_kvs(**kwargs), pair())


def tiny_base(extra: tuple[bytes, ...] = (), drop: tuple[str, ...] = (),
              tensors: list[T] | None = None) -> bytes:
    """A tiny GGUF base our inspection accepts (llama.cpp would not load it)."""
    items = {"general.architecture": kv_str("general.architecture", "llama"),
             "llama.block_count": kv_u32("llama.block_count", 1),
             "llama.embedding_length": kv_u32("llama.embedding_length", 8),
             "llama.attention.head_count": kv_u32("llama.attention.head_count", 2)}
    kvs = [v for k, v in items.items() if k not in drop] + list(extra)
    return assemble(kvs, [T("token_embd.weight", (8, 16))] if tensors is None else tensors)


# GGUF rewriting: copy a real model, changing only metadata (tensor data copied verbatim).

def rewrite_gguf(src: Path, dst: Path, replace: dict[str, bytes]) -> Path:
    """Copy `src` with some metadata entries replaced (or appended): key -> kv bytes."""
    with src.open("rb") as handle:
        buf = handle.read(64 << 20)
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    pos, kvs = 24, []
    for _ in range(n_kv):
        start = pos
        length = struct.unpack_from("<Q", buf, pos)[0]
        key = buf[pos + 8:pos + 8 + length].decode()
        pos = skip_value(buf, pos + 8 + length + 4,
                          struct.unpack_from("<I", buf, pos + 8 + length)[0])
        kvs.append((key, buf[start:pos]))
    infos_start = pos
    for _ in range(n_tensors):
        pos += 8 + struct.unpack_from("<Q", buf, pos)[0]
        pos += 4 + 8 * struct.unpack_from("<I", buf, pos)[0] + 4 + 8
    data_offset = -(-pos // 32) * 32
    pending = dict(replace)
    out = [pending.pop(key, raw) for key, raw in kvs] + list(pending.values())
    head = b"GGUF" + struct.pack("<IQQ", version, n_tensors, len(out)) + b"".join(out)
    head += buf[infos_start:pos]
    head += b"\0" * (-len(head) % 32)
    with src.open("rb") as source, dst.open("wb") as target:
        target.write(head)
        source.seek(data_offset)
        while chunk := source.read(16 << 20):
            target.write(chunk)
    return dst


def base_copy(w: Workshop, name: str, **replace: str) -> Path:
    """The embedded model with some string metadata replaced (keys use '__' for '.')."""
    changes = {k.replace("__", "."): kv_str(k.replace("__", "."), v) for k, v in replace.items()}
    return rewrite_gguf(w.embedded, w.tmp / f"{name}.gguf", changes)


# Safetensors / PEFT


PEFT_Q = "base_model.model.model.layers.0.self_attn.q_proj"
CONFIG = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}


def st_entries(tensors: dict[str, tuple[str, list[int], bytes]]) -> tuple[dict, bytes]:
    header, blob = {}, b""
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    return header, blob


def peft_tensors(module: str = PEFT_Q, rank: int = 8, value: float = 0.01,
                 halves: tuple[str, ...] = ("lora_A", "lora_B")) -> dict:
    shapes = {"lora_A": [rank, 576], "lora_B": [576, rank]}
    return {f"{module}.{h}.weight": ("F32", shapes[h], f32(rank * 576, value)) for h in halves}


def peft_folder(w: Workshop, name: str, weights: bytes | None = None,
                config: dict | str | None = CONFIG) -> Path:
    folder = w.folder(name)
    if weights is None:
        header, blob = st_entries(peft_tensors())
        weights = f.raw_safetensors(header, blob)
    (folder / "adapter_model.safetensors").write_bytes(weights)
    if config is not None:
        text = config if isinstance(config, str) else json.dumps(config)
        (folder / "adapter_config.json").write_text(text)
    return folder


def st(w: Workshop, name: str, header: dict | str | bytes, data: bytes = b"",
       length: int | None = None) -> Path:
    return peft_folder(w, name, f.raw_safetensors(header, data, length))


def st_with(w: Workshop, name: str, change: Callable[[dict], None], data_extra: bytes = b""
            ) -> Path:
    header, blob = st_entries(peft_tensors())
    change(header)
    return st(w, name, header, blob + data_extra)


def ov_folder(w: Workshop, name: str, xml: str | None = None,
              skip: tuple[str, ...] = ()) -> Path:
    """A small OpenVINO IR folder: q and v projections of layer 0, named as optimum does."""
    folder = w.folder(name)
    layers = []
    for i, (module, out) in enumerate((("self_attn.q_proj", 576), ("self_attn.v_proj", 192))):
        layers.append(
            f'<layer id="{i}" name="__module.model.layers.0.{module}/aten::linear/MatMul" '
            'type="MatMul" version="opset1"><data transpose_a="false" transpose_b="true"/>'
            '<input><port id="0"><dim>1</dim><dim>576</dim></port>'
            f'<port id="1"><dim>{out}</dim><dim>576</dim></port></input></layer>')
    files = {
        "openvino_model.xml": xml or ('<?xml version="1.0"?><net name="tiny" version="11">'
                                      f'<layers>{"".join(layers)}</layers></net>'),
        "openvino_model.bin": "\0" * 64,
        "openvino_tokenizer.xml": '<net name="tok"/>',
        "openvino_detokenizer.xml": '<net name="detok"/>',
        "config.json": json.dumps({"model_type": "llama", "num_hidden_layers": 1,
                                   "hidden_size": 576, "num_attention_heads": 9}),
    }
    for file, text in files.items():
        if file not in skip:
            (folder / file).write_text(text)
    return folder


# Filesystem oddities


def fifo(w: Workshop, name: str) -> Path:
    if not hasattr(os, "mkfifo"):
        raise Unavailable("this OS has no FIFOs")
    path = w.tmp / f"{name}.gguf"
    os.mkfifo(path)
    return path


def unix_socket(w: Workshop, name: str) -> Path:
    if not hasattr(socket, "AF_UNIX"):
        raise Unavailable("this OS has no Unix sockets")
    path = w.tmp / f"{name}.gguf"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
    return path


def symlink_to(w: Workshop, name: str, target: str) -> Path:
    if not os.path.exists(target):
        raise Unavailable(f"this OS has no {target}")
    path = w.tmp / f"{name}.gguf"
    os.symlink(target, path)
    return path


def symlink_loop(w: Workshop, name: str) -> Path:
    path = w.tmp / f"{name}.gguf"
    os.symlink(path, path)
    return path


def peft_with_link(w: Workshop, name: str, file: str, target: str) -> Path:
    folder = peft_folder(w, name)
    if not os.path.exists(target):
        raise Unavailable(f"this OS has no {target}")
    (folder / file).unlink()
    os.symlink(target, folder / file)
    return folder


def peft_with_fifo_config(w: Workshop, name: str) -> Path:
    if not hasattr(os, "mkfifo"):
        raise Unavailable("this OS has no FIFOs")
    folder = peft_folder(w, name, config=None)
    os.mkfifo(folder / "adapter_config.json")
    return folder


# Bytes for the cases

HOSTILE_TEXT = "\x1b[2J\x1b[31mPWNED\x07\r\n\x00\u202e../../x"
MAX64 = 2**64 - 1


def cut(data: bytes, at: int) -> bytes:
    return data[:at]


def gguf_header_and_first_key(key_len: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", key_len) + b"k" * 64


def gguf_one_kv(entry: bytes, tensors: list[T] | None = None) -> bytes:
    return assemble(lora_kvs(extra=(entry,)), pair() if tensors is None else tensors)


def array_kv(key: str, item_type: int, count: int, payload: bytes = b"") -> bytes:
    return kv(key, 9, struct.pack("<IQ", item_type, count) + payload)


def data_start(blob: bytes) -> int:
    """Where the tensor data of an `assemble`d mini adapter begins."""
    return len(blob) - 2 * 576 * 8 * 4


# --------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Case:
    id: str
    what: str
    surface: str  # adapter | peft | model | variant
    build: Callable[[Workshop], Path | str]
    cli: str  # "refused: <reason>" or ACCEPTED
    engine: str = ""  # through the engine, when it differs from `cli`

    @property
    def engine_outcome(self) -> str:
        return self.engine or self.cli


def refused(reason: str) -> str:
    return f"refused: {reason}"


def _c(id: str, what: str, surface: str, build: Callable[[Workshop], Path | str], cli: str,
       engine: str = "") -> Case:
    return Case(id, what, surface, build, cli, engine)


NOT_ADAPTER = refused("stored file is not an adapter")
NOT_BASE = refused("base hostile: not a base model")
PEFT_ON_LLAMA = refused("PEFT safetensors LoRA (OpenVINO)")

CASES: tuple[Case, ...] = (
    # ---- empty, tiny, magic, version
    _c("empty-file", "a zero-byte file", "adapter",
       lambda w: w.put("empty", b""), refused("empty file")),
    _c("one-byte", "a single byte", "adapter",
       lambda w: w.put("one", b"\x00"), refused("not a GGUF or safetensors file")),
    _c("tiny-gguf", "'GGUF' and a version, nothing more", "adapter",
       lambda w: w.put("tiny", b"GGUF\x03\x00\x00\x00"), refused("too small to be a GGUF")),
    _c("bad-magic", "a valid adapter with the magic changed to GGML", "adapter",
       lambda w: w.put("magic", b"GGML" + mini_lora()[4:]),
       refused("not a GGUF or safetensors file")),
    _c("random-bytes", "64 KiB of random bytes", "adapter",
       lambda w: w.put("random", np.random.default_rng(6).bytes(65536)),
       refused("not a GGUF or safetensors file")),
    _c("gguf-version-1", "GGUF version 1 (unsupported)", "adapter",
       lambda w: w.put("v1", assemble(lora_kvs(), pair(), version=1)),
       refused("unsupported GGUF version 1")),
    _c("gguf-version-future", "GGUF version 4 (from the future)", "adapter",
       lambda w: w.put("v4", assemble(lora_kvs(), pair(), version=4)),
       refused("unsupported GGUF version 4")),
    _c("gguf-version-max", "GGUF version 2^32-1", "model",
       lambda w: w.put("vmax", assemble(lora_kvs(), pair(), version=2**32 - 1)),
       refused("unsupported GGUF version 4294967295")),
    # ---- truncation
    _c("truncated-in-metadata", "cut inside the metadata", "adapter",
       lambda w: w.put("cut-kv", cut(mini_lora(extra=(kv_str("general.description",
                                                             "d" * 4096),)), 300)),
       refused("truncated GGUF: the value of general.description claims 4096 bytes")),
    _c("truncated-in-tensor-directory", "cut inside the tensor directory", "adapter",
       lambda w: w.put("cut-ti", cut(mini_lora(), data_start(mini_lora()) - 40)),
       refused("truncated GGUF: file ends inside the dimension count of")),
    _c("truncated-in-data", "cut in the middle of the tensor data", "adapter",
       lambda w: w.put("cut-data", cut(mini_lora(), len(mini_lora()) - 1000)),
       refused("lies past the end of the file")),
    _c("truncated-real-base", "the embedded model cut in half", "model",
       lambda w: w.put("half", w.embedded.read_bytes()[:50 << 20]),
       refused("lies past the end of the file")),
    # ---- absurd counts and lengths
    _c("absurd-tensor-count", "2^60 tensors claimed", "adapter",
       lambda w: w.put("nt", assemble(lora_kvs(), pair(), n_tensors=2**60)),
       refused("tensors, more than the file can hold")),
    _c("absurd-kv-count", "2^63 metadata entries claimed", "model",
       lambda w: w.put("nkv", assemble(lora_kvs(), pair(), n_kv=2**63)),
       refused("metadata entries, more than the file can hold")),
    _c("key-length-2^64", "a key length of 2^64-1", "adapter",
       lambda w: w.put("keylen", gguf_header_and_first_key(MAX64)),
       refused("claims a length of 18446744073709551615 bytes")),
    _c("string-length-2^64", "a string value length of 2^64-2", "adapter",
       lambda w: w.put("strlen", gguf_one_kv(kv("general.name", 8, struct.pack("<Q", MAX64 - 1)))),
       refused("claims a length of 18446744073709551614 bytes")),
    _c("string-length-past-end", "a string claiming 1 MiB in a small file", "adapter",
       lambda w: w.put("strend", gguf_one_kv(kv("general.name", 8, struct.pack("<Q", 1 << 20)))),
       refused("claims 1048576 bytes past the end")),
    _c("array-length-2^64", "a uint8 array of 2^64-1 items", "adapter",
       lambda w: w.put("arrlen", gguf_one_kv(array_kv("x.arr", 0, MAX64))),
       refused("array claims 18446744073709551615 items")),
    _c("string-array-length-2^62", "a string array of 2^62 items", "model",
       lambda w: w.put("sarr", gguf_one_kv(array_kv("tokenizer.ggml.tokens", 8, 2**62))),
       refused("array claims 4611686018427387904 items")),
    # ---- tensor directory
    _c("too-many-dimensions", "a tensor with 5 dimensions", "adapter",
       lambda w: w.put("dims5", assemble(lora_kvs(), [T("blk.0.attn_q.weight.lora_a",
                                                        (2, 2, 2, 2, 2))])),
       refused("has 5 dimensions")),
    _c("zero-dimensions", "a tensor with 0 dimensions", "adapter",
       lambda w: w.put("dims0", assemble(lora_kvs(), [T("blk.0.attn_q.weight.lora_a", (),
                                                        data=b"")])),
       refused("has 0 dimensions")),
    _c("zero-dimension", "a dimension of 0 (a rank-0 GGUF LoRA)", "adapter",
       lambda w: w.put("rank0", assemble(lora_kvs(), pair(rank=0))),
       refused("invalid dimension [576, 0]")),
    _c("negative-dimension", "a dimension of 2^64-1 (-1 as int64)", "adapter",
       lambda w: w.put("dimneg", assemble(lora_kvs(), [T("blk.0.attn_q.weight.lora_a",
                                                         (576, MAX64), data=b"")])),
       refused("invalid dimension")),
    _c("element-count-overflow", "dimensions whose product overflows 2^64", "adapter",
       lambda w: w.put("overflow", assemble(lora_kvs(), [T("blk.0.attn_q.weight.lora_a",
                                                           (2**39, 2**39, 2**39), data=b"")])),
       refused("elements (overflow)")),
    _c("tensor-larger-than-file", "2^48 elements claimed in a small file", "adapter",
       lambda w: w.put("huge", assemble(lora_kvs(), [T("blk.0.attn_q.weight.lora_a",
                                                       (2**24, 2**24), data=b"")])),
       refused("lies past the end of the file")),
    _c("overlapping-tensors", "two tensors at the same offset", "adapter",
       lambda w: w.put("overlap", assemble(lora_kvs(), [
           T("blk.0.attn_q.weight.lora_a", (576, 8)),
           T("blk.0.attn_q.weight.lora_b", (8, 576), offset=0)])),
       refused("overlap")),
    _c("offset-out-of-bounds", "a tensor offset of 2^63", "adapter",
       lambda w: w.put("oob", assemble(lora_kvs(), [T("blk.0.attn_q.weight.lora_a", (576, 8)),
                                                    T("blk.0.attn_q.weight.lora_b", (8, 576),
                                                      offset=2**63)])),
       refused("lies past the end of the file")),
    _c("offset-misaligned", "a tensor offset that is not a multiple of 32", "adapter",
       lambda w: w.put("misaligned", assemble(lora_kvs(), [
           T("blk.0.attn_q.weight.lora_a", (576, 8)),
           T("blk.0.attn_q.weight.lora_b", (8, 576), offset=18436)]) + b"\0" * 18436),
       refused("is not aligned to 32 bytes")),
    _c("alignment-not-power-of-two", "general.alignment = 48", "adapter",
       lambda w: w.put("align48", gguf_one_kv(kv_u32("general.alignment", 48))),
       refused("general.alignment must be a power-of-two uint32")),
    _c("alignment-zero", "general.alignment = 0", "model",
       lambda w: w.put("align0", gguf_one_kv(kv_u32("general.alignment", 0))),
       refused("general.alignment must be a power-of-two uint32")),
    _c("alignment-wrong-type", "general.alignment as a string", "adapter",
       lambda w: w.put("alignstr", gguf_one_kv(kv_str("general.alignment", "32"))),
       refused("general.alignment must be a power-of-two uint32")),
    _c("unknown-tensor-type", "a ggml type id of 200", "adapter",
       lambda w: w.put("type200", assemble(lora_kvs(), [T("blk.0.attn_q.weight.lora_a",
                                                          (576, 8), type_id=200)])),
       refused("has unknown type 200")),
    _c("row-not-a-block-multiple", "a Q4_0 row of 10 elements", "adapter",
       lambda w: w.put("block", assemble(lora_kvs(), [T("blk.0.attn_q.weight.lora_a",
                                                        (10, 8), type_id=2, data=b"")])),
       refused("is not a multiple of block 32")),
    # ---- keys and names
    _c("duplicate-key", "general.type given twice", "adapter",
       lambda w: w.put("dupkey", gguf_one_kv(kv_str("general.type", "adapter"))),
       refused("duplicate metadata key general.type")),
    _c("duplicate-tensor-name", "the same tensor name twice", "adapter",
       lambda w: w.put("dupt", assemble(lora_kvs(), pair() + [T("blk.0.attn_q.weight.lora_a",
                                                                (576, 8))])),
       refused("duplicate tensor name blk.0.attn_q.weight.lora_a")),
    _c("empty-key", "a metadata key of length 0", "adapter",
       lambda w: w.put("emptykey", gguf_one_kv(kv_str("", "x"))), refused("is empty")),
    _c("empty-tensor-name", "a tensor named ''", "adapter",
       lambda w: w.put("emptyname", assemble(lora_kvs(), [T("", (576, 8))])),
       refused("has an empty name")),
    _c("key-not-utf8", "a key with invalid UTF-8", "adapter",
       lambda w: w.put("utf8", gguf_one_kv(kv(b"general.\xff\xfe", 8, string("x")))),
       refused("is not valid UTF-8")),
    _c("unknown-value-type", "a value type id of 99", "adapter",
       lambda w: w.put("vt99", gguf_one_kv(kv("x.odd", 99, b"\0" * 8))),
       refused("unknown value type 99")),
    _c("nested-array", "an array of arrays", "adapter",
       lambda w: w.put("nested", gguf_one_kv(array_kv("x.nest", 9, 1, b"\0" * 16))),
       refused("nested arrays are not supported")),
    _c("control-chars-in-tensor-name", "a tensor name holding terminal escapes", "adapter",
       lambda w: w.put("ctlname", assemble(lora_kvs(), pair(target="blk.0\x1b[2J.attn_q"))),
       refused("matches no layer")),
    # ---- metadata of the wrong type
    _c("general-type-integer", "general.type as a uint32", "adapter",
       lambda w: w.put("typeint", assemble([kv_str("general.architecture", "llama"),
                                            kv_u32("general.type", 1)], pair())),
       refused("general.type has type uint32, expected a string")),
    _c("general-type-unknown", "general.type = 'virus'", "adapter",
       lambda w: w.put("typevirus", assemble([kv_str("general.architecture", "llama"),
                                              kv_str("general.type", "virus")], pair())),
       refused("unknown general.type 'virus'")),
    _c("alpha-string", "adapter.lora.alpha as a string", "adapter",
       lambda w: w.put("alphastr", assemble(lora_kvs(alpha=None, extra=(
           kv_str("adapter.lora.alpha", "16"),)), pair())),
       refused("adapter.lora.alpha has type string, expected a float")),
    _c("architecture-integer", "general.architecture as a uint32", "adapter",
       lambda w: w.put("archint", assemble([kv_u32("general.architecture", 7)]
                                           + lora_kvs(arch=None), pair())),
       refused("general.architecture has type uint32, expected a string")),
    _c("block-count-string", "llama.block_count as a string", "model",
       lambda w: w.put("bcstr", tiny_base(extra=(kv_str("llama.block_count", "30"),),
                                          drop=("llama.block_count",))),
       refused("llama.block_count has type string, expected an integer")),
    _c("chat-template-integer", "tokenizer.chat_template as a uint32", "model",
       lambda w: w.put("tplint", tiny_base(extra=(kv_u32("tokenizer.chat_template", 1),))),
       refused("tokenizer.chat_template has type uint32, expected a string")),
    # ---- implausible bases
    _c("absurd-block-count", "llama.block_count = 1000000", "model",
       lambda w: w.put("bc", tiny_base(extra=(kv_u32("llama.block_count", 10**6),),
                                       drop=("llama.block_count",))),
       refused("implausible llama.block_count 1000000")),
    _c("block-count-2^32", "llama.block_count = 2^32-1", "model",
       lambda w: w.put("bc32", tiny_base(extra=(kv_u32("llama.block_count", 2**32 - 1),),
                                         drop=("llama.block_count",))),
       refused("llama.block_count = 4294967295 is out of range")),
    _c("block-count-zero", "llama.block_count = 0", "model",
       lambda w: w.put("bc0", tiny_base(extra=(kv_u32("llama.block_count", 0),),
                                        drop=("llama.block_count",))),
       refused("implausible llama.block_count 0")),
    _c("head-count-zero", "a copy of the embedded base with 0 attention heads", "model",
       lambda w: rewrite_gguf(w.embedded, w.tmp / "heads0.gguf", {
           "llama.attention.head_count": kv_u32("llama.attention.head_count", 0)}),
       refused("llama.attention.head_count = 0 is implausible")),
    _c("embedding-length-mismatch", "a copy whose embedding_length disagrees with its "
       "tensors", "model",
       lambda w: rewrite_gguf(w.embedded, w.tmp / "emb577.gguf", {
           "llama.embedding_length": kv_u32("llama.embedding_length", 577)}),
       refused("llama.embedding_length = 577 disagrees with token_embd.weight")),
    _c("base-without-architecture", "a base with no general.architecture", "model",
       lambda w: w.put("noarch", tiny_base(drop=("general.architecture",))),
       refused("no general.architecture")),
    _c("architecture-path-traversal", "general.architecture = '../../x'", "model",
       lambda w: w.put("archdots", tiny_base(extra=(kv_str("general.architecture",
                                                           "../../x"),),
                                             drop=("general.architecture",))),
       refused("implausible architecture '../../x'")),
    _c("base-without-tensors", "a header-only base", "model",
       lambda w: w.put("notensors", tiny_base(tensors=[])), refused("a model with no tensors")),
    _c("chat-template-too-long", "a 300 000-character chat template", "model",
       lambda w: w.put("tpllong", tiny_base(extra=(kv_str("tokenizer.chat_template",
                                                          "x" * 300_000),))),
       refused("chat template longer than 262144 chars")),
    _c("base-llama-cannot-load", "a copy with an unknown tokenizer model (passes our "
       "checks; llama.cpp refuses it)", "model",
       lambda w: base_copy(w, "badtok", tokenizer__ggml__model="nonsense"),
       ACCEPTED, refused("llama.cpp could not load")),
    _c("base-empty-merges", "a copy with an empty BPE merge list", "model",
       lambda w: rewrite_gguf(w.embedded, w.tmp / "nomerges.gguf", {
           "tokenizer.ggml.merges": array_kv("tokenizer.ggml.merges", 8, 0)}), ACCEPTED),
    # ---- kinds and compatibility
    _c("base-given-as-adapter", "the embedded base model imported as an adapter", "adapter",
       lambda w: w.embedded, refused("is a base model (llama, 30 layers), not an adapter"),
       NOT_ADAPTER),
    _c("adapter-given-as-model", "a LoRA adapter registered as a base model", "model",
       lambda w: w.put("as-model", mini_lora()), refused("is a LoRA adapter, not a base model"),
       NOT_BASE),
    _c("other-architecture", "an adapter for qwen2", "adapter",
       lambda w: w.put("qwen", mini_lora(arch="qwen2")), refused("adapter is for 'qwen2'")),
    _c("no-architecture", "an adapter without general.architecture", "adapter",
       lambda w: w.put("noarch-a", mini_lora(arch=None)),
       refused("declares no general.architecture")),
    _c("control-chars-in-architecture", "general.architecture with terminal escapes", "adapter",
       lambda w: w.put("ctlarch", mini_lora(arch="llama\x1b[2J\x07")),
       refused("adapter is for 'llama\\x1b[2J\\x07', the base is 'llama'")),
    _c("adapter-type-not-lora", "adapter.type = 'ia3'", "adapter",
       lambda w: w.put("ia3", assemble([kv_str("general.architecture", "llama"),
                                        kv_str("general.type", "adapter"),
                                        kv_str("adapter.type", "ia3")], pair())),
       refused("adapter.type is 'ia3', expected 'lora'")),
    _c("wrong-shapes", "lora_a sized for a 512-wide layer", "adapter",
       lambda w: w.put("shape", assemble(lora_kvs(), pair(n_in=512))),
       refused("1 layer(s) with wrong shapes")),
    _c("rank-disagreement", "lora_a rank 8, lora_b rank 4", "adapter",
       lambda w: w.put("ranks", assemble(lora_kvs(), pair()[:1] + [
           T("blk.0.attn_q.weight.lora_b", (4, 576))])),
       refused("lora_a rank 8 differs from lora_b rank 4")),
    _c("mixed-ranks", "two layers with ranks 8 and 4", "adapter",
       lambda w: w.put("mixed", assemble(lora_kvs(), pair() + pair("blk.1.attn_q.weight", 4))),
       refused("layers disagree on rank ([4, 8])")),
    _c("three-dimensional-halves", "LoRA halves with three dimensions", "adapter",
       lambda w: w.put("3d", assemble(lora_kvs(), [T("blk.0.attn_q.weight.lora_a", (576, 8, 1)),
                                                   T("blk.0.attn_q.weight.lora_b", (8, 576, 1))])),
       refused("LoRA halves must be 2-D")),
    _c("missing-lora-a", "a lora_b without its lora_a", "adapter",
       lambda w: w.put("noa", assemble(lora_kvs(), pair()[1:] + pair("blk.1.attn_q.weight"))),
       refused("blk.0.attn_q.weight has no lora_a")),
    _c("missing-lora-b", "a lora_a without its lora_b", "adapter",
       lambda w: w.put("nob", assemble(lora_kvs(), pair()[:1] + pair("blk.1.attn_q.weight"))),
       refused("blk.0.attn_q.weight has no lora_b")),
    _c("unknown-tensor-suffix", "a tensor ending in .lora_c", "adapter",
       lambda w: w.put("lorac", assemble(lora_kvs(), pair() + [T("blk.0.attn_q.weight.lora_c",
                                                                 (576, 8))])),
       refused("is not a LoRA half")),
    _c("no-lora-tensors", "an adapter holding only a plain weight", "adapter",
       lambda w: w.put("plain", assemble(lora_kvs(), [T("blk.0.attn_q.weight", (576, 576))])),
       refused("no LoRA tensors (.lora_a/.lora_b) in the file")),
    _c("header-only-adapter", "an adapter with no tensors at all", "adapter",
       lambda w: w.put("hdr", assemble(lora_kvs(), [])), refused("no LoRA tensors")),
    _c("targets-match-nothing", "LoRA pairs for blk.99 (the base has 30 layers)", "adapter",
       lambda w: w.put("blk99", assemble(lora_kvs(), pair("blk.99.attn_q.weight"))),
       refused("matches no layer: 0 of 2 tensors attach")),
    _c("targets-partly-missing", "one pair for blk.0, one for blk.99", "adapter",
       lambda w: w.put("blk0-99", assemble(lora_kvs(), pair() + pair("blk.99.attn_q.weight"))),
       refused("llama.cpp refuses an adapter whose base tensor is missing")),
    _c("unsupported-adapter-dtype", "LoRA halves stored as I32", "adapter",
       lambda w: w.put("i32", assemble(lora_kvs(), [
           T(t.name, t.dims, 26, t.data) for t in pair()])),
       refused("unsupported tensor type I32")),
    _c("declared-base-mismatch", "adapter.base.sha256 of another model", "adapter",
       lambda w: w.put("othersha", mini_lora(extra=(kv_str("adapter.base.sha256", "0" * 64),))),
       refused("adapter declares base sha256 0000000000000000")),
    # ---- alpha and values
    _c("alpha-nan", "adapter.lora.alpha = NaN", "adapter",
       lambda w: w.put("anan", mini_lora(alpha=math.nan)), refused("alpha is NaN")),
    _c("alpha-infinite", "adapter.lora.alpha = +inf", "adapter",
       lambda w: w.put("ainf", mini_lora(alpha=math.inf)), refused("alpha is infinite")),
    _c("alpha-negative", "adapter.lora.alpha = -16", "adapter",
       lambda w: w.put("aneg", mini_lora(alpha=-16.0)), refused("alpha -16 is negative")),
    _c("alpha-huge", "adapter.lora.alpha = 1e30", "adapter",
       lambda w: w.put("ahuge", mini_lora(alpha=1e30)), refused("is absurd (at most 4096)")),
    _c("nan-weights", "a lora_b full of NaN", "adapter",
       lambda w: w.put("wnan", assemble(lora_kvs(), pair()[:1] + [
           T("blk.0.attn_q.weight.lora_b", (8, 576), data=f32(8 * 576, math.nan))])),
       refused("weights contain NaN or infinite values")),
    _c("infinite-weights", "a lora_a holding +inf", "adapter",
       lambda w: w.put("winf", assemble(lora_kvs(), pair(value=math.inf))),
       refused("weights contain NaN or infinite values")),
    # ---- scales
    _c("scale-nan", "a variant with scale NaN", "variant", lambda w: "nan",
       refused("scale is NaN"), refused("is not finite")),
    _c("scale-infinite", "a variant with scale inf", "variant", lambda w: "inf",
       refused("scale is infinite"), refused("is not finite")),
    _c("scale-negative", "a variant with scale -1", "variant", lambda w: "-1",
       refused("scale -1 is negative")),
    _c("scale-huge", "a variant with scale 1e9", "variant", lambda w: "1e9",
       refused("scale 1e+09 is absurd")),
    # ---- safetensors structure (PEFT adapters for the OpenVINO base)
    _c("st-too-small", "a 4-byte .safetensors file", "peft",
       lambda w: peft_folder(w, "st-small", b"\x01\x00\x00\x00"),
       refused("too small to be a safetensors file")),
    _c("st-header-longer-than-file", "a header length of 1000 in a 30-byte file", "peft",
       lambda w: st(w, "st-long", "{}" + " " * 20, length=1000),
       refused("header length 1000 is longer than the file")),
    _c("st-header-over-100mb", "a header length of 200 MB", "peft",
       lambda w: st(w, "st-100mb", "{}", length=200_000_000),
       refused("header of 200000000 bytes exceeds the 100 MB limit")),
    _c("st-header-length-2^64", "a header length of 2^64-1", "peft",
       lambda w: st(w, "st-2-64", "{}", length=MAX64),
       refused("exceeds the 100 MB limit")),
    _c("st-header-empty", "a header length of 0", "peft",
       lambda w: st(w, "st-empty", "", data=b"\0" * 16), refused("header is empty")),
    _c("st-header-not-json", "a header that is not JSON", "peft",
       lambda w: st(w, "st-notjson", "{not json}"), refused("header is not valid UTF-8 JSON")),
    _c("st-header-not-utf8", "a header with invalid UTF-8", "peft",
       lambda w: st(w, "st-utf8", b'{"\xff": 1}'), refused("header is not valid UTF-8 JSON")),
    _c("st-header-not-object", "a header that is a JSON array", "peft",
       lambda w: st(w, "st-array", "[1, 2]"), refused("header is not a JSON object")),
    _c("st-header-deeply-nested", "100 000 nested JSON arrays", "peft",
       lambda w: st(w, "st-deep", "[" * 100_000), refused("nested too deeply")),
    _c("st-offsets-past-end", "data_offsets beyond the file", "peft",
       lambda w: st_with(w, "st-past", lambda h: h[f"{PEFT_Q}.lora_B.weight"].update(
           data_offsets=[18432, 18432 + 10**9])),
       refused("lies past the end of the file")),
    _c("st-shape-disagrees", "a shape that disagrees with its byte span", "peft",
       lambda w: st_with(w, "st-shape", lambda h: h[f"{PEFT_Q}.lora_A.weight"].update(
           shape=[8, 575])),
       refused("does not match its 18432 bytes")),
    _c("st-overlapping-ranges", "two tensors over the same bytes", "peft",
       lambda w: st_with(w, "st-overlap", lambda h: h[f"{PEFT_Q}.lora_B.weight"].update(
           data_offsets=[0, 18432])),
       refused("tensor data ranges overlap")),
    _c("st-gap", "a gap between tensor ranges", "peft",
       lambda w: st_with(w, "st-gap", lambda h: h[f"{PEFT_Q}.lora_B.weight"].update(
           data_offsets=[18436, 36868]), b"\0" * 4),
       refused("tensor data ranges leave a gap")),
    _c("st-trailing-bytes", "bytes after the last tensor", "peft",
       lambda w: st_with(w, "st-trail", lambda h: None, b"TRAILING"),
       refused("8 trailing bytes after the data")),
    _c("st-duplicate-keys", "a tensor name twice in the JSON header", "peft",
       lambda w: st(w, "st-dup", '{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
                    '"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}', b"\0" * 4),
       refused("duplicate JSON key a")),
    _c("st-unsupported-dtype", "dtype F128", "peft",
       lambda w: st_with(w, "st-f128", lambda h: h[f"{PEFT_Q}.lora_A.weight"].update(
           dtype="F128")),
       refused("unsupported dtype 'F128'")),
    _c("st-integer-dtype", "LoRA halves stored as I32 (valid safetensors)", "peft",
       lambda w: st_with(w, "st-i32", lambda h: [v.update(dtype="I32") for v in h.values()]),
       refused("unsupported tensor type I32"), PEFT_ON_LLAMA),
    _c("st-negative-offset", "a data_offsets pair [-4, 0]", "peft",
       lambda w: st_with(w, "st-negoff", lambda h: h[f"{PEFT_Q}.lora_A.weight"].update(
           data_offsets=[-4, 0])),
       refused("has invalid data_offsets")),
    _c("st-huge-dimension", "a shape of [2^62]", "peft",
       lambda w: st_with(w, "st-hugedim", lambda h: h[f"{PEFT_Q}.lora_A.weight"].update(
           shape=[2**62])),
       refused("has an invalid shape [4611686018427387904]")),
    _c("st-negative-dimension", "a shape of [-8, 576]", "peft",
       lambda w: st_with(w, "st-negdim", lambda h: h[f"{PEFT_Q}.lora_A.weight"].update(
           shape=[-8, 576])),
       refused("has an invalid shape [-8, 576]")),
    _c("st-metadata-not-strings", "__metadata__ holding a number", "peft",
       lambda w: st_with(w, "st-meta", lambda h: h.update(__metadata__={"x": 1})),
       refused("__metadata__ must map strings to strings")),
    _c("st-malformed-entry", "a tensor entry with an extra field", "peft",
       lambda w: st_with(w, "st-extra", lambda h: h[f"{PEFT_Q}.lora_A.weight"].update(
           evil="x")),
       refused("has a malformed entry")),
    # ---- PEFT semantics
    _c("peft-names-match-nothing", "PEFT tensors for a module the base does not have",
       "peft",
       lambda w: peft_folder(w, "peft-nomatch", f.raw_safetensors(*st_entries(peft_tensors(
           "base_model.model.model.layers.0.self_attn.zz_proj")))),
       refused("matches no layer"), PEFT_ON_LLAMA),
    _c("peft-missing-lora-b", "a lora_A without its lora_B", "peft",
       lambda w: peft_folder(w, "peft-nob", f.raw_safetensors(*st_entries(peft_tensors(
           halves=("lora_A",))))),
       refused("has no lora_B"), PEFT_ON_LLAMA),
    _c("peft-unknown-suffix", "a tensor ending in .lora_C.weight", "peft",
       lambda w: peft_folder(w, "peft-c", f.raw_safetensors(*st_entries({
           **peft_tensors(), f"{PEFT_Q}.lora_C.weight": ("F32", [1], f32(1))}))),
       refused("is not a LoRA half"), PEFT_ON_LLAMA),
    _c("peft-rank-0", "lora_A [0, 576] and lora_B [576, 0]", "peft",
       lambda w: peft_folder(w, "peft-r0", f.raw_safetensors(*st_entries(peft_tensors(rank=0))),
                             {**CONFIG, "r": 0}),
       refused("rank 0: the adapter has no effect"), PEFT_ON_LLAMA),
    _c("peft-wrong-shapes", "lora_A sized for a 512-wide layer", "peft",
       lambda w: peft_folder(w, "peft-shape", f.raw_safetensors(*st_entries({
           f"{PEFT_Q}.lora_A.weight": ("F32", [8, 512], f32(8 * 512)),
           f"{PEFT_Q}.lora_B.weight": ("F32", [576, 8], f32(576 * 8))}))),
       refused("with wrong shapes"), PEFT_ON_LLAMA),
    _c("peft-nan-weights", "a lora_B full of NaN", "peft",
       lambda w: peft_folder(w, "peft-nan", f.raw_safetensors(*st_entries({
           **peft_tensors(halves=("lora_A",)),
           f"{PEFT_Q}.lora_B.weight": ("F32", [576, 8], f32(576 * 8, math.nan))}))),
       refused("weights contain NaN or infinite values"), PEFT_ON_LLAMA),
    _c("peft-config-alpha-nan", "adapter_config.json lora_alpha: NaN", "peft",
       lambda w: peft_folder(w, "peft-anan", config='{"r": 8, "lora_alpha": NaN}'),
       refused("alpha is NaN"), PEFT_ON_LLAMA),
    _c("peft-config-alpha-string", "adapter_config.json lora_alpha: '16'", "peft",
       lambda w: peft_folder(w, "peft-astr", config={**CONFIG, "lora_alpha": "16"}),
       refused("lora_alpha must be a number"), PEFT_ON_LLAMA),
    _c("peft-config-rank-mismatch", "adapter_config.json r: 16 for rank-8 tensors", "peft",
       lambda w: peft_folder(w, "peft-r16", config={**CONFIG, "r": 16}),
       refused("says r=16 but the tensors have rank 8"), PEFT_ON_LLAMA),
    _c("peft-config-not-json", "adapter_config.json that is not JSON", "peft",
       lambda w: peft_folder(w, "peft-cfgbad", config="{r: 8"),
       refused("adapter_config.json is not valid JSON")),
    _c("peft-config-deeply-nested", "adapter_config.json with 100 000 nested arrays", "peft",
       lambda w: peft_folder(w, "peft-cfgdeep", config="[" * 100_000),
       refused("adapter_config.json is nested too deeply")),
    _c("peft-config-fifo", "adapter_config.json that is a FIFO", "peft",
       lambda w: peft_with_fifo_config(w, "peft-cfgfifo"), refused("a FIFO (named pipe)")),
    _c("peft-weights-link-to-dev-zero", "adapter_model.safetensors -> /dev/zero", "peft",
       lambda w: peft_with_link(w, "peft-zero", "adapter_model.safetensors", "/dev/zero"),
       refused("a device, expected a regular file")),
    _c("peft-on-llama-base", "a valid PEFT adapter for the llama.cpp base", "adapter",
       lambda w: peft_folder(w, "peft-llama"), PEFT_ON_LLAMA),
    _c("gguf-on-openvino-base", "a valid GGUF adapter for the OpenVINO base", "peft",
       lambda w: w.put("gguf-ov", mini_lora()), refused("GGUF LoRA (llama.cpp)"), ACCEPTED),
    # ---- OpenVINO model folders
    _c("ov-missing-tokenizer", "an OpenVINO folder without its tokenizer", "model",
       lambda w: ov_folder(w, "ov-notok", skip=("openvino_tokenizer.xml",)),
       refused("openvino_tokenizer.xml is missing")),
    _c("ov-billion-laughs", "an OpenVINO model XML with exponential entities", "model",
       lambda w: ov_folder(w, "ov-laughs", xml=(
           '<?xml version="1.0"?><!DOCTYPE net [<!ENTITY a "aaaaaaaaaa">'
           + "".join(f'<!ENTITY {c} "{("&" + p + ";") * 10}">' for p, c in
                     zip("abcdefgh", "bcdefghi", strict=True))
           + ']><net name="&i;"><layers/></net>')),
       refused("malformed model XML")),
    _c("ov-xml-link-to-dev-zero", "openvino_model.xml -> /dev/zero", "model",
       lambda w: ov_with_link(w, "ov-zero"), refused("a device, expected a regular file")),
    _c("ov-config-deeply-nested", "config.json with 100 000 nested arrays", "model",
       lambda w: ov_with_config(w, "ov-deep", "[" * 100_000),
       refused("config.json is nested too deeply")),
    # ---- filesystem
    _c("directory", "an empty directory", "adapter",
       lambda w: w.folder("a-dir"), refused("a directory, expected a model or adapter file"),
       refused("a directory, expected a regular file")),
    _c("fifo", "a FIFO (opening it would block)", "adapter",
       lambda w: fifo(w, "fifo"), refused("a FIFO (named pipe), expected a regular file")),
    _c("fifo-as-model", "a FIFO given to model add", "model",
       lambda w: fifo(w, "fifo-model"), refused("a FIFO (named pipe), expected a regular file")),
    _c("unix-socket", "a Unix socket", "adapter",
       lambda w: unix_socket(w, "sock"), refused("a socket, expected a regular file")),
    _c("symlink-loop", "a symlink to itself", "adapter",
       lambda w: symlink_loop(w, "loop"), refused("symlink loop")),
    _c("symlink-to-dev-zero", "a symlink to /dev/zero (reads never end)", "adapter",
       lambda w: symlink_to(w, "zero", "/dev/zero"), refused("a device, expected a regular file")),
    _c("symlink-to-dev-zero-as-model", "a symlink to /dev/zero given to model add", "model",
       lambda w: symlink_to(w, "zero-model", "/dev/zero"),
       refused("a device, expected a regular file")),
    _c("device-node", "/dev/null itself", "model",
       lambda w: dev_path("/dev/null"), refused("a device, expected a regular file")),
    _c("symlink-to-proc", "a symlink to /proc/self/status (size 0, has content)", "adapter",
       lambda w: symlink_to(w, "proc", "/proc/self/status"), refused("a kernel pseudo-file")),
    _c("missing-file", "a path that does not exist", "adapter",
       lambda w: w.tmp / "nothing-here.gguf", refused("no such file")),
    _c("dangling-symlink", "a symlink to a missing file", "model",
       lambda w: dangling(w), refused("no such file")),
    # ---- harmless metadata, shown safely
    _c("metadata-path-traversal", "names and URLs of '../../x' in an adapter's metadata",
       "adapter",
       lambda w: w.put("dots", mini_lora(extra=(
           kv_str("general.name", "../../x"), kv_str("general.source.url", "../../../x"),
           kv_u32("general.base_model.count", 1),
           kv_str("general.base_model.0.name", "../../../../etc/passwd")))), ACCEPTED),
    _c("metadata-control-chars", "terminal escapes, NUL and bidi overrides in metadata",
       "adapter",
       lambda w: w.put("ctl", mini_lora(extra=(
           kv_str("general.name", HOSTILE_TEXT), kv_u32("general.base_model.count", 1),
           kv_str("general.base_model.0.name", HOSTILE_TEXT)))), ACCEPTED),
    _c("base-metadata-hostile", "a base copy whose general.name holds escapes and '../../x'",
       "model", lambda w: base_copy(w, "hostile-name", general__name=HOSTILE_TEXT), ACCEPTED),
    _c("huge-metadata-array", "a base copy with a 1 000 000-item metadata array", "model",
       lambda w: rewrite_gguf(w.embedded, w.tmp / "bigarray.gguf", {
           "x.big": array_kv("x.big", 0, 10**6, b"\x01" * 10**6)}), ACCEPTED),
    # ---- chat templates (accepted at import, never executed there; refused when used)
    _c("template-python-internals", "a chat template reaching for __class__.__mro__",
       "model",
       lambda w: base_copy(w, "tpl-internals", tokenizer__chat_template=(
           "{{ ''.__class__.__mro__[1].__subclasses__() }}")),
       ACCEPTED, refused("chat template tried something unsafe")),
    _c("template-never-terminates", "a chat template with 10^10 loop iterations", "model",
       lambda w: base_copy(w, "tpl-endless", tokenizer__chat_template=(
           "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")),
       ACCEPTED, refused("chat template did not finish within 2 s")),
    _c("template-syntax-error", "a chat template with a syntax error", "model",
       lambda w: base_copy(w, "tpl-syntax", tokenizer__chat_template="{% for m in messages %}"),
       ACCEPTED, refused("chat template has a syntax error")),
    _c("template-memory-bomb", "a chat template building a 10^8-character string", "model",
       lambda w: base_copy(w, "tpl-bomb", tokenizer__chat_template="{{ 'x' * 100000000 }}"),
       ACCEPTED, refused("chat template output exceeds")),
    _c("template-memory-doubling", "a chat template doubling a string 40 times", "model",
       lambda w: base_copy(w, "tpl-double", tokenizer__chat_template=(
           "{% set ns = namespace(s='x') %}{% for i in range(40) %}"
           "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}")),
       ACCEPTED, refused("chat template used too much memory")),
    _c("template-deeply-nested", "a chat template nesting 300 parentheses (found by "
       "fuzzing: RecursionError while compiling)", "model",
       lambda w: base_copy(w, "tpl-nested", tokenizer__chat_template=(
           "{{ " + "(" * 300 + "1" + ")" * 300 + " }}")),
       ACCEPTED, refused("chat template is nested too deeply to compile")),
)


def dev_path(path: str) -> Path:
    if not os.path.exists(path):
        raise Unavailable(f"this OS has no {path}")
    return Path(path)


def dangling(w: Workshop) -> Path:
    path = w.tmp / "dangling.gguf"
    os.symlink(w.tmp / "gone.gguf", path)
    return path


def ov_with_link(w: Workshop, name: str) -> Path:
    folder = ov_folder(w, name)
    if not os.path.exists("/dev/zero"):
        raise Unavailable("this OS has no /dev/zero")
    (folder / "openvino_model.xml").unlink()
    os.symlink("/dev/zero", folder / "openvino_model.xml")
    return folder


def ov_with_config(w: Workshop, name: str, text: str) -> Path:
    folder = ov_folder(w, name)
    (folder / "config.json").write_text(text)
    return folder


CASE_IDS = [c.id for c in CASES]
assert len(set(CASE_IDS)) == len(CASE_IDS), "case ids must be unique"


def build(case: Case, w: Workshop) -> Path | str:
    try:
        return case.build(w)
    except Unavailable as exc:
        pytest.skip(f"{case.id}: {exc}")


# --------------------------------------------------------------------------- harness


@contextlib.contextmanager
def deadline(seconds: float, what: str) -> Iterator[None]:
    """Fail (instead of hanging the suite) if the body runs longer than `seconds`."""

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"{what}: still running after {seconds} s (a hang)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def printable_everywhere(value: Any) -> bool:
    """True if every string inside `value` is free of control characters."""
    if isinstance(value, str):
        return value.isprintable()
    if isinstance(value, dict):
        return all(printable_everywhere(k) and printable_everywhere(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(printable_everywhere(v) for v in value)
    return True


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}



def markdown_rows() -> str:
    """The table for docs/security.md (python -c 'from tests.hostile_cases import *; ...')."""
    lines = []
    for c in CASES:
        cells = [f"`{c.id}`", c.what.replace("|", "\\|"), c.surface,
                 c.cli.replace("|", "\\|"), c.engine_outcome.replace("|", "\\|")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary() -> dict[str, int]:
    return {
        "cases": len(CASES),
        "cli refused": sum(c.cli != ACCEPTED for c in CASES),
        "cli accepted-harmless": sum(c.cli == ACCEPTED for c in CASES),
        "engine refused": sum(c.engine_outcome != ACCEPTED for c in CASES),
        "engine accepted-harmless": sum(c.engine_outcome == ACCEPTED for c in CASES),
    }


# --------------------------------------------------------------------------- engine side

ENGINE_PROMPT = {"text": "Hello", "chat": True}
ENGINE_SAMPLING = {"temperature": 0.0, "max_tokens": 2, "repeat_penalty": 1.0}
ENGINE_TIMEOUT = 120  # seconds; a request still running then is a hang


@dataclass
class EngineWorld:
    """A catalog with a good control variant and the one engine process of a module."""

    catalog: Catalog
    client: EngineClient
    workshop: Workshop
    pid: int


def wire_params(spec: dict[str, Any]) -> dict[str, Any]:
    """The raw `generate` params for a (possibly tampered) spec dict, as sent on the wire:
    what the engine must refuse is sent as data, never built from the typed request."""
    spec["identity"]["context"]["n_ctx"] = 512  # small contexts keep the modules quick
    return {"spec": spec, "prompt": ENGINE_PROMPT, "sampling": ENGINE_SAMPLING}


def raw_generate(client: EngineClient, params: dict[str, Any],
                 timeout: float = ENGINE_TIMEOUT) -> Any:
    return client.submit_raw("generate", params).wait(timeout)


def true_digest(path: Path) -> str:
    """The file's real digest, so the engine's digest check passes and its inspection
    has to refuse the file on its own (zeros for what cannot be hashed)."""
    try:
        return digest.content_digest(path)
    except InspectionError:
        return "0" * 64


def with_hostile_adapter(spec: dict[str, Any], target: Path, name: str) -> dict[str, Any]:
    """`spec` (a variant's, as a dict) with its adapter replaced by the file `target`,
    under its true digest."""
    path = target
    weights = path / "adapter_model.safetensors"
    if path.is_dir() and (weights.exists() or weights.is_symlink()):
        path = weights  # the engine is handed a stored PEFT adapter's weights file
    sha = true_digest(path)
    spec["name"] = name
    spec["adapters"] = [{"name": "hostile", "path": str(path), "sha256": sha, "scale": 1.0,
                         "config_sha256": None}]
    spec["identity"]["adapters"] = [{"name": "hostile", "sha256": sha, "scale": 1.0}]
    return spec

