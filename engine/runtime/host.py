"""The engine host process: `python -m engine.runtime.host`.

Reads requests from stdin and writes events on the protocol channel (a private copy
of stdout: `engine.runtime.worker.ChildChannel`). One engine thread owns every native
object (the Anki pattern: a single executor for the resource that is unsafe to share);
the main thread keeps reading so that cancel requests take effect during long work.
Requests are decoded into the typed messages of `engine.runtime.messages`.

The engine thread is a small scheduler over one `SessionRegistry` (residents and
sessions, `engine.runtime.sessions`). Generate and compare requests become
`GenerationTask`s (`engine.runtime.generation`) that advance in turn, one prompt chunk
or one token each, so any
number of requests (the local server's clients, the window's chat and comparison)
progress together and a long generation never blocks a short one. Score requests are
tasks too (`engine.runtime.scoring.ScoreTask`: one item, prompt chunk or greedy token
per step), so an evaluation runs beside the chat instead of in front of it. Quick requests
(`HANDLERS`: ping, describe) are answered at once; work that needs the engine to
itself (`EXCLUSIVE`: warming a session, a cross-check, a build, closing everything)
waits until the running tasks have finished, and later requests wait behind it.
Results are typed values (`engine.runtime.results`), written as JSON here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine import wire
from engine.errors import Cancelled, StudioError
from engine.runtime import messages as m
from engine.runtime import protocol
from engine.runtime.worker import ChildChannel

if TYPE_CHECKING:
    from engine.runtime.sessions import SessionRegistry


@dataclass
class Job:
    """One request on its way through the engine thread."""

    id: str
    op: str
    params: Any
    cancel: threading.Event = field(default_factory=threading.Event)

    def cancelled(self) -> bool:
        return self.cancel.is_set()


class Host:
    def __init__(self, channel: ChildChannel) -> None:
        self.channel = channel
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._pending: dict[str, Job] = {}
        self._pending_lock = threading.Lock()
        self._registry: SessionRegistry | None = None

    # ---------------------------------------------------------------- main thread

    def serve(self) -> None:
        worker = threading.Thread(target=self._engine_loop, name="engine", daemon=True)
        worker.start()
        self.channel.send({"event": "ready", "pid": os.getpid(), "versions": _versions()})
        for line in sys.stdin.buffer:
            if len(line) > protocol.MAX_LINE:
                continue
            try:
                message = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if not isinstance(message, dict):
                continue
            op = message.get("op")
            if op == "shutdown":
                break
            if op == "cancel":
                self._cancel(str(message.get("target")))
                continue
            job = Job(str(message.get("id")), str(op), message.get("params") or {})
            with self._pending_lock:
                self._pending[job.id] = job
            self._queue.put(job)
        # stdin closed or shutdown: stop after the current request.
        with self._pending_lock:
            for job in self._pending.values():
                job.cancel.set()
        self._queue.put(None)
        worker.join(timeout=30)

    def _cancel(self, target: str) -> None:
        with self._pending_lock:
            job = self._pending.get(target)
        if job is not None:
            job.cancel.set()

    # ---------------------------------------------------------------- engine thread

    def _engine_loop(self) -> None:
        running: list[tuple[Job, Any]] = []  # GenerationTask or ScoreTask
        waiting: list[Job] = []  # behind an exclusive job, in arrival order
        while True:
            # Take every request that arrived; block for one only when nothing runs.
            arrived = self._take(block=not running and not waiting)
            if None in arrived:
                break
            waiting.extend(job for job in arrived if job is not None)
            # Start what may start: everything up to the first exclusive job, which
            # runs once nothing else does.
            while waiting:
                job = waiting[0]
                try:
                    request = m.decode_request(job.op, job.params)
                except Exception as exc:
                    waiting.pop(0)
                    self._failed(job, exc)
                    continue
                if type(request) in EXCLUSIVE:
                    if running:
                        break
                    waiting.pop(0)
                    self._run(job, lambda r=request, j=job: EXCLUSIVE[type(r)](self, r, j))
                elif isinstance(request, m.Generate | m.Score):
                    waiting.pop(0)
                    task = self._start_task(job, request)
                    if task is not None:
                        running.append((job, task))
                else:
                    waiting.pop(0)
                    self._run(job, lambda r=request, j=job: HANDLERS[type(r)](self, r, j))
            for entry in list(running):
                job, task = entry
                try:
                    result = task.advance()
                except Exception as exc:
                    task.close()
                    running.remove(entry)
                    self._failed(job, exc)
                    continue
                if result is not None:
                    task.close()
                    running.remove(entry)
                    self._finished(job, result)
        for _job, task in running:
            task.close()
        if self._registry is not None:
            self._registry.close_all()

    def _take(self, block: bool) -> list[Job | None]:
        """The requests queued now (None stands for "stop"), waiting for one if `block`."""
        taken: list[Job | None] = []
        try:
            taken.append(self._queue.get(block=block))
            while True:
                taken.append(self._queue.get_nowait())
        except queue.Empty:
            pass
        return taken

    def _start_task(self, job: Job, request: m.Generate | m.Score) -> Any:
        try:
            if job.cancelled():
                raise Cancelled("cancelled before it started")
            if isinstance(request, m.Score):
                # A task like a generation (not EXCLUSIVE): an evaluation of many items
                # must not stop the chat or the server for minutes (engine.runtime.scoring).
                from engine.runtime.scoring import ScoreTask

                return ScoreTask(self.registry(), request, self.emitter(job), job.cancelled)
            from engine.runtime.generation import GenerationTask

            kind = "compare" if isinstance(request, m.Compare) else "generate"
            return GenerationTask(self.registry(), kind, request.spec, request.prompt,
                                  request.sampling, self.emitter(job), job.cancelled,
                                  request.top_logprobs)
        except Exception as exc:
            self._failed(job, exc)
            return None

    def _run(self, job: Job, handler: Callable[[], Any]) -> None:
        try:
            if job.cancelled():
                raise Cancelled("cancelled before it started")
            result = handler()
        except Exception as exc:
            self._failed(job, exc)
        else:
            self._finished(job, result)

    def _finished(self, job: Job, result: Any) -> None:
        self.channel.send({"id": job.id, "event": "finished", "result": wire.encode(result)})
        self._forget(job)

    def _failed(self, job: Job, exc: BaseException) -> None:
        if isinstance(exc, Cancelled) or job.cancelled():
            self.channel.send({"id": job.id, "event": "cancelled"})
        else:
            payload = protocol.error_payload(exc)
            if not isinstance(exc, StudioError):
                payload["details"] = payload["details"] + traceback.format_exception(exc)
            self.channel.send({"id": job.id, "event": "failed", "error": payload})
        self._forget(job)

    def _forget(self, job: Job) -> None:
        with self._pending_lock:
            self._pending.pop(job.id, None)

    def registry(self) -> SessionRegistry:
        """The residents and sessions, created on first use."""
        if self._registry is None:
            from engine.runtime.sessions import SessionRegistry

            self._registry = SessionRegistry(max_sessions=configured_sessions(),
                                             n_threads=configured_threads())
        return self._registry

    @property
    def started(self) -> SessionRegistry | None:
        """The registry if anything was asked of it yet (else None: nothing loaded)."""
        return self._registry

    def emitter(self, job: Job) -> Callable[..., None]:
        def emit(event: str, **payload: Any) -> None:
            self.channel.send({"id": job.id, "event": event, **payload})
        return emit

    def progress(self, job: Job) -> Callable[[str, float], None]:
        emit = self.emitter(job)
        return lambda stage, fraction: emit("progress", stage=stage, fraction=fraction)


# --------------------------------------------------------------------------- handlers


def _ping(host: Host, request: m.Ping, job: Job) -> Any:
    return {"pid": os.getpid()}


def _describe(host: Host, request: m.Describe, job: Job) -> Any:
    if host.started is None:
        from engine.runtime.sessions import idle_status

        # n_threads as the sessions will use it, so the window can show it before any load.
        return idle_status(configured_sessions(), configured_threads())
    return host.started.describe()


def _open(host: Host, request: m.Open, job: Job) -> Any:
    host.registry().open(request.spec, job.cancelled, host.progress(job))
    return host.registry().describe()


def _cross_check(host: Host, request: m.CrossCheck, job: Job) -> Any:
    from engine.runtime import cross_check
    from engine.runtime.openvino import genai_check

    registry = host.registry()
    first, second = request.first, request.second
    # Everything printed on stderr meanwhile (OpenVINO's own LoRA warnings among it)
    # goes into the report, as well as to the engine's log.
    stderr: list[str] = []
    with genai_check.captured_stderr(stderr):
        result = cross_check.run(registry, request, job.cancelled)
        if request.genai:
            which = "second" if second.backend == "openvino" else "first"
            result = dataclasses.replace(result, genai=genai_check.run(
                second if which == "second" else first,
                [getattr(r, which) for r in result.prompts], list(request.prompts),
                registry, job.cancelled))
    return dataclasses.replace(
        result, openvino_warnings=tuple(genai_check.openvino_warnings(stderr)),
        unused_lora_tensors=tuple(genai_check.unused_tensors(stderr)))


def _build_openvino(host: Host, request: m.BuildOpenVino, job: Job) -> Any:
    from engine.runtime.openvino import build

    return build.build_from_gguf(Path(request.source), host.progress(job),
                                 job.cancelled).to_dict()


def _close_all(host: Host, request: m.CloseAll, job: Job) -> Any:
    if host.started is not None:
        host.started.close_all()
    return {}


def _abort(host: Host, request: m.Abort, job: Job) -> Any:
    if os.environ.get("VARIANT_STUDIO_TEST_HOOKS") != "1":
        # Off, the hook does not exist: the request is answered as any unknown one.
        raise StudioError(f"unknown engine request {job.op!r}")
    print(f"engine: test hook: aborting on request {job.id}", file=sys.stderr, flush=True)
    os.abort()  # a native crash, as a malformed file could cause


# Answered at once, between the steps of running generations.
HANDLERS: dict[type[m.Request], Callable[[Host, Any, Job], Any]] = {
    m.Ping: _ping, m.Describe: _describe, m.Abort: _abort,
}
# Run alone: they wait until no generation is running.
EXCLUSIVE: dict[type[m.Request], Callable[[Host, Any, Job], Any]] = {
    m.Open: _open, m.CrossCheck: _cross_check, m.BuildOpenVino: _build_openvino,
    m.CloseAll: _close_all,
}


def configured_threads() -> int:
    """Threads for inference: VARIANT_STUDIO_THREADS (set by the client from the
    settings when it starts this process), else one per CPU core."""
    try:
        threads = int(os.environ.get("VARIANT_STUDIO_THREADS", "0"))
    except ValueError:
        threads = 0
    return threads if threads > 0 else max(1, os.cpu_count() or 1)


def configured_sessions() -> int:
    """Live sessions at most: VARIANT_STUDIO_MAX_SESSIONS (the server's --max-sessions),
    else 3."""
    try:
        value = int(os.environ.get("VARIANT_STUDIO_MAX_SESSIONS", "3"))
    except ValueError:
        value = 3
    return min(max(value, 1), 64)


def _versions() -> dict[str, str]:
    out = {}
    for package in ("llama-cpp-python", "openvino-genai"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = "missing"
    return out


def main() -> None:
    Host(ChildChannel()).serve()


if __name__ == "__main__":
    main()
