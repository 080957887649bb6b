"""A fake inference backend for the unit tier: the backend interface of
`engine.runtime.backend` (ResidentModel, Context, TextStream) over small tables, no
native code.

The model is a character-level vocabulary (a few special tokens, then letters, digits
and punctuation). The next-token logits after a token are a row of a table of the
previous token, plus, for each applied adapter, its own table (seeded by the adapter's
sha256) times its scale, so which adapters are applied and at what scale changes the
output measurably. The base table makes greedy decoding walk the alphabet, then '.',
then end: any prompt's greedy answer on the base is `GREEDY_ANSWER` (an end token, so
exact match and the "eos" finish can be tested).

Like llama.cpp, the numbers depend a little on how the cache was filled: every cached
token carries a state that hashes the tokens before it and its offset in the batch it
was decoded in, and the logits move by about 1e-4 with that state. The greedy tokens
never change, but a prefix cache that reused a different prefix, or cut the prompt into
other chunks than a cold run, gives other log-probabilities: warm = cold means something.

The base file is a real GGUF (`write_base`: tiny tensors, this vocabulary, a ChatML
template), so the catalog, the digest checks and adapter validation run unchanged; only
loading is replaced. `FakeBackend` is the loader tests put into
`engine.runtime.backend.TEST_LOADERS` (`install`); it refuses any file that is not the
fake base, so a real model never runs on fake numbers.
"""

from __future__ import annotations

import codecs
import contextlib
import string
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.catalog import imports
from engine.catalog.identity import ComputeProfile
from engine.catalog.store import AdapterSpec, Catalog
from engine.errors import Cancelled, EngineError, RefusedError
from engine.formats import artifacts
from engine.runtime import backend
from engine.runtime.backend import AdapterSet
from engine.runtime.tokens import common_prefix
from tests import factories

BASE_NAME = "Variant Studio fake base"
SPECIALS = ("<s>", "</s>", "<|im_start|>", "<|im_end|>", "<unk>")
BOS, EOS, IM_START, IM_END, UNK = range(len(SPECIALS))
CHARS = string.ascii_lowercase + string.ascii_uppercase + string.digits + " .,:;!?'\"-_()<>|/\n"
VOCAB = SPECIALS + tuple(CHARS)
N_VOCAB = len(VOCAB)
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
GREEDY_ANSWER = string.ascii_lowercase + "."
# The GGUF's shapes (a llama layout: one layer, 8 wide) only have to pass inspection and
# adapter validation; nothing computes with them.
WIDTH, FF, CONTEXT = 8, 16, 4096
ROLES = ("attn_q", "attn_k", "attn_v", "attn_output")
# How far the cache state moves the logits: well below the base table's margins (so
# greedy tokens never change) and well above float32 rounding (so log-probabilities do).
STATE_WEIGHT = 1e-3
STATE_MOD = 1_000_003
MIN_CAPACITY = 512  # KV cells, doubled up to n_ctx, as the llama.cpp backend allocates
BYTES_PER_CELL = 64
PAUSE_TIMEOUT = 30.0


# --------------------------------------------------------------------------- vocabulary


def token_id(text: str) -> int:
    return VOCAB.index(text)


def tokenize(text: str, add_special: bool, parse_special: bool = True) -> list[int]:
    """Characters to ids (unknown ones to <unk>); special tokens' texts are parsed as
    single tokens when `parse_special`, as llama.cpp does."""
    ids = [BOS] if add_special else []
    at = 0
    while at < len(text):
        special = next((i for i, s in enumerate(SPECIALS[:IM_END + 1])
                        if parse_special and text.startswith(s, at)), None)
        if special is not None:
            ids.append(special)
            at += len(SPECIALS[special])
            continue
        char = text[at]
        ids.append(VOCAB.index(char) if char in CHARS else UNK)
        at += 1
    return ids


def base_table() -> np.ndarray:
    """Row `prev`: the logits of the token after `prev`. Noise of std 0.5, the successor
    (a..z, '.', then the end) 8 above it, specials far below except where they follow."""
    rng = np.random.default_rng(20240601)
    table = rng.normal(0.0, 0.5, (N_VOCAB, N_VOCAB))
    table[:, :len(SPECIALS)] -= 8.0
    for prev in range(N_VOCAB):
        text = VOCAB[prev]
        if text in string.ascii_lowercase[:-1]:
            after = token_id(chr(ord(text) + 1))
        elif text == "z":
            after = token_id(".")
        elif text == ".":
            after = EOS
        else:
            after = token_id("a")
        table[prev, after] += 16.0 if after == EOS else 8.0
    return table


