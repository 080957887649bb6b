"""The client side of the engine process, with no Qt.

`EngineClient` starts `python -m engine.runtime.host` on demand (a `ChildProcess`),
gives every request an id, delivers its typed events (`engine.runtime.messages`) to a
callback on the reader thread (a request's result read as its typed result, `engine.
runtime.results`), and guarantees each request ends exactly once:
finished, failed or cancelled. If the process dies, every request in flight fails with
"engine stopped: ..." and the last lines of its log, and the next request starts a
fresh engine. The GUI wraps this in Qt signals; the CLI, the local server and tests
use it directly.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.errors import Cancelled, EngineError, StudioError
from engine.runtime import messages as m
from engine.runtime.worker import ChildProcess, describe_exit

EventCallback = Callable[[m.Event], None]
StateCallback = Callable[[str, str], None]
EnvFactory = Callable[[], dict[str, str]]
HOST_MODULE = "engine.runtime.host"


@dataclass
class RequestHandle:
    id: str
    op: str
    on_event: EventCallback | None
    kind: type[m.Request] | None = None  # reads the result (None: raw JSON, `submit_raw`)
    done: threading.Event = field(default_factory=threading.Event)
    outcome: str | None = None  # finished | failed | cancelled
    result: Any = None
    error: StudioError | None = None
    cancel_requested: bool = False
    engine: int = 0  # which engine process (EngineClient.starts) it was sent to

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the request ends; return its result or raise its error."""
        if not self.done.wait(timeout):
            raise EngineError(f"engine request {self.op} timed out after {timeout} s")
        if self.outcome == "finished":
            return self.result
        if self.outcome == "cancelled":
            raise Cancelled(f"{self.op} cancelled")
        assert self.error is not None
        raise self.error


