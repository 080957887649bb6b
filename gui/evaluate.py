"""Evaluate: score base models and variants on a data file, as served.

A person picks models (checkboxes over the bases and variants), a data file (by default
the evaluation set of the adapter selected in the library) and runs: the file is read
and checked off the GUI thread (`gui.tasks.Task`, the training data's own line checks),
then each model is one engine `Score` request through the window's client, its `Reply`
driving the progress bar; Cancel stops the running reply. Each model's figures land in
the table (items, tokens, mean NLL per token, perplexity, exact match, and the tool-call
exact match of items whose answer is a tool call) and in a chart of
its own (`gui.widgets.score_chart`) as soon as it is scored. A score of an adapter's
attached evaluation set is kept in the catalog (`engine.catalog.evaluation`) and
announced on `CatalogEvents` ("evaluation"), so the detail pane shows it.

The flow is a coroutine on the qasync loop (`gui.aio`); nothing modal runs inside it.
"""

from __future__ import annotations

import asyncio
import html
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from engine.catalog import evaluation
from engine.catalog.store import Catalog
from engine.errors import Cancelled, StudioError
from engine.runtime import assembly
from engine.runtime.results import ScoreResult
from engine.training import score_sets
from gui import aio
from gui.catalog_events import CatalogEvents, touches
from gui.engine_client import QtEngineClient, Reply
from gui.tasks import Task
from gui.widgets.score_chart import ScoreChart

NameRole = Qt.ItemDataRole.UserRole + 1
# "Tool-call exact": the greedy answers' tool calls against the expected ones (items
# whose answer is a tool call; "n/a" for a set without any).
COLUMNS = ("Model", "Backend", "Items", "Tokens", "Mean NLL", "Perplexity", "Exact match",
           "Tool-call exact")
BACKENDS = (("each model's own", None), ("llama.cpp", "llama"), ("OpenVINO", "openvino"))


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


