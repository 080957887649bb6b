"""The client side of the engine process, with no Qt.

`EngineClient` is the worker service's client (`engine.runtime.service`) for `python -m
engine.runtime.host`: started on demand, every request with an id and its typed events
(`engine.runtime.messages`; a result read as its typed result, `engine.runtime.results`)
delivered to a callback on the reader thread, each request ending exactly once. If the
process dies, every request in flight fails with "engine stopped: ..." and the last
lines of its log, and the next request starts a fresh engine. The GUI wraps this in Qt
signals; the CLI, the local server and tests use it directly.
"""

from __future__ import annotations

from typing import Any

from engine.runtime import messages as m
from engine.runtime.service import (
    EnvFactory,
    EventCallback,
    RequestHandle,
    ServiceClient,
    StateCallback,
)

__all__ = ["EngineClient", "RequestHandle", "run_once"]
HOST_MODULE = "engine.runtime.host"


class EngineClient(ServiceClient):
    def __init__(self, env: dict[str, str] | EnvFactory | None = None,
                 on_state: StateCallback | None = None) -> None:
        """`env` is the engine's environment, or a function called at each start that
        returns it (so a restarted engine sees settings changed since the last one)."""
        super().__init__(HOST_MODULE, what="the engine process", stopped="engine", env=env,
                         on_state=on_state)


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