class EngineClient:
    def __init__(self, env: dict[str, str] | EnvFactory | None = None,
                 on_state: StateCallback | None = None) -> None:
        """`env` is the engine's environment, or a function called at each start that
        returns it (so a restarted engine sees settings changed since the last one)."""
        self._env = env
        self._on_state = on_state
        self._lock = threading.RLock()
        self._child: ChildProcess | None = None
        self._pending: dict[str, RequestHandle] = {}
        self._ids = itertools.count(1)
        self.state = "stopped"
        self.pid: int | None = None
        self.starts = 0
        self._killed: ChildProcess | None = None  # a kill we asked for
        self._last: ChildProcess | None = None  # its log outlives it, for reports

    # ---------------------------------------------------------------- process

    def _set_state(self, state: str, detail: str = "") -> None:
        self.state = state
        if self._on_state:
            self._on_state(state, detail)

    def running(self) -> bool:
        """Whether an engine process is alive now (nothing is started to find out)."""
        with self._lock:
            return self._child is not None and self._child.alive()

    def _ensure_started(self) -> ChildProcess:
        if self._child is not None and self._child.alive():
            return self._child
        if callable(self._env):
            env = dict(self._env())
        else:
            env = dict(os.environ if self._env is None else self._env)
        self.starts += 1
        number = self.starts
        holder: list[ChildProcess] = []
        child = ChildProcess(HOST_MODULE, env, self._dispatch,
                             lambda code: self._on_exit(holder[0], code, number), "engine")
        holder.append(child)
        self._child = self._last = child
        self.pid = child.pid
        self._set_state("running", f"pid {child.pid}")
        return child

    def _dispatch(self, message: dict[str, Any]) -> None:
        with self._lock:
            handle = self._pending.get(str(message.get("id")))
        if handle is None:
            return
        try:
            event = m.decode_event(message, handle.kind)
        except StudioError as exc:  # an engine of another version, or a bug
            if message.get("event") != "finished":
                return
            event = m.Failed(EngineError(f"the engine answered {handle.op} with a malformed "
                                         f"result: {exc.message}"))
        if event is None:
            return
        if isinstance(event, m.TERMINAL):
            with self._lock:
                self._pending.pop(handle.id, None)
            if isinstance(event, m.Finished):
                handle.result = event.result
                handle.outcome = "finished"
            elif handle.cancel_requested or isinstance(event, m.Cancelled):
                event = m.Cancelled()
                handle.outcome = "cancelled"
            else:
                handle.error = event.error
                handle.outcome = "failed"
            self._deliver(handle, event)
            handle.done.set()
            return
        if handle.cancel_requested:
            return  # nothing but the terminal event after a cancel
        self._deliver(handle, event)

    @staticmethod
    def _deliver(handle: RequestHandle, event: m.Event) -> None:
        if handle.on_event is not None:
            try:
                handle.on_event(event)
            except Exception:  # a failing callback must not kill the reader
                import traceback

                traceback.print_exc()

    def _on_exit(self, child: ChildProcess, code: int, number: int) -> None:
        with self._lock:
            if self._child is child:
                self._child = None
            superseded = self._child is not None  # a fresh engine already runs
            # Only this process's requests: a fresh engine's are still being served.
            failed = [h for h in self._pending.values() if h.engine == number]
            for handle in failed:
                del self._pending[handle.id]
        restarted = child is self._killed  # kill(expected=True): a restart, not a crash
        reason = describe_exit(code)
        tail = child.tail(8)
        for handle in failed:
            handle.outcome = "failed"
            handle.error = EngineError(f"engine stopped: {reason}", details=tuple(tail))
            self._deliver(handle, m.Failed(handle.error))
            handle.done.set()
        if superseded:
            return  # the new engine's "running" is the state; this exit is history
        if restarted or (code == 0 and not failed):
            self._set_state("stopped", "restarted" if restarted else "")
        else:
            detail = f"engine stopped: {reason}"
            if tail:
                detail += " — last log: " + " | ".join(tail[-3:])
            self._set_state("crashed", detail)

    # ---------------------------------------------------------------- requests

    def submit(self, request: m.Request, on_event: EventCallback | None = None
               ) -> RequestHandle:
        """Send a typed request; its events go to `on_event` (on the reader thread)."""
        return self.submit_raw(request.OP, request.to_params(), on_event, type(request))

    def submit_raw(self, op: str, params: Any, on_event: EventCallback | None = None,
                   kind: type[m.Request] | None = None) -> RequestHandle:
        """Send a request as wire data (tests of what the engine refuses send it so;
        without `kind` its result stays the raw JSON)."""
        with self._lock:
            child = self._ensure_started()
            handle = RequestHandle(f"r{next(self._ids)}", op, on_event, kind,
                                   engine=self.starts)
            self._pending[handle.id] = handle
            # A failed write: the reader sees the exit and fails this request.
            child.write({"id": handle.id, "op": op, "params": params})
        return handle

    def call(self, request: m.Request, timeout: float | None = None) -> Any:
        return self.submit(request).wait(timeout)

    def cancel(self, handle: RequestHandle) -> None:
        """Ask the engine to stop `handle`; no event but its terminal one follows."""
        with self._lock:
            if handle.done.is_set() or handle.id not in self._pending:
                return
            handle.cancel_requested = True
            if self._child is not None:
                self._child.write({"op": "cancel", "target": handle.id})

    def log_tail(self, count: int = 20) -> list[str]:
        with self._lock:
            child = self._last
        return child.tail(count) if child is not None else []

    def kill(self, expected: bool = False) -> None:
        """Kill the engine process. Requests in flight fail with "engine stopped".

        `expected` (a restart the user asked for) reports the exit as "stopped"
        rather than "crashed"; a plain kill is what a crash looks like to the client.
        """
        with self._lock:
            child = self._child
            if child is not None and expected:
                self._killed = child
        if child is not None:
            child.kill()

    def close(self, timeout: float = 10.0) -> None:
        with self._lock:
            child = self._child
        if child is None:
            return
        child.write({"op": "shutdown"})
        child.finish(timeout)


def run_once(request: m.Request, on_event: EventCallback | None = None) -> Any:
    """One request in a fresh engine process (the CLI's way); Ctrl-C cancels it."""
    client = EngineClient()
    handle = client.submit(request, on_event)
    try:
        return handle.wait()
    except KeyboardInterrupt:
        client.cancel(handle)
        handle.done.wait(30)
        raise
    finally:
        client.close()

