"""The only bridge between the window and the engine process.

Wraps engine.runtime.client.EngineClient (which delivers typed events on a reader
thread) into Qt objects on the GUI thread. `submit` returns a `Reply` per request,
the way `QNetworkAccessManager` returns a `QNetworkReply`: the view that asked
connects to that reply's own signals and hears nothing of other requests. Token
events are buffered and delivered at most every `FLUSH_MS` milliseconds, so a fast
model cannot flood the event loop — except each side's first token, delivered at once
(the time to first token a person sees is the engine's, not the engine's plus a timer);
a reply that was stopped delivers nothing but its `cancelled` signal. The client's
`generating` signal says a request's first token arrived: its model is resident then,
and the status bar asks the engine to describe itself. A reply can also be awaited
(with qasync's event loop), which reads better than chained callbacks for one-shot
work. When the engine process dies,
`stateChanged("crashed", reason)` fires and the next request starts a fresh engine.
Each engine process gets its environment from the settings as they are when it starts
(`engine_environment`), so a restart applies a changed thread count.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Generator
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal, Slot

from engine.errors import Cancelled, StudioError
from engine.runtime import messages as m
from engine.runtime.client import EngineClient, RequestHandle
from engine.runtime.results import EngineStatus
from engine.state import settings
from gui.controllers.engine_port import RequestSink
from gui.machine_load import load_of

FLUSH_MS = 50


def engine_environment() -> dict[str, str]:
    """The environment of an engine process started now: ours plus the settings.

    Read at every start (the host reads VARIANT_STUDIO_THREADS once, when it starts),
    so changing the threads in Settings and restarting takes effect. Threads 0 means
    automatic: an inherited VARIANT_STUDIO_THREADS then still holds.
    """
    env = dict(os.environ)
    threads = settings.load().threads
    if threads:
        env["VARIANT_STUDIO_THREADS"] = str(threads)
    return env


class Reply(QObject):
    """One engine request as seen by the view that made it (GUI thread only).

    Exactly one of `finished`, `failed` or `cancelled` fires, then `done`.
    """

    # side ("main", "base", "variant"), text since the last delivery, and per token
    # since the last delivery: [token id, logprob, text, names of the tool calls it
    # started]. With tools the text is the answer's content only: a call's JSON is
    # parsed out as it streams (the calls come whole with the result).
    tokens = Signal(str, str, list)
    progress = Signal(str, float)  # stage, fraction
    finished = Signal(object)  # the result
    failed = Signal(str, list)  # message, details
    cancelled = Signal()
    done = Signal()

    def __init__(self, client: QtEngineClient, request: m.Request) -> None:
        # No Qt parent: the view that holds the reply owns it (Python frees it after).
        super().__init__()
        self.request = request
        self.op = request.OP
        self.client = client
        self.handle: RequestHandle | None = None
        self.outcome: str | None = None  # finished | failed | cancelled
        self.result: Any = None
        self.error: StudioError | None = None
        self._stopped = False
        self._buffers: dict[str, tuple[list[str], list]] = {}
        self._sides: set[str] = set()  # sides whose first token was delivered

    @property
    def id(self) -> str:
        return self.handle.id if self.handle is not None else ""

    def is_done(self) -> bool:
        return self.outcome is not None

    def stop(self) -> None:
        """Stop the request: no token is delivered for it after this call."""
        if self.outcome is not None or self._stopped:
            return
        self._stopped = True
        self._buffers.clear()
        if self.handle is not None:
            self.client._client.cancel(self.handle)

    # ---------------------------------------------------------------- awaiting

    def __await__(self) -> Generator[Any, None, Any]:
        """`result = await reply` inside a qasync coroutine; raises the request's error
        (or Cancelled)."""
        future: asyncio.Future = asyncio.get_event_loop().create_future()

        def settle() -> None:
            if future.done():
                return
            if self.outcome == "finished":
                future.set_result(self.result)
            elif self.outcome == "cancelled":
                future.set_exception(Cancelled(f"{self.op} cancelled"))
            else:
                future.set_exception(self.error or StudioError(f"{self.op} failed"))

        if self.is_done():
            settle()
        else:
            self.done.connect(settle)
        return future.__await__()

    # ---------------------------------------------------------------- events

    def _event(self, event: m.Event) -> None:
        if isinstance(event, m.Token):
            if self._stopped:
                return
            texts, toks = self._buffers.setdefault(event.side, ([], []))
            texts.append(event.text if event.content is None else event.content)
            toks.append([event.token_id, event.logprob, event.text,
                         [c.name for c in event.calls if c.name]])
            if event.side not in self._sides:
                first = not self._sides
                self._sides.add(event.side)
                self.flush()  # the first token of a side is shown at once
                if first:
                    self.client.generating.emit(self.op)
                return
            self.client._schedule_flush()
            return
        if isinstance(event, m.Progress):
            if not self._stopped:
                self.progress.emit(event.stage, event.fraction)
            return
        # A terminal event: deliver what is buffered first, so nothing arrives late.
        self.flush()
        if isinstance(event, m.Finished):
            self.outcome, self.result = "finished", event.result
            self.finished.emit(event.result)
        elif isinstance(event, m.Cancelled) or self._stopped:
            self.outcome = "cancelled"
            self.cancelled.emit()
        else:
            assert isinstance(event, m.Failed)
            self.outcome, self.error = "failed", event.error
            self.failed.emit(event.error.message, list(event.error.details))
        self.done.emit()
        self.client._ended(self)

    def flush(self) -> None:
        buffers, self._buffers = self._buffers, {}
        if self._stopped:
            return
        for side, (texts, toks) in buffers.items():
            self.tokens.emit(side, "".join(texts), toks)

    def has_buffered(self) -> bool:
        return bool(self._buffers)


class QtEngineClient(QObject):
    stateChanged = Signal(str, str)
    described = Signal(object)  # an EngineStatus
    requestFailed = Signal(str, str)  # op, message (any request's failure, for a status line)
    generating = Signal(str)  # op: a request's first token arrived (its model is resident)
    # After each answer or comparison: a MachineLoad when other programs slowed the
    # engine, else None (gui.machine_load).
    machineLoad = Signal(object)
    _raw = Signal(object, object)  # reply, event: from the reader thread to the GUI thread
    _state = Signal(str, str)

    def __init__(self, parent: QObject | None = None,
                 env: Callable[[], dict[str, str]] = engine_environment) -> None:
        super().__init__(parent)
        self._client = EngineClient(env=env, on_state=self._state.emit)
        self._replies: set[Reply] = set()
        self._raw.connect(self._on_raw)
        self._state.connect(self._on_state)
        self._timer = QTimer(self)
        self._timer.setInterval(FLUSH_MS)
        self._timer.timeout.connect(self._flush)
        self.state = "stopped"
        self.last_description: EngineStatus | None = None

    # ---------------------------------------------------------------- requests

    def submit(self, request: m.Request) -> Reply:
        reply = Reply(self, request)
        self._replies.add(reply)
        reply.handle = self._client.submit(request, lambda event: self._raw.emit(reply, event))
        return reply

    def start(self, request: m.Request, sink: RequestSink) -> Reply:
        """`submit`, with the reply's events going to `sink` (a view's controller,
        `gui.controllers.engine_port`)."""
        reply = self.submit(request)
        # Lambdas, held by the connections: a bound method of a plain object is held
        # weakly, and a sink nobody else holds would stop hearing its request.
        reply.tokens.connect(lambda side, text, toks: sink.tokens(side, text, toks))
        reply.finished.connect(lambda result: sink.finished(result))
        reply.failed.connect(lambda message, details: sink.failed(message, details))
        reply.cancelled.connect(lambda: sink.cancelled())
        return reply

    def describe(self) -> Reply:
        return self.submit(m.Describe())

    def busy(self) -> bool:
        """Is a generation or comparison running?"""
        return any(isinstance(r.request, m.Generate) and not r.is_done()
                   for r in self._replies)

    def restart(self) -> None:
        """Kill the engine if it runs; the next request starts a fresh one.

        The exit is reported as `stateChanged("stopped", "restarted")`, not as a crash.
        """
        self._client.kill(expected=True)

    def close(self) -> None:
        self._timer.stop()
        self._client.close()

    def pid(self) -> int | None:
        return self._client.pid

    def log_tail(self, count: int = 20) -> list[str]:
        return self._client.log_tail(count)

    # ---------------------------------------------------------------- GUI thread

    @Slot(str, str)
    def _on_state(self, state: str, detail: str) -> None:
        self.state = state
        self.stateChanged.emit(state, detail)

    @Slot(object, object)
    def _on_raw(self, reply: Reply, event: m.Event) -> None:
        reply._event(event)

    def _schedule_flush(self) -> None:
        if not self._timer.isActive():
            self._timer.start()

    def _ended(self, reply: Reply) -> None:
        self._replies.discard(reply)
        if reply.outcome == "finished" and isinstance(reply.request, m.Describe):
            self.last_description = reply.result
            self.described.emit(reply.result)
        elif reply.outcome == "finished" and isinstance(reply.request, m.Generate):
            self.machineLoad.emit(load_of(reply.result))
        elif reply.outcome == "failed" and reply.error is not None:
            self.requestFailed.emit(reply.op, reply.error.message)

    @Slot()
    def _flush(self) -> None:
        for reply in list(self._replies):
            reply.flush()
        if not any(r.has_buffered() for r in self._replies):
            self._timer.stop()
