"""The llama.cpp backend: one resident model per base, one context per session.

Only the engine process imports this module, and only its engine thread calls into
it (llama.cpp objects are not safe to share across threads). We use
llama-cpp-python's low-level bindings, never `Llama(lora_path=...)`: that path treats
a rejected adapter as success and crashes at the first decode.

Adapters belong to the model and are loaded once per file digest; adapter *sets*
belong to a context and are fixed when the context is created, so a context's KV
cache only ever holds state computed under its own identity.
"""

from __future__ import annotations

import codecs
import ctypes
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import llama_cpp
import numpy as np

from engine.catalog.resolve import AdapterFile
from engine.errors import Cancelled, EngineError, RefusedError
from engine.formats.artifacts import AdapterInfo
from engine.formats.safeio import printable
from engine.runtime import contention
from engine.runtime.tokens import common_prefix

_log_lines: deque[str] = deque(maxlen=500)
_log_partial = [""]
_log_count = [0]  # lines ever logged (the ring buffer keeps the last 500)
_log_lock = threading.Lock()
_log_callback = None
_initialised = False


def init_runtime() -> None:
    """Initialise llama.cpp once and route its log into a ring buffer (and stderr)."""
    global _log_callback, _initialised
    if _initialised:
        return

    @llama_cpp.llama_log_callback
    def on_log(level: int, text: bytes | None, user: ctypes.c_void_p) -> None:
        if not text:
            return
        os.write(2, text)
        with _log_lock:
            chunk = _log_partial[0] + text.decode("utf-8", "replace")
            *lines, _log_partial[0] = chunk.split("\n")
            kept = [line for line in lines if line.strip()]
            _log_lines.extend(kept)
            _log_count[0] += len(kept)

    _log_callback = on_log  # keep a reference: llama.cpp holds only the pointer
    llama_cpp.llama_log_set(on_log, None)
    llama_cpp.llama_backend_init()
    _initialised = True


def recent_log(count: int = 12) -> tuple[str, ...]:
    with _log_lock:
        return tuple(list(_log_lines)[-count:])


def log_mark() -> int:
    """A position in llama.cpp's log, for `log_since`."""
    with _log_lock:
        return _log_count[0]


def log_since(mark: int) -> list[str]:
    """The log lines written after `mark` (those still in the ring buffer)."""
    with _log_lock:
        new = _log_count[0] - mark
        return list(_log_lines)[-new:] if new > 0 else []


