"""The local OpenAI-compatible server, run from the window (the Server panel).

`ServerController` owns one `engine.serve.server.ServerThread` at a time: uvicorn in a
background thread, with an engine process of its own (the window's chats and
comparisons keep theirs, so a client of the server never waits behind the window, or
the window behind a client). Starting binds the port and waits for uvicorn, stopping
joins its thread and ends its engine: both run in a `Task`, so the window never
freezes. The server reads the catalog on its own thread through its own `Catalog`
(none is shared across threads).

Every served or refused request is reported by the server's `on_request` callback, on
the server's thread; `_logged` is emitted there and, connected to `requestLogged` of
this GUI-thread object, arrives queued on the GUI thread. A generation that reached the
engine is announced the same way (`on_pending` -> `requestStarted`) before it ends.

Signals: `stateChanged(state, detail)` with state "stopped", "starting", "running",
"stopping" or "failed" (detail: the URL when running, the reason when it failed), and
`requestLogged(LogEntry)`, `requestStarted(Pending)`.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject, Signal

from engine.catalog.store import Catalog
from engine.errors import StudioError
from engine.serve.app import LogEntry
from engine.serve.config import ServeConfig
from engine.serve.server import ServerThread
from gui.tasks import Task


def _start(config: ServeConfig, catalog: Catalog, on_request: Any, on_pending: Any
           ) -> ServerThread:
    """Bind and start (on a worker thread); a port in use becomes a readable refusal."""
    try:
        server = ServerThread(config, catalog, on_request, on_pending)
    except OSError as exc:
        raise StudioError(f"cannot listen on {config.host}:{config.port}: "
                          f"{exc.strerror or exc}") from None
    try:
        return server.start()
    except RuntimeError as exc:
        raise StudioError(str(exc)) from None


class ServerController(QObject):
    stateChanged = Signal(str, str)
    requestLogged = Signal(object)  # LogEntry, on the GUI thread
    requestStarted = Signal(object)  # Pending, on the GUI thread
    _logged = Signal(object)  # emitted on the server's thread
    _pending = Signal(object)  # emitted on the server's thread

    def __init__(self, catalog: Catalog, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.catalog = catalog
        self.server: ServerThread | None = None
        self.config: ServeConfig | None = None
        self.state = "stopped"
        self.task: Task | None = None
        self._logged.connect(self.requestLogged)  # queued: across threads
        self._pending.connect(self.requestStarted)

    # ---------------------------------------------------------------- queries

    def running(self) -> bool:
        return self.server is not None

    @property
    def port(self) -> int | None:
        return self.server.port if self.server is not None else None

    @property
    def url(self) -> str | None:
        return self.server.url if self.server is not None else None

    def log(self) -> list[LogEntry]:
        return list(self.server.state.log) if self.server is not None else []

    def expose(self, names: tuple[str, ...] | None) -> None:
        """Change which models a running server offers, at once (None: all of them).

        `ServedModels.exposed` is read per request; replacing the tuple is atomic."""
        if self.server is not None:
            self.server.state.models.exposed = names

    # ---------------------------------------------------------------- start and stop

    def start(self, config: ServeConfig) -> Task | None:
        if self.task is not None or self.server is not None:
            return None
        self.config = config
        catalog = Catalog(self.catalog.state)  # the server thread's own
        task = Task(lambda _progress, _cancelled: _start(config, catalog, self._logged.emit,
                                                         self._pending.emit), self)
        task.succeeded.connect(self._started)
        task.failed.connect(lambda message: self._set("failed", message))
        task.done.connect(self._task_done)
        self.task = task
        self._set("starting", f"{config.host}:{config.port}")
        task.start()
        return task

    def _started(self, server: ServerThread) -> None:
        self.server = server
        self._set("running", server.url)

    def stop(self) -> Task | None:
        server = self.server
        if server is None or self.task is not None:
            return None
        self.server = None
        task = Task(lambda _progress, _cancelled: server.stop(), self)
        task.done.connect(self._task_done)
        task.done.connect(lambda: self._set("stopped", ""))
        self.task = task
        self._set("stopping", "")
        task.start()
        return task

    def _task_done(self) -> None:
        self.task = None

    def shutdown(self) -> None:
        """At quit: stop now, on this thread (the window is closing anyway)."""
        task = self.task
        if task is not None:
            task.wait(60)
            if self.server is None and isinstance(task.result, ServerThread):
                self.server = task.result  # started; its signal is still queued
        server, self.server = self.server, None
        if server is not None:
            server.stop()
        self.state = "stopped"

    def _set(self, state: str, detail: str) -> None:
        self.state = state
        self.stateChanged.emit(state, detail)