def adapter_table(sha256: str) -> np.ndarray:
    """An adapter's own logit table (std 3: at scale 1 it changes most greedy choices)."""
    return np.random.default_rng(int(sha256[:16], 16)).normal(0.0, 3.0, (N_VOCAB, N_VOCAB))


# --------------------------------------------------------------------------- files


def write_base(path: Path, name: str = BASE_NAME) -> Path:
    """The fake base as a GGUF file: a one-layer llama layout of F32 zeros, this
    vocabulary, BOS/EOS ids and the ChatML template (under another `name`, a file the
    fake refuses to serve)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(name)
    writer.add_string("general.type", "model")
    writer.add_uint32("general.file_type", 0)
    writer.add_uint32("llama.vocab_size", N_VOCAB)
    writer.add_uint32("llama.context_length", CONTEXT)
    writer.add_uint32("llama.embedding_length", WIDTH)
    writer.add_uint32("llama.block_count", 1)
    writer.add_uint32("llama.feed_forward_length", FF)
    writer.add_uint32("llama.attention.head_count", 2)
    writer.add_uint32("llama.attention.head_count_kv", 2)
    writer.add_uint32("llama.rope.dimension_count", WIDTH // 2)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_array("tokenizer.ggml.tokens", list(VOCAB))
    writer.add_array("tokenizer.ggml.token_type",
                     [3 if i < len(SPECIALS) else 1 for i in range(N_VOCAB)])
    writer.add_uint32("tokenizer.ggml.bos_token_id", BOS)
    writer.add_uint32("tokenizer.ggml.eos_token_id", IM_END)
    writer.add_bool("tokenizer.ggml.add_bos_token", False)
    writer.add_string("tokenizer.chat_template", CHAT_TEMPLATE)
    tensors = {"token_embd.weight": (N_VOCAB, WIDTH), "output_norm.weight": (WIDTH,),
               "output.weight": (N_VOCAB, WIDTH), "blk.0.attn_norm.weight": (WIDTH,),
               "blk.0.ffn_norm.weight": (WIDTH,), "blk.0.ffn_gate.weight": (FF, WIDTH),
               "blk.0.ffn_up.weight": (FF, WIDTH), "blk.0.ffn_down.weight": (WIDTH, FF)}
    tensors.update({f"blk.0.{role}.weight": (WIDTH, WIDTH) for role in ROLES})
    for name, shape in tensors.items():
        writer.add_tensor(name, np.zeros(shape, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# --------------------------------------------------------------------------- the backend


class FakeStream:
    """A `TextStream`: token texts as UTF-8 (special tokens render as nothing)."""

    def __init__(self) -> None:
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, token: int) -> str:
        return self.decoder.decode(piece(token))

    def finish(self) -> str:
        return self.decoder.decode(b"", final=True)


def piece(token: int) -> bytes:
    return b"" if token < len(SPECIALS) else VOCAB[token].encode()


class FakeContext:
    """A `Context`: the cached tokens with their states, the prefix cache of the llama.cpp
    backend (whole chunks of `n_batch` aligned to absolute positions are reused, the rest
    is decoded in the same aligned chunks) and a KV allocation that grows in powers of
    two (a growth empties the cache, as there)."""

    def __init__(self, model: FakeModel, adapters: list[tuple[np.ndarray, float]],
                 n_ctx: int, n_batch: int) -> None:
        self.model = model
        self.adapters = adapters
        self.n_ctx = n_ctx
        self.n_batch = n_batch
        self.cancelled: Callable[[], bool] = lambda: False
        self.tokens: list[int] = []
        self.states: list[int] = []  # one per cached token
        self.aligned = 0
        self.reused = 0
        self.capacity = min(MIN_CAPACITY, n_ctx)
        self.closed = False

    @property
    def kv_capacity(self) -> int:
        return self.capacity

    @property
    def kv_bytes(self) -> int:
        return self.capacity * BYTES_PER_CELL

    def logits_after(self, token: int, state: int) -> np.ndarray:
        row = self.model.base[token].copy()
        for table, scale in self.adapters:
            row += scale * table[token]
        row += STATE_WEIGHT * (state / STATE_MOD) * self.model.wobble[token]
        return row.astype(np.float32)

    def _decode(self, batch: list[int], want: str) -> list[np.ndarray]:
        if self.closed:
            raise EngineError("internal: decode on a closed fake context")
        if self.cancelled():
            raise Cancelled("cancelled")
        if len(self.tokens) + len(batch) > self.n_ctx:
            raise EngineError(f"context full: {len(self.tokens) + len(batch)} tokens do "
                              f"not fit in n_ctx={self.n_ctx}")
        start = len(self.tokens)
        rows = []
        for offset, token in enumerate(batch):
            previous = self.states[-1] if self.states else 0
            state = (previous * 131 + token * 257 + offset + 1) % STATE_MOD
            self.tokens.append(token)
            self.states.append(state)
            if want == "all" or (want == "last" and offset == len(batch) - 1):
                rows.append(self.logits_after(token, state))
        if start == self.aligned and len(batch) == self.n_batch and start % self.n_batch == 0:
            self.aligned += len(batch)
        return rows

    def _chunks(self, tokens: list[int]) -> Iterator[list[int]]:
        at, position = 0, len(self.tokens)
        while at < len(tokens):
            size = self.n_batch - position % self.n_batch
            yield tokens[at:at + size]
            at += size
            position += size

    def _reserve(self, n_tokens: int) -> None:
        if n_tokens > self.capacity and self.capacity < self.n_ctx:
            while self.capacity < n_tokens:
                self.capacity *= 2
            self.capacity = min(self.capacity, self.n_ctx)
            self.tokens, self.states, self.aligned = [], [], 0

    def _reuse(self, prompt: list[int]) -> None:
        keep = min(self.aligned, common_prefix(self.tokens, prompt), len(prompt) - 1)
        keep -= keep % self.n_batch
        del self.tokens[keep:], self.states[keep:]
        self.aligned = min(self.aligned, keep)
        self.reused = keep

    def prefill_steps(self, prompt: list[int], reserve: int = 0
                      ) -> Iterator[np.ndarray | None]:
        if not prompt:
            raise EngineError("empty prompt")
        self._reserve(len(prompt) + reserve)
        self._reuse(prompt)
        chunks = list(self._chunks(prompt[len(self.tokens):]))
        for index, chunk in enumerate(chunks):
            last = index == len(chunks) - 1
            rows = self._decode(chunk, "last" if last else "none")
            yield rows[-1] if last else None

    def prefill(self, prompt: list[int], reserve: int = 0) -> np.ndarray:
        for logits in self.prefill_steps(prompt, reserve):
            if logits is not None:
                return logits
        raise EngineError("internal: prefill produced no logits")

    def step(self, token: int) -> np.ndarray:
        if self.model.owner.before_step is not None:
            self.model.owner.before_step()
        return self._decode([token], "last")[-1]

    def score(self, prompt: list[int], continuation: list[int]) -> list[np.ndarray]:
        if not continuation:
            return []
        feed = prompt + continuation[:-1]
        self._reserve(len(feed))
        self._reuse(prompt)
        rows: list[np.ndarray] = []
        for chunk in self._chunks(feed[len(self.tokens):]):
            rows.extend(self._decode(chunk, "all"))
        return rows[len(rows) - len(continuation):]

    def close(self) -> None:
        self.closed = True
        self.model.contexts_closed += 1


class FakeModel:
    """A `ResidentModel` over the tables; adapters are "loaded" (their tables made) once
    per digest, and unloaded when the engine's adapter manager says so."""

    backend = "llama"

    def __init__(self, owner: FakeBackend, path: str, sha256: str) -> None:
        self.owner = owner
        self.path = path
        self.sha256 = sha256
        self.size_bytes = Path(path).stat().st_size
        self.n_vocab = N_VOCAB
        self.base = base_table()
        self.wobble = np.random.default_rng(7).normal(0.0, 1.0, (N_VOCAB, N_VOCAB))
        self.adapters: dict[str, np.ndarray] = {}
        self.unloaded: list[str] = []  # digests, in the order they were freed
        self.contexts_opened = 0
        self.contexts_closed = 0
        self.closed = False

    def tokenize(self, text: str, add_special: bool, parse_special: bool = True
                 ) -> list[int]:
        return tokenize(text, add_special, parse_special)

    def token_text(self, token: int) -> bytes:
        return VOCAB[token].encode()

    def is_end(self, token: int) -> bool:
        return token in (EOS, IM_END)

    def vocabulary(self) -> list[bytes]:
        return [(b"\xff" if token < len(SPECIALS) else b"") + text.encode()
                for token, text in enumerate(VOCAB)]

    def text_stream(self) -> FakeStream:
        return FakeStream()

    def needs_rebuild(self, adapters: AdapterSet) -> bool:
        return False

    def new_context(self, adapters: AdapterSet, n_ctx: int, n_batch: int) -> FakeContext:
        tables = []
        for adapter, _info in adapters:
            if adapter.sha256 not in self.adapters:
                self.adapters[adapter.sha256] = adapter_table(adapter.sha256)
            tables.append((self.adapters[adapter.sha256], adapter.scale))
        self.contexts_opened += 1
        return FakeContext(self, tables, n_ctx, n_batch)

    def unload_adapter(self, sha256: str) -> None:
        if self.adapters.pop(sha256, None) is not None:
            self.unloaded.append(sha256)

    def details(self) -> dict[str, Any]:
        return {"adapters_loaded": sorted(self.adapters), "fake": True}

    def close(self) -> None:
        self.adapters.clear()
        self.closed = True


