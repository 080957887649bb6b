"""The adapter import wizard's Qt pages: thin views over engine.catalog.wizard.

Navigation and every rule live in `ImportWizard` (tested without Qt); this dialog
only shows the current step and forwards input. Everything that reads whole files
runs on a worker thread (`gui.tasks.Task`) with progress and a cancel button: the
inspection of a chosen file (and the re-hash of a base that changed on disk), the
validation against the chosen base (a scan of every weight), and the import. Each
runs on a copy of the wizard's state with its own `Catalog` (none is shared across
threads); only the newest step's result is applied, on the GUI thread; `stepReady`
says one has ended. A finished import is announced (`CatalogEvents`).
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QStackedWidget,
    QTableView,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from engine.catalog.store import Catalog
from engine.catalog.wizard import ImportWizard, Step
from engine.curated import setup
from engine.formats.artifacts import AdapterInfo
from engine.formats.safeio import printable
from gui.catalog_events import CatalogEvents
from gui.detail import ChecksModel
from gui.tasks import Task

TITLES = {
    Step.PICK: "1 · Choose an adapter",
    Step.SUMMARY: "2 · What the file holds",
    Step.BASE: "3 · Choose its base model",
    Step.REPORT: "4 · Compatibility report",
    Step.DETAILS: "5 · Name and source",
}


TYPING_PAUSE_MS = 500  # a typed path is inspected once the typing pauses this long

LABELS = {"kind": "Kind", "format": "Format", "backend": "Runtime", "rank": "Rank",
          "alpha": "Alpha", "targets": "Targets", "architecture": "Architecture",
          "base_sha256": "Declared base digest", "tensors": "Tensors", "layers": "Layers",
          "dtype": "Weights", "size": "Size", "base_model_name": "Declared base model",
          "path": "Path", "adapted_tensors": "Adapted weights", "tensor_count": "Tensors",
          "dtypes": "Weight types"}
BACKENDS = {"llama": "llama.cpp", "openvino": "OpenVINO"}


def human(key: str, value: Any) -> str:
    """A metadata value as a person reads it: no Python lists, None or True."""
    if value is None or value == "" or value == [] or value == {}:
        return "not declared" if "sha256" in key or "base" in key else "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return ", ".join(human(key, v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k} {human(key, v)}" for k, v in value.items())
    if key == "backend":
        return BACKENDS.get(str(value), str(value))
    return str(value)


def label(key: str) -> str:
    return LABELS.get(key, key.replace("_", " ").capitalize())


def made_for_text(info: AdapterInfo, made_for: list[str] | tuple[str, ...]) -> str:
    """Which base the adapter was made for, in the library's names where it has them
    (the file's own name for its base, "Smollm2 135M 8k Lc100K Mix1 Ep2", is not one)."""
    named = f"“{printable(info.base_name, 80)}”" if info.base_name else ""
    if made_for:
        how = ("the file declares this base's digest" if info.base_sha256
               else f"by the base's model name {named}; its digest is not declared")
        return f"{', '.join(made_for)} ({how})"
    if info.base_sha256:
        return (f"a base that is not in your library (digest "
                f"{printable(info.base_sha256, 12)}…{', named ' + named if named else ''})")
    if named:
        return (f"a base named {named}; none in your library has that name (its digest is "
                "not declared)")
    return "not declared: the check against each base below decides"


def summary_rows(info: AdapterInfo, made_for: list[str] | tuple[str, ...]) -> list[tuple[str, str]]:
    """The summary page's rows: what the file holds, its targets on one line (the
    projections it adapts; a PEFT config's own module names beside them when they
    differ), and the base it was made for in the library's names."""
    meta = info.summary()
    rows = []
    for key, value in meta.items():
        if key in ("target_shapes", "target_modules", "expected_base_name",
                   "expected_base_sha256"):
            continue
        text = human(key, value)
        if key == "targets":
            declared = [m for m in meta.get("target_modules") or [] if m not in value]
            if declared:
                text += f" (adapter_config.json: {human(key, declared)})"
        rows.append((label(key), text))
    rows.append(("Made for", made_for_text(info, made_for)))
    return rows


class ImportDialog(QDialog):
    stepReady = Signal()  # a step's background work ended: applied, failed or stopped
    addModelRequested = Signal(str)  # the file is a base model: add it as one

    def __init__(self, catalog: Catalog, events: CatalogEvents, path: str | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.events = events
        self.setWindowTitle("Import adapter")
        self.setAcceptDrops(True)
        self.resize(680, 520)
        self.state = ImportWizard(catalog)
        self.result_names: dict[str, Any] = {}
        self.task: Task | None = None  # the import
        self.step_task: Task | None = None  # inspection or validation of this step
        self._step_label = ""
        self._inspecting = ""  # the path last given to inspection
        self._next_when_read = False  # Enter in the path field: Next once it is read

        self.title = QLabel()
        self.title.setStyleSheet("font-size:15px;font-weight:bold")
        self.pages = QStackedWidget()
        # PICK
        self.path = QLineEdit()
        self.path.setPlaceholderText("A GGUF LoRA, a .safetensors file, or a PEFT folder — "
                                     "or drop it here")
        self.path.editingFinished.connect(self._path_edited)
        # Enter goes on to the next page: at once when the path was read already (the
        # dialog's default button, Next), else once it has been read.
        self.path.returnPressed.connect(self._path_entered)
        self.path.textEdited.connect(lambda _text: setattr(self, "_next_when_read", False))
        # A typed path is checked as typed, once the typing pauses (not only on Enter).
        self.typing = QTimer(self)
        self.typing.setSingleShot(True)
        self.typing.setInterval(TYPING_PAUSE_MS)
        self.typing.timeout.connect(self._path_edited)
        self.path.textEdited.connect(lambda _text: self.typing.start())
        browse_file = QPushButton("Choose file…")
        browse_file.clicked.connect(self._browse_file)
        browse_dir = QPushButton("Choose folder…")
        browse_dir.clicked.connect(self._browse_dir)
        pick = QWidget()
        pick_layout = QVBoxLayout(pick)
        pick_layout.addWidget(QLabel("Adapters are copied into Variant Studio's store and "
                                     "checked against a base before they can be used."))
        row = QHBoxLayout()
        row.addWidget(self.path, 1)
        row.addWidget(browse_file)
        row.addWidget(browse_dir)
        pick_layout.addLayout(row)
        pick_layout.addStretch(1)
        # SUMMARY
        self.summary = QTextBrowser()
        self.as_model = QPushButton("Add it as a base model instead")
        self.as_model.clicked.connect(self._add_as_model)
        self.as_model.hide()
        summary_page = QWidget()
        summary_layout = QVBoxLayout(summary_page)
        summary_layout.setContentsMargins(0, 0, 0, 0)
        summary_layout.addWidget(self.summary, 1)
        summary_layout.addWidget(self.as_model, 0, Qt.AlignmentFlag.AlignLeft)
        # BASE
        self.bases = QListWidget()
        self.bases.currentItemChanged.connect(self._base_chosen)
        self.bases.itemClicked.connect(self._base_clicked)
        # REPORT
        self.checks = ChecksModel(self)
        self.checks_view = QTableView()
        self.checks_view.setModel(self.checks)
        self.checks_view.verticalHeader().hide()
        self.checks_view.horizontalHeader().setStretchLastSection(True)
        self.ack = QCheckBox("I have read the warnings and want to import this adapter")
        self.ack.toggled.connect(self._acknowledge)
        report = QWidget()
        report_layout = QVBoxLayout(report)
        report_layout.addWidget(self.checks_view)
        report_layout.addWidget(self.ack)
        # DETAILS
        self.name = QLineEdit()
        self.source = QLineEdit()
        self.source.setPlaceholderText("where it came from: a URL, a colleague, a path")
        self.scale = QDoubleSpinBox()
        self.scale.setRange(0.0, 10.0)
        self.scale.setSingleStep(0.05)
        self.scale.setValue(1.0)
        self.make_variant = QCheckBox("Also create a variant with this adapter")
        self.make_variant.setChecked(True)
        self.variant_name = QLineEdit()
        details = QWidget()
        form = QFormLayout(details)
        form.addRow("Adapter name", self.name)
        form.addRow("Source", self.source)
        form.addRow("Default scale", self.scale)
        form.addRow(self.make_variant)
        form.addRow("Variant name", self.variant_name)
        for widget in (self.name, self.source, self.variant_name):
            widget.textChanged.connect(self._details_changed)
        self.scale.valueChanged.connect(self._details_changed)
        self.make_variant.toggled.connect(self._details_changed)
        for page in (pick, summary_page, self.bases, report, details):
            self.pages.addWidget(page)

        self.blocker = QLabel()
        self.blocker.setWordWrap(True)
        self.blocker.setStyleSheet("color:#c07a00")
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.hide()
        self.back_button = QPushButton("Back")
        self.next_button = QPushButton("Next")
        self.next_button.setDefault(True)
        self.cancel_button = QPushButton("Cancel")
        self.back_button.clicked.connect(self.back)
        self.next_button.clicked.connect(self.next)
        self.cancel_button.clicked.connect(self._cancel)
        buttons = QHBoxLayout()
        buttons.addWidget(self.progress, 1)
        buttons.addStretch(0)
        for button in (self.back_button, self.next_button, self.cancel_button):
            buttons.addWidget(button)
        layout = QVBoxLayout(self)
        layout.addWidget(self.title)
        layout.addWidget(self.pages, 1)
        layout.addWidget(self.blocker)
        layout.addLayout(buttons)
        if path:
            self._set_path(path)
        self._refresh()

    # ---------------------------------------------------------------- input

    def _browse_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Adapter file", "",
                                              "Adapters (*.gguf *.safetensors);;All files (*)")
        if path:
            self._set_path(path)

    def _browse_dir(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "PEFT adapter folder")
        if path:
            self._set_path(path)

    def _path_edited(self) -> None:
        # editingFinished also fires when the field merely loses focus (leaving the
        # first page hides it): only a different path is inspected again.
        self.typing.stop()
        if self.path.text().strip() != self._inspecting:
            self._set_path(self.path.text())

    def _path_entered(self) -> None:
        self._path_edited()
        if self.step_task is not None and self.state.step == Step.PICK:
            self._next_when_read = True

    def _add_as_model(self) -> None:
        path = str(self.state.path) if self.state.path else ""
        self.reject()
        if path:
            self.addModelRequested.emit(path)

    def _set_path(self, path: str) -> None:
        path = path.strip()
        if not path:
            return
        self.path.setText(path)
        self._inspecting = path
        worker = self._worker_state()
        self._run_step(f"Reading {Path(path).name}…",
                       lambda progress, cancelled: worker.inspect(Path(path), progress,
                                                                  cancelled),
                       self.state.apply_inspection)

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if event.mimeData().hasUrls() and self.state.step == Step.PICK:
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        urls = event.mimeData().urls()
        if urls:
            self._set_path(urls[0].toLocalFile())

    def _base_chosen(self, item: QListWidgetItem | None, _previous: Any) -> None:
        if item is None or not item.flags() & Qt.ItemFlag.ItemIsEnabled:
            return
        name = item.data(Qt.ItemDataRole.UserRole)
        worker = self._worker_state()
        self._run_step(f"Checking the adapter against {name} (every weight is read)…",
                       lambda progress, cancelled: worker.validate(name, progress,
                                                                   cancelled),
                       lambda report: self.state.apply_report(name, report))

    # ---------------------------------------------------------------- step work

    def _worker_state(self) -> ImportWizard:
        """A copy of the wizard for a worker thread, with a Catalog of its own.

        `inspect`, `validate` and `finish` only read the wizard's fields; the copy is
        taken on the GUI thread, so the worker sees the state of the moment it began.
        """
        return dataclasses.replace(self.state, catalog=Catalog(self.state.catalog.state),
                                   choices=list(self.state.choices))

    def _run_step(self, label: str, work: Callable[..., Any],
                  apply: Callable[[Any], None]) -> Task:
        """Run a step's reading on a worker thread; `apply` its result on this one."""
        if self.step_task is not None:
            self.step_task.cancel()  # superseded: a cancelled task delivers nothing
        task = Task(work, self)
        self.step_task = task
        self._step_label = label
        self.progress.setRange(0, 0)  # busy, until the work reports how far it is
        self.progress.show()
        self.cancel_button.setText("Stop")
        task.progress.connect(lambda done, total: self._step_progress(task, done, total))
        task.succeeded.connect(lambda result: self._step_ended(task, apply, result))
        task.failed.connect(lambda message: self._step_ended(task, None, message))
        task.cancelled.connect(lambda: self._step_ended(task, None, "stopped"))
        task.start()
        self._refresh()
        return task

    def _step_progress(self, task: Task, done: int, total: int) -> None:
        if task is self.step_task:
            self.progress.setRange(0, total)
            self.progress.setValue(done)

    def _step_ended(self, task: Task, apply: Callable[[Any], None] | None,
                    result: Any) -> None:
        if task is not self.step_task:
            return  # a newer step replaced it
        self.step_task = None
        self.progress.hide()
        self.progress.setRange(0, 1000)
        self.cancel_button.setText("Cancel")
        if apply is not None:
            apply(result)
        self._load_state_into_pages()
        self._refresh()
        if apply is None:
            self.blocker.setText(f"<span style='color:#d23c3c'>{html.escape(self._step_label)}"
                                 f" {html.escape(str(result))}</span>")
        elif self._next_when_read and self.state.step == Step.PICK and \
                self.state.can_advance():
            self.next()
        self._next_when_read = False
        self.stepReady.emit()

    def _preselect_base(self) -> None:
        """On the base page, the only compatible base is chosen (and checked) at once."""
        compatible = [c for c in self.state.choices if c.compatible]
        if self.state.base is not None or self.step_task is not None or len(compatible) != 1:
            return
        for row in range(self.bases.count()):
            item = self.bases.item(row)
            if item.data(Qt.ItemDataRole.UserRole) == compatible[0].name:
                self.bases.setCurrentItem(item)  # runs the validation step

    def _base_clicked(self, item: QListWidgetItem) -> None:
        """A click on the chosen base checks it again when its check was stopped."""
        if self.step_task is None and self.state.report is None:
            self._base_chosen(item, None)

    def _add_pending_bases(self) -> None:
        """Bases listed before they exist (the OpenVINO default before its build), shown
        disabled with the reason, as the incompatible ones are."""
        listed = {c.name for c in self.state.choices}
        try:
            pending = setup.pending_entries(self.state.catalog)
        except Exception:  # noqa: BLE001 (a listing aid: never blocks the import)
            return
        for entry in pending:
            if entry["name"] in listed:
                continue
            backend = BACKENDS.get(entry.get("backend", ""), entry.get("backend", ""))
            reason = ("not built yet (Engine → Build the OpenVINO default model); an "
                      "OpenVINO base takes a PEFT adapter (.safetensors)")
            item = QListWidgetItem(f"{entry['name']}  ({backend}) — {reason}")
            item.setData(Qt.ItemDataRole.UserRole, entry["name"])
            item.setToolTip(reason)
            item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEnabled &
                          ~Qt.ItemFlag.ItemIsSelectable)
            self.bases.addItem(item)

    def busy(self) -> bool:
        """Is background work (a step's reading, or the import) running?"""
        return self.task is not None or self.step_task is not None

    def _acknowledge(self, checked: bool) -> None:
        self.state.acknowledge_warnings(checked)
        self._refresh()

    def _details_changed(self) -> None:
        self.variant_name.setEnabled(self.make_variant.isChecked())
        self.state.set_details(self.name.text(), self.source.text(), self.scale.value(),
                               self.make_variant.isChecked(), self.variant_name.text())
        self._refresh()

    # ---------------------------------------------------------------- views

    def _load_state_into_pages(self) -> None:
        s = self.state
        if s.error:
            self.summary.setHtml(f"<p style='color:#d23c3c'><b>This file cannot be imported."
                                 f"</b><br>{html.escape(s.error)}</p>")
        elif s.info is not None:
            rows = "".join(
                f"<tr><td style='color:#888;padding-right:12px'>{html.escape(k)}</td>"
                f"<td>{html.escape(printable(v, 200))}</td></tr>"
                for k, v in summary_rows(s.info, s.made_for))
            heading = html.escape(printable(Path(s.info.path).name))
            self.summary.setHtml(f"<p><b>{heading}</b></p><table>{rows}</table>")
        self.bases.blockSignals(True)
        self.bases.clear()
        self.as_model.setVisible(s.base_model)
        for choice in s.choices:
            runtime = BACKENDS.get(choice.backend, choice.backend)
            item = QListWidgetItem(f"{choice.name}  ({runtime}) — {choice.reason}")
            item.setData(Qt.ItemDataRole.UserRole, choice.name)
            item.setToolTip(choice.reason)
            if not choice.compatible:
                item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEnabled &
                              ~Qt.ItemFlag.ItemIsSelectable)
            self.bases.addItem(item)
            if choice.name == s.base:
                self.bases.setCurrentItem(item)
        if s.info is not None:
            self._add_pending_bases()
        self.bases.blockSignals(False)
        self.checks.load(s.report.to_list() if s.report else [])
        self.checks_view.resizeColumnsToContents()
        has_warnings = bool(s.report and s.report.ok and s.report.warnings())
        self.ack.setVisible(has_warnings)
        self.ack.blockSignals(True)
        self.ack.setChecked(s.acknowledged)
        self.ack.blockSignals(False)
        for widget, value in ((self.name, s.name), (self.source, s.source),
                              (self.variant_name, s.variant_name)):
            widget.blockSignals(True)
            widget.setText(value)
            widget.blockSignals(False)

    def _refresh(self) -> None:
        step = self.state.step
        self.pages.setCurrentIndex(int(step))
        self.title.setText(TITLES[step])
        blockers = self.state.blockers()
        if self.step_task is not None:
            blockers = [self._step_label]
        elif step == Step.SUMMARY and self.state.error:
            blockers = ["go back and choose another file"]  # the page says why, once
        self.blocker.setText(html.escape(blockers[0]) if blockers else "")
        busy = self.busy()
        self.back_button.setEnabled(step > Step.PICK and not busy)
        self.next_button.setText("Import" if step == Step.DETAILS else "Next")
        self.next_button.setEnabled(not blockers and not busy)

    # ---------------------------------------------------------------- navigation

    def next(self) -> None:
        if self.state.step == Step.DETAILS:
            self._finish()
            return
        if self.state.can_advance():
            self.state.advance()
            if self.state.step == Step.DETAILS:
                self._details_changed()
            self._refresh()
            if self.state.step == Step.BASE:
                self._preselect_base()

    def back(self) -> None:
        self.state.back()
        self._refresh()

    def _finish(self) -> None:
        self.progress.setValue(0)
        self.progress.show()
        worker = self._worker_state()
        self.task = Task(lambda progress, cancelled: worker.finish(progress, cancelled), self)
        self.task.progress.connect(lambda done, total: self.progress.setValue(done))
        self.task.succeeded.connect(self._imported)
        self.task.failed.connect(self._import_failed)
        self.task.cancelled.connect(self._import_cancelled)
        self.task.start()
        self.cancel_button.setText("Cancel import")
        self._refresh()

    def _imported(self, result: dict[str, Any]) -> None:
        self.task = None
        self.result_names = result
        self.events.changed(["adapter", "variant"] if "variant" in result else ["adapter"],
                            [result["adapter"], result.get("variant", "")])
        self.accept()

    def _import_failed(self, message: str) -> None:
        self.task = None
        self.progress.hide()
        self.cancel_button.setText("Cancel")
        self._refresh()
        self.blocker.setText(f"<span style='color:#d23c3c'>{html.escape(message)}</span>")

    def _import_cancelled(self) -> None:
        self.task = None
        done = self.state.imported()
        if done:  # the cancel came after the import was recorded: it happened
            self._imported(done)
            return
        self.progress.hide()
        self.cancel_button.setText("Cancel")
        self._refresh()
        self.blocker.setText("import cancelled; nothing was added")

    def _cancel(self) -> None:
        if self.step_task is not None:
            self.step_task.cancel()
        elif self.task is not None:
            self.task.cancel()
        else:
            self.reject()

    def reject(self) -> None:
        """Closing the dialog stops its background work; an import then adds nothing."""
        for task in (self.step_task, self.task):
            if task is not None:
                task.cancel()
        super().reject()
