"""The only bridge between the window and the engine process.

Wraps engine.client.EngineClient (which delivers events on a reader thread) into Qt
signals on the GUI thread. Token events are buffered and delivered at most every
`FLUSH_MS` milliseconds, so a fast model cannot flood the event loop; a request that
was stopped delivers nothing but its `cancelled` signal. When the engine process
dies, `stateChanged("crashed", reason)` fires and the next request starts a fresh
engine. Each engine process gets its environment from the settings as they are when
it starts (`engine_environment`), so a restart applies a changed thread count.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal, Slot

from engine import settings
from engine.client import EngineClient, RequestHandle
from engine.protocol import error_from_payload

FLUSH_MS = 50


def engine_environment() -> dict[str, str]:
    """The environment of an engine process started now: ours plus the settings.

    Read at every start (engine/host.py reads VARIANT_STUDIO_THREADS once, when it
    starts), so changing the threads in Settings and restarting takes effect.
    Threads 0 means automatic: an inherited VARIANT_STUDIO_THREADS then still holds.
    """
    env = dict(os.environ)
    threads = settings.load().threads
    if threads:
        env["VARIANT_STUDIO_THREADS"] = str(threads)
    return env


class QtEngineClient(QObject):
    # request id, side ("main", "base", "variant"), text since the last delivery,
    # and per token since the last delivery: [token id, logprob, text]
    tokens = Signal(str, str, str, list)
    progress = Signal(str, dict)
    finished = Signal(str, object)
    failed = Signal(str, str, list)
    cancelled = Signal(str)
    stateChanged = Signal(str, str)
    described = Signal(dict)
    _raw = Signal(object)
    _state = Signal(str, str)

    def __init__(self, parent: QObject | None = None,
                 env: Callable[[], dict[str, str]] = engine_environment) -> None:
        super().__init__(parent)
        self._client = EngineClient(env=env, on_state=self._state.emit)
        self._handles: dict[str, RequestHandle] = {}
        self._buffers: dict[tuple[str, str], tuple[list[str], list]] = {}
        self._stopped: set[str] = set()
        self._raw.connect(self._on_raw)
        self._state.connect(self._on_state)
        self._timer = QTimer(self)
        self._timer.setInterval(FLUSH_MS)
        self._timer.timeout.connect(self._flush)
        self.state = "stopped"
        self.last_description: dict[str, Any] = {}

    # ---------------------------------------------------------------- requests

    def submit(self, op: str, params: dict[str, Any] | None = None) -> str:
        handle = self._client.submit(op, params, self._raw.emit)
        self._handles[handle.id] = handle
        return handle.id

    def generate(self, params: dict[str, Any]) -> str:
        return self.submit("generate", params)

    def compare(self, params: dict[str, Any]) -> str:
        return self.submit("compare", params)

    def describe(self) -> str:
        return self.submit("describe")

    def stop(self, request_id: str) -> None:
        """Stop a request: no token is delivered for it after this call."""
        handle = self._handles.get(request_id)
        if handle is None:
            return
        self._stopped.add(request_id)
        for key in [k for k in self._buffers if k[0] == request_id]:
            del self._buffers[key]
        self._client.cancel(handle)

    def is_busy(self) -> bool:
        return any(not h.done.is_set() for h in self._handles.values()
                   if h.op in ("generate", "compare"))

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

    @Slot(object)
    def _on_raw(self, message: dict[str, Any]) -> None:
        request_id = str(message.get("id"))
        event = message.get("event")
        if event == "token":
            if request_id in self._stopped:
                return
            key = (request_id, str(message.get("side", "main")))
            texts, toks = self._buffers.setdefault(key, ([], []))
            texts.append(message.get("text", ""))
            toks.append([message.get("token_id"), message.get("logprob"),
                         message.get("text", "")])
            if not self._timer.isActive():
                self._timer.start()
            return
        if event == "progress":
            self.progress.emit(request_id, message)
            return
        # A terminal event: deliver what is buffered first, so nothing arrives late.
        self._flush(request_id)
        handle = self._handles.pop(request_id, None)
        stopped = request_id in self._stopped
        self._stopped.discard(request_id)
        if event == "finished":
            result = message.get("result")
            if handle is not None and handle.op == "describe":
                self.last_description = result or {}
                self.described.emit(self.last_description)
            self.finished.emit(request_id, result)
        elif event == "cancelled" or stopped:
            self.cancelled.emit(request_id)
        else:
            error = error_from_payload(message.get("error") or {})
            self.failed.emit(request_id, error.message, list(error.details))

    @Slot()
    def _flush(self, only: str | None = None) -> None:
        for key in list(self._buffers):
            if only is not None and key[0] != only:
                continue
            texts, toks = self._buffers.pop(key)
            if key[0] not in self._stopped:
                self.tokens.emit(key[0], key[1], "".join(texts), toks)
        if not self._buffers:
            self._timer.stop()
