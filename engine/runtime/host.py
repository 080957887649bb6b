"""The engine host process: `python -m engine.runtime.host`.

Reads requests from stdin and writes events on the protocol channel (a private copy
of stdout: `engine.runtime.worker.ChildChannel`). One engine thread owns every native
object and runs requests one at a time (the Anki pattern: a single executor for the
resource that is unsafe to share); the main thread keeps reading so that cancel
requests take effect during long work. Requests are decoded into the typed messages of
`engine.runtime.messages` and dispatched through `HANDLERS`, a table from request type
to handler.
"""

from __future__ import annotations

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
from typing import Any

from engine.errors import Cancelled, StudioError
from engine.runtime import messages as m
from engine.runtime import protocol
from engine.runtime.worker import ChildChannel


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
        self._manager: Any = None

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
        while True:
            job = self._queue.get()
            if job is None:
                break
            try:
                if job.cancelled():
                    raise Cancelled("cancelled before it started")
                request = m.decode_request(job.op, job.params)
                result = HANDLERS[type(request)](self, request, job)
            except Cancelled:
                self.channel.send({"id": job.id, "event": "cancelled"})
            except Exception as exc:
                payload = protocol.error_payload(exc)
                if not isinstance(exc, StudioError):
                    payload["details"] = payload["details"] + traceback.format_exc().splitlines()
                self.channel.send({"id": job.id, "event": "failed", "error": payload})
            else:
                self.channel.send({"id": job.id, "event": "finished", "result": result})
            finally:
                with self._pending_lock:
                    self._pending.pop(job.id, None)
        if self._manager is not None:
            self._manager.close_all()

    def manager(self) -> Any:
        if self._manager is None:
            from engine.runtime.sessions import SessionManager

            self._manager = SessionManager(n_threads=configured_threads())
        return self._manager

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
    return host.manager().describe() if host._manager else _idle_description()


def _open(host: Host, request: m.Open, job: Job) -> Any:
    host.manager().open(request.spec, job.cancelled, host.progress(job))
    return host.manager().describe()


def _generate(host: Host, request: m.Generate, job: Job) -> Any:
    return host.manager().generate(request.spec, request.prompt, request.sampling,
                                   host.emitter(job), job.cancelled)


def _compare(host: Host, request: m.Compare, job: Job) -> Any:
    return host.manager().compare(request.spec, request.prompt, request.sampling,
                                  host.emitter(job), job.cancelled)


def _cross_check(host: Host, request: m.CrossCheck, job: Job) -> Any:
    from engine.runtime.openvino import genai_check

    manager = host.manager()
    first, second = request.first, request.second
    # Everything printed on stderr meanwhile (OpenVINO's own LoRA warnings among it)
    # goes into the report, as well as to the engine's log.
    stderr: list[str] = []
    with genai_check.captured_stderr(stderr):
        result = manager.cross_check(first, second, list(request.prompts), request.tokens,
                                     job.cancelled)
        if request.genai:
            which = "second" if second.backend == "openvino" else "first"
            result["genai"] = genai_check.run(
                second if which == "second" else first,
                [r[which] for r in result["prompts"]], list(request.prompts), manager,
                job.cancelled)
    result["openvino_warnings"] = genai_check.openvino_warnings(stderr)
    result["unused_lora_tensors"] = genai_check.unused_tensors(stderr)
    return result


def _build_openvino(host: Host, request: m.BuildOpenVino, job: Job) -> Any:
    from engine.runtime.openvino import build

    return build.build_from_gguf(Path(request.source), host.progress(job),
                                 job.cancelled).to_dict()


def _close_all(host: Host, request: m.CloseAll, job: Job) -> Any:
    if host._manager:
        host._manager.close_all()
    return {}


def _abort(host: Host, request: m.Abort, job: Job) -> Any:
    if os.environ.get("VARIANT_STUDIO_TEST_HOOKS") != "1":
        raise StudioError("the abort test hook is not enabled")
    print(f"engine: test hook: aborting on request {job.id}", file=sys.stderr, flush=True)
    os.abort()  # a native crash, as a malformed file could cause


HANDLERS: dict[type[m.Request], Callable[[Host, Any, Job], Any]] = {
    m.Ping: _ping, m.Describe: _describe, m.Open: _open, m.Generate: _generate,
    m.Compare: _compare, m.CrossCheck: _cross_check, m.BuildOpenVino: _build_openvino,
    m.CloseAll: _close_all, m.Abort: _abort,
}


def configured_threads() -> int:
    """Threads for inference: VARIANT_STUDIO_THREADS (set by the client from the
    settings when it starts this process), else one per CPU core."""
    try:
        threads = int(os.environ.get("VARIANT_STUDIO_THREADS", "0"))
    except ValueError:
        threads = 0
    return threads if threads > 0 else max(1, os.cpu_count() or 1)


def _idle_description() -> dict[str, Any]:
    from engine.runtime.sessions import memory_usage

    # n_threads as the sessions will use it, so the window can show it before any load.
    return {"pid": os.getpid(), "residents": [], "sessions": [], "memory": memory_usage(),
            "n_threads": configured_threads()}


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