class FakeBackend:
    """The loader put in place of llama.cpp's (`install`): the models it loaded, and two
    points where a test may hold the engine thread (`before_load`, `before_step`)."""

    def __init__(self) -> None:
        self.models: list[FakeModel] = []
        self.before_load: Callable[[], None] | None = None
        self.before_step: Callable[[], None] | None = None

    def __call__(self, path: str, sha256: str, n_threads: int,
                 progress: backend.LoadProgress | None, cancelled: backend.CancelCheck,
                 compute: ComputeProfile | None = None) -> FakeModel:
        info = artifacts.inspect_path(Path(path))
        if not isinstance(info, artifacts.BaseModelInfo) or info.name != BASE_NAME:
            raise RefusedError(f"the fake backend serves only its own base, not {path}")
        if self.before_load is not None:
            self.before_load()
        if cancelled():
            raise Cancelled("loading the model was cancelled")
        if progress is not None:
            progress(1.0)
        model = FakeModel(self, path, sha256)
        self.models.append(model)
        return model


@contextlib.contextmanager
def install() -> Iterator[FakeBackend]:
    """The fake serves every "llama" base of this process meanwhile (removed after, so
    other tests in the same xdist worker load real models)."""
    fake = FakeBackend()
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(backend.TEST_LOADERS, "llama", fake)
        yield fake