class EvaluateView(QWidget):
    busyChanged = Signal(bool)
    scored = Signal(object)  # one model's ScoreResult, as soon as it is scored
    runFinished = Signal(str)  # "finished" | "cancelled" | "failed"

    def __init__(self, client: QtEngineClient, catalog: Catalog, events: CatalogEvents,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.client = client
        self.catalog = catalog
        self.events = events
        self.flow: asyncio.Task | None = None
        self.reply: Reply | None = None  # the model being scored
        self.loader: Task | None = None  # reading the data file
        self.results: list[ScoreResult] = []
        self.charts: list[ScoreChart] = []
        self._manual_data = False  # the user chose the file: selection leaves it alone
        self._busy = False  # a run is under way (its flow may still be finishing)

        self.models = QListWidget()
        self.models.setToolTip("The base models and variants to score, in this order")
        self.data = QLineEdit()
        self.data.setPlaceholderText("JSONL in the training formats, or a text file (one "
                                     "item per line)")
        self.data.textEdited.connect(lambda _t: setattr(self, "_manual_data", True))
        self.browse = QPushButton("Browse…")
        self.browse.clicked.connect(self._browse)
        self.backend = QComboBox()
        for label, value in BACKENDS:
            self.backend.addItem(label, value)
        self.exact = QCheckBox("Exact match")
        self.exact.setChecked(True)
        self.exact.setToolTip("Also decode each prompt's greedy answer and compare it with "
                              "the expected one")
        self.run_button = QPushButton("Evaluate")
        self.run_button.clicked.connect(self.run)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.cancel)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(list(COLUMNS))
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.chart_box = QWidget()
        self.chart_layout = QVBoxLayout(self.chart_box)
        self.chart_layout.setContentsMargins(0, 0, 0, 0)
        self.chart_layout.addStretch(1)
        self.charts_area = charts = QScrollArea()
        charts.setWidgetResizable(True)
        charts.setWidget(self.chart_box)
        # Before a run: what to do, where the table and the charts will be.
        self.placeholder = QLabel(
            "<p><b>No scores yet.</b></p><p>Check the models to score on the left, choose "
            "a data file (JSONL in the training formats, or a text file with one item per "
            "line; selecting an adapter in the library picks its evaluation set), then "
            "<b>Evaluate</b>.</p><p>Each model's figures appear here as soon as it is "
            "scored: a row of the table (mean NLL per token, perplexity, exact match) and "
            "a chart of its items.</p>")
        self.placeholder.setObjectName("evaluate-placeholder")
        self.placeholder.setWordWrap(True)
        self.placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.placeholder.setStyleSheet("color:#888;padding:24px")

        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(0, 0, 0, 0)
        left_layout.addWidget(QLabel("<b>Models</b>"))
        left_layout.addWidget(self.models, 1)
        # The names whole: the list's own headers say which are bases and variants.
        self.models.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        right = QWidget()
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 0, 0, 0)
        file_row = QHBoxLayout()
        file_row.addWidget(QLabel("Data"))
        file_row.addWidget(self.data, 1)
        file_row.addWidget(self.browse)
        run_row = QHBoxLayout()
        run_row.addWidget(QLabel("served by"))
        run_row.addWidget(self.backend)
        run_row.addWidget(self.exact)
        run_row.addStretch(1)
        run_row.addWidget(self.run_button)
        run_row.addWidget(self.cancel_button)
        right_layout.addLayout(file_row)
        right_layout.addLayout(run_row)
        right_layout.addWidget(self.progress)
        right_layout.addWidget(self.status)
        right_layout.addWidget(self.placeholder, 3)
        right_layout.addWidget(self.table, 1)
        right_layout.addWidget(charts, 2)
        splitter = QSplitter()
        splitter.addWidget(left)
        splitter.addWidget(right)
        splitter.setStretchFactor(1, 4)
        splitter.setSizes([220, 800])
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(splitter)

        events.catalogChanged.connect(self._catalog_changed)
        self.reload_models()
        self._update_buttons()

    # ---------------------------------------------------------------- choices

    def reload_models(self) -> None:
        """The bases and variants of the catalog, keeping what was checked."""
        checked = set(self.checked())
        self.models.clear()
        try:
            data = self.catalog.data()
        except StudioError:
            return
        for title, key in (("Base models", "models"), ("Variants", "variants")):
            if not data[key]:
                continue
            # A heading row, not a "(base model)" after each name (it was cut first).
            heading = QListWidgetItem(title)
            heading.setFlags(Qt.ItemFlag.ItemIsEnabled)  # a heading: not chosen, not checked
            font = heading.font()
            font.setBold(True)
            heading.setFont(font)
            self.models.addItem(heading)
            for name in sorted(data[key], key=str.lower):
                item = QListWidgetItem(name)
                item.setToolTip(f"{name} ({'base model' if key == 'models' else 'variant'})")
                item.setData(NameRole, name)
                item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
                item.setCheckState(Qt.CheckState.Checked if name in checked
                                   else Qt.CheckState.Unchecked)
                self.models.addItem(item)

    def _entries(self) -> list[QListWidgetItem]:
        """The list's models (its headings apart)."""
        return [item for item in (self.models.item(i) for i in range(self.models.count()))
                if item.data(NameRole)]

    def checked(self) -> list[str]:
        return [item.data(NameRole) for item in self._entries()
                if item.checkState() == Qt.CheckState.Checked]

    def set_checked(self, names: list[str]) -> None:
        for item in self._entries():
            item.setCheckState(Qt.CheckState.Checked if item.data(NameRole) in names
                               else Qt.CheckState.Unchecked)

    def set_data(self, path: str | Path) -> None:
        """Use this data file (as if chosen: a selection no longer replaces it)."""
        self.data.setText(str(path))
        self._manual_data = True

    def select(self, kind: str, name: str) -> None:
        """The library's selection: its models checked, and (unless a file was chosen)
        its adapter's evaluation set as the data."""
        if self.running():
            return
        try:
            data = self.catalog.data()
            if kind == "adapter":
                record = data["adapters"][name]
                adapters = [name]
                names = [record["base"]] + sorted(
                    v for v, r in data["variants"].items()
                    if any(a["name"] == name for a in r["adapters"]))
            elif kind == "variant":
                record = data["variants"][name]
                adapters = [a["name"] for a in record["adapters"]]
                names = [record["base"], name]
            else:
                adapters, names = [], [name]
            self.set_checked(names)
            if not self._manual_data:
                for adapter in adapters:
                    path = evaluation.set_path(self.catalog, adapter)
                    if path is not None:
                        self.data.setText(str(path))
                        break
        except (StudioError, KeyError):
            return

    def _catalog_changed(self, kinds: list[str], _names: list[str]) -> None:
        if touches(kinds, ("model", "variant")) and not self.running():
            self.reload_models()
            self._update_buttons()

    def _browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Data to score", "",
                                              "Data (*.jsonl *.json *.txt);;All files (*)")
        if path:
            self.set_data(path)

    # ---------------------------------------------------------------- running

    def running(self) -> bool:
        return self._busy

    def run(self) -> asyncio.Task | None:
        names, path = self.checked(), self.data.text().strip()
        if self.running():
            return self.flow
        if not names or not path:
            self.status.setText("Check at least one model and choose a data file.")
            return None
        self.results = []
        self.table.setRowCount(0)
        for chart in self.charts:
            chart.setParent(None)
            chart.deleteLater()
        self.charts = []
        self.progress.setValue(0)
        self.status.setText(f"reading {html.escape(Path(path).name)}…")
        self._busy = True
        self.flow = aio.spawn(self._flow(names, path, self.backend.currentData(),
                                         self.exact.isChecked()))
        self._update_buttons()
        self.busyChanged.emit(True)
        return self.flow

    def cancel(self) -> None:
        if self.loader is not None:
            self.loader.cancel()
        if self.reply is not None:
            self.reply.stop()

    stop = cancel

    async def _flow(self, names: list[str], path: str, backend: str | None,
                    exact: bool) -> None:
        try:
            outcome = await self._steps(names, path, backend, exact)
        except asyncio.CancelledError:
            outcome = "cancelled"
        finally:
            self.reply = self.loader = None
            self._busy = False
        if outcome == "cancelled":
            self.status.setText(f"cancelled after {len(self.results)} of {len(names)} "
                                "model(s)")
        self._update_buttons()
        self.busyChanged.emit(False)
        self.runFinished.emit(outcome)

    async def _steps(self, names: list[str], path: str, backend: str | None,
                     exact: bool) -> str:
        self.loader = Task(lambda _progress, _cancelled: score_sets.read_set(Path(path)), self)
        try:
            score_set = await self.loader
        except Cancelled:
            return "cancelled"
        except StudioError as exc:
            self._error(exc.message)
            return "failed"
        finally:
            self.loader = None
        for number, name in enumerate(names):
            try:
                reply = self.client.submit(assembly.score(
                    self.catalog, name, score_set.items, exact_match=exact, per_token=False,
                    backend=backend))
            except StudioError as exc:
                self._error(f"{name}: {exc.message}")
                return "failed"
            self.reply = reply
            self.status.setText(f"scoring {html.escape(name)} ({number + 1} of "
                                f"{len(names)}) on {score_set.rows} items…")
            reply.progress.connect(lambda _stage, fraction, n=number: self.progress.setValue(
                int((n + fraction) / len(names) * 1000)))
            try:
                result = await reply
            except Cancelled:
                return "cancelled"
            except StudioError as exc:
                self._error(f"{name}: {exc.message}")
                return "failed"
            finally:
                self.reply = None
            self._add(result)
            try:
                recorded = evaluation.record_score(self.catalog, score_set.sha256, result)
            except StudioError as exc:
                self._error(f"the score of {name} was not kept: {exc.message}")
                recorded = []
            if recorded:
                self.events.changed(["evaluation"], [*recorded, name])
        self.progress.setValue(1000)
        kept = " · kept as the latest scores of its evaluation set" if any(
            evaluation.adapter_sets(self.catalog, score_set.sha256)) else ""
        self.status.setText(f"{len(names)} model(s) scored on {score_set.rows} items of "
                            f"{html.escape(Path(path).name)} ({score_set.kind}){kept}")
        return "finished"

    def _error(self, message: str) -> None:
        self.status.setText(f"<span style='color:#d23c3c'>{html.escape(message)}</span>")

    def _add(self, result: ScoreResult) -> None:
        self.results.append(result)
        row = self.table.rowCount()
        self.table.insertRow(row)
        cells = (result.name, result.backend, str(result.items), str(result.tokens),
                 _num(result.mean_nll), _num(result.perplexity), result.exact_text,
                 result.tool_call_text)
        for column, text in enumerate(cells):
            item = QTableWidgetItem(text)
            if column >= 2:
                item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            self.table.setItem(row, column, item)
        self.table.resizeColumnsToContents()
        chart = ScoreChart(f"{result.name} ({result.backend})")
        chart.set_result(result)
        self.chart_layout.insertWidget(self.chart_layout.count() - 1, chart)
        self.charts.append(chart)
        self.scored.emit(result)

    def _update_buttons(self) -> None:
        busy = self.running()
        self.run_button.setEnabled(not busy and bool(self._entries()))
        empty = not busy and not self.results
        self.placeholder.setVisible(empty)
        self.table.setVisible(not empty)
        self.charts_area.setVisible(not empty)
        self.cancel_button.setEnabled(busy)
        for widget in (self.models, self.data, self.browse, self.backend, self.exact):
            widget.setEnabled(not busy)
