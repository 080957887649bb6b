"""The main window: library sidebar, detail / chat / compare / train tabs, status bar,
banner.

The window owns one QtEngineClient (the only bridge to the engine process), the
Catalog of the GUI thread and the `CatalogEvents` that every view, dialog and
controller shares. Every catalog change goes through the engine package and is
announced there (`catalogChanged(kinds, names)`); the window reloads the library for
changes of models, adapters and variants, and each view refreshes itself for the kinds
it shows. The engine never runs on the GUI thread, so nothing freezes. Nothing that
reads a whole file runs on the GUI thread either: adding a base model (hashing it) and
converting an adapter run in a `Task` with its own Catalog; the long flows live in
controllers (`gui.controllers`): the background check of entries whose files are new
or changed on disk, the OpenVINO build, and training.
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
    QSizePolicy,
    QSplitter,
    QStyle,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from engine.catalog import entries, health, imports
from engine.catalog.store import Catalog
from engine.curated import demo, setup
from engine.errors import StudioError
from engine.runtime.openvino import models as openvino_models
from engine.runtime.results import EngineStatus, MachineLoad
from engine.state import paths, presence, settings, statefile
from gui import help as help_menu
from gui import machine_load, notify, theme
from gui.catalog_events import CATALOG_KINDS, CatalogEvents, touches
from gui.chat import ChatView
from gui.compare import CompareView
from gui.composer import ComposerDialog
from gui.controllers.library_check import LibraryCheck
from gui.controllers.openvino_build import OpenVinoBuild
from gui.controllers.server import ServerController
from gui.controllers.training import TrainingController
from gui.detail import DetailPane
from gui.download_dialog import DownloadDialog
from gui.engine_client import QtEngineClient
from gui.evaluate import EvaluateView
from gui.library import LibraryView, snapshot
from gui.lineage import LineageDialog
from gui.server_panel import ServerPanel
from gui.settings_dialog import SettingsDialog
from gui.tasks import Task
from gui.train_page import TrainPage
from gui.widgets.elided_label import ElidedLabel
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
        self.topic = ""  # what is shown, when it has a name (`show_message`)
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

    def show_message(self, text: str, kind: str = "error", topic: str = "") -> None:
        """`topic` names what is shown ("welcome"), for whoever hears of a dismissal."""
        self.topic = topic
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
        self.first_run = setup.first_run(self.catalog, with_demo=True)
        # The client reads the settings (threads) each time it starts an engine.
        self.client = client or QtEngineClient(self)
        # `status` reads this (and the engine's state, kept up to date below): it never
        # starts an engine of its own to describe one.
        self.presence = presence.announce("app")
        self.events = CatalogEvents(self)
        self.window_state = QSettings(str(paths.data_dir() / "window.ini"),
                                      QSettings.Format.IniFormat)
        self.theme = str(self.window_state.value("theme", "system"))
        self._tasks: list[Task] = []  # adding a model, converting an adapter
        self._describe_when_stopped = False
        self.model_progress: QProgressDialog | None = None

        self.library_check = LibraryCheck(self.catalog, self)
        self.openvino = OpenVinoBuild(self.client, self.catalog, self.events, self)
        self.training = TrainingController(self.catalog, self.events, parent=self)
        self.library = LibraryView()
        self.detail = DetailPane()
        self.chat = ChatView(self.client, self.catalog, self.events)
        self.compare = CompareView(self.client, self.catalog, self.events)
        self.train = TrainPage(self.training)
        self.evaluate = EvaluateView(self.client, self.catalog, self.events)
        self.server_controller = ServerController(self.catalog, self)
        self.server = ServerPanel(self.server_controller, self.catalog, self.events,
                                  self.window_state)
        self.tabs = QTabWidget()
        self.tabs.addTab(self.detail, "Details")
        self.tabs.addTab(self.chat, "Chat")
        self.tabs.addTab(self.compare, "Compare")
        self.tabs.addTab(self.train, "Train")
        self.tabs.addTab(self.evaluate, "Evaluate")
        self.tabs.addTab(self.server, "Server")
        self.splitter = QSplitter()
        self.splitter.addWidget(self.library)
        self.splitter.addWidget(self.tabs)
        # A wider window widens the library a little too: one made narrow (1024 px)
        # and widened again has room for its names.
        self.splitter.setStretchFactor(0, 1)
        self.splitter.setStretchFactor(1, 3)
        self.splitter.setSizes([300, 900])
        # A collapsed library has no menu item to bring it back: it keeps its minimum
        # (set again after a restore, whose saved state carries the flag).
        self.splitter.setChildrenCollapsible(False)
        self.banner = Banner()
        self.banner.retry.clicked.connect(self.restart_engine)
        self.banner.dismiss.clicked.connect(self._banner_dismissed)
        central = QWidget()
        layout = QVBoxLayout(central)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self.banner)
        layout.addWidget(self.splitter, 1)
        self.setCentralWidget(central)

        self.check_label = _status_label()
        self.check_button = QPushButton("Stop")
        self.check_button.setFlat(True)
        self.check_button.clicked.connect(self._check_button_clicked)
        self.statusBar().addPermanentWidget(self.check_label)
        self.statusBar().addPermanentWidget(self.check_button)
        self.check_label.hide()
        self.check_button.hide()
        self.engine_label = QLabel()
        self.resident_label = _status_label()
        self.memory_label = QLabel()
        self.threads_label = QLabel()
        self.threads_label.setToolTip("Inference threads of the engine process "
                                      "(Settings → Engine threads)")
        # Shown only while other programs slow the engine (gui.machine_load).
        self.machine_label = _status_label()
        self.machine_label.hide()
        for label in (self.engine_label, self.resident_label, self.memory_label,
                      self.threads_label, self.machine_label):
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
        self.detail.lineageRequested.connect(self.show_lineage)
        self.chat.answered.connect(self.client.describe)
        # From the first token on, the status bar names the resident model (the engine
        # answers a describe between two tokens), not only once the answer has ended.
        self.client.generating.connect(lambda _op: self.client.describe())
        self.compare.busyChanged.connect(lambda busy: None if busy else self.client.describe())
        # The toolbar's Stop is enabled only while something it stops runs.
        for view in (self.chat, self.compare, self.evaluate):
            view.busyChanged.connect(lambda _busy: self._update_stop())
        self.events.catalogChanged.connect(self._catalog_changed)
        self.library_check.status.connect(self._show_check)
        self.library_check.checked.connect(self._checked)
        self.openvino.message.connect(self.statusBar().showMessage)
        self.training.variantCreated.connect(self._trained)
        self.client.stateChanged.connect(self._engine_state)
        self.client.described.connect(self._described)
        self.client.machineLoad.connect(self._machine_load)
        self.client.requestFailed.connect(self._request_failed)

        self._make_actions()
        self._update_stop()
        self.refresh()
        self._restore()
        self._show_state_notices()
        self._engine_state(self.client.state, "")
        # Start the engine process early so the first answer comes sooner.
        QTimer.singleShot(0, self.client.describe)
        # Only when the user asked for it (Server panel): never just because it ran before.
        QTimer.singleShot(0, self.server.autostart_if_asked)

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
        # Through a lambda: `triggered` passes its `checked` flag, which is no path.
        self.act_model = action("Add base model…", "Ctrl+Shift+B", lambda: self.add_model(),
                                "Add a GGUF base model")
        self.act_download = action("Download model or adapter…", "Ctrl+Shift+D",
                                   lambda: self.download(),
                                   "From a URL or a Hugging Face repository, checked like "
                                   "an import")
        self.act_variant = action("New variant…", "Ctrl+Shift+N", lambda: self.compose())
        self.act_new_chat = action("New chat", "Ctrl+N", self._new_chat)
        self.act_stop = action("Stop", "Esc", self.stop_current, "Stop generating")
        self.act_compare = action("Compare with base", "Ctrl+K", self._compare_current)
        self.act_evaluate = action("Evaluate…", "Ctrl+E", self.open_evaluate,
                                   "Score models and variants on a data file")
        self.act_search = action("Search library", "Ctrl+F", lambda: self.library.search.setFocus())
        self.act_settings = action("Settings…", "Ctrl+,", self.open_settings)
        self.act_restart = action("Restart engine", "Ctrl+Shift+R", self.restart_engine)
        self.act_server = action("Start or stop the local server", "Ctrl+Shift+S",
                                 self._toggle_server, "The OpenAI-compatible server (Server tab)")
        self.act_openvino = action("Build the OpenVINO default model…", None,
                                   lambda: self.build_openvino_default(),
                                   "Make the embedded model servable by OpenVINO")
        self.act_quit = action("Quit", "Ctrl+Q", self.close)
        menu = self.menuBar()
        file_menu = menu.addMenu("&File")
        for act in (self.act_import, self.act_model, self.act_download, None,
                    self.act_settings, None, self.act_quit):
            file_menu.addSeparator() if act is None else file_menu.addAction(act)
        model_menu = menu.addMenu("&Model")
        for act in (self.act_variant, self.act_new_chat, self.act_compare, self.act_evaluate,
                    self.act_stop, self.act_search):
            model_menu.addAction(act)
        engine_menu = menu.addMenu("&Engine")
        engine_menu.addAction(self.act_restart)
        engine_menu.addAction(self.act_openvino)
        engine_menu.addAction(self.act_server)
        # Every tab from the keyboard: Ctrl+1 ... in the View menu.
        view_menu = menu.addMenu("&View")
        self.tab_actions = []
        for index in range(self.tabs.count()):
            self.tab_actions.append(action(
                self.tabs.tabText(index), f"Ctrl+{index + 1}" if index < 9 else None,
                lambda _checked=False, i=index: self.tabs.setCurrentIndex(i)))
            view_menu.addAction(self.tab_actions[-1])
        self.help_actions = help_menu.install(self)
        style = self.style()
        pixmap = QStyle.StandardPixmap
        for act, icon in ((self.act_import, pixmap.SP_DialogOpenButton),
                          (self.act_download, pixmap.SP_ArrowDown),
                          (self.act_variant, pixmap.SP_FileDialogNewFolder),
                          (self.act_new_chat, pixmap.SP_FileIcon),
                          (self.act_compare, pixmap.SP_FileDialogContentsView),
                          (self.act_stop, pixmap.SP_BrowserStop),
                          (self.act_settings, pixmap.SP_FileDialogDetailedView)):
            act.setIcon(style.standardIcon(icon))
        toolbar = self.addToolBar("Main")
        toolbar.setObjectName("main-toolbar")
        toolbar.setMovable(False)
        toolbar.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        for act in (self.act_import, self.act_variant, self.act_new_chat, self.act_compare,
                    self.act_stop):
            toolbar.addAction(act)
        self.tabs.setAccessibleName("Views")
        self.library.setAccessibleName("Library")

    def _toggle_server(self) -> None:
        self.tabs.setCurrentWidget(self.server)
        self.server.toggle()

    # ---------------------------------------------------------------- library

    def _catalog_changed(self, kinds: list[str], _names: list[str]) -> None:
        if touches(kinds, CATALOG_KINDS):
            self.refresh()
        elif touches(kinds, ("default", "evaluation")):  # "Default model ✓", scores
            current = self.library.current()
            if current:
                self._selected(*current)

    def refresh(self) -> None:
        """Reload the library. What the caches cannot answer (a file that is new or
        changed on disk: hashing it again, perhaps gigabytes) is checked in the
        background (`LibraryCheck`); until then those entries are badged "unchecked"."""
        self.library_check.supersede()  # this refresh checks again: the old result is stale
        try:
            checking = health.unchecked(self.catalog)
            loaded = snapshot(self.catalog, checking=checking)
        except StudioError as exc:
            self.statusBar().showMessage(exc.message, 10000)
            return
        self.library_check.checking = checking
        self._load_library(loaded)
        self.library_check.start(checking)

    def _load_library(self, loaded: dict[str, Any]) -> None:
        shown = self.library.current()
        self.library.load(loaded)
        current = self.library.current()
        if current:
            self._selected(*current)
        elif shown:  # the entry on show was removed: show another, not a stale one
            self._select_first()

    def _checked(self, problems: dict[str, list[str]]) -> None:
        """The background check ended: show what it found."""
        try:
            # Whatever changed again while it ran stays unchecked (no endless loop).
            left = health.unchecked(self.catalog)
            loaded = snapshot(self.catalog, problems, left)
        except StudioError as exc:
            self._show_check(exc.message, "Check now")
            return
        self.library_check.report_left(left)
        self._load_library(loaded)

    def _show_check(self, text: str, button: str = "") -> None:
        self.check_label.setVisible(bool(text))
        self.check_button.setVisible(bool(text))
        self.check_label.setText(text)
        self.check_button.setText(button)

    def _check_button_clicked(self) -> None:
        if self.library_check.running():
            self.library_check.cancel()
        else:
            self.refresh()

    def _selected(self, kind: str, name: str) -> None:
        built = True  # False only for the OpenVINO default before its first use
        if name in self.library_check.checking:
            # Its check would read whole files here on the GUI thread: wait for the
            # background check, which selects it again when it is done.
            self.detail.show_entry(None)
            self.detail.browser.setHtml(
                f"<p><b>{html.escape(name)}</b></p><p style='color:#888'>Checking its "
                "files in the background (new or changed on disk)…</p>")
        else:
            try:
                entry = entries.show_entry(self.catalog, name,
                                           setup.pending_entries(self.catalog))
            except StudioError as exc:
                self.statusBar().showMessage(exc.message, 10000)
                return
            self.detail.show_entry(entry, is_default=settings.load().default_model == name)
            built = entry.get("built", True)
        if kind == "variant" or (kind == "model" and built):
            self.chat.set_model(name)
        if kind == "variant":
            self.compare.select_variant(name)
        self.evaluate.select(kind, name)
        self.server.select_model(name)

    def select(self, name: str) -> None:
        self.library.select(name)

    # ---------------------------------------------------------------- commands

    def import_adapter(self, path: str | None = None) -> ImportDialog:
        dialog = ImportDialog(self.catalog, self.events, path, self)
        dialog.finished.connect(lambda _code: self._imported(dialog))
        # The wizard's hint for a base model: add it as one, with the same checks.
        dialog.addModelRequested.connect(lambda file: self.add_model(file))
        dialog.open()
        return dialog

    def _imported(self, dialog: ImportDialog) -> None:
        if not dialog.result_names:
            return
        # The wizard announced the entries (the library has them): show the new one.
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
        data = self.catalog.data()
        taken = {n for kind in ("models", "adapters", "variants") for n in data[kind]}
        # The wizard's naming rule: ASCII, valid, not taken ("modèle.gguf" -> "modele").
        name = paths.suggest_name(file.stem, taken, fallback="model")
        backend = settings.load().default_backend
        dialog = QProgressDialog(f"Reading and hashing {file.name}…", "Cancel", 0, 1000, self)
        dialog.setWindowTitle("Add base model")
        dialog.setWindowModality(Qt.WindowModality.WindowModal)
        dialog.setMinimumDuration(0)
        dialog.setAutoClose(False)
        dialog.setAutoReset(False)
        worker = Catalog(self.catalog.state)  # its own: no memo shared across threads
        # A GGUF for OpenVINO is built into a named IR first (its stages as progress).
        task = Task(lambda progress, cancelled: openvino_models.add_model(
            worker, name, file, backend, progress=progress, cancelled=cancelled,
            stages=lambda _stage, fraction: progress(int(fraction * 1000), 1000)), self)
        task.progress.connect(lambda done, _total: dialog.setValue(done))
        dialog.canceled.connect(task.cancel)
        task.succeeded.connect(lambda _record: self._model_added(name))
        task.failed.connect(lambda message: notify.warn(self, "Model not added", message))
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
        self.events.changed(["model"], [name])
        self.select(name)
        self.statusBar().showMessage(f"added base model {name}", 8000)

    def _model_cancelled(self, name: str) -> None:
        if name in self.catalog.data()["models"]:
            self._model_added(name)  # the cancel came after it was recorded
        else:
            self.statusBar().showMessage(f"adding {name} was cancelled; nothing was added",
                                         8000)

    def download(self) -> DownloadDialog:
        """File → Download model or adapter… (non-modal: the window goes on meanwhile)."""
        current = self.library.current()
        base = current[1] if current and current[0] == "model" else None
        dialog = DownloadDialog(self.catalog, self.events, base, self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.downloaded.connect(self._downloaded)
        dialog.show()
        return dialog

    def _downloaded(self, name: str) -> None:
        # The dialog announced the entries (the library has them): show the new one.
        self.select(name)
        self.statusBar().showMessage(f"downloaded and added {name}", 8000)

    def compose(self, editing: str | None = None, duplicate_of: str | None = None,
                adapter: str | None = None) -> ComposerDialog:
        dialog = ComposerDialog(self.catalog, self.events, editing, duplicate_of, adapter,
                                self)
        dialog.finished.connect(lambda _code: self._composed(dialog))
        dialog.open()
        return dialog

    def _composed(self, dialog: ComposerDialog) -> None:
        if dialog.saved_name:  # announced by the composer: the library has it
            self.select(dialog.saved_name)

    def _trained(self, name: str) -> None:
        self.select(name)
        self.statusBar().showMessage(f"trained variant {name} is ready", 10000)

    def convert_adapter(self, name: str) -> Task:
        """Give an adapter a file for the other backend (GGUF <-> PEFT), in the background."""
        record = self.catalog.adapter(name)
        backend = "openvino" if record["backend"] == "llama" else "llama"
        worker = Catalog(self.catalog.state)
        task = Task(lambda progress, cancelled: imports.convert_adapter(
            worker, name, backend, progress=progress, cancelled=cancelled), self)
        task.succeeded.connect(lambda _r: self._converted(name, backend))
        task.failed.connect(lambda message: notify.warn(self, "Not converted", message))
        task.done.connect(lambda: self._tasks.remove(task))
        self._tasks.append(task)
        task.start()
        return task

    def _converted(self, name: str, backend: str) -> None:
        self.events.changed(["adapter"], [name])
        self.statusBar().showMessage(f"{name} now has a {backend} file", 8000)

    def show_lineage(self, name: str) -> LineageDialog:
        """The lineage of `name` in a dialog of its own (non-modal)."""
        dialog = LineageDialog(self.catalog, name, self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.show()
        return dialog

    def remove_entry(self, name: str) -> None:
        answer = QMessageBox.question(self, "Remove", f"Remove {name} from the catalog?")
        if answer != QMessageBox.StandardButton.Yes:
            return
        try:
            kind, _record = self.catalog.find(name)
            self.catalog.remove(name)
        except StudioError as exc:
            QMessageBox.warning(self, "Not removed", exc.message)
            return
        self.events.changed([kind], [name])

    def set_default(self, name: str) -> None:
        settings.update(default_model=name)
        self.statusBar().showMessage(f"{name} is now the default model", 6000)
        self.events.changed(["default"], [name])

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

    def open_evaluate(self) -> None:
        self.tabs.setCurrentWidget(self.evaluate)

    def stop_current(self) -> None:
        self.chat.stop()
        self.compare.stop()
        self.evaluate.stop()

    def _update_stop(self) -> None:
        self.act_stop.setEnabled(self.chat.reply is not None or
                                 self.compare.reply is not None or self.evaluate.running())

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
        self.openvino.start()

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
        self.presence.engine(state, self.client.pid())
        if state != "running" and self._describe_when_stopped:
            self._describe_when_stopped = False
            self.client.describe()
        if state == "crashed":
            self.banner.show_message(
                f"<b>The engine process stopped.</b> {html.escape(detail)}<br>Your catalog "
                "and conversations are safe. The engine restarts with the next request.")

    def _show_state_notices(self) -> None:
        """State files that were unreadable at start were set aside: say so. Else a
        welcome that points at the demo variant and the comparison, at every start until
        it is dismissed or a comparison has been made (`welcome_due`)."""
        notes = statefile.take_notices()
        if notes:
            self.banner.show_message(
                "<b>Some saved state could not be read and was set aside</b> (nothing was "
                "deleted):<br>" + "<br>".join(html.escape(n) for n in notes), kind="info")
        elif self.welcome_due():
            self.banner.show_message(
                f"<b>Welcome to Variant Studio.</b> Start with the demo variant "
                f"<b>{demo.VARIANT_NAME}</b> (the bundled model with an adapter trained "
                "to answer with JSON tool calls): chat with it (Ctrl+2), then compare it "
                "with its base (Ctrl+K) to see the first token where the adapter changes "
                "the answer. Import your own adapter with Ctrl+I.", kind="info",
                topic="welcome")

    def welcome_due(self) -> bool:
        """The welcome is shown until the user dismisses it or has made a comparison
        (the step it leads to: the recent comparisons are kept), while the demo variant
        it points at is there."""
        return (self.window_state.value("welcome") != "dismissed"
                and not self.compare.history
                and demo.VARIANT_NAME in self.catalog.data()["variants"])

    def _banner_dismissed(self) -> None:
        if self.banner.topic == "welcome":
            self.window_state.setValue("welcome", "dismissed")
            self.window_state.sync()

    def _described(self, info: EngineStatus) -> None:
        self.resident_label.setText(
            "resident: " + (", ".join(r.base for r in info.residents) or "none") +
            f" · {len(info.sessions)} session(s)")
        self.memory_label.setText(f"{info.memory.rss_bytes / 2**20:.0f} MiB")
        threads = info.n_threads
        self.threads_label.setText(f"{threads} thread{'' if threads == 1 else 's'}"
                                   if threads else "")

    def _machine_load(self, load: MachineLoad | None) -> None:
        """Say so while other programs slow the engine; nothing once they do not."""
        if load is None:
            self.machine_label.hide()
            return
        text, tooltip = machine_load.note(load)
        self.machine_label.setText(text)
        self.machine_label.setToolTip(tooltip)
        self.machine_label.show()

    def _request_failed(self, _op: str, message: str) -> None:
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
            self.splitter.setChildrenCollapsible(False)
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

    def confirm_server_stop(self) -> bool:
        """May the window close? Asks first while the local server runs (quitting stops
        it, and the clients using it lose it)."""
        controller = self.server_controller
        if not controller.running() and controller.state != "starting":
            return True
        where = f" at {controller.url}" if controller.url else ""
        answer = QMessageBox.question(
            self, "Local server running",
            f"The local server is running{where}. Quitting stops it: the programs using "
            "it lose their connection. Quit anyway?")
        return answer == QMessageBox.StandardButton.Yes

    def closeEvent(self, event: QCloseEvent) -> None:
        if not self.training.confirm_close(self) or not self.confirm_server_stop():
            event.ignore()
            return
        self.save_state()
        self.server.record_running()
        self.server_controller.shutdown()
        self.stop_current()
        self.library_check.cancel()
        self.openvino.stop()
        for task in self._tasks:
            task.cancel()
        for dialog in self.findChildren(DownloadDialog):
            dialog.cancel()  # a download in flight keeps nothing
        self.training.shutdown()
        self.client.close()
        self.presence.close()
        super().closeEvent(event)


def _status_label() -> ElidedLabel:
    """A status-bar label with a text of any length: its full width while there is room,
    elided (the whole text in its tooltip) when not, never widening the window (the
    labels' widths add up: a long resident list and a busy-machine note made the
    window's minimum wider than 1024 px)."""
    label = ElidedLabel()
    label.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
    return label