class Pause:
    """Holds the engine thread where it is called until the test lets it go: `reached`
    is set when the engine arrives, `go` lets it on (synchronisation without sleeps)."""

    def __init__(self, after: int = 0) -> None:
        self.after = after  # calls that pass before the one that holds
        self.calls = 0
        self.reached = threading.Event()
        self.go = threading.Event()

    def __call__(self) -> None:
        self.calls += 1
        if self.calls <= self.after:
            return
        self.reached.set()
        if not self.go.wait(PAUSE_TIMEOUT):
            raise EngineError("a test's pause was never released")


# --------------------------------------------------------------------------- the catalog

BASE = "fake"
# Variant -> its adapters and scales: two scales of one adapter, scale 0, another
# adapter, and both at once.
VARIANTS: dict[str, tuple[tuple[str, float], ...]] = {
    "va": (("a", 1.0),), "va-half": (("a", 0.5),), "va0": (("a", 0.0),),
    "vb": (("b", 1.0),), "vab": (("a", 0.5), ("b", 0.5)),
}


def populate(catalog: Catalog, folder: Path) -> None:
    """The fake base as `BASE`, GGUF adapters a (seed 1) and b (seed 2) validated against
    it, and `VARIANTS`, through the catalog's own imports (digests, validation)."""
    path = write_base(folder / "fake-base.gguf")
    imports.add_model(catalog, BASE, path)
    info = artifacts.inspect_path(path)
    assert isinstance(info, artifacts.BaseModelInfo)
    for name, seed in (("a", 1), ("b", 2)):
        lora = factories.write_gguf_lora(folder / f"{name}.gguf", info, rank=2, seed=seed)
        imports.add_adapter(catalog, name, BASE, lora)
    for variant, adapters in VARIANTS.items():
        catalog.add_variant(variant, BASE, [AdapterSpec(n, s) for n, s in adapters])
