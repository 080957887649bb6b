"""The Server panel: the local OpenAI-compatible server, run from the window.

Start and stop, the address (loopback unless the user chooses another, which needs an
API key: the engine's `ServeConfig` refuses otherwise, and its message is shown as
typed), the port (0: a free one, chosen at start), the key, which bases and variants are
offered (checkboxes; a running server follows them at once), a copyable `curl` and
Python `openai` example for the chosen model with the exact URL and key in use, and a
live log of the requests: each one served or refused, with its status and the error's
message (a client's 400, 401 and 404 are what someone debugging it looks for), and a
generation while it runs, saying when the engine is loading the model first (the first
request after Start waits for it) (`ServerController.requestLogged`, `requestStarted`).

What is remembered (in the window's settings file, which holds the key and is made
readable by its owner only): address, port, key, the models *not* offered (so a new
variant is offered, as `variant-studio serve` offers everything), whether the user asked
for the server to start with the app, and whether it was running at quit. The server
starts with the app only when the user ticked that box: having been running at quit is
not, by itself, a request to listen on a port at the next start (the panel says so).
"""

from __future__ import annotations

import dataclasses
import http
import json
import os
import secrets
import shlex
import time
from typing import Any

from PySide6.QtCore import QSettings, Qt, QTimer
from PySide6.QtGui import (
    QColor,
    QGuiApplication,
    QShowEvent,
    QStandardItem,
    QStandardItemModel,
)
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QSplitter,
    QStyle,
    QTableView,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from engine.catalog.store import Catalog
from engine.errors import StudioError
from engine.serve.app import LogEntry, Pending
from engine.serve.config import DEFAULT_HOST, DEFAULT_PORT, ServeConfig, is_loopback
from engine.state import recent
from gui.catalog_events import CatalogEvents, touches
from gui.controllers.server import ServerController

LOG_ROWS = recent.REQUESTS
LOG_SAVE_MS = 1000  # new log rows are written this long after they arrive, together
# tokens: the prompt's → the answer's (one column: eight left the message 70 px at
# 1024×700).
COLUMNS = ("time", "status", "model", "identity", "tokens", "tok/s", "message")
MESSAGE = COLUMNS.index("message")
MODEL_WIDTH = 200  # px at most for the model column (long names elide; tooltip: whole)
HOSTS = (("127.0.0.1", "127.0.0.1 — this computer only"),
         ("0.0.0.0", "0.0.0.0 — every network interface (needs a key)"))
EXAMPLE_MESSAGE = "Hello!"


def client_host(host: str) -> str:
    """The address a client on this computer uses for a server bound to `host`."""
    if host in ("0.0.0.0", "::", "[::]", ""):
        return "127.0.0.1"
    return f"[{host.strip('[]')}]" if ":" in host else host


def curl_example(base_url: str, model: str, key: str | None) -> str:
    body = json.dumps({"model": model,
                       "messages": [{"role": "user", "content": EXAMPLE_MESSAGE}]})
    lines = [f"curl {shlex.quote(base_url + '/chat/completions')}",
             "  -H 'Content-Type: application/json'"]
    if key:
        lines.append(f"  -H {shlex.quote('Authorization: Bearer ' + key)}")
    lines.append(f"  -d {shlex.quote(body)}")
    return " \\\n".join(lines)


def python_example(base_url: str, model: str, key: str | None) -> str:
    # json.dumps of a str is a valid Python string literal (names and keys are ASCII).
    return "\n".join([
        "from openai import OpenAI",
        "",
        f"client = OpenAI(base_url={json.dumps(base_url)}, "
        f"api_key={json.dumps(key or 'unused')})",
        "answer = client.chat.completions.create(",
        f"    model={json.dumps(model)},",
        f"    messages=[{{\"role\": \"user\", \"content\": {json.dumps(EXAMPLE_MESSAGE)}}}])",
        "print(answer.choices[0].message.content)",
    ])


