"""The engine as the views' controllers see it: start one request with a sink for its
events, and stop it.

`gui.engine_client.QtEngineClient.start` is the window's (the request's `Reply`, its
signals connected to the sink); a controller's tests give it a fake that delivers the
events by hand. A sink hears one request: tokens as they come, then exactly one of
`finished`, `failed` or `cancelled`. Plain Python: no Qt.
"""

from __future__ import annotations

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
