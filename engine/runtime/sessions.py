"""The registry of residents and sessions, keyed by identity.

Runs only on the engine thread of the engine process. One resident model per base
file (per backend and served digest); any number of sessions (contexts) over it, each
with its own adapter set and KV cache, looked up by identity key, so warm state (the
prefix cache of a context) is reused only for an identical identity. An identity may
have several sessions when requests for it run at once; a session serves one request
at a time (`acquire` / `release`). The number of live sessions is bounded; the least
recently used idle one closes first; so is the number of residents. Before a base is
loaded its digest is checked against the spec; its adapters go through the one
adapter manager (`engine.runtime.adapters`: verify, signature gate, load, count,
evict).

This is all the registry does. Prompts are rendered in `engine.runtime.prompting`,
generations stepped in `engine.runtime.generation`, items scored in
`engine.runtime.scoring`, backends compared in `engine.runtime.cross_check`; they
reach residents and sessions through the public methods here.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from engine.catalog import digest
from engine.catalog.resolve import SessionSpec
from engine.errors import EngineError, RefusedError
from engine.formats import artifacts
from engine.formats.artifacts import BaseModelInfo
from engine.runtime.adapters import AdapterManager
from engine.runtime.backend import Context, ResidentModel, common_prefix, load_model
from engine.runtime.results import (
    EngineStatus,
    Memory,
    ResidentStatus,
    SessionStatus,
    adapters_of,
)

Emit = Callable[..., None]
CancelCheck = Callable[[], bool]
LoadProgress = Callable[[str, float], None]


@dataclass
class OpenSession:
    spec: SessionSpec
    context: Context
    number: int = 0  # tells apart sessions of one identity
    busy: bool = False  # serving a request now
    opened_at: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.time)
    generations: int = 0


@dataclass
class Resident:
    name: str  # the catalog name it was opened under
    model: ResidentModel
    info: BaseModelInfo
    last_used: float = field(default_factory=time.time)


def resident_key(spec: SessionSpec) -> str:
    """Residents are per backend and the digest of the weights served (the same file may
    serve both backends; an OpenVINO base's profiles are separate residents)."""
    sha = spec.identity.served_sha256
    return sha if spec.backend == "llama" else f"{spec.backend}:{sha}"


class SessionRegistry:
    def __init__(self, max_sessions: int = 3, max_bases: int = 2,
                 n_threads: int | None = None) -> None:
        self.max_sessions = max_sessions
        self.max_bases = max_bases
        self.n_threads = n_threads or max(1, os.cpu_count() or 1)
        self.adapters = AdapterManager()
        self.residents: OrderedDict[str, Resident] = OrderedDict()
        # Residents a request holds a session on while it opens another (`pinned`):
        # never evicted then, though the session is not generating (not `busy`).
        self._pinned: set[str] = set()
        self.sessions: list[OpenSession] = []  # least recently used first
        self._numbers = itertools.count(1)

    # ------------------------------------------------------------------ sessions

    def acquire(self, spec: SessionSpec, prompt: list[int] | None = None,
                cancelled: CancelCheck = lambda: False,
                progress: LoadProgress | None = None) -> OpenSession | None:
        """An idle session of `spec`'s identity, marked busy: the one whose cache shares
        the longest prefix with `prompt`, else a new one. None when every session is
        busy and no more may open (the caller waits and asks again)."""
        # Signatures first, for a new session and a warm one alike.
        self.adapters.gate(spec)
        key = spec.identity.key
        idle = [s for s in self.sessions if s.spec.identity.key == key and not s.busy]
        if idle:
            session = max(idle, key=lambda s: common_prefix(s.context.tokens, prompt or []))
        else:
            session = self._new_session(spec, cancelled, progress)
            if session is None:
                return None
        session.busy = True
        self._touch(session)
        return session

    def release(self, session: OpenSession) -> None:
        """`session` is free for the next request of its identity (if it is still open)."""
        if session not in self.sessions:
            return  # closed meanwhile (its resident was dropped)
        session.busy = False
        session.context.cancelled = lambda: False
        self._touch(session)
        self._trim()

    def open(self, spec: SessionSpec, cancelled: CancelCheck = lambda: False,
             progress: LoadProgress | None = None) -> OpenSession:
        """A session of `spec`'s identity for work that runs alone on the engine thread
        (warming, cross-checks): an existing one or a new one, not held busy."""
        session = self.acquire(spec, None, cancelled, progress)
        if session is None:
            raise EngineError("every session is busy")
        self.release(session)
        return session

    def _new_session(self, spec: SessionSpec, cancelled: CancelCheck,
                     progress: LoadProgress | None) -> OpenSession | None:
        resident = self.resident(spec, cancelled, progress)
        adapters = self.adapters.verify(spec, resident.info)
        base = resident_key(spec)
        if resident.model.needs_rebuild(adapters):
            # OpenVINO recompiles its model for new LoRA layers: the contexts on the old
            # compiled model close first, so wait until none of them is serving.
            on_base = [s for s in self.sessions if resident_key(s.spec) == base]
            if any(s.busy for s in on_base):
                return None
            for other in on_base:
                self._close_session(other)
        if len(self.sessions) >= self.max_sessions:
            idle = [s for s in self.sessions if not s.busy]
            if not idle:
                return None
            self._close_session(idle[0])
        shas = [a.sha256 for a, _info in adapters]
        # Counted before the context loads them, so a failed load releases them.
        self.adapters.hold(base, shas)
        try:
            context = resident.model.new_context(adapters, spec.identity.context.n_ctx,
                                                 spec.identity.context.n_batch)
        except BaseException:
            self.adapters.release(base, resident.model, shas)
            raise
        session = OpenSession(spec, context, next(self._numbers))
        self.sessions.append(session)
        return session

    def _touch(self, session: OpenSession) -> None:
        session.last_used = time.time()
        self.sessions.remove(session)
        self.sessions.append(session)

    def _trim(self) -> None:
        """Close the least recently used idle sessions beyond `max_sessions`."""
        for session in [s for s in self.sessions if not s.busy]:
            if len(self.sessions) <= self.max_sessions:
                break
            self._close_session(session)

    def _close_session(self, session: OpenSession) -> None:
        self.sessions.remove(session)
        # The context first: a native adapter is freed only once no context uses it.
        session.context.close()
        key = resident_key(session.spec)
        resident = self.residents.get(key)
        if resident is not None:
            self.adapters.release(key, resident.model, [a.sha256 for a in session.spec.adapters])

    # ------------------------------------------------------------------ residents

    def resident(self, spec: SessionSpec, cancelled: CancelCheck = lambda: False,
                 progress: LoadProgress | None = None) -> Resident:
        """The loaded base `spec` is served by: loaded now (its digest checked against
        the spec first) unless it is resident already."""
        sha = spec.identity.served_sha256
        key = resident_key(spec)
        if key in self.residents:
            self.residents.move_to_end(key)
            return self.residents[key]
        path = Path(spec.base_path)
        try:
            current = digest.content_digest(
                path, (lambda d, t: progress("verifying base", d / max(t, 1)))
                if progress else None, cancelled)
        except artifacts.InspectionError as exc:
            raise RefusedError(f"base {spec.base_name}: {exc.message}") from None
        if current != sha:
            raise RefusedError(f"base {spec.base_name} changed on disk since it was added "
                               f"(sha256 {current[:16]}…, recorded {sha[:16]}…); not serving it")
        info = artifacts.inspect_path(path)
        formats = ("gguf", "openvino") if spec.backend == "openvino" else ("gguf",)
        if not isinstance(info, BaseModelInfo) or info.format not in formats:
            raise RefusedError(f"base {spec.base_name}: not a base model {spec.backend} serves")
        while len(self.residents) >= self.max_bases:
            # The least recently used base whose sessions are all idle goes.
            unused = [k for k in self.residents if k not in self._pinned and not any(
                s.busy for s in self.sessions if resident_key(s.spec) == k)]
            if not unused:
                break
            self._drop_resident(unused[0])
        model = load_model(spec.backend, str(path), sha, self.n_threads,
                           (lambda f: progress("loading model", f)) if progress else None,
                           cancelled, spec.identity.compute)
        self.residents[key] = Resident(spec.base_name, model, info)
        return self.residents[key]

    def model(self, spec: SessionSpec) -> ResidentModel:
        """The resident model serving `spec` (loaded: a session of it was acquired)."""
        return self.residents[resident_key(spec)].model

    @contextlib.contextmanager
    def pinned(self, spec: SessionSpec) -> Iterator[None]:
        """Keep `spec`'s resident loaded meanwhile, though no session of it is busy (a
        cross-check holds a session of its first side while it opens the second)."""
        key = resident_key(spec)
        self._pinned.add(key)
        try:
            yield
        finally:
            self._pinned.discard(key)

    def _drop_resident(self, key: str) -> None:
        for session in [s for s in self.sessions if resident_key(s.spec) == key]:
            self._close_session(session)
        self.adapters.forget(key)
        self.residents.pop(key).model.close()

    def close_all(self) -> None:
        for session in list(self.sessions):
            self._close_session(session)
        for key in list(self.residents):
            self._drop_resident(key)

    # ------------------------------------------------------------------ status

    def describe(self) -> EngineStatus:
        return EngineStatus(
            pid=os.getpid(),
            residents=tuple(
                ResidentStatus(r.name, r.info.name, r.model.path, r.model.sha256,
                               r.model.backend, r.model.size_bytes, r.model.details())
                for r in self.residents.values()),
            sessions=tuple(
                SessionStatus(s.spec.name, s.spec.kind, s.spec.identity.key, s.number,
                              s.busy, s.spec.backend, s.spec.base_name,
                              adapters_of(s.spec), s.context.n_ctx,
                              len(s.context.tokens), s.context.kv_capacity,
                              s.context.kv_bytes, s.generations)
                for s in self.sessions),
            memory=memory_usage(), max_sessions=self.max_sessions, n_threads=self.n_threads)


def idle_status(max_sessions: int, n_threads: int) -> EngineStatus:
    """What `describe` answers before anything was loaded."""
    return EngineStatus(os.getpid(), (), (), memory_usage(), max_sessions, n_threads)


def memory_usage() -> Memory:
    values = {}
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    values[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return Memory(values.get("VmRSS", 0), values.get("VmHWM", 0))