def status_text(status: int) -> str:
    """A status as a log row shows it: its code and HTTP's phrase ("404 Not Found")."""
    if status == 499:  # nginx's, not in HTTP's table: the client went away
        return "499 Client Closed Request"
    try:
        return f"{status} {http.HTTPStatus(status).phrase}"
    except ValueError:
        return str(status)


def message_text(entry: LogEntry) -> str:
    """The row's last column: why it failed, or what was answered and how long it took."""
    if entry.reason:
        return entry.reason
    return f"{entry.path} · {entry.seconds:.2f} s"


def pending_text(pending: Pending) -> str:
    if pending.loading:
        return f"loading {pending.base}…"
    return "answering…"


def log_entry(item: dict[str, Any]) -> LogEntry | None:
    """A kept log row as the server reported it; None when it does not read as one."""
    known = {f.name for f in dataclasses.fields(LogEntry)}
    values = {k: v for k, v in item.items() if k in known}
    numbers = ("time", "prompt_tokens", "completion_tokens", "tokens_per_second", "status",
               "seconds")
    if (any(not isinstance(values.get(k), int | float) or isinstance(values.get(k), bool)
            for k in numbers)
            or any(not isinstance(values.get(k, ""), str)
                   for k in ("path", "model", "identity", "reason", "id"))):
        return None
    try:
        return LogEntry(**values)
    except TypeError:
        return None


