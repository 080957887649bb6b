"""The engine host process: `python -m engine.runtime.host`.

A worker of the one worker service (`engine.runtime.service`): the main thread reads
requests from stdin (its `Inbox`), each a `Job` that writes its events on the protocol
channel and ends exactly once. One engine thread owns every native
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
import os
import queue
import sys
import threading
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import Cancelled, StudioError
from engine.runtime import messages as m
from engine.runtime.service import Inbox, Job
from engine.runtime.worker import ChildChannel

if TYPE_CHECKING:
    from engine.runtime.sessions import SessionRegistry


class Host:
    def __init__(self, channel: ChildChannel) -> None:
        self.channel = channel
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._registry: SessionRegistry | None = None

    # ---------------------------------------------------------------- main thread

    def serve(self) -> None:
        worker = threading.Thread(target=self._engine_loop, name="engine", daemon=True)
        worker.start()
        self.channel.send({"event": "ready", "pid": os.getpid(), "versions": _versions()})
        # stdin closed or shutdown: everything in flight is cancelled; stop after the
        # current request.
        Inbox(self.channel).read(self._queue.put)
        self._queue.put(None)
        worker.join(timeout=30)

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
                    job.fail(exc)
                    continue
                if type(request) in EXCLUSIVE:
                    if running:
                        break
                    waiting.pop(0)
                    job.run(lambda r=request, j=job: EXCLUSIVE[type(r)](self, r, j))
                elif isinstance(request, m.Generate | m.Score):
                    waiting.pop(0)
                    task = self._start_task(job, request)
                    if task is not None:
                        running.append((job, task))
                else:
                    waiting.pop(0)
                    job.run(lambda r=request, j=job: HANDLERS[type(r)](self, r, j))
            for entry in list(running):
                job, task = entry
                try:
                    result = task.advance()
                except Exception as exc:
                    task.close()
                    running.remove(entry)
                    job.fail(exc)
                    continue
                if result is not None:
                    task.close()
                    running.remove(entry)
                    job.finish(result)
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

                return ScoreTask(self.registry(), request, job.emit, job.cancelled)
            from engine.runtime.generation import GenerationTask

            kind = "compare" if isinstance(request, m.Compare) else "generate"
            return GenerationTask(self.registry(), kind, request.spec, request.prompt,
                                  request.sampling, job.emit, job.cancelled,
                                  request.top_logprobs, request.constraint)
        except Exception as exc:
            job.fail(exc)
            return None

    def registry(self) -> SessionRegistry:
        """The residents and sessions, created on first use."""
        if self._registry is None:
            from engine.runtime import contention
            from engine.runtime.sessions import SessionRegistry

            # Measure the machine while decoding; adapt the threads if they are automatic.
            contention.enable(*contention.configured())
            self._registry = SessionRegistry(max_sessions=configured_sessions(),
                                             n_threads=configured_threads())
        return self._registry

    @property
    def started(self) -> SessionRegistry | None:
        """The registry if anything was asked of it yet (else None: nothing loaded)."""
        return self._registry


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
    host.registry().open(request.spec, job.cancelled, job.progress)
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

    return build.build_from_gguf(Path(request.source), job.progress,
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
    """Threads for inference at most (`engine.runtime.contention.configured`: the
    settings' count, else one per CPU core, fewer while other programs hold cores)."""
    from engine.runtime import contention

    return contention.configured()[0]


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
