"""The main window: library sidebar, detail / chat / compare tabs, status bar, banner.

The window owns one QtEngineClient (the only bridge to the engine process) and a
Catalog. Every catalog change goes through the engine package and is followed by a
library refresh; the engine never runs on the GUI thread, so nothing freezes.
"""

from __future__ import annotations

import html
from typing import Any

from PySide6.QtCore import QSettings, QTimer
from PySide6.QtGui import QAction, QCloseEvent, QDragEnterEvent, QDropEvent, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMessageBox,
    QProgressDialog,
    QPushButton,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from engine import openvino_default, paths, settings, statefile
from engine.catalog import Catalog
from engine.entries import show_entry
from engine.errors import StudioError
from gui import theme
from gui.chat import ChatView
from gui.compare import CompareView
from gui.composer import ComposerDialog
from gui.detail import DetailPane
from gui.engine_client import QtEngineClient
from gui.library import LibraryView, snapshot
from gui.settings_dialog import SettingsDialog
from gui.tasks import Task
from gui.train_page import TrainPage
from gui.wizard import ImportDialog


class Banner(QFrame):
    """A strip at the top of the window for the engine stopping, with a retry."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("banner")
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.retry = QPushButton("Restart engine")
        self.dismiss = QPushButton("Dismiss")
        self.dismiss.clicked.connect(self.hide)
        layout = QHBoxLayout(self)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.retry)
        layout.addWidget(self.dismiss)
        self.hide()

    STYLES = {
        "error": "#banner{background:#fbe3e3;border-bottom:1px solid #d23c3c}"
                 "#banner QLabel{color:#6b1010}",
        "info": "#banner{background:#fdf3d8;border-bottom:1px solid #c07a00}"
                "#banner QLabel{color:#5a3a00}",
    }

    def show_message(self, text: str, kind: str = "error") -> None:
        self.setStyleSheet(self.STYLES[kind])
        self.retry.setVisible(kind == "error")
        self.label.setText(text)
        self.show()


class MainWindow(QMainWindow):
    def __init__(self, catalog: Catalog | None = None,
                 client: QtEngineClient | None = None) -> None:
        super().__init__()
        self.setWindowTitle("Variant Studio")
        self.setAcceptDrops(True)
        self.catalog = catalog or Catalog()
        # The app's first run gets the shipped demo variant, like the CLI's.
        self.catalog.ensure_initialized(demo=True)
        prefs = settings.load()
        self.client = client or QtEngineClient(self, threads=prefs.threads)
        self.window_state = QSettings(str(paths.data_dir() / "window.ini"),
                                      QSettings.Format.IniFormat)
        self.theme = str(self.window_state.value("theme", "system"))
        self._tasks: list[Task] = []

        self.library = LibraryView()
        self.detail = DetailPane()
        self.chat = ChatView(self.client, self.catalog)
        self.compare = CompareView(self.client, self.catalog)
        self.train = TrainPage(self.catalog)
        self.tabs = QTabWidget()
        self.tabs.addTab(self.detail, "Details")
        self.tabs.addTab(self.chat, "Chat")
        self.tabs.addTab(self.compare, "Compare")
        self.tabs.addTab(self.train, "Train")
        self.splitter = QSplitter()
        self.splitter.addWidget(self.library)
        self.splitter.addWidget(self.tabs)
        self.splitter.setStretchFactor(1, 3)
        self.splitter.setSizes([300, 900])
        self.banner = Banner()
        self.banner.retry.clicked.connect(self.restart_engine)
        central = QWidget()
        layout = QVBoxLayout(central)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self.banner)
        layout.addWidget(self.splitter, 1)
        self.setCentralWidget(central)

        self.engine_label = QLabel()
        self.resident_label = QLabel()
        self.memory_label = QLabel()
        for label in (self.engine_label, self.resident_label, self.memory_label):
            self.statusBar().addPermanentWidget(label)

        self.library.selected.connect(self._selected)
        self.detail.chatRequested.connect(self.open_chat)
        self.detail.compareRequested.connect(self.open_compare)
        self.detail.editRequested.connect(lambda n: self.compose(editing=n))
        self.detail.duplicateRequested.connect(lambda n: self.compose(duplicate_of=n))
        self.detail.newVariantRequested.connect(lambda n: self.compose(adapter=n))
        self.detail.removeRequested.connect(self.remove_entry)
        self.detail.convertRequested.connect(self.convert_adapter)
        self.detail.defaultRequested.connect(self.set_default)
        self.chat.answered.connect(self.client.describe)
        self.compare.busyChanged.connect(lambda busy: None if busy else self.client.describe())
        self.train.variantCreated.connect(self._trained)
        self.train.catalogChanged.connect(self.refresh)
        self.client.stateChanged.connect(self._engine_state)
        self.client.described.connect(self._described)
        self.client.failed.connect(self._request_failed)

        self._make_actions()
        self.refresh()
        self._restore()
        self._show_state_notices()
        self._engine_state(self.client.state, "")
        # Start the engine process early so the first answer comes sooner.
        QTimer.singleShot(0, self.client.describe)

    # ---------------------------------------------------------------- actions

    def _make_actions(self) -> None:
        def action(text: str, shortcut: str | None, slot: Any, tip: str = "") -> QAction:
            act = QAction(text, self)
            if shortcut:
                act.setShortcut(QKeySequence(shortcut))
            act.setStatusTip(tip)
            act.triggered.connect(slot)
            self.addAction(act)
            return act

        self.act_import = action("Import adapter…", "Ctrl+I", lambda: self.import_adapter(),
                                 "Import a GGUF or PEFT LoRA adapter")
        self.act_model = action("Add base model…", None, self.add_model)
        self.act_variant = action("New variant…", "Ctrl+Shift+N", lambda: self.compose())
        self.act_new_chat = action("New chat", "Ctrl+N", self._new_chat)
        self.act_stop = action("Stop", "Esc", self.stop_current, "Stop generating")
        self.act_compare = action("Compare with base", "Ctrl+K", self._compare_current)
        self.act_search = action("Search library", "Ctrl+F", self.library.search.setFocus)
        self.act_settings = action("Settings…", "Ctrl+,", self.open_settings)
        self.act_restart = action("Restart engine", None, self.restart_engine)
        self.act_openvino = action("Build the OpenVINO default model…", None,
                                   self.build_openvino_default,
                                   "Make the embedded model servable by OpenVINO")
        self.act_quit = action("Quit", "Ctrl+Q", self.close)
        menu = self.menuBar()
        file_menu = menu.addMenu("&File")
        for act in (self.act_import, self.act_model, None, self.act_settings, None,
                    self.act_quit):
            file_menu.addSeparator() if act is None else file_menu.addAction(act)
        model_menu = menu.addMenu("&Model")
        for act in (self.act_variant, self.act_new_chat, self.act_compare, self.act_stop,
                    self.act_search):
            model_menu.addAction(act)
        engine_menu = menu.addMenu("&Engine")
        engine_menu.addAction(self.act_restart)
        engine_menu.addAction(self.act_openvino)
        toolbar = self.addToolBar("Main")
        toolbar.setObjectName("main-toolbar")
        toolbar.setMovable(False)
        for act in (self.act_import, self.act_variant, self.act_new_chat, self.act_compare,
                    self.act_stop):
            toolbar.addAction(act)

    # ---------------------------------------------------------------- library

    def refresh(self) -> None:
        try:
            entries = snapshot(self.catalog)
        except StudioError as exc:
            self.statusBar().showMessage(exc.message, 10000)
            return
        self.library.load(entries)
        self.compare.set_variants(self.library.model.names("variant"))
        self.chat.catalog_changed()
        self.train.refresh()
        current = self.library.current()
        if current:
            self._selected(*current)

    def _selected(self, kind: str, name: str) -> None:
        try:
            entry = show_entry(self.catalog, name)
        except StudioError as exc:
            self.statusBar().showMessage(exc.message, 10000)
            return
        self.detail.show_entry(entry, is_default=settings.load().default_model == name)
        if kind in ("model", "variant"):
            self.chat.set_model(name)
        if kind == "variant":
            self.compare.select_variant(name)

    def select(self, name: str) -> None:
        self.library.select(name)

    # ---------------------------------------------------------------- commands

    def import_adapter(self, path: str | None = None) -> ImportDialog:
        dialog = ImportDialog(self.catalog, path, self)
        dialog.finished.connect(lambda _code: self._imported(dialog))
        dialog.open()
        return dialog

    def _imported(self, dialog: ImportDialog) -> None:
        if not dialog.result_names:
            return
        self.refresh()
        self.select(dialog.result_names.get("variant") or dialog.result_names["adapter"])
        self.statusBar().showMessage(f"imported {dialog.result_names['adapter']}", 8000)

    def add_model(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Base model (GGUF)", "",
                                              "GGUF models (*.gguf);;All files (*)")
        if not path:
            return
        from pathlib import Path

        name = "".join(c if c.isalnum() or c in "._-" else "-" for c in Path(path).stem)[:64]
        try:
            self.catalog.add_model(name, Path(path), settings.load().default_backend)
        except StudioError as exc:
            QMessageBox.warning(self, "Model not added", exc.message)
            return
        self.refresh()
        self.select(name)

    def compose(self, editing: str | None = None, duplicate_of: str | None = None,
                adapter: str | None = None) -> ComposerDialog:
        dialog = ComposerDialog(self.catalog, editing, duplicate_of, adapter, self)
        dialog.finished.connect(lambda _code: self._composed(dialog))
        dialog.open()
        return dialog

    def _composed(self, dialog: ComposerDialog) -> None:
        if dialog.saved_name:
            self.refresh()
            self.select(dialog.saved_name)

    def _trained(self, name: str) -> None:
        self.refresh()
        self.select(name)
        self.statusBar().showMessage(f"trained variant {name} is ready", 10000)

    def convert_adapter(self, name: str) -> Task:
        """Give an adapter a file for the other backend (GGUF <-> PEFT), in the background."""
        record = self.catalog.adapter(name)
        backend = "openvino" if record["backend"] == "llama" else "llama"
        task = Task(lambda progress, _cancelled: self.catalog.convert_adapter(
            name, backend, progress=progress), self)
        task.succeeded.connect(lambda _r: (self.refresh(), self.statusBar().showMessage(
            f"{name} now has a {backend} file", 8000)))
        task.failed.connect(lambda message: QMessageBox.warning(
            self, "Not converted", message))
        task.start()
        self._tasks.append(task)
        task.done.connect(lambda: self._tasks.remove(task))
        return task

    def remove_entry(self, name: str) -> None:
        answer = QMessageBox.question(self, "Remove", f"Remove {name} from the catalog?")
        if answer != QMessageBox.StandardButton.Yes:
            return
        try:
            self.catalog.remove(name)
        except StudioError as exc:
            QMessageBox.warning(self, "Not removed", exc.message)
            return
        self.refresh()

    def set_default(self, name: str) -> None:
        settings.update(default_model=name)
        self.statusBar().showMessage(f"{name} is now the default model", 6000)
        self._selected(*(self.library.current() or ("", name)))

    def open_chat(self, name: str) -> None:
        self.library.select(name)  # the sidebar always shows what the tabs are about
        self.chat.set_model(name)
        self.tabs.setCurrentWidget(self.chat)
        self.chat.input.setFocus()

    def open_compare(self, name: str) -> None:
        self.library.select(name)
        self.compare.select_variant(name)
        self.tabs.setCurrentWidget(self.compare)
        self.compare.prompt.setFocus()

    def _compare_current(self) -> None:
        current = self.library.current()
        if current and current[0] == "variant":
            self.open_compare(current[1])
        else:
            self.tabs.setCurrentWidget(self.compare)

    def _new_chat(self) -> None:
        self.tabs.setCurrentWidget(self.chat)
        self.chat.new_chat()

    def stop_current(self) -> None:
        self.chat.stop()
        self.compare.stop()

    def open_settings(self) -> None:
        dialog = SettingsDialog(self.theme, self)
        if dialog.exec():
            self.theme = dialog.theme.currentText()
            self.window_state.setValue("theme", self.theme)
            theme.apply(QApplication.instance(), self.theme)
            if dialog.threads_changed:
                self.restart_engine()

    def build_openvino_default(self) -> None:
        """Build the curated OpenVINO twin of the embedded model (about 30 s, once)."""
        if openvino_default.is_registered(self.catalog):
            self.statusBar().showMessage("the OpenVINO default model is already built", 6000)
            return
        request = self.client.submit("build_openvino_default", {})
        dialog = QProgressDialog("Building the OpenVINO default model from the embedded "
                                 "GGUF…", "Cancel", 0, 1000, self)
        dialog.setWindowTitle("OpenVINO default model")
        dialog.setMinimumDuration(0)
        dialog.canceled.connect(lambda: self.client.stop(request))

        def progress(request_id: str, event: dict) -> None:
            if request_id == request:
                dialog.setLabelText(str(event.get("stage", "")))
                dialog.setValue(int(float(event.get("fraction", 0.0)) * 999))

        def finished(request_id: str, result: Any) -> None:
            if request_id != request:
                return
            disconnect()
            try:
                openvino_default.ensure_default(self.catalog, builder=lambda _p: result)
            except StudioError as exc:
                QMessageBox.warning(self, "OpenVINO default", exc.message)
            self.refresh()
            self.statusBar().showMessage("OpenVINO default model ready: variants of the "
                                         "embedded model can now be served by OpenVINO",
                                         10000)

        def ended(request_id: str, *details: Any) -> None:
            if request_id != request:
                return
            disconnect()
            if details:
                QMessageBox.warning(self, "OpenVINO default", str(details[0]))

        def disconnect() -> None:
            dialog.reset()
            self.client.progress.disconnect(progress)
            self.client.finished.disconnect(finished)
            self.client.failed.disconnect(ended)
            self.client.cancelled.disconnect(ended)

        self.client.progress.connect(progress)
        self.client.finished.connect(finished)
        self.client.failed.connect(ended)
        self.client.cancelled.connect(ended)
        self._openvino_dialog = dialog

    def restart_engine(self) -> None:
        self.banner.hide()
        self.client.restart()
        QTimer.singleShot(200, self.client.describe)

    # ---------------------------------------------------------------- engine state

    def _engine_state(self, state: str, detail: str) -> None:
        labels = {"running": "● engine running", "stopped": "○ engine idle",
                  "crashed": "✗ engine stopped"}
        self.engine_label.setText(labels.get(state, state))
        if state == "crashed":
            self.banner.show_message(
                f"<b>The engine process stopped.</b> {html.escape(detail)}<br>Your catalog "
                "and conversations are safe. The engine restarts with the next request.")

    def _show_state_notices(self) -> None:
        """State files that were unreadable at start were set aside: say so."""
        notes = statefile.take_notices()
        if notes:
            self.banner.show_message(
                "<b>Some saved state could not be read and was set aside</b> (nothing was "
                "deleted):<br>" + "<br>".join(html.escape(n) for n in notes), kind="info")

    def _described(self, info: dict[str, Any]) -> None:
        residents = info.get("residents") or []
        sessions = info.get("sessions") or []
        self.resident_label.setText(
            "resident: " + (", ".join(r["base"] for r in residents) or "none") +
            f" · {len(sessions)} session(s)")
        rss = (info.get("memory") or {}).get("rss_bytes", 0)
        self.memory_label.setText(f"{rss / 2**20:.0f} MiB")

    def _request_failed(self, _request_id: str, message: str, _details: list) -> None:
        self.statusBar().showMessage(message, 15000)

    # ---------------------------------------------------------------- drag and drop

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if event.mimeData().hasUrls():
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        urls = event.mimeData().urls()
        if urls and urls[0].isLocalFile():
            self.import_adapter(urls[0].toLocalFile())

    # ---------------------------------------------------------------- state

    def _restore(self) -> None:
        geometry = self.window_state.value("geometry")
        if geometry is not None:
            self.restoreGeometry(geometry)
        else:
            self.resize(1280, 800)
        splitter = self.window_state.value("splitter")
        if splitter is not None:
            self.splitter.restoreState(splitter)
        chat_splitter = self.window_state.value("chat_splitter")
        if chat_splitter is not None:
            self.chat.splitter.restoreState(chat_splitter)
        self.tabs.setCurrentIndex(int(self.window_state.value("tab", 0) or 0))
        # The last selection, else the default model, else (a first run) the first
        # variant, so the window never opens on an empty detail pane.
        candidates = [self.window_state.value("selection"), settings.load().default_model,
                      *self.library.model.names("variant"), *self.library.model.names("model")]
        for name in candidates:
            if name and self.library.select(str(name)):
                break

    def save_state(self) -> None:
        self.window_state.setValue("geometry", self.saveGeometry())
        self.window_state.setValue("splitter", self.splitter.saveState())
        self.window_state.setValue("chat_splitter", self.chat.splitter.saveState())
        self.window_state.setValue("tab", self.tabs.currentIndex())
        current = self.library.current()
        if current:
            self.window_state.setValue("selection", current[1])
        self.window_state.sync()

    def closeEvent(self, event: QCloseEvent) -> None:
        if self.train.busy():
            answer = QMessageBox.question(
                self, "Training in progress",
                "A training run is in progress. Stop it and quit? (Its last checkpoint is "
                "kept and can be resumed.)")
            if answer != QMessageBox.StandardButton.Yes:
                event.ignore()
                return
        self.save_state()
        self.stop_current()
        self.train.client.shutdown()
        self.client.close()
        super().closeEvent(event)