class LlamaModel:
    """A loaded base model and the adapters loaded against it (a `ResidentModel`)."""

    backend = "llama"

    def __init__(self, path: str, sha256: str, n_threads: int = 1,
                 progress: Callable[[float], None] | None = None,
                 cancelled: Callable[[], bool] = lambda: False) -> None:
        init_runtime()
        self.path = path
        self.sha256 = sha256
        self.n_threads = n_threads
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = 0

        # Returning False from the progress callback makes llama.cpp stop loading.
        @llama_cpp.llama_progress_callback
        def on_progress(fraction: float, user: ctypes.c_void_p) -> bool:
            if progress is not None:
                progress(fraction)
            return not cancelled()

        self._progress_cb = on_progress
        params.progress_callback = on_progress
        self.ptr = llama_cpp.llama_model_load_from_file(path.encode(), params)
        if not self.ptr and cancelled():
            raise Cancelled("loading the model was cancelled")
        if not self.ptr:
            # The file passed our checks but llama.cpp refuses it: a refused artifact.
            raise RefusedError(f"llama.cpp could not load {os.path.basename(path)}: "
                               f"{(recent_log(1) or ('see the engine log',))[0]}",
                               details=recent_log())
        self.vocab = llama_cpp.llama_model_get_vocab(self.ptr)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        # Loaded adapters by digest; `engine.runtime.adapters` says when one is freed.
        self.adapters: dict[str, ctypes.c_void_p] = {}
        self.size_bytes = int(llama_cpp.llama_model_size(self.ptr))
        # f16 keys and values of every layer, per KV cell (llama.cpp's default types).
        n_head = max(llama_cpp.llama_model_n_head(self.ptr), 1)
        kv_width = (llama_cpp.llama_model_n_embd(self.ptr) // n_head
                    * llama_cpp.llama_model_n_head_kv(self.ptr))
        self.kv_bytes_per_cell = int(llama_cpp.llama_model_n_layer(self.ptr)) * 2 * kv_width * 2

    # -------------------------------------------------------------- vocabulary

    def tokenize(self, text: str, add_special: bool, parse_special: bool = True) -> list[int]:
        raw = text.encode("utf-8")
        capacity = len(raw) + 16
        buf = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(self.vocab, raw, len(raw), buf, capacity, add_special,
                                     parse_special)
        if n < 0:
            capacity = -n
            buf = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(self.vocab, raw, len(raw), buf, capacity,
                                         add_special, parse_special)
        if n < 0:
            raise EngineError("tokenization failed")
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, 64, 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, -n, 0, False)
        return buf.raw[: max(n, 0)]

    def token_text(self, token: int) -> bytes:
        """The token's text including special tokens (for the template's BOS/EOS)."""
        buf = ctypes.create_string_buffer(128)
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, 128, 0, True)
        return buf.raw[: max(n, 0)]

    def is_end(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))

    def vocabulary(self) -> list[bytes]:
        """Every token's bytes as it adds them to text; a control token as b"\\xff" and
        its text (the grammar engine's mark for tokens text never produces)."""
        out = []
        buf = ctypes.create_string_buffer(256)
        for token in range(self.n_vocab):
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
            if n < 0:  # a longer piece: read it whole
                buf = ctypes.create_string_buffer(-n)
                n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
            text = buf.raw[: max(n, 0)]
            if llama_cpp.llama_token_get_attr(self.vocab, token) & \
                    llama_cpp.LLAMA_TOKEN_ATTR_CONTROL:
                text = b"\xff" + text
            out.append(text)
        return out

    def text_stream(self) -> ByteStream:
        return ByteStream(self.piece)

    # -------------------------------------------------------------- sessions

    def needs_rebuild(self, adapters: Sequence[tuple[AdapterFile, AdapterInfo]]) -> bool:
        return False  # adapter sets belong to contexts: a new one changes no other

    def new_context(self, adapters: Sequence[tuple[AdapterFile, AdapterInfo]], n_ctx: int,
                    n_batch: int) -> LlamaContext:
        return LlamaContext(self, tuple(a for a, _ in adapters), n_ctx, n_batch,
                            self.n_threads)

    def details(self) -> dict[str, Any]:
        return {"adapters_loaded": sorted(self.adapters)}

    # -------------------------------------------------------------- adapters

    def load_adapter(self, adapter: AdapterFile) -> ctypes.c_void_p:
        """The native adapter of `adapter`'s file, loaded once per digest. It stays
        loaded until `unload_adapter` (the engine's adapter manager calls it when no
        session uses it) or until the model closes."""
        if adapter.sha256 not in self.adapters:
            mark = log_mark()
            ptr = llama_cpp.llama_adapter_lora_init(self.ptr, adapter.path.encode())
            if not ptr:  # a NULL pointer, never None
                # llama.cpp only logs why: put its words into the one-line reason.
                said = log_since(mark)
                last = said[-1].split(": ", 1)[-1] if said else "no reason logged"
                reason = printable(last.strip(), 300)
                raise RefusedError(f"llama.cpp rejected adapter {adapter.name}: {reason}",
                                   details=tuple(said[-12:]))
            self.adapters[adapter.sha256] = ptr
        return self.adapters[adapter.sha256]

    def unload_adapter(self, sha256: str) -> None:
        """Free a loaded adapter (every context using it was freed first)."""
        ptr = self.adapters.pop(sha256, None)
        if ptr is not None:
            llama_cpp.llama_adapter_lora_free(ptr)

    def close(self) -> None:
        # Adapters first: the model frees still-attached adapters itself, so freeing
        # them after the model would be a double free.
        for ptr in self.adapters.values():
            llama_cpp.llama_adapter_lora_free(ptr)
        self.adapters.clear()
        if self.ptr:
            llama_cpp.llama_model_free(self.ptr)
            self.ptr = None


# The smallest KV cache a session allocates, in cells. A power of two (so a multiple of
# llama.cpp's 256-cell KV padding): see LlamaContext.
MIN_CAPACITY = 512
# Flash attention off. llama.cpp's default (AUTO) turns it on for the CPU, where one
# token decoded after 3,000 cached ones took 98 ms with it and 47 ms without (measured
# side by side, docs/notes.md); llama-cpp-python's `Llama` turns it off too.
FLASH_ATTN = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED


def capacity_for(n_tokens: int, n_ctx: int) -> int:
    """KV cells to allocate for `n_tokens`: the next power of two from MIN_CAPACITY,
    never more than the session's n_ctx."""
    capacity = MIN_CAPACITY
    while capacity < n_tokens:
        capacity *= 2
    return min(capacity, n_ctx)


class ByteStream:
    """Text from llama.cpp's token pieces (bytes), emitted once characters are whole."""

    def __init__(self, piece: Callable[[int], bytes]) -> None:
        self.piece = piece
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, token: int) -> str:
        return self.decoder.decode(self.piece(token))

    def finish(self) -> str:
        return self.decoder.decode(b"", final=True)


