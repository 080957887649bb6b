"""The server's way to the engine: one `EngineClient` shared by every request, its
typed events handed from the client's reader thread to the request's asyncio task.

A request holds a slot while it runs; when `queue_limit` requests are in flight the
next one is told to come back (429 with Retry-After). Leaving the `stream` block
before the request ended (the client disconnected, or the handler failed) cancels it
in the engine, so a disconnect stops its generation.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from engine.runtime import messages as m
from engine.runtime.client import EngineClient
from engine.serve.errors import ApiError


class EngineBridge:
    def __init__(self, client: EngineClient, queue_limit: int) -> None:
        self.client = client
        self.queue_limit = queue_limit
        self.in_flight = 0
        self.served = 0

    @contextlib.asynccontextmanager
    async def stream(self, request: m.Request) -> AsyncIterator[AsyncIterator[m.Event]]:
        """The request's events, ending with its terminal one."""
        if self.in_flight >= self.queue_limit:
            raise ApiError(429, f"the server is busy ({self.in_flight} requests in flight); "
                           "retry shortly", None, "rate_limit_exceeded", {"Retry-After": "1"})
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[m.Event] = asyncio.Queue()

        def deliver(event: m.Event) -> None:  # on the client's reader thread
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody listens
                loop.call_soon_threadsafe(events.put_nowait, event)

        self.in_flight += 1
        handle = self.client.submit(request, deliver)

        async def iterate() -> AsyncIterator[m.Event]:
            while True:
                event = await events.get()
                yield event
                if isinstance(event, m.TERMINAL):
                    return

        try:
            yield iterate()
        finally:
            self.in_flight -= 1
            self.served += 1
            if not handle.done.is_set():
                self.client.cancel(handle)

    async def call(self, request: m.Request) -> Any:
        """The result of a request that streams nothing (describe)."""
        async with self.stream(request) as events:
            async for event in events:
                if isinstance(event, m.Finished):
                    return event.result
                if isinstance(event, m.Failed):
                    raise event.error
        return None
