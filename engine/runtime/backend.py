"""The one interface sessions drive a backend through: a resident model and its contexts.

A `ResidentModel` is a loaded base (weights, tokenizer) that many sessions share; a
`Context` is one session over it, with a fixed adapter set and its own KV state. The
llama.cpp backend (`engine.runtime.llama.backend`) and the OpenVINO backend
(`engine.runtime.openvino.backend`) implement these protocols; `load_model` is the only
place that names them, so the sessions know nothing else about either. The backends
import nothing from here (the protocols are structural), so there is no import circle.
`TEST_LOADERS` is the one hook for tests: a loader put there by test code (the unit
tier's fake backend) stands in for a backend's own, in that process only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from engine.catalog.identity import ComputeProfile
from engine.catalog.resolve import AdapterFile
from engine.errors import RefusedError
from engine.formats.artifacts import AdapterInfo
from engine.runtime.tokens import common_prefix

__all__ = ["BACKENDS", "TEST_LOADERS", "AdapterSet", "Context", "Loader", "ResidentModel",
           "TextStream", "common_prefix", "load_model"]

BACKENDS = ("llama", "openvino")
CancelCheck = Callable[[], bool]
LoadProgress = Callable[[float], None]
# An adapter as a session asks for it: the file (digest-verified) and its inspection.
AdapterSet = Sequence[tuple[AdapterFile, AdapterInfo]]


class TextStream(Protocol):
    """Text from generated tokens, emitted once characters are whole."""

    def feed(self, token: int) -> str: ...

    def finish(self) -> str: ...


class Context(Protocol):
    n_ctx: int  # the session's context size (part of its identity)
    tokens: list[int]  # what its KV state holds, in order
    reused: int  # prompt tokens the last prefill took from the cache
    cancelled: CancelCheck  # checked inside long native work

    @property
    def kv_capacity(self) -> int:
        """KV cells allocated now (at most n_ctx)."""
        ...

    @property
    def kv_bytes(self) -> int:
        """Memory the KV state takes now."""
        ...

    def prefill(self, prompt: list[int], reserve: int = 0) -> np.ndarray:
        """Logits after `prompt`, with room for `reserve` more tokens."""
        ...

    def prefill_steps(self, prompt: list[int], reserve: int = 0
                      ) -> Iterator[np.ndarray | None]:
        """`prefill` in steps, so other requests can run between them: None after each
        step but the last, which yields the logits after the prompt."""
        ...

    def step(self, token: int) -> np.ndarray:
        """Append one token; the logits after it."""
        ...

    def score(self, prompt: list[int], continuation: list[int]) -> list[np.ndarray]:
        """Logits predicting each token of `continuation` after `prompt` (teacher forcing)."""
        ...

    def close(self) -> None: ...


class ResidentModel(Protocol):
    backend: str
    path: str
    sha256: str
    size_bytes: int
    n_vocab: int

    def tokenize(self, text: str, add_special: bool, parse_special: bool = True
                 ) -> list[int]: ...

    def token_text(self, token: int) -> bytes:
        """The token's text including special tokens (for the template's BOS/EOS)."""
        ...

    def is_end(self, token: int) -> bool: ...

    def vocabulary(self) -> list[bytes]:
        """Every token's bytes, in id order, as it adds them to text; control tokens as
        b"\\xff" + their text (constrained decoding builds its tokenizer from this:
        `engine.runtime.constraint`)."""
        ...

    def text_stream(self) -> TextStream: ...

    def needs_rebuild(self, adapters: AdapterSet) -> bool:
        """Would a context with `adapters` invalidate this model's other contexts?"""
        ...

    def new_context(self, adapters: AdapterSet, n_ctx: int, n_batch: int) -> Context:
        """A context for `adapters` (loaded now unless loaded already, once per digest);
        prompts are decoded in chunks of `n_batch`."""
        ...

    def unload_adapter(self, sha256: str) -> None:
        """Free what this model holds of adapter `sha256` (no context uses it any more:
        `engine.runtime.adapters` counts them). Nothing loaded: nothing happens."""
        ...

    def details(self) -> dict[str, Any]:
        """What `describe` reports of this model beyond the common fields."""
        ...

    def close(self) -> None: ...


# load_model's arguments, in its order.
Loader = Callable[[str, str, int, LoadProgress | None, CancelCheck, ComputeProfile | None],
                  ResidentModel]
# Loaders that stand in for a backend's own in this process: the unit tier of the tests puts
# a fake backend here (tests/fake_backend.py) to run sessions, the scheduler and the server
# in-process without native code. Only code in the process can fill it (no file, setting,
# environment variable or request names a loader), so a model file cannot select one; the
# engine never does, so it is empty in every engine and worker process.
TEST_LOADERS: dict[str, Loader] = {}


def load_model(backend: str, path: str, sha256: str, n_threads: int,
               progress: LoadProgress | None, cancelled: CancelCheck,
               compute: ComputeProfile | None = None) -> ResidentModel:
    """Load a base model on `backend` (the file's digest was verified by the caller);
    `compute` is the OpenVINO profile it computes with (None: the exact settings)."""
    loader = TEST_LOADERS.get(backend)
    if loader is not None:
        return loader(path, sha256, n_threads, progress, cancelled, compute)
    if backend == "llama":
        from engine.runtime.llama.backend import LlamaModel

        return LlamaModel(path, sha256, n_threads, progress, cancelled)
    if backend == "openvino":
        from engine.runtime.openvino.backend import load_base

        if progress is not None:
            progress(0.0)
        return load_base(path, sha256, n_threads, compute)
    raise RefusedError(f"backend {backend} is not available in this engine")