class LlamaContext:
    """One session (a `Context`): a context over a resident model, with a fixed adapter
    set, and a prefix cache that keeps warm answers equal to cold ones.

    llama.cpp's numerics depend on the batch a token was decoded in, so reusing any
    matching prefix (as `Llama.generate` does) changes the logits a little. Here every
    prompt is decoded in chunks of `n_batch` tokens aligned to absolute positions
    (0, n_batch, 2·n_batch, ...); a later request of the same context (same identity)
    keeps only the *whole aligned chunks* of its cached tokens that match its prompt
    (`aligned` counts them), drops the partial tail chunk and the tokens generated one
    by one, and decodes the rest the same aligned way. Every token is then computed in
    the same batch as in a cold run, so warm and cold logits are bit-identical
    (tests/test_prefix_cache.py holds this; see docs/notes.md).

    `n_ctx` is the session's context size (part of its identity); the native KV cache
    is allocated only as large as the requests need (`capacity`, grown in powers of two
    up to n_ctx), because one full cache costs as much memory as this model's weights.
    Growing recreates the native context (the cache starts empty again). The size does
    not change any result: attention runs over the used cells rounded up to llama.cpp's
    padding, not over the allocation (tests/test_engine_llama.py holds this).
    """

    def __init__(self, model: LlamaModel, adapters: tuple[AdapterFile, ...], n_ctx: int,
                 n_batch: int, n_threads: int) -> None:
        self.model = model
        self.n_ctx = n_ctx
        self.n_batch = n_batch
        self.n_threads = n_threads
        self.cancelled: Callable[[], bool] = lambda: False
        self.ptr = None
        self.batch = None
        self.capacity = 0
        self.threads_now = n_threads  # what the native context decodes on now
        self.tokens: list[int] = []  # what the KV cache holds, in order (sequence 0)
        self.aligned = 0  # leading cached tokens decoded as whole aligned chunks
        self.reused = 0  # tokens the last prefill or score took from the cache

        @llama_cpp.ggml_abort_callback
        def should_abort(user: ctypes.c_void_p) -> bool:
            return bool(self.cancelled())

        self._abort_cb = should_abort
        # Borrowed from the model (loaded there once per digest; never freed here).
        self._adapter_ptrs: list[ctypes.c_void_p] = []
        self._scales = [a.scale for a in adapters]
        try:
            for adapter in adapters:
                self._adapter_ptrs.append(model.load_adapter(adapter))
            self._allocate(capacity_for(0, n_ctx))
        except BaseException:
            self.close()
            raise
        self.batch = llama_cpp.llama_batch_init(n_batch, 0, 1)

    def _allocate(self, capacity: int) -> None:
        """(Re)create the native context with `capacity` KV cells and the adapter set."""
        if self.ptr:
            llama_cpp.llama_free(self.ptr)
            self.ptr = None
        self.tokens = []
        self.aligned = 0
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = capacity
        params.n_batch = self.n_batch
        params.n_ubatch = self.n_batch
        params.n_seq_max = 1
        params.n_threads = self.n_threads
        params.n_threads_batch = self.n_threads
        self.threads_now = self.n_threads
        params.no_perf = True
        params.flash_attn_type = FLASH_ATTN
        params.abort_callback = self._abort_cb
        self.ptr = llama_cpp.llama_init_from_model(self.model.ptr, params)
        if not self.ptr:
            raise EngineError("llama.cpp could not create a context", details=recent_log())
        self.capacity = capacity
        self.memory = llama_cpp.llama_get_memory(self.ptr)
        if self._adapter_ptrs:
            count = len(self._adapter_ptrs)
            array = (llama_cpp.llama_adapter_lora_p_ctypes * count)(*self._adapter_ptrs)
            scales = (ctypes.c_float * count)(*self._scales)
            rc = llama_cpp.llama_set_adapters_lora(self.ptr, array, count, scales)
            if rc != 0:
                raise EngineError(f"llama.cpp refused the adapter set (code {rc})",
                                  details=recent_log())

    @property
    def kv_capacity(self) -> int:
        return self.capacity

    @property
    def kv_bytes(self) -> int:
        """Memory of the allocated KV cache (f16 keys and values)."""
        return self.capacity * self.model.kv_bytes_per_cell

    def reserve(self, n_tokens: int) -> None:
        """Make room for `n_tokens` cached tokens (up to n_ctx); may empty the cache."""
        if n_tokens > self.capacity and self.capacity < self.n_ctx:
            self._allocate(capacity_for(n_tokens, self.n_ctx))

    def _logits(self, index: int) -> np.ndarray:
        ptr = llama_cpp.llama_get_logits_ith(self.ptr, index)
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_vocab,)).copy()

    def _check_room(self, more: int) -> None:
        if len(self.tokens) + more > self.n_ctx:
            raise EngineError(f"context full: {len(self.tokens) + more} tokens do not fit in "
                              f"n_ctx={self.n_ctx}")
        if len(self.tokens) + more > self.capacity:
            # prefill and score reserve what a request needs; growing here would drop the
            # cached tokens.
            raise EngineError(f"internal: {len(self.tokens) + more} tokens exceed the "
                              f"reserved KV capacity {self.capacity}")

    def _decode_batch(self, tokens: list[int], want: str) -> list[np.ndarray]:
        """Decode one batch appended to the cache; logits of "all", "last" or "none"."""
        if self.cancelled():
            raise Cancelled("cancelled")
        b = self.batch
        start = len(self.tokens)
        for i, token in enumerate(tokens):
            b.token[i] = token
            b.pos[i] = start + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = want == "all" or (want == "last" and i == len(tokens) - 1)
        b.n_tokens = len(tokens)
        # Fewer threads while other programs hold cores (engine.runtime.contention);
        # the count changes no result, only how the rows are shared out.
        threads = contention.threads_for(self.n_threads)
        if threads != self.threads_now:
            llama_cpp.llama_set_n_threads(self.ptr, threads, threads)
            self.threads_now = threads
        rc = llama_cpp.llama_decode(self.ptr, b)
        if rc != 0:
            # An aborted or failed batch leaves the cache in an unknown state.
            self.reset()
            if self.cancelled():
                raise Cancelled("cancelled")
            raise EngineError(f"llama_decode failed (code {rc})", details=recent_log())
        self.tokens.extend(tokens)
        if start == self.aligned and len(tokens) == self.n_batch and start % self.n_batch == 0:
            self.aligned += len(tokens)
        if want == "all":
            return [self._logits(i) for i in range(len(tokens))]
        return [self._logits(len(tokens) - 1)] if want == "last" else []

    def _chunks(self, tokens: list[int]) -> Iterator[list[int]]:
        """`tokens` (appended at the cache's end) cut at absolute multiples of n_batch."""
        at, position = 0, len(self.tokens)
        while at < len(tokens):
            size = self.n_batch - position % self.n_batch
            yield tokens[at:at + size]
            at += size
            position += size

    def _reuse(self, prompt: list[int]) -> None:
        """Keep the whole aligned chunks of the cache that start `prompt` (at least one
        prompt token is left to decode, for its logits); drop the rest."""
        keep = min(self.aligned, common_prefix(self.tokens, prompt), len(prompt) - 1)
        keep -= keep % self.n_batch
        if keep < len(self.tokens):
            if not llama_cpp.llama_memory_seq_rm(self.memory, 0, keep, -1):
                self.reset()
                keep = 0
            self.tokens = self.tokens[:keep]
        self.aligned = min(self.aligned, keep)
        self.reused = keep

    def prefill_steps(self, prompt: list[int], reserve: int = 0
                      ) -> Iterator[np.ndarray | None]:
        """Decode `prompt` (reusing what the prefix cache allows) one aligned chunk per
        step: yields None after each chunk but the last, then the logits after the
        prompt. Room is reserved for `reserve` more tokens."""
        if not prompt:
            raise EngineError("empty prompt")
        self.reserve(len(prompt) + reserve)
        self._reuse(prompt)
        rest = prompt[len(self.tokens):]
        self._check_room(len(rest))
        chunks = list(self._chunks(rest))
        for index, chunk in enumerate(chunks):
            last = index == len(chunks) - 1
            rows = self._decode_batch(chunk, "last" if last else "none")
            yield rows[-1] if last else None

    def prefill(self, prompt: list[int], reserve: int = 0) -> np.ndarray:
        """Logits after `prompt` (all its chunks at once)."""
        for logits in self.prefill_steps(prompt, reserve):
            if logits is not None:
                return logits
        raise EngineError("internal: prefill produced no logits")

    def step(self, token: int) -> np.ndarray:
        self._check_room(1)
        return self._decode_batch([token], "last")[-1]

    def score(self, prompt: list[int], continuation: list[int]) -> list[np.ndarray]:
        """Logits predicting each token of `continuation` after `prompt` (teacher forcing),
        computed in the same aligned chunks as a cold decode of prompt + continuation."""
        if not continuation:
            return []
        feed = prompt + continuation[:-1]
        self.reserve(len(feed))
        self._reuse(prompt)
        rest = feed[len(self.tokens):]
        self._check_room(len(rest))
        rows: list[np.ndarray] = []
        for chunk in self._chunks(rest):
            rows.extend(self._decode_batch(chunk, "all"))
        return rows[len(rows) - len(continuation):]

    def reset(self) -> None:
        llama_cpp.llama_memory_clear(self.memory, True)
        self.tokens = []
        self.aligned = 0

    def close(self) -> None:
        if getattr(self, "batch", None) is not None:
            llama_cpp.llama_batch_free(self.batch)
            self.batch = None
        if self.ptr:
            llama_cpp.llama_free(self.ptr)
            self.ptr = None
        self._adapter_ptrs = []
