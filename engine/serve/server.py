"""Running the local server: uvicorn on the configured address, one engine process.

`serve` runs in the foreground (the `variant-studio serve` command; Ctrl-C stops it
cleanly). `ServerThread` runs the same server in a background thread with its own
event loop (the app's Server panel, tests), on a port of its choosing when given 0.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import threading
import time
from collections.abc import Callable

import uvicorn

from engine.catalog.store import Catalog
from engine.runtime.client import EngineClient
from engine.serve.app import LogEntry, Pending, ServerState, create_app, guarded
from engine.serve.bridge import EngineBridge
from engine.serve.config import ServeConfig
from engine.state import presence


def engine_client(config: ServeConfig,
                  on_state: Callable[[str, str], None] | None = None) -> EngineClient:
    def env() -> dict[str, str]:
        return {**os.environ, "VARIANT_STUDIO_MAX_SESSIONS": str(config.max_sessions)}

    return EngineClient(env=env, on_state=on_state)


class _Announced:
    """The server's file in `<data>/run/` (`engine.state.presence`, read by `status`),
    kept up to date with its engine's state once the server listens."""

    def __init__(self) -> None:
        self.presence: presence.Presence | None = None
        self.client: EngineClient | None = None

    def start(self, url: str) -> None:
        self.presence = presence.announce("server", url)
        if self.client is not None and self.client.running():
            self.presence.engine("running", self.client.pid)

    def engine(self, state: str, _detail: str) -> None:
        if self.presence is not None and self.client is not None:
            self.presence.engine(state, self.client.pid)

    def stop(self) -> None:
        if self.presence is not None:
            self.presence.close()
            self.presence = None


def _uvicorn(config: ServeConfig, app: object) -> uvicorn.Server:
    return uvicorn.Server(uvicorn.Config(
        app, host=config.host, port=config.port, log_level="warning", access_log=False,
        lifespan="off", server_header=False, proxy_headers=False,
        limit_concurrency=config.queue_limit * 2 + 16))


def _bind(config: ServeConfig) -> socket.socket:
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((config.host.strip("[]"), config.port))
    sock.set_inheritable(True)
    return sock


class ServerThread:
    """The server in a background thread: `start()`, then `port`, `state`, `stop()`.

    `on_request` hears each logged request, `on_pending` each generation as it reaches
    the engine; both are called on the server's thread."""

    def __init__(self, config: ServeConfig, catalog: Catalog | None = None,
                 on_request: Callable[[LogEntry], None] | None = None,
                 on_pending: Callable[[Pending], None] | None = None) -> None:
        self.config = config
        self._announced = _Announced()
        self.client = self._announced.client = engine_client(config, self._announced.engine)
        self.app = create_app(config, EngineBridge(self.client, config.queue_limit), catalog)
        self.state: ServerState = self.app.state.server
        if on_request is not None:
            self.state.listeners.append(on_request)
        if on_pending is not None:
            self.state.pending_listeners.append(on_pending)
        self._sock = _bind(config)  # bound now: a port in use fails here, not later
        self.port = self._sock.getsockname()[1]
        self._server = _uvicorn(config, guarded(self.app, config))
        self._thread = threading.Thread(target=self._run, name="server", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            asyncio.run(self._server.serve(sockets=[self._sock]))
        except BaseException as exc:  # reported by stop() / the caller
            self.error = exc

    def start(self, timeout: float = 30.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        pause = threading.Event()
        # uvicorn sets `started` and offers no callback for it.
        while not self._server.started and self._thread.is_alive() and \
                time.monotonic() < deadline:
            pause.wait(0.01)
        if not self._server.started:
            self.stop()
            raise RuntimeError(f"the server did not start: {self.error!r}")
        self._announced.start(self.url)
        return self

    @property
    def url(self) -> str:
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        return f"http://{host}:{self.port}"

    def stop(self, timeout: float = 30.0) -> None:
        self._announced.stop()
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._sock.close()
        self.client.close()


def serve(config: ServeConfig, catalog: Catalog | None = None,
          on_request: Callable[[LogEntry], None] | None = None) -> int:
    """Serve in the foreground until interrupted (SIGINT/SIGTERM); returns the exit code."""
    announced = _Announced()
    client = announced.client = engine_client(config, announced.engine)
    app = create_app(config, EngineBridge(client, config.queue_limit), catalog)
    if on_request is not None:
        app.state.server.listeners.append(on_request)
    sock = _bind(config)
    server = _uvicorn(config, guarded(app, config))
    host = f"[{config.host}]" if ":" in config.host else config.host
    print(f"serving on http://{host}:{sock.getsockname()[1]}/v1 "
          f"({'API key required' if config.api_key else 'no key: loopback only'}); "
          "Ctrl-C stops", file=sys.stderr, flush=True)
    announced.start(f"http://{host}:{sock.getsockname()[1]}")
    try:
        asyncio.run(server.serve(sockets=[sock]))
    finally:
        announced.stop()
        sock.close()
        client.close()
    return 0