class ServerPanel(QWidget):
    def __init__(self, controller: ServerController, catalog: Catalog, events: CatalogEvents,
                 store: QSettings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        self.catalog = catalog
        self.store = store
        self.config_error: str | None = None

        # -- settings
        self.host = QComboBox()
        self.host.setEditable(True)
        for value, label in HOSTS:
            self.host.addItem(label, value)
        self.host.setAccessibleName("Bind address")
        # Its longest choice ("0.0.0.0 — every network interface (needs a key)") would set
        # the panel's minimum width; closed, the choice may elide (the list shows it all).
        self.host.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.host.setMinimumContentsLength(18)
        self.host.setToolTip("Where the server listens. Loopback (127.0.0.1) is reachable "
                             "from this computer only; any other address needs an API key.")
        self.port = QSpinBox()
        self.port.setRange(0, 65535)
        self.port.setSpecialValueText("0 (a free port, chosen at start)")
        self.port.setAccessibleName("Port")
        self.key = QLineEdit()
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.key.setPlaceholderText("none: loopback only (at least 8 characters, no spaces)")
        self.key.setAccessibleName("API key")
        self.show_key = QCheckBox("show")
        self.show_key.toggled.connect(lambda shown: self.key.setEchoMode(
            QLineEdit.EchoMode.Normal if shown else QLineEdit.EchoMode.Password))
        self.generate_key = QPushButton("Generate")
        self.generate_key.setToolTip("A new random key")
        self.generate_key.clicked.connect(lambda: self.key.setText(secrets.token_urlsafe(24)))
        key_row = QHBoxLayout()
        key_row.addWidget(self.key, 1)
        key_row.addWidget(self.show_key)
        key_row.addWidget(self.generate_key)
        self.autostart = QCheckBox("Start the server when Variant Studio opens")
        self.start_button = QPushButton("Start server")
        self.start_button.setAccessibleName("Start or stop the server")
        self.start_button.clicked.connect(self.toggle)
        self.state_label = QLabel()
        self.state_label.setWordWrap(True)
        self.state_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        # What a running server is doing now: "Loading <base>…" while its engine loads a
        # model for a request (tens of seconds at a first request, which looks hung
        # without it).
        self.activity = QLabel()
        self.activity.setWordWrap(True)
        self.activity.hide()
        form_box = QGroupBox("Server")
        form = QFormLayout(form_box)
        form.addRow("Address", self.host)
        form.addRow("Port", self.port)
        form.addRow("API key", key_row)
        form.addRow(self.autostart)
        start_row = QHBoxLayout()
        start_row.addWidget(self.start_button)
        start_row.addWidget(self.state_label, 1)
        form.addRow(start_row)

        # -- exposure
        self.exposed = QListWidget()
        self.exposed.setAccessibleName("Models offered by the server")
        self.exposed.itemChanged.connect(self._exposure_changed)
        self.exposed.currentItemChanged.connect(lambda *_: self._example_model_from_list())
        exposed_box = QGroupBox("Offered models (GET /v1/models)")
        exposed_layout = QVBoxLayout(exposed_box)
        exposed_layout.addWidget(self.exposed)

        # -- examples
        self.example_model = QComboBox()
        self.example_model.setAccessibleName("Model of the examples")
        self.example_model.currentTextChanged.connect(lambda _t: self._render_examples())
        self.curl = QPlainTextEdit()
        self.python = QPlainTextEdit()
        for edit in (self.curl, self.python):
            edit.setReadOnly(True)
            # Wrapped to be read whole; copied as it is (one command, exact).
            edit.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
            font = edit.font()
            font.setFamily("monospace")
            edit.setFont(font)
        self.copy_curl = QPushButton("Copy curl")
        self.copy_curl.clicked.connect(
            lambda: QGuiApplication.clipboard().setText(self.curl.toPlainText()))
        self.copy_python = QPushButton("Copy Python")
        self.copy_python.clicked.connect(
            lambda: QGuiApplication.clipboard().setText(self.python.toPlainText()))
        self.examples = QTabWidget()
        self.examples.addTab(self.curl, "curl")
        self.examples.addTab(self.python, "Python (openai)")
        self.example_note = QLabel()
        self.example_note.setWordWrap(True)
        example_box = QGroupBox("Try it")
        example_layout = QVBoxLayout(example_box)
        example_top = QHBoxLayout()
        example_top.addWidget(QLabel("Model"))
        example_top.addWidget(self.example_model, 1)
        example_top.addWidget(self.copy_curl)
        example_top.addWidget(self.copy_python)
        example_layout.addLayout(example_top)
        example_layout.addWidget(self.examples, 1)
        example_layout.addWidget(self.example_note)

        # -- log
        self.log_model = QStandardItemModel(0, len(COLUMNS), self)
        self.log_model.setHorizontalHeaderLabels(list(COLUMNS))
        self.log_view = QTableView()
        self.log_view.setModel(self.log_model)
        self.log_view.setAccessibleName("Requests served")
        self.log_view.verticalHeader().hide()
        # One line a row: the style's default row height showed two rows at 1024×700.
        self.log_view.verticalHeader().setDefaultSectionSize(
            self.log_view.fontMetrics().height() + 6)
        self.log_view.setEditTriggers(QTableView.EditTrigger.NoEditTriggers)
        # The short columns as wide as what they hold, the message takes the rest of the
        # panel's width (elided, whole in the tooltip); the user can still drag them.
        # (Widths kept here from every row's text: Qt's ResizeToContents measures only
        # the rows in view, and cut "401 Unauthorized" once it was scrolled past.)
        header = self.log_view.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        header.setSectionResizeMode(MESSAGE, QHeaderView.ResizeMode.Stretch)
        header.setMinimumSectionSize(40)
        self._widths = [0] * len(COLUMNS)
        self.log_view.setWordWrap(False)
        self.log_view.setTextElideMode(Qt.TextElideMode.ElideRight)
        # Rows of generations still running, by reply id (replaced by their outcome).
        self._pending_rows: dict[str, tuple[QStandardItem, Pending]] = {}
        self.clear_log = QPushButton("Clear")
        self.clear_log.clicked.connect(self.clear_requests)
        # The log is kept across restarts (engine.state.recent): an earlier run's rows
        # are shown again, and new rows are written together a moment after they arrive
        # (a client sending many requests costs one write, not one each) and at quit.
        self.kept_log = recent.requests()
        self._unsaved: list[LogEntry] = []
        self._save_timer = QTimer(self)
        self._save_timer.setSingleShot(True)
        self._save_timer.setInterval(LOG_SAVE_MS)
        self._save_timer.timeout.connect(self.save_log)
        log_box = QGroupBox("Requests")
        log_layout = QVBoxLayout(log_box)
        log_layout.addWidget(self.activity)
        log_layout.addWidget(self.log_view, 1)
        log_layout.addWidget(self.clear_log, 0, Qt.AlignmentFlag.AlignRight)

        # The settings and the examples side by side, the request log below across the
        # whole width: its eight columns need it (beside the examples they were squeezed
        # into a third of the window).
        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(0, 0, 0, 0)
        left_layout.addWidget(form_box)
        left_layout.addWidget(exposed_box, 1)
        top = QSplitter()
        top.addWidget(left)
        top.addWidget(example_box)
        top.setStretchFactor(0, 1)
        top.setStretchFactor(1, 1)
        top.setChildrenCollapsible(False)
        self.splitter = QSplitter(Qt.Orientation.Vertical)
        self.splitter.addWidget(top)
        self.splitter.addWidget(log_box)
        self.splitter.setStretchFactor(0, 1)
        self.splitter.setStretchFactor(1, 1)
        self._split_once = False  # sized at the first show (`showEvent`)
        self.splitter.setChildrenCollapsible(False)
        layout = QVBoxLayout(self)
        layout.addWidget(self.splitter)

        self._restore()
        for signal in (self.host.currentTextChanged, self.key.textChanged,
                       self.port.valueChanged):
            signal.connect(self._settings_changed)
        self.autostart.toggled.connect(lambda on: self._save(autostart=on))
        controller.stateChanged.connect(self._state_changed)
        controller.requestLogged.connect(self.add_log_row)
        controller.requestStarted.connect(self.add_pending_row)
        self._show_kept_log()
        events.catalogChanged.connect(self._catalog_changed)
        self.reload_models()
        self._settings_changed()
        self._state_changed(controller.state, "")

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 (Qt's name)
        """At the first show: the settings and examples get what they need (and at most
        45 % of the height), the log the rest. By the size hints alone the log had four
        rows at 1024×700."""
        super().showEvent(event)
        if self._split_once:
            return
        self._split_once = True
        total = sum(self.splitter.sizes())
        top = max(self.splitter.widget(0).minimumSizeHint().height(), int(total * 0.45))
        if 0 < top < total:
            self.splitter.setSizes([top, total - top])

    # ---------------------------------------------------------------- settings

    def host_value(self) -> str:
        index = self.host.findText(self.host.currentText())
        if index >= 0 and self.host.itemData(index):
            return str(self.host.itemData(index))
        return self.host.currentText().strip()

    def hidden(self) -> set[str]:
        return {self.exposed.item(i).text() for i in range(self.exposed.count())
                if self.exposed.item(i).checkState() != Qt.CheckState.Checked}

    def exposed_names(self) -> tuple[str, ...] | None:
        """What the server offers: None (everything) unless the user unticked some."""
        hidden = self.hidden()
        if not hidden:
            return None
        return tuple(self.exposed.item(i).text() for i in range(self.exposed.count())
                     if self.exposed.item(i).text() not in hidden)

    def config(self) -> ServeConfig:
        """The configuration as typed; raises the engine's refusal (UsageError)."""
        return ServeConfig(host=self.host_value(), port=self.port.value(),
                           api_key=self.key.text() or None, variants=self.exposed_names())

    def _settings_changed(self) -> None:
        try:
            self.config()
            self.config_error = None
        except StudioError as exc:
            self.config_error = exc.message
        self._save()
        self._update()
        self._render_examples()

    def _restore(self) -> None:
        s = self.store
        host = str(s.value("server/host", DEFAULT_HOST) or DEFAULT_HOST)
        index = next((i for i in range(self.host.count()) if self.host.itemData(i) == host),
                     -1)
        if index >= 0:
            self.host.setCurrentIndex(index)
        else:
            self.host.setEditText(host)
        self.port.setValue(int(s.value("server/port", DEFAULT_PORT) or 0))
        self.key.setText(str(s.value("server/api_key", "") or ""))
        self.autostart.setChecked(str(s.value("server/autostart", "false")) == "true")
        self._hidden_saved = set(json.loads(str(s.value("server/hidden", "[]") or "[]")))
        self.was_running = str(s.value("server/running", "false")) == "true"

    def _save(self, **extra: Any) -> None:
        s = self.store
        # The file holds the API key: the owner's alone, from its first byte (Qt writes a
        # new file and renames it over the old one, keeping the old one's permissions).
        if not os.path.exists(s.fileName()):
            os.makedirs(os.path.dirname(s.fileName()), exist_ok=True)
            os.close(os.open(s.fileName(), os.O_WRONLY | os.O_CREAT, 0o600))
        s.setValue("server/host", self.host_value())
        s.setValue("server/port", self.port.value())
        s.setValue("server/api_key", self.key.text())
        if self.exposed.count():
            s.setValue("server/hidden", json.dumps(sorted(self.hidden())))
        for key, value in extra.items():
            s.setValue(f"server/{key}", "true" if value else "false")
        s.sync()
        if os.path.exists(s.fileName()):
            os.chmod(s.fileName(), 0o600)

    def record_running(self) -> None:
        """At quit: remember whether it was running (shown, not acted on, next time),
        and the log rows not written yet."""
        self._save(running=self.controller.running())
        self.save_log()

    # ---------------------------------------------------------------- models

    def reload_models(self) -> None:
        try:
            data = self.catalog.data()
        except StudioError:
            return
        names = sorted(data["variants"], key=str.lower) + sorted(data["models"], key=str.lower)
        hidden = self.hidden() if self.exposed.count() else self._hidden_saved
        self.exposed.blockSignals(True)
        self.exposed.clear()
        for name in names:
            item = QListWidgetItem(name)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(Qt.CheckState.Unchecked if name in hidden
                               else Qt.CheckState.Checked)
            item.setToolTip(("variant" if name in data["variants"] else "base model") +
                            f" {name}")
            self.exposed.addItem(item)
        self.exposed.blockSignals(False)
        self._reload_example_models()

    def _catalog_changed(self, kinds: list[str], _names: list[str]) -> None:
        if touches(kinds, ("model", "variant")):
            self.reload_models()
            self.controller.expose(self.exposed_names())

    def _exposure_changed(self, _item: QListWidgetItem) -> None:
        self._save()
        self.controller.expose(self.exposed_names())
        self._reload_example_models()
        self._settings_changed()

    def _reload_example_models(self) -> None:
        current = self.example_model.currentText()
        offered = [self.exposed.item(i).text() for i in range(self.exposed.count())
                   if self.exposed.item(i).checkState() == Qt.CheckState.Checked]
        self.example_model.blockSignals(True)
        self.example_model.clear()
        self.example_model.addItems(offered)
        if current in offered:
            self.example_model.setCurrentText(current)
        self.example_model.blockSignals(False)
        self._render_examples()

    def select_model(self, name: str) -> None:
        """The window's selection: the examples follow it when it is offered."""
        index = self.example_model.findText(name)
        if index >= 0:
            self.example_model.setCurrentIndex(index)

    def _example_model_from_list(self) -> None:
        item = self.exposed.currentItem()
        if item is not None:
            self.select_model(item.text())

    # ---------------------------------------------------------------- examples

    def base_url(self) -> str | None:
        """The URL a client here uses: the running server's, else the configured one
        (None while the port is 0 and not yet chosen)."""
        config = self.controller.config if self.controller.running() else None
        host = config.host if config else self.host_value()
        port = self.controller.port if self.controller.running() else self.port.value()
        if not port:
            return None
        return f"http://{client_host(host)}:{port}/v1"

    def example_key(self) -> str | None:
        config = self.controller.config if self.controller.running() else None
        return config.api_key if config else (self.key.text() or None)

    def _render_examples(self) -> None:
        model = self.example_model.currentText()
        url = self.base_url()
        shown_url = url or "http://127.0.0.1:PORT/v1"
        if not model:
            self.curl.setPlainText("")
            self.python.setPlainText("")
            self.example_note.setText("Offer a model to see how to call it.")
            return
        key = self.example_key()
        self.curl.setPlainText(curl_example(shown_url, model, key))
        self.python.setPlainText(python_example(shown_url, model, key))
        notes = []
        if url is None:
            notes.append("PORT is the free port chosen when the server starts.")
        elif not self.controller.running():
            notes.append("Start the server to use these.")
        host = self.controller.config.host if self.controller.running() and \
            self.controller.config else self.host_value()
        if not is_loopback(host):
            notes.append("From another computer, use this computer's address instead of "
                         "127.0.0.1.")
        self.example_note.setText(" ".join(notes))

    # ---------------------------------------------------------------- start and stop

    def toggle(self) -> None:
        if self.controller.running():
            self.controller.stop()
        else:
            self.start()

    def start(self) -> bool:
        try:
            config = self.config()
        except StudioError as exc:
            self.config_error = exc.message
            self._update()
            return False
        return self.controller.start(config) is not None

    def autostart_if_asked(self) -> None:
        if self.autostart.isChecked():
            self.start()

    def _state_changed(self, state: str, detail: str) -> None:
        if state == "running":
            self._save(running=True)
        elif state == "stopped":
            self._save(running=False)
        self._update(detail)
        self._render_examples()

    def _update(self, detail: str | None = None) -> None:
        if detail is not None:
            self._detail = detail
        detail = getattr(self, "_detail", "")
        state = self.controller.state
        running = self.controller.running()
        busy = state in ("starting", "stopping")
        for widget in (self.host, self.port, self.key, self.generate_key):
            widget.setEnabled(not running and not busy)
        self.start_button.setText("Stop server" if running else "Start server")
        self.start_button.setEnabled(not busy and (running or self.config_error is None))
        if self.config_error and not running:
            text, color = self.config_error, "#d23c3c"
        elif state == "running":
            text, color = f"Running at {self.controller.url}/v1", "#1f9d55"
        elif state == "starting":
            text, color = "Starting…", ""
        elif state == "stopping":
            text, color = "Stopping…", ""
        elif state == "failed":
            text, color = f"Not started: {detail}", "#d23c3c"
        else:
            text = "Stopped."
            if getattr(self, "was_running", False) and not self.autostart.isChecked():
                text += (" It was running when Variant Studio closed; it starts by itself "
                         "only when the box above is ticked.")
            color = ""
        self.state_label.setTextFormat(Qt.TextFormat.PlainText)
        self.state_label.setStyleSheet(f"color:{color}" if color else "")
        self.state_label.setText(text)

    # ---------------------------------------------------------------- log

    def add_pending_row(self, pending: Pending) -> None:
        """A generation that reached the engine: shown until its outcome replaces it."""
        values = (time.strftime("%H:%M:%S", time.localtime(pending.time)), "…",
                  pending.model, "", "", "", pending_text(pending))
        items = [QStandardItem(value) for value in values]
        for item in items:
            item.setToolTip(f"{pending.path}: running")
        self._pending_rows[pending.id] = (items[0], pending)
        self._append(items)
        self._show_activity()

    def _show_activity(self) -> None:
        names = sorted({pending.base for item, pending in self._pending_rows.values()
                        if pending.loading and item.row() >= 0})
        self.activity.setText(f"Loading {', '.join(names)}… a model's first request "
                              "waits until the engine has it in memory." if names else "")
        self.activity.setVisible(bool(names))

    def add_log_row(self, entry: LogEntry) -> None:
        """A request served (or refused): shown, and kept for the next start."""
        self._show_log_row(entry)
        self._unsaved.append(entry)
        if not self._save_timer.isActive():
            self._save_timer.start()

    def save_log(self) -> None:
        """Write the rows not written yet (`recent.requests`)."""
        self._save_timer.stop()
        unsaved, self._unsaved = self._unsaved, []
        try:
            self.kept_log.extend([dataclasses.asdict(entry) for entry in unsaved])
        except StudioError:
            pass  # shown all the same; only the next start will not have them

    def clear_requests(self) -> None:
        self.log_model.removeRows(0, self.log_model.rowCount())
        self._pending_rows.clear()
        self._show_activity()
        self._save_timer.stop()
        self._unsaved = []
        try:
            self.kept_log.clear()
        except StudioError:
            pass

    def _show_kept_log(self) -> None:
        try:
            kept = self.kept_log.load()
        except StudioError:
            return
        for item in kept:
            entry = log_entry(item)
            if entry is not None:
                self._show_log_row(entry)

    def _show_log_row(self, entry: LogEntry) -> None:
        failed = entry.status >= 400
        values = (time.strftime("%H:%M:%S", time.localtime(entry.time)),
                  status_text(entry.status), entry.model or "—", entry.identity or "—",
                  "" if failed else f"{entry.prompt_tokens} → {entry.completion_tokens}",
                  "" if failed else f"{entry.tokens_per_second:.1f}", message_text(entry))
        tip = f"{entry.path} · {status_text(entry.status)} · {entry.seconds:.2f} s" + (
            f"\n{entry.reason}" if entry.reason else "")
        pending = self._pending_rows.pop(entry.id, None) if entry.id else None
        row = pending[0].row() if pending is not None else -1
        if row >= 0:  # the running request's row, in place
            items = [self.log_model.item(row, column) for column in range(len(COLUMNS))]
            for item, value in zip(items, values, strict=True):
                item.setText(value)
            self._fit_columns(items)
        else:
            items = [QStandardItem(value) for value in values]
        for item in items:
            item.setToolTip(tip)
            if failed:
                # The palette's own red would be the theme's; this one reads on both.
                item.setForeground(QColor("#d23c3c"))
        if row < 0:
            self._append(items)
        self._show_activity()

    def _fit_columns(self, items: list[QStandardItem]) -> None:
        """Each short column as wide as the widest text it held (a model's name at most
        MODEL_WIDTH px: elided, whole in the tooltip); the message takes the rest."""
        metrics = self.log_view.fontMetrics()
        header = self.log_view.horizontalHeader()
        pad = 2 * self.log_view.style().pixelMetric(
            QStyle.PixelMetric.PM_FocusFrameHMargin, None, self.log_view) + 12
        for column, item in enumerate(items):
            if column == MESSAGE:
                continue
            title = metrics.horizontalAdvance(COLUMNS[column]) + pad + 8
            width = max(metrics.horizontalAdvance(item.text()) + pad, title)
            if column == COLUMNS.index("model"):
                width = min(width, MODEL_WIDTH)
            if width > self._widths[column]:
                self._widths[column] = width
                header.resizeSection(column, width)

    def _append(self, items: list[QStandardItem]) -> None:
        self._fit_columns(items)
        self.log_model.appendRow(items)
        while self.log_model.rowCount() > LOG_ROWS:
            self.log_model.removeRow(0)
        self.log_view.scrollToBottom()

    def log_rows(self) -> list[list[str]]:
        return [[self.log_model.item(r, c).text() for c in range(len(COLUMNS))]
                for r in range(self.log_model.rowCount())]
