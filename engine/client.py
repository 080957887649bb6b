"""The client side of the engine process, with no Qt.

`EngineClient` starts `python -m engine.host` on demand, gives every request an id,
delivers its events to a callback (on the reader thread), and guarantees each
request ends exactly once: finished, failed or cancelled. If the process dies, every
request in flight fails with "engine stopped: ..." and the last lines of its log,
and the next request starts a fresh engine. The GUI wraps this in Qt signals; the
CLI and tests use it directly.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine import protocol
from engine.errors import Cancelled, EngineError, StudioError

EventCallback = Callable[[dict[str, Any]], None]
StateCallback = Callable[[str, str], None]
EnvFactory = Callable[[], dict[str, str]]


@dataclass
class RequestHandle:
    id: str
    op: str
    on_event: EventCallback | None
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
        self._proc: subprocess.Popen[bytes] | None = None
        self._pending: dict[str, RequestHandle] = {}
        self._ids = itertools.count(1)
        self._log: deque[str] = deque(maxlen=200)
        self.state = "stopped"
        self.pid: int | None = None
        self.starts = 0
        self._killed: subprocess.Popen[bytes] | None = None  # a kill we asked for

    # ---------------------------------------------------------------- process

    def _set_state(self, state: str, detail: str = "") -> None:
        self.state = state
        if self._on_state:
            self._on_state(state, detail)

    def _ensure_started(self) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        if callable(self._env):
            env = dict(self._env())
        else:
            env = dict(os.environ if self._env is None else self._env)
        proc = subprocess.Popen(
            [sys.executable, "-m", "engine.host"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, bufsize=0,
            start_new_session=True)  # a Ctrl-C in the terminal goes to us, not the engine
        self._proc = proc
        self.pid = proc.pid
        self.starts += 1
        self._log.clear()
        threading.Thread(target=self._read_events, args=(proc, self.starts), daemon=True,
                         name="engine-events").start()
        threading.Thread(target=protocol.read_log, args=(proc.stderr, self._log),
                         daemon=True, name="engine-log").start()
        self._set_state("running", f"pid {proc.pid}")
        return proc

    def _read_events(self, proc: subprocess.Popen[bytes], number: int) -> None:
        assert proc.stdout is not None
        protocol.read_messages(proc.stdout, self._dispatch)
        code = proc.wait()
        self._on_exit(proc, code, number)

    def _dispatch(self, message: dict[str, Any]) -> None:
        event = message.get("event")
        with self._lock:
            handle = self._pending.get(str(message.get("id")))
        if handle is None:
            return
        if event in protocol.TERMINAL:
            with self._lock:
                self._pending.pop(handle.id, None)
            if event == "finished":
                handle.result = message.get("result")
            elif event == "failed":
                handle.error = protocol.error_from_payload(message.get("error") or {})
            if handle.cancel_requested and event != "finished":
                event = "cancelled"
            handle.outcome = event
            self._deliver(handle, message | {"event": event})
            handle.done.set()
            return
        if handle.cancel_requested:
            return  # nothing but the terminal event after a cancel
        self._deliver(handle, message)

    @staticmethod
    def _deliver(handle: RequestHandle, message: dict[str, Any]) -> None:
        if handle.on_event is not None:
            try:
                handle.on_event(message)
            except Exception:  # a failing callback must not kill the reader
                import traceback

                traceback.print_exc()

    def _on_exit(self, proc: subprocess.Popen[bytes], code: int, number: int) -> None:
        with self._lock:
            if self._proc is proc:
                self._proc = None
            superseded = self._proc is not None  # a fresh engine already runs
            # Only this process's requests: a fresh engine's are still being served.
            failed = [h for h in self._pending.values() if h.engine == number]
            for handle in failed:
                del self._pending[handle.id]
        restarted = proc is self._killed  # kill(expected=True): a restart, not a crash
        reason = _describe_exit(code)
        tail = list(self._log)[-8:]
        for handle in failed:
            handle.outcome = "failed"
            handle.error = EngineError(f"engine stopped: {reason}", details=tuple(tail))
            self._deliver(handle, {"id": handle.id, "event": "failed",
                                   "error": protocol.error_payload(handle.error)})
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

    def submit(self, op: str, params: dict[str, Any] | None = None,
               on_event: EventCallback | None = None) -> RequestHandle:
        with self._lock:
            proc = self._ensure_started()
            handle = RequestHandle(f"r{next(self._ids)}", op, on_event, engine=self.starts)
            self._pending[handle.id] = handle
            try:
                self._write(proc, {"id": handle.id, "op": op, "params": params or {}})
            except OSError:
                pass  # the reader will see the exit and fail this request
        return handle

    def call(self, op: str, params: dict[str, Any] | None = None,
             timeout: float | None = None) -> Any:
        return self.submit(op, params).wait(timeout)

    def cancel(self, handle: RequestHandle) -> None:
        """Ask the engine to stop `handle`; no event but its terminal one follows."""
        with self._lock:
            if handle.done.is_set() or handle.id not in self._pending:
                return
            handle.cancel_requested = True
            if self._proc is not None:
                try:
                    self._write(self._proc, {"op": "cancel", "target": handle.id})
                except OSError:
                    pass

    @staticmethod
    def _write(proc: subprocess.Popen[bytes], message: dict[str, Any]) -> None:
        assert proc.stdin is not None
        proc.stdin.write(protocol.encode(message))
        proc.stdin.flush()

    def log_tail(self, count: int = 20) -> list[str]:
        return list(self._log)[-count:]

    def kill(self, expected: bool = False) -> None:
        """Kill the engine process. Requests in flight fail with "engine stopped".

        `expected` (a restart the user asked for) reports the exit as "stopped"
        rather than "crashed"; a plain kill is what a crash looks like to the client.
        """
        with self._lock:
            proc = self._proc
            if proc is not None and expected:
                self._killed = proc
        if proc is not None and proc.poll() is None:
            proc.kill()

    def close(self, timeout: float = 10.0) -> None:
        with self._lock:
            proc = self._proc
        if proc is None:
            return
        try:
            self._write(proc, {"op": "shutdown"})
            proc.stdin.close()  # type: ignore[union-attr]
            proc.wait(timeout)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()


def run_once(op: str, params: dict[str, Any] | None = None,
             on_event: EventCallback | None = None) -> Any:
    """One request in a fresh engine process (the CLI's way); Ctrl-C cancels it."""
    client = EngineClient()
    handle = client.submit(op, params, on_event)
    try:
        return handle.wait()
    except KeyboardInterrupt:
        client.cancel(handle)
        handle.done.wait(30)
        raise
    finally:
        client.close()


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the engine process was killed by {name}"
    return f"the engine process exited with code {code}"
