"""An engine client whose engine runs in this process: the host's own request handling
(`engine.runtime.host.Host.serve`, its scheduler on its engine thread) on a thread, fed
through a line queue instead of a pipe, for the unit tier.

It speaks the client's part the local server's bridge uses (`submit`, `cancel`, a
handle with `done`), plus `call` and `submit_raw` for tests. Every message the host
sends goes through JSON as on the wire, then `messages.decode_event`, so results are
read as the real client reads them. Unlike `EngineClient` it hides nothing: every event
is delivered and kept (`RequestHandle.messages`), so a test can count terminal events.

`InProcessEngine.handled(n)` returns once the host's reading thread has dealt with the
first `n` lines (queued them, or acted on a cancel): the host asks for line n + 1 only
then. With the fake backend's pauses this orders a test's steps without sleeping.
"""

from __future__ import annotations

import itertools
import json
import queue
import sys
import threading
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from engine.errors import Cancelled, EngineError, StudioError
from engine.runtime import messages as m
from engine.runtime import protocol
from engine.runtime.host import Host

TIMEOUT = 30.0
EventCallback = Callable[[m.Event], None]


@dataclass
class RequestHandle:
    id: str
    op: str
    kind: type[m.Request] | None
    on_event: EventCallback | None
    events: list[m.Event] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)  # as the host sent them
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def terminal(self) -> list[m.Event]:
        return [e for e in self.events if isinstance(e, m.TERMINAL)]

    def wait(self, timeout: float = TIMEOUT) -> Any:
        """The result; raises the request's error (Cancelled when it was cancelled)."""
        if not self.done.wait(timeout):
            raise EngineError(f"in-process engine: {self.op} did not end in {timeout} s")
        end = self.terminal[0]
        if isinstance(end, m.Finished):
            return end.result
        if isinstance(end, m.Cancelled):
            raise Cancelled(f"{self.op} cancelled")
        assert isinstance(end, m.Failed)
        raise end.error


class LineFeed:
    """The host's stdin: an iterator of lines that counts how many the host asked for."""

    def __init__(self) -> None:
        self.lines: queue.Queue[bytes | None] = queue.Queue()
        self.asked = 0
        self.changed = threading.Condition()

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        with self.changed:
            self.asked += 1
            self.changed.notify_all()
        line = self.lines.get()
        if line is None:
            raise StopIteration
        return line

    def put(self, message: dict[str, Any] | None) -> None:
        self.lines.put(None if message is None else protocol.encode(message))


class InProcessEngine:
    """Start with `start()` (or use as a context manager); `close()` shuts the host down
    as a closed stdin does."""

    def __init__(self) -> None:
        self.feed = LineFeed()
        self.written = 0
        self.ready = threading.Event()
        self.host = Host(self)  # the host sends its events to `send` below
        self.thread = threading.Thread(target=self.host.serve, name="host-main", daemon=True)
        self._pending: dict[str, RequestHandle] = {}
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._patch = pytest.MonkeyPatch()
        self.unmatched: list[dict[str, Any]] = []  # messages for no known request

    def start(self) -> InProcessEngine:
        # The host reads `sys.stdin.buffer`; the feed stands in for it while this runs.
        self._patch.setattr(sys, "stdin", types.SimpleNamespace(buffer=self.feed))
        self.thread.start()
        if not self.ready.wait(TIMEOUT):
            raise EngineError("in-process engine: the host never said ready")
        return self

    def __enter__(self) -> InProcessEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ the host's channel

    def send(self, message: dict[str, Any]) -> None:
        """Called by the host (its engine thread, or its main thread for "ready")."""
        message = json.loads(protocol.encode(message))  # what crosses the pipe
        if message.get("event") == "ready":
            self.ready.set()
            return
        with self._lock:
            handle = self._pending.get(str(message.get("id")))
        if handle is None:
            self.unmatched.append(message)
            return
        handle.messages.append(message)
        try:
            event = m.decode_event(message, handle.kind)
        except StudioError as exc:
            event = m.Failed(EngineError(f"malformed {handle.op} result: {exc.message}"))
        if event is None:
            return
        handle.events.append(event)
        if handle.on_event is not None:
            handle.on_event(event)
        if isinstance(event, m.TERMINAL):
            handle.done.set()

    # ------------------------------------------------------------ the client's part

    def _write(self, message: dict[str, Any] | None) -> None:
        with self._lock:  # the count and the order of lines agree
            self.feed.put(message)
            self.written += 1

    def submit(self, request: m.Request, on_event: EventCallback | None = None
               ) -> RequestHandle:
        return self.submit_raw(request.OP, request.to_params(), on_event, type(request))

    def submit_raw(self, op: str, params: Any, on_event: EventCallback | None = None,
                   kind: type[m.Request] | None = None) -> RequestHandle:
        with self._lock:
            handle = RequestHandle(f"r{next(self._ids)}", op, kind, on_event)
            self._pending[handle.id] = handle
            self._write({"id": handle.id, "op": op, "params": params})
        return handle

    def call(self, request: m.Request, timeout: float = TIMEOUT) -> Any:
        return self.submit(request).wait(timeout)

    def running(self) -> bool:
        """As `EngineClient.running`: the host thread serves until `close`."""
        return self.thread.is_alive()

    def cancel(self, handle: RequestHandle) -> None:
        if not handle.done.is_set():
            self._write({"op": "cancel", "target": handle.id})

    def handled(self, count: int | None = None, timeout: float = TIMEOUT) -> None:
        """Wait until the host's reader has dealt with the first `count` lines written
        (all of them by default)."""
        wanted = self.written if count is None else count
        with self.feed.changed:
            if not self.feed.changed.wait_for(lambda: self.feed.asked > wanted, timeout):
                raise EngineError(f"in-process engine: line {wanted} was never handled")

    def close(self) -> None:
        if self.thread.is_alive():
            self._write(None)  # stdin closed: the host stops after the current step
            self.thread.join(TIMEOUT)
        self._patch.undo()
