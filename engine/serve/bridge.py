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

    def engine_running(self) -> bool:
        """Whether the engine process is alive now (nothing is started to find out)."""
        return self.client.running()

    def check_capacity(self) -> None:
        """Refuse (429 with Retry-After) when `queue_limit` requests are in flight.

        A streamed reply calls it before its response starts, so a full queue is a 429
        status a client sees, not an error event after a 200 (`stream` checks again: a
        request admitted here may still find the queue filled meanwhile).
        """
        if self.in_flight >= self.queue_limit:
            raise ApiError(429, f"the server is busy ({self.in_flight} requests in flight); "
                           "retry shortly", None, "rate_limit_exceeded", {"Retry-After": "1"})

    @contextlib.asynccontextmanager
    async def stream(self, request: m.Request) -> AsyncIterator[AsyncIterator[m.Event]]:
        """The request's events, ending with its terminal one."""
        self.check_capacity()
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[m.Event] = asyncio.Queue()

        def deliver(event: m.Event) -> None:  # on the client's reader thread
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody listens
                loop.call_soon_threadsafe(events.put_nowait, event)

        # Submitted before the slot is taken: a submit that fails (the engine cannot be
        # started) must not keep a slot for good.
        handle = self.client.submit(request, deliver)
        self.in_flight += 1

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
