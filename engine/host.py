"""The engine host process: `python -m engine.host`.

Reads requests from stdin, writes events to a private copy of stdout (fd 1 itself is
pointed at stderr, so anything native code prints cannot corrupt the protocol).
One engine thread owns every native object and runs requests one at a time (the
Anki pattern: a single executor for the resource that is unsafe to share); the main
thread keeps reading so that cancel requests take effect during long work.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import traceback
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from engine import protocol
from engine.errors import Cancelled, EngineError, RefusedError, StudioError


@dataclass
class Request:
    id: str
    op: str
    params: dict[str, Any]
    cancel: threading.Event = field(default_factory=threading.Event)


class Host:
    def __init__(self, out_fd: int) -> None:
        self._out = out_fd
        self._write_lock = threading.Lock()
        self._queue: queue.Queue[Request | None] = queue.Queue()
        self._pending: dict[str, Request] = {}
        self._pending_lock = threading.Lock()
        self._manager: Any = None

    def send(self, message: dict[str, Any]) -> None:
        data = protocol.encode(message)
        with self._write_lock:
            view = memoryview(data)
            while view:
                written = os.write(self._out, view)
                view = view[written:]

    # ---------------------------------------------------------------- main thread

    def serve(self) -> None:
        worker = threading.Thread(target=self._engine_loop, name="engine", daemon=True)
        worker.start()
        self.send({"event": "ready", "pid": os.getpid(), "versions": _versions()})
        for line in sys.stdin.buffer:
            if len(line) > protocol.MAX_LINE:
                continue
            try:
                message = json.loads(line)
            except ValueError:
                continue
            op = message.get("op")
            if op == "shutdown":
                break
            if op == "cancel":
                self._cancel(str(message.get("target")))
                continue
            request = Request(str(message.get("id")), str(op), message.get("params") or {})
            with self._pending_lock:
                self._pending[request.id] = request
            self._queue.put(request)
        # stdin closed or shutdown: stop after the current request.
        with self._pending_lock:
            for request in self._pending.values():
                request.cancel.set()
        self._queue.put(None)
        worker.join(timeout=30)

    def _cancel(self, target: str) -> None:
        with self._pending_lock:
            request = self._pending.get(target)
        if request is not None:
            request.cancel.set()

    # ---------------------------------------------------------------- engine thread

    def _engine_loop(self) -> None:
        while True:
            request = self._queue.get()
            if request is None:
                break
            try:
                if request.cancel.is_set():
                    raise Cancelled("cancelled before it started")
                result = self._handle(request)
            except Cancelled:
                self.send({"id": request.id, "event": "cancelled"})
            except Exception as exc:
                payload = protocol.error_payload(exc)
                if not isinstance(exc, StudioError):
                    payload["details"] = payload["details"] + traceback.format_exc().splitlines()
                self.send({"id": request.id, "event": "failed", "error": payload})
            else:
                self.send({"id": request.id, "event": "finished", "result": result})
            finally:
                with self._pending_lock:
                    self._pending.pop(request.id, None)
        if self._manager is not None:
            self._manager.close_all()

    def manager(self) -> Any:
        if self._manager is None:
            from engine.sessions import SessionManager

            self._manager = SessionManager(n_threads=configured_threads())
        return self._manager

    def _handle(self, request: Request) -> Any:
        from engine.sampling import Sampling
        from engine.sessions import Prompt
        from engine.spec import SessionSpec

        p = request.params

        def emit(event: str, **payload: Any) -> None:
            self.send({"id": request.id, "event": event, **payload})

        cancelled = request.cancel.is_set
        if request.op == "ping":
            return {"pid": os.getpid()}
        if request.op == "describe":
            return self.manager().describe() if self._manager else _idle_description()
        if request.op in ("generate", "compare", "open"):
            try:
                spec = SessionSpec.from_dict(p["spec"])
                sampling = Sampling.from_dict(p.get("sampling") or spec.sampling.to_dict())
                prompt = Prompt.from_dict(p.get("prompt") or {})
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                # e.g. a non-finite scale in the identity: refused, not an internal error
                raise RefusedError(f"malformed {request.op} request: "
                                   f"{type(exc).__name__}: {exc}") from None
            if request.op == "open":
                self.manager().open(spec, cancelled, lambda stage, f: emit(
                    "progress", stage=stage, fraction=f))
                return self.manager().describe()
            run = self.manager().generate if request.op == "generate" else self.manager().compare
            return run(spec, prompt, sampling, emit, cancelled)
        if request.op == "cross_check":
            first, second = (SessionSpec.from_dict(p[k]) for k in ("first", "second"))
            prompts = [Prompt.from_dict(x) for x in p.get("prompts") or []]
            if not prompts or len(prompts) > 64:
                raise RefusedError("cross_check needs 1 to 64 prompts")
            tokens = int(p.get("tokens", 8))
            if not 1 <= tokens <= 256:
                raise RefusedError("cross_check decodes 1 to 256 tokens per prompt")
            from engine import openvino_genai_check as ov_check

            # Everything printed on stderr meanwhile (OpenVINO's own LoRA warnings
            # among it) goes into the report, as well as to the engine's log.
            stderr: list[str] = []
            with ov_check.captured_stderr(stderr):
                result = self.manager().cross_check(first, second, prompts, tokens,
                                                    cancelled)
                if p.get("genai"):
                    which = "second" if second.backend == "openvino" else "first"
                    result["genai"] = ov_check.run(
                        second if which == "second" else first,
                        [r[which] for r in result["prompts"]], prompts, self.manager(),
                        cancelled)
            result["openvino_warnings"] = ov_check.openvino_warnings(stderr)
            result["unused_lora_tensors"] = ov_check.unused_tensors(stderr)
            return result
        if request.op == "build_openvino_default":
            from engine import openvino_default

            return openvino_default.build_in_engine(
                lambda stage, fraction: emit("progress", stage=stage, fraction=fraction),
                cancelled)
        if request.op == "close_all":
            if self._manager:
                self._manager.close_all()
            return {}
        if request.op == "abort" and os.environ.get("VARIANT_STUDIO_TEST_HOOKS") == "1":
            print(f"engine: test hook: aborting on request {request.id}", file=sys.stderr,
                  flush=True)
            os.abort()  # test hook: a native crash, as a malformed file could cause
        raise EngineError(f"unknown engine request {request.op!r}")


def configured_threads() -> int:
    """Threads for inference: VARIANT_STUDIO_THREADS (set by the client from the
    settings when it starts this process), else one per CPU core."""
    try:
        threads = int(os.environ.get("VARIANT_STUDIO_THREADS", "0"))
    except ValueError:
        threads = 0
    return threads if threads > 0 else max(1, os.cpu_count() or 1)


def _idle_description() -> dict[str, Any]:
    from engine.sessions import memory_usage

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
    # Keep a private descriptor for the protocol and send fd 1 to stderr, so stray
    # native prints cannot interleave with protocol lines.
    out_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    Host(out_fd).serve()


if __name__ == "__main__":
    main()
