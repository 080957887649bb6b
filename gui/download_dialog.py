"""File → Download model or adapter…: a URL or a Hugging Face repository, into the
catalog through the same checks as an import.

A thin view over `engine.catalog.downloads`: the source is checked as typed (a mistake
is one line under the form and nothing starts); the download, its sha256 check and the
import run in a `gui.tasks.Task` with a Catalog of its own, with progress, a stage line
and Cancel (a cancel keeps nothing). A failed download keeps the part it fetched in the
data directory's cache, and the button reads Resume: the same source continues where it
stopped. The new entries are announced on the window's `CatalogEvents`.
"""

from __future__ import annotations

import html
import urllib.parse
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QCloseEvent
from PySide6.QtWidgets import (
    QButtonGroup,
    QCheckBox,
    QComboBox,
    QDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QRadioButton,
    QVBoxLayout,
    QWidget,
)

from engine.catalog import downloads
from engine.catalog.store import AdapterSpec, Catalog
from engine.errors import StudioError, UsageError
from engine.state import paths, settings
from gui.catalog_events import CatalogEvents
from gui.tasks import Task

STAGES = {"downloading": "Downloading…",
          "checking": "Checking it (digest, format, fit with the base)…"}


class DownloadDialog(QDialog):
    downloaded = Signal(str)  # the entry to show: the new variant, adapter or model
    ended = Signal(str)  # a download ended, shown: succeeded | failed | cancelled
    _stage = Signal(str)  # from the worker thread

    def __init__(self, catalog: Catalog, events: CatalogEvents, base: str | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Download model or adapter")
        self.setMinimumWidth(560)
        self.catalog = catalog
        self.events = events
        self.task: Task | None = None
        self.source: downloads.Source | None = None  # of the last attempt
        self.result_names: dict[str, str] = {}  # kind -> name of what was added
        self._named = False  # the user typed a name: stop suggesting one

        self.where = QLineEdit()
        self.where.setPlaceholderText("https://… or a Hugging Face repo id (namespace/name)")
        self.where.setAccessibleName("URL or Hugging Face repo id")
        self.filename = QLineEdit()
        self.filename.setPlaceholderText("the file in the repo (empty: a PEFT adapter's "
                                         "adapter_model.safetensors + adapter_config.json)")
        self.revision = QLineEdit()
        self.revision.setPlaceholderText("main")
        self.sha256 = QLineEdit()
        self.sha256.setPlaceholderText("optional: refuse unless the file's sha256 is this")
        self.as_adapter = QRadioButton("Adapter")
        self.as_model = QRadioButton("Base model (GGUF)")
        self.as_adapter.setChecked(True)
        kinds = QButtonGroup(self)
        kinds.addButton(self.as_adapter)
        kinds.addButton(self.as_model)
        kind_row = QHBoxLayout()
        kind_row.addWidget(self.as_adapter)
        kind_row.addWidget(self.as_model)
        kind_row.addStretch(1)
        self.base = QComboBox()
        self.base.setAccessibleName("Base model of the adapter")
        models = list(catalog.data()["models"])
        self.base.addItems(models)
        preferred = base or settings.load().default_model
        if preferred in models:
            self.base.setCurrentText(preferred)
        self.name = QLineEdit()
        self.name.setAccessibleName("Name of the new entry")
        self.name.textEdited.connect(lambda _t: setattr(self, "_named", True))
        self.make_variant = QCheckBox("Also create a variant with this adapter")
        self.make_variant.setChecked(True)
        self.variant_name = QLineEdit()
        self.variant_name.setAccessibleName("Name of the new variant")

        form = QFormLayout()
        form.addRow("From", self.where)
        form.addRow("File in the repo", self.filename)
        form.addRow("Revision", self.revision)
        form.addRow("SHA-256", self.sha256)
        form.addRow("Kind", kind_row)
        form.addRow("Base model", self.base)
        form.addRow("Name", self.name)
        form.addRow(self.make_variant)
        form.addRow("Variant name", self.variant_name)
        self.form = form

        self.stage = QLabel()
        self.stage.setWordWrap(True)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.hide()
        self.message = QLabel()
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.download_button = QPushButton("Download")
        self.download_button.setDefault(True)
        self.cancel_button = QPushButton("Close")
        self.download_button.clicked.connect(self.start)
        self.cancel_button.clicked.connect(self._cancel_clicked)
        buttons = QHBoxLayout()
        buttons.addWidget(self.progress, 1)
        buttons.addWidget(self.download_button)
        buttons.addWidget(self.cancel_button)
        layout = QVBoxLayout(self)
        note = QLabel("Downloads are checked like an import: nothing is added unless the "
                      "file passes. An interrupted download can be resumed.")
        note.setWordWrap(True)
        layout.addWidget(note)
        layout.addLayout(form)
        layout.addWidget(self.stage)
        layout.addWidget(self.message)
        layout.addLayout(buttons)

        for widget in (self.where, self.filename):
            widget.textChanged.connect(self._suggest)
        for widget in (self.where, self.filename, self.revision, self.sha256, self.name,
                       self.variant_name):
            widget.textChanged.connect(self._edited)
        self.as_adapter.toggled.connect(self._kind_changed)
        self.make_variant.toggled.connect(self._kind_changed)
        self._stage.connect(lambda stage: self.stage.setText(STAGES.get(stage, stage)))
        self._kind_changed()

    # ---------------------------------------------------------------- input

    def kind(self) -> str:
        return "adapter" if self.as_adapter.isChecked() else "model"

    def _is_url(self) -> bool:
        return self.where.text().strip().lower().startswith(("http://", "https://"))

    def _kind_changed(self, *_args: Any) -> None:
        adapter = self.kind() == "adapter"
        for widget in (self.base, self.make_variant):
            widget.setEnabled(adapter)
        self.variant_name.setEnabled(adapter and self.make_variant.isChecked())
        self._suggest()

    def _edited(self, *_args: Any) -> None:
        if self.task is None:
            self.message.setText("")
            self._set_button()

    def _suggest(self, *_args: Any) -> None:
        """A name from the file name (the wizard's rule), until the user types one."""
        if self._named:
            return
        text = self.where.text().strip()
        if self._is_url():
            stem = PurePosixPath(urllib.parse.urlsplit(text).path).stem
        else:
            stem = PurePosixPath(self.filename.text().strip()).stem or text.rpartition("/")[2]
        if not stem:
            return
        data = self.catalog.data()
        taken = {n for kind in ("models", "adapters", "variants") for n in data[kind]}
        name = paths.suggest_name(stem, taken, fallback=self.kind())
        self.name.setText(name)
        base = self.base.currentText() or "base"
        self.variant_name.setText(paths.suggest_name(f"{base.split('-')[0]}-{name}",
                                                     taken | {name}, fallback="variant"))

    def parse(self) -> downloads.Source:
        """The source as typed, checked (UsageError: one line, nothing starts)."""
        text = self.where.text().strip()
        if not text:
            raise UsageError("give a URL or a Hugging Face repo id")
        extra = {"filename": self.filename.text().strip() or None,
                 "revision": self.revision.text().strip() or None}
        if self._is_url():
            if extra["filename"] or extra["revision"]:
                raise UsageError("a URL names its file: leave the file and revision empty")
            return downloads.Source.parse(self.kind(), url=text,
                                          sha256=self.sha256.text().strip() or None)
        return downloads.Source.parse(self.kind(), repo=text,
                                      sha256=self.sha256.text().strip() or None, **extra)

    # ---------------------------------------------------------------- the download

    def start(self) -> Task | None:
        """Download (or resume) what the form says, in the background."""
        if self.task is not None:
            return None
        try:
            source = self.parse()
            work = self._work(source)
        except StudioError as exc:
            self._show_error(exc.message)
            return None
        self.source = source
        task = Task(work, self)
        self.task = task
        task.progress.connect(self._progress)
        task.succeeded.connect(self._succeeded)
        task.failed.connect(self._failed)
        task.cancelled.connect(self._cancelled)
        self.message.setText("")
        self.stage.setText(STAGES["downloading"])
        self.progress.setValue(0)
        self.progress.show()
        self._set_busy(True)
        task.start()
        return task

    def _work(self, source: downloads.Source) -> Callable[..., Any]:
        """What the worker runs, with every name checked here first (on this thread)."""
        name = paths.check_name(self.name.text().strip(), f"{self.kind()} name")
        self.catalog.check_free(name)
        worker = Catalog(self.catalog.state)  # its own: none is shared across threads
        stage = self._stage.emit
        if self.kind() == "model":
            return lambda progress, cancelled: {"model": downloads.download_model(
                worker, name, source, progress=progress, cancelled=cancelled, stage=stage
            )["name"]}
        base = self.base.currentText()
        if not base:
            raise UsageError("choose the base model the adapter was made for")
        variant = None
        if self.make_variant.isChecked():
            variant = paths.check_name(self.variant_name.text().strip(), "variant name")
            if variant == name:
                raise UsageError("the variant needs a name of its own")
            self.catalog.check_free(variant)

        def work(progress: Any, cancelled: Any) -> dict[str, str]:
            record = downloads.download_adapter(worker, name, base, source, progress=progress,
                                                cancelled=cancelled, stage=stage)
            made = {"adapter": record["name"]}
            if variant is not None:
                worker.add_variant(variant, base, [AdapterSpec(name, 1.0)])
                made["variant"] = variant
            return made

        return work

    def _progress(self, done: int, total: int) -> None:
        self.progress.setRange(0, total)
        self.progress.setValue(done)

    def _succeeded(self, made: dict[str, str]) -> None:
        self._ended()
        self.result_names = made
        self.events.changed(list(made), list(made.values()))
        self.stage.setText("Added " + ", ".join(f"{kind} {name}" for kind, name in made.items()))
        self.downloaded.emit(made.get("variant") or made.get("adapter") or made["model"])
        self.ended.emit("succeeded")
        self.accept()

    def _failed(self, message: str) -> None:
        self._ended()
        kept = self.source is not None and downloads.partial_files(self.source, self.kind())
        self._show_error(message + ("\nThe part downloaded is kept: Resume continues it."
                                    if kept else ""))
        self.ended.emit("failed")

    def _cancelled(self) -> None:
        self._ended()
        data = self.catalog.data()
        made = {kind[:-1]: name for kind, name in (
            ("models", self.name.text().strip()), ("adapters", self.name.text().strip()),
            ("variants", self.variant_name.text().strip())) if name and name in data[kind]}
        if made:  # the cancel came after the entry was recorded: it is there, say so
            self._succeeded(made)
            return
        self.stage.setText("Cancelled: nothing was added.")
        self._set_button()
        self.ended.emit("cancelled")

    def _ended(self) -> None:
        self.task = None
        self.progress.hide()
        self._set_busy(False)

    def _show_error(self, message: str) -> None:
        self.stage.setText("")
        self.message.setText(f"<span style='color:#d23c3c'>"
                             f"{html.escape(message).replace(chr(10), '<br>')}</span>")
        self._set_button()

    def _set_button(self) -> None:
        """Download, or Resume when the form's source has a partial download kept."""
        try:
            source = self.parse()
        except StudioError:
            source = None
        resumable = source is not None and bool(downloads.partial_files(source, self.kind()))
        self.download_button.setText("Resume" if resumable else "Download")

    def _set_busy(self, busy: bool) -> None:
        self.download_button.setEnabled(not busy)
        for row in range(self.form.rowCount()):
            for role in (QFormLayout.ItemRole.FieldRole, QFormLayout.ItemRole.SpanningRole):
                item = self.form.itemAt(row, role)
                if item is not None and item.widget() is not None:
                    item.widget().setEnabled(not busy)
        if not busy:
            self._kind_changed()
        for button in (self.as_adapter, self.as_model):
            button.setEnabled(not busy)
        self.cancel_button.setText("Cancel download" if busy else "Close")

    def cancel(self) -> None:
        """Stop the download; nothing of it is kept."""
        if self.task is not None:
            self.task.cancel()
            self.stage.setText("Cancelling…")

    def _cancel_clicked(self) -> None:
        if self.task is not None:
            self.cancel()
        else:
            self.reject()

    def reject(self) -> None:
        self.cancel()
        super().reject()

    def closeEvent(self, event: QCloseEvent) -> None:
        self.cancel()
        super().closeEvent(event)
