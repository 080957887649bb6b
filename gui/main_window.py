"""The main window: library sidebar, detail / chat / compare tabs, status bar, banner.

The window owns one QtEngineClient (the only bridge to the engine process) and a
Catalog. Every catalog change goes through the engine package and is followed by a
library refresh; the engine never runs on the GUI thread, so nothing freezes.
Nothing that reads a whole file runs on the GUI thread either: adding a base model
(hashing it) runs in a `Task` with a progress dialog and Cancel, and a refresh only
re-checks what the caches answer at once; the entries whose files are new or changed
on disk are badged "unchecked" and checked in the background.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from PySide6.QtCore import QSettings, Qt, QTimer
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

from engine.catalog import health
from engine.catalog import store as catalog_mod
from engine.curated import openvino_default
from engine.state import paths, settings, statefile
from engine.catalog.store import Catalog
from engine.catalog.entries import show_entry
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
from engine.curated import setup
from engine.catalog import imports


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
        setup.first_run(self.catalog, with_demo=True)
        # The client reads the settings (threads) each time it starts an engine.
        self.client = client or QtEngineClient(self)
        self.window_state = QSettings(str(paths.data_dir() / "window.ini"),
                                      QSettings.Format.IniFormat)
        self.theme = str(self.window_state.value("theme", "system"))
        self._tasks: list[Task] = []
        self._checking: set[str] = set()  # entries whose files are not checked yet
        self._check: Task | None = None  # the background check of those
        self._describe_when_stopped = False
        self.model_progress: QProgressDialog | None = None

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

        self.check_label = QLabel()
        self.check_button = QPushButton("Stop")
        self.check_button.setFlat(True)
        self.check_button.clicked.connect(self._check_button_clicked)
        self.statusBar().addPermanentWidget(self.check_label)
        self.statusBar().addPermanentWidget(self.check_button)
        self.check_label.hide()
        self.check_button.hide()
        self.engine_label = QLabel()
        self.resident_label = QLabel()
        self.memory_label = QLabel()
        self.threads_label = QLabel()
        self.threads_label.setToolTip("Inference threads of the engine process "
                                      "(Settings → Engine threads)")
        for label in (self.engine_label, self.resident_label, self.memory_label,
                      self.threads_label):
            self.statusBar().addPermanentWidget(label)

        self.library.selected.connect(self._selected)
        self.detail.chatRequested.connect(self.open_chat)
        self.detail.compareRequested.connect(self.open_compare)
        self.detail.editRequested.connect(lambda n: self.compose(editing=n))
        self.detail.duplicateRequested.connect(lambda n: self.compose(duplicate_of=n))
        self.detail.newVariantRequested.connect(lambda n: self.compose(adapter=n))
        self.detail.removeRequested.connect(self.remove_entry)
        self.detail.convertRequested.connect(self.convert_adapter)
        self.detail.buildRequested.connect(lambda _name: self.build_openvino_default())
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
        """Reload the library. What the caches cannot answer (a file that is new or
        changed on disk: hashing it again, perhaps gigabytes) is checked in the
        background; until then those entries are badged "unchecked"."""
        if self._check is not None:
            self._check.cancel()  # this refresh checks again; the old result is stale
            self._check = None
        try:
            self._checking = health.unchecked(self.catalog)
            entries = snapshot(self.catalog, checking=self._checking)
        except StudioError as exc:
            self.statusBar().showMessage(exc.message, 10000)
            return
        shown = self.library.current()
        self.library.load(entries)
        self.compare.set_variants(self.library.model.names("variant"))
        self.chat.catalog_changed()
        self.train.refresh()
        current = self.library.current()
        if current:
            self._selected(*current)
        elif shown:  # the entry on show was removed: show another, not a stale one
            self._select_first()
        if self._checking:
            self._start_check()
        else:
            self._show_check(None)

    def _start_check(self) -> Task:
        # The worker gets its own Catalog (same file): no memo shared across threads.
        worker = Catalog(self.catalog.state)

        def work(progress: Any, cancelled: Any) -> dict[str, list[str]]:
            health.check_files(worker, progress, cancelled)
            return health.status_of_records(worker)

        task = Task(work, self)
        self._check = task
        count = len(self._checking)
        self._show_check(f"checking {count} entr{'y' if count == 1 else 'ies'} "
                         "(files new or changed on disk)…", "Stop")
        task.progress.connect(lambda done, _total: task is self._check and self._show_check(
            f"checking {count} entr{'y' if count == 1 else 'ies'}… {done / 10:.0f} %",
            "Stop"))
        task.succeeded.connect(lambda problems: self._checked(task, problems))
        task.failed.connect(lambda message: task is self._check and self._check_ended(
            f"check failed: {message}"))
        task.cancelled.connect(lambda: task is self._check and self._check_ended(
            f"check stopped: {len(self._checking)} entries unchecked"))
        task.start()
        return task

    def _checked(self, task: Task, problems: dict[str, list[str]]) -> None:
        if task is not self._check:
            return  # a newer refresh replaced it
        self._check = None
        try:
            # Whatever changed again while it ran stays unchecked (no endless loop).
            self._checking = health.unchecked(self.catalog)
            entries = snapshot(self.catalog, problems, self._checking)
        except StudioError as exc:
            self._check_ended(exc.message)
            return
        self.library.load(entries)
        current = self.library.current()
        if current:
            self._selected(*current)
        if self._checking:
            self._check_ended(f"{len(self._checking)} entries changed while they were "
                              "checked")
        else:
            self._show_check(None)

    def _check_ended(self, message: str) -> None:
        self._check = None
        self._show_check(message, "Check now")

    def _show_check(self, text: str | None, button: str = "") -> None:
        self.check_label.setVisible(text is not None)
        self.check_button.setVisible(text is not None)
        self.check_label.setText(text or "")
        self.check_button.setText(button)

    def _check_button_clicked(self) -> None:
        if self._check is not None:
            self._check.cancel()
        else:
            self.refresh()

    def _selected(self, kind: str, name: str) -> None:
        built = True  # False only for the OpenVINO default before its first use
        if name in self._checking:
            # Its check would read whole files here on the GUI thread: wait for the
            # background check, which selects it again when it is done.
            self.detail.show_entry(None)
            self.detail.browser.setHtml(
                f"<p><b>{html.escape(name)}</b></p><p style='color:#888'>Checking its "
                "files in the background (new or changed on disk)…</p>")
        else:
            try:
                entry = show_entry(self.catalog, name)
            except StudioError as exc:
                self.statusBar().showMessage(exc.message, 10000)
                return
            self.detail.show_entry(entry, is_default=settings.load().default_model == name)
            built = entry.get("built", True)
        if kind == "variant" or (kind == "model" and built):
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

    def add_model(self, path: str | None = None) -> Task | None:
        """Add a base model: inspected and hashed (seconds per gigabyte) in a Task,
        with a progress dialog whose Cancel leaves the catalog unchanged."""
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self, "Base model (GGUF)", "",
                                                  "GGUF models (*.gguf);;All files (*)")
        if not path:
            return None
        file = Path(path)
        name = "".join(c if c.isalnum() or c in "._-" else "-" for c in file.stem)[:64]
        backend = settings.load().default_backend
        dialog = QProgressDialog(f"Reading and hashing {file.name}…", "Cancel", 0, 1000, self)
        dialog.setWindowTitle("Add base model")
        dialog.setWindowModality(Qt.WindowModality.WindowModal)
        dialog.setMinimumDuration(0)
        dialog.setAutoClose(False)
        dialog.setAutoReset(False)
        task = Task(lambda progress, cancelled: imports.add_model(self.catalog, 
            name, file, backend, progress=progress, cancelled=cancelled), self)
        task.progress.connect(lambda done, _total: dialog.setValue(done))
        dialog.canceled.connect(task.cancel)
        task.succeeded.connect(lambda _record: self._model_added(name))
        task.failed.connect(lambda message: QMessageBox.warning(self, "Model not added",
                                                                message))
        task.cancelled.connect(lambda: self._model_cancelled(name))

        def ended() -> None:
            dialog.canceled.disconnect(task.cancel)
            dialog.hide()
            self._tasks.remove(task)

        task.done.connect(ended)
        self._tasks.append(task)
        self.model_progress = dialog
        task.start()
        dialog.setValue(0)
        dialog.show()
        return task

    def _model_added(self, name: str) -> None:
        self.refresh()
        self.select(name)
        self.statusBar().showMessage(f"added base model {name}", 8000)

    def _model_cancelled(self, name: str) -> None:
        if name in self.catalog.data()["models"]:
            self._model_added(name)  # the cancel came after it was recorded
        else:
            self.statusBar().showMessage(f"adding {name} was cancelled; nothing was added",
                                         8000)

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
        task = Task(lambda progress, _cancelled: imports.convert_adapter(self.catalog, 
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
        """A fresh engine process, started with the settings as they are now."""
        self.banner.hide()
        if self.client.state == "running":
            # Describe (which starts the new engine) once the old one has gone.
            self._describe_when_stopped = True
            self.client.restart()
        else:
            self.client.describe()

    # ---------------------------------------------------------------- engine state

    def _engine_state(self, state: str, detail: str) -> None:
        labels = {"running": "● engine running", "stopped": "○ engine idle",
                  "crashed": "✗ engine stopped"}
        self.engine_label.setText(labels.get(state, state))
        if state != "running" and self._describe_when_stopped:
            self._describe_when_stopped = False
            self.client.describe()
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
        threads = info.get("n_threads")
        self.threads_label.setText(f"{threads} thread{'' if threads == 1 else 's'}"
                                   if threads else "")

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
        self._select_first(self.window_state.value("selection"))

    def _select_first(self, preferred: Any = None) -> None:
        """Select `preferred`, else the default model, else (a first run) the first
        variant, else the first model: the panes never show an empty or a stale entry."""
        candidates = [preferred, settings.load().default_model,
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
        if self._check is not None:
            self._check.cancel()
        self.train.client.shutdown()
        self.client.close()
        super().closeEvent(event)
