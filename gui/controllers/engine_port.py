"""The engine as the views' controllers see it: start one request with a sink for its
events, and stop it.

`gui.engine_client.QtEngineClient.start` is the window's (the request's `Reply`, its
signals connected to the sink); a controller's tests give it a fake that delivers the
events by hand. A sink hears one request: tokens as they come, then exactly one of
`finished`, `failed` or `cancelled`. Plain Python: no Qt.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from engine.runtime.messages import Request


class RequestSink(Protocol):
    def tokens(self, side: str, text: str, tokens: list) -> None:
        """Text since the last delivery and, per token, [token id, logprob, text]."""

    def finished(self, result: Any) -> None: ...

    def failed(self, message: str, details: list) -> None: ...

    def cancelled(self) -> None: ...


class Running(Protocol):
    """A request on its way: stopping it delivers no more tokens (then `cancelled`)."""

    def stop(self) -> None: ...


class Engine(Protocol):
    def start(self, request: Request, sink: RequestSink) -> Running: ...


class CurrentSink:
    """One request's events, passed on while `current()` says the controller still waits
    for this request: one the user moved away from may still deliver, and is not heard."""

    def __init__(self, current: Callable[[], bool],
                 on_tokens: Callable[[str, str, list], None],
                 on_finished: Callable[[Any], None], on_failed: Callable[[str], None],
                 on_cancelled: Callable[[], None]) -> None:
        self.current = current
        self._on_tokens, self._on_finished = on_tokens, on_finished
        self._on_failed, self._on_cancelled = on_failed, on_cancelled

    def tokens(self, side: str, text: str, tokens: list) -> None:
        if self.current():
            self._on_tokens(side, text, tokens)

    def finished(self, result: Any) -> None:
        if self.current():
            self._on_finished(result)

    def failed(self, message: str, _details: list) -> None:
        if self.current():
            self._on_failed(message)

    def cancelled(self) -> None:
        if self.current():
            self._on_cancelled()
