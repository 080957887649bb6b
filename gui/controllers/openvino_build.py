"""Building the curated OpenVINO default model from the window (about 30 s, once).

One flow, written as a coroutine on the qasync loop (`gui.aio`) because it is a chain
of waits: ask the engine process to build the IR (`openvino_default.build_request()`;
a progress dialog follows the reply's `progress` and its Cancel stops the reply), then
register the build in the catalog on a worker thread (`ensure_default` hashes the IR
and gives the shipped demo adapter its OpenVINO file, which reads whole files), with
its own `Catalog`, then announce the change. Any step's failure is shown in a
non-blocking warning (no modal `exec()` inside a coroutine).

Signals: `message(text, ms)` for the status bar; `finished(outcome)` at the end of each
started build: "built", "cancelled" or "failed".
"""

from __future__ import annotations

import asyncio

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QProgressDialog, QWidget

from engine.catalog.store import Catalog
from engine.curated import demo, openvino_default
from engine.errors import Cancelled, StudioError
from gui import aio, notify
from gui.catalog_events import CatalogEvents
from gui.engine_client import QtEngineClient, Reply
from gui.tasks import Task

TITLE = "OpenVINO default model"


class OpenVinoBuild(QObject):
    message = Signal(str, int)  # status bar text, milliseconds
    finished = Signal(str)  # "built" | "cancelled" | "failed"

    def __init__(self, client: QtEngineClient, catalog: Catalog, events: CatalogEvents,
                 parent: QWidget) -> None:
        super().__init__(parent)
        self.client = client
        self.catalog = catalog
        self.events = events
        self.window = parent
        self.flow: asyncio.Task | None = None
        self.reply: Reply | None = None  # the engine's build, while it runs
        self.register: Task | None = None  # the catalog registration, while it runs
        self.dialog: QProgressDialog | None = None

    def running(self) -> bool:
        return self.flow is not None and not self.flow.done()

    def start(self) -> asyncio.Task | None:
        """Build it, unless it is built already (or being built: the dialog is shown)."""
        if self.running():
            if self.dialog is not None:
                self.dialog.show()
            return self.flow
        if openvino_default.is_registered(self.catalog):
            self.message.emit("the OpenVINO default model is already built", 6000)
            return None
        self.flow = aio.spawn(self._build())
        return self.flow

    def stop(self) -> None:
        """Stop a running build (the window is closing): nothing is registered."""
        if self.reply is not None:
            self.reply.stop()
        if self.register is not None:
            self.register.cancel()
        if self.flow is not None:
            self.flow.cancel()

    async def _build(self) -> None:
        try:
            outcome = await self._steps()
        except asyncio.CancelledError:
            outcome = "cancelled"
        finally:
            self.reply = self.register = None
            if self.dialog is not None:
                self.dialog.reset()
                self.dialog.hide()
        self.finished.emit(outcome)

    async def _steps(self) -> str:
        dialog = self._progress_dialog()
        try:
            reply = self.client.submit(openvino_default.build_request())
        except StudioError as exc:  # the embedded model is not installed
            notify.warn(self.window, TITLE, exc.message)
            return "failed"
        self.reply = reply
        reply.progress.connect(lambda stage, fraction: (
            dialog.setLabelText(stage), dialog.setValue(int(fraction * 999))))
        dialog.canceled.connect(reply.stop)
        try:
            result = await reply
        except Cancelled:
            self.message.emit("the OpenVINO build was cancelled; nothing was added", 8000)
            return "cancelled"
        except StudioError as exc:
            notify.warn(self.window, TITLE, exc.message)
            return "failed"
        finally:
            dialog.canceled.disconnect(reply.stop)
            self.reply = None

        dialog.setLabelText("Adding it to the catalog…")
        dialog.setCancelButton(None)  # the record is written in one step
        dialog.setRange(0, 0)
        worker = Catalog(self.catalog.state)
        self.register = Task(lambda _progress, _cancelled: openvino_default.ensure_default(
            worker, builder=lambda _p: result), self)
        try:
            await self.register
        except Cancelled:
            return "cancelled"
        except StudioError as exc:
            notify.warn(self.window, TITLE, exc.message)
            return "failed"
        self.events.changed(["model", "adapter"], [openvino_default.NAME, demo.ADAPTER_NAME])
        self.message.emit("OpenVINO default model ready: variants of the embedded model can "
                          "now be served by OpenVINO", 10000)
        return "built"

    def _progress_dialog(self) -> QProgressDialog:
        dialog = QProgressDialog("Building the OpenVINO default model from the embedded "
                                 "GGUF…", "Cancel", 0, 1000, self.window)
        dialog.setWindowTitle(TITLE)
        dialog.setMinimumDuration(0)
        dialog.setAutoClose(False)
        dialog.setAutoReset(False)
        if self.dialog is not None:
            self.dialog.deleteLater()
        self.dialog = dialog
        dialog.setValue(0)
        dialog.show()
        return dialog
