"""The Train page: pick a base and data, set the few settings that matter, start, watch
the loss fall, cancel, and land on the new variant.

A view over `gui.controllers.training.TrainingController`, which starts and cancels
the runs (in a worker process) and announces what a finished run added; the page
shows the run's events (`controller.client`'s signals) and the loss in a QtCharts plot,
and reloads its base and adapter choices when the catalog's models or adapters change
(`CatalogEvents`). Nothing here imports torch or a native runtime.

Mounting (for the main window): `page = TrainPage(controller)`; add it as a tab; the
window listens to the controller (`variantCreated`), not to the page.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Slot
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from engine import training
from engine.errors import StudioError
from engine.formats import naming
from engine.training.config import TrainConfig
from engine.training.job import TrainRequest
from gui.catalog_events import touches
from gui.controllers.training import TrainingController
from gui.widgets.loss_chart import LossChart


class TrainPage(QWidget):
    """Train a LoRA adapter through the GGUF file that is served."""

    def __init__(self, controller: TrainingController, parent: QWidget | None = None
                 ) -> None:
        super().__init__(parent)
        self.controller = controller
        self.catalog = controller.catalog
        self.client = controller.client
        defaults = TrainConfig()
        self.last_result: dict[str, Any] | None = None

        self.hint = QLabel()
        self.hint.setWordWrap(True)
        self.base = QComboBox()
        self.data = QLineEdit()
        self.data.setPlaceholderText("a JSONL file: text, prompt/completion, messages or "
                                     "token ids")
        self.browse = QPushButton("Browse…")
        self.browse.clicked.connect(self._browse)
        data_row = QHBoxLayout()
        data_row.addWidget(self.data, 1)
        data_row.addWidget(self.browse)
        self.name = QLineEdit()
        self.name.setPlaceholderText("name of the new adapter")
        self.variant = QLineEdit()
        self.variant.setPlaceholderText("name of the new variant (empty: adapter only)")
        self.name.textEdited.connect(self._suggest_variant)
        self.steps = _spin(1, 100_000, defaults.steps)
        self.lr = QDoubleSpinBox()
        self.lr.setDecimals(5)
        self.lr.setRange(0.00001, 1.0)
        self.lr.setSingleStep(0.0001)
        self.lr.setValue(defaults.lr)
        self.rank = _spin(1, 256, defaults.rank)
        self.train_eot = QCheckBox("answers learn to stop (train the end-of-turn token)")
        self.train_eot.setChecked(True)
        main = QFormLayout()
        main.addRow("Base model", self.base)
        main.addRow("Training data", data_row)
        main.addRow("Adapter name", self.name)
        main.addRow("Variant name", self.variant)
        main.addRow("Steps", self.steps)
        main.addRow("Learning rate", self.lr)
        main.addRow("Rank", self.rank)
        main.addRow("", self.train_eot)

        # Advanced settings, folded away.
        self.advanced_toggle = QToolButton()
        self.advanced_toggle.setText("Advanced settings")
        self.advanced_toggle.setCheckable(True)
        self.advanced_toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.advanced_toggle.setArrowType(Qt.ArrowType.RightArrow)
        self.advanced_toggle.toggled.connect(self._toggle_advanced)
        self.advanced = QGroupBox()
        self.alpha = QDoubleSpinBox()
        self.alpha.setRange(0.01, 10_000)
        self.alpha.setValue(defaults.alpha)
        self.targets = QLineEdit(",".join(short for short, role in naming.SHORT_ROLES.items()
                                          if role in defaults.targets))
        self.seq_len = _spin(8, 32768, defaults.seq_len)
        self.batch = _spin(1, 4096, defaults.batch)
        self.seed = _spin(0, 2**31 - 1, defaults.seed)
        self.threads = _spin(1, 1024, defaults.threads)
        self.save_every = _spin(0, 1_000_000, defaults.save_every)
        self.dpo = QCheckBox("preference training (DPO: chosen/rejected pairs)")
        self.dpo_beta = QDoubleSpinBox()
        self.dpo_beta.setRange(0.001, 100)
        self.dpo_beta.setValue(defaults.dpo_beta)
        self.init_adapter = QComboBox()
        # served: llama.cpp's own roundings in the forward pass; float: the old arithmetic.
        self.numerics = QComboBox()
        self.numerics.addItems(["served", "float"])
        self.numerics.setCurrentText(defaults.numerics)
        adv = QFormLayout(self.advanced)
        adv.addRow("Alpha", self.alpha)
        adv.addRow("Targets", self.targets)
        adv.addRow("Sequence length", self.seq_len)
        adv.addRow("Batch", self.batch)
        adv.addRow("Seed", self.seed)
        adv.addRow("CPU threads", self.threads)
        adv.addRow("Checkpoint every", self.save_every)
        adv.addRow("", self.dpo)
        adv.addRow("DPO beta", self.dpo_beta)
        adv.addRow("Continue adapter", self.init_adapter)
        adv.addRow("Numerics", self.numerics)
        self.advanced.hide()

        self.start_button = QPushButton("Start training")
        self.start_button.setDefault(True)
        self.start_button.clicked.connect(self.start)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.cancel_button.clicked.connect(self.cancel)
        buttons = QHBoxLayout()
        buttons.addWidget(self.start_button)
        buttons.addWidget(self.cancel_button)
        buttons.addStretch(1)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.status = QLabel("Ready.")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.warnings = QLabel()
        self.warnings.setWordWrap(True)
        self.warnings.setStyleSheet("color:#b36b00")
        self.warnings.hide()
        self.plot = LossChart()

        # Everything in a scroll area: opening the advanced settings (or a long
        # warning) scrolls the page instead of growing the window past a laptop screen.
        content = QWidget()
        layout = QVBoxLayout(content)
        layout.addWidget(self.hint)
        layout.addLayout(main)
        layout.addWidget(self.advanced_toggle)
        layout.addWidget(self.advanced)
        layout.addLayout(buttons)
        layout.addWidget(self.progress)
        layout.addWidget(self.status)
        layout.addWidget(self.warnings)
        self.plot.setMinimumHeight(180)
        layout.addWidget(self.plot, 1)
        self.scroll = QScrollArea()
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        self.scroll.setWidget(content)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(self.scroll)
        # A refusal ("give the new adapter a name") is stale once the user acts on it.
        for field in (self.name, self.data):
            field.textChanged.connect(self._clear_refusal)

        c = self.client
        c.stage.connect(lambda stage: self._status(f"{stage[:1].upper()}{stage[1:]}…"))
        c.dataLoaded.connect(self._data_loaded)
        c.warning.connect(self._warning)
        c.loading.connect(lambda f: self._status(f"Loading the base weights… {f:.0%}"))
        c.progress.connect(self._progress)
        c.checkpoint.connect(lambda step, _p: self._status(f"Checkpoint saved at step {step}."))
        c.failed.connect(self._failed)
        c.cancelled.connect(self._cancelled)
        # After the controller announced the new entries (so the choices are fresh).
        controller.trained.connect(self._finished)
        controller.events.catalogChanged.connect(self._catalog_changed)
        self.refresh()

    # ---------------------------------------------------------------- state

    def busy(self) -> bool:
        return self.controller.busy()

    def _catalog_changed(self, kinds: list[str], _names: list[str]) -> None:
        if touches(kinds, ("model", "adapter")):  # the choices: bases, adapters to continue
            self.refresh()

    def refresh(self) -> None:
        """Reload the base and adapter choices from the catalog."""
        available = training.torch_available()
        self.hint.setText(
            "Trains a LoRA adapter through the same quantized GGUF file the app serves, "
            "with llama.cpp's own tokens; same data, seed and settings give the same "
            "adapter bytes." if available else
            f"<b>Training is off.</b> {training.ENABLE_HINT}.")
        self.start_button.setEnabled(available and not self.busy())
        current_base, current_init = self.base.currentText(), self.init_adapter.currentText()
        self.base.clear()
        self.init_adapter.clear()
        self.init_adapter.addItem("")
        try:
            data = self.catalog.data()
        except StudioError as exc:
            self._status(exc.message, error=True)
            return
        for record in data["models"].values():
            if record.get("backend") == "llama" and record.get("format") == "gguf":
                self.base.addItem(record["name"])
        for record in data["adapters"].values():
            if record.get("format") == "gguf":
                self.init_adapter.addItem(record["name"])
        for combo, value in ((self.base, current_base), (self.init_adapter, current_init)):
            index = combo.findText(value)
            if index >= 0:
                combo.setCurrentIndex(index)

    def request(self) -> TrainRequest:
        """The request the form describes (not yet checked against the catalog)."""
        settings: dict[str, Any] = {
            "steps": self.steps.value(), "lr": self.lr.value(), "rank": self.rank.value(),
            "train_eot": self.train_eot.isChecked(), "alpha": self.alpha.value(),
            "targets": self.targets.text(), "seq_len": self.seq_len.value(),
            "batch": self.batch.value(), "seed": self.seed.value(),
            "threads": self.threads.value(), "save_every": self.save_every.value(),
            "dpo": self.dpo.isChecked(), "dpo_beta": self.dpo_beta.value(),
            "numerics": self.numerics.currentText(),
        }
        init = self.init_adapter.currentText() or None
        if init:  # the starting adapter decides rank, alpha and targets
            for key in ("rank", "alpha", "targets"):
                settings.pop(key)
        return TrainRequest(name=self.name.text().strip(), base=self.base.currentText(),
                            data=self.data.text().strip(), settings=settings,
                            init_adapter=init, variant=self.variant.text().strip() or None)

    @Slot()
    def start(self) -> None:
        if self.busy():
            return
        if not training.torch_available():
            self._status(training.ENABLE_HINT, error=True)
            return
        try:
            if not self.name.text().strip():
                raise StudioError("give the new adapter a name")
            if not self.data.text().strip():
                raise StudioError("choose a training data file")
            prepared = self.controller.start(self.request())
        except StudioError as exc:
            self._status(exc.message, error=True)
            return
        self.last_result = None
        self.plot.reset(prepared.config.steps)
        self.progress.setRange(0, prepared.config.steps)
        self.progress.setValue(0)
        self.warnings.clear()
        self.warnings.hide()
        self._set_running(True)
        self._status("Starting the training worker…")

    @Slot()
    def cancel(self) -> None:
        if self.busy():
            self.cancel_button.setEnabled(False)
            self._status("Cancelling…")
            self.controller.cancel()

    # ---------------------------------------------------------------- events

    def _set_running(self, running: bool) -> None:
        self.start_button.setEnabled(not running and training.torch_available())
        self.cancel_button.setEnabled(running)
        for widget in (self.base, self.data, self.browse, self.name, self.variant,
                       self.steps, self.lr, self.rank, self.train_eot, self.advanced):
            widget.setEnabled(not running)

    def _status(self, text: str, error: bool = False) -> None:
        self.status.setStyleSheet("color:#c0392b" if error else "")
        self.status.setText(text)
        self._refusal = error and not self.busy()

    def _clear_refusal(self) -> None:
        if getattr(self, "_refusal", False):
            self._status("Ready.")

    @Slot(dict)
    def _data_loaded(self, event: dict) -> None:
        self._status(f"Data: {event.get('examples')} examples, {event.get('target_tokens')} "
                     f"target tokens ({', '.join(event.get('kinds', []))}).")

    @Slot(str)
    def _warning(self, message: str) -> None:
        text = self.warnings.text()
        self.warnings.setText((text + "\n" if text else "") + f"⚠ {message}")
        self.warnings.show()

    @Slot(dict)
    def _progress(self, event: dict) -> None:
        step, steps = int(event["step"]), int(event["steps"])
        self.progress.setRange(0, steps)
        self.progress.setValue(step)
        self.plot.steps = steps
        self.plot.add(step, float(event["loss"]))
        extra = (f" · reward accuracy {event['reward_accuracy']:.2f}"
                 if "reward_accuracy" in event else "")
        self._status(f"Step {step}/{steps} · loss {float(event['loss']):.4f}{extra} · "
                     f"{_duration(event.get('seconds', 0))} elapsed, about "
                     f"{_duration(event.get('eta', 0))} left")

    @Slot(dict)
    def _finished(self, result: dict) -> None:
        self.last_result = result
        self._set_running(False)
        record = result.get("provenance", {})
        gguf = result.get("files", {}).get("gguf", {})
        self._status(f"Done: adapter {result.get('adapter')} (sha256 "
                     f"{str(gguf.get('sha256', ''))[:16]}…), loss "
                     f"{record.get('loss', {}).get('first', 0):.4f} → "
                     f"{record.get('loss', {}).get('last', 0):.4f}"
                     + (f", variant {result['variant']}." if result.get("variant") else "."))

    @Slot(str, list)
    def _failed(self, message: str, details: list) -> None:
        self._set_running(False)
        self._status(f"Training failed: {message}", error=True)
        if details:
            self.status.setToolTip("\n".join(str(d) for d in details[:20]))

    @Slot(str)
    def _cancelled(self, checkpoint: str) -> None:
        self._set_running(False)
        self._status("Cancelled." + (f" The last checkpoint is {checkpoint} (resume it with "
                                     f"`variant-studio train … --resume`)."
                                     if checkpoint else ""))

    # ---------------------------------------------------------------- helpers

    def _toggle_advanced(self, shown: bool) -> None:
        self.advanced.setVisible(shown)
        self.advanced_toggle.setArrowType(Qt.ArrowType.DownArrow if shown
                                          else Qt.ArrowType.RightArrow)

    def _suggest_variant(self, text: str) -> None:
        if not self.variant.isModified():
            self.variant.setText(f"{text}-variant" if text else "")

    def _browse(self) -> None:
        start = str(Path(self.data.text()).parent) if self.data.text() else os.getcwd()
        path, _ = QFileDialog.getOpenFileName(self, "Training data", start,
                                              "JSON lines (*.jsonl *.json);;All files (*)")
        if path:
            self.data.setText(path)


def _spin(low: int, high: int, value: int) -> QSpinBox:
    spin = QSpinBox()
    spin.setRange(low, high)
    spin.setValue(value)
    return spin


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}:{seconds % 60:02d}" if seconds >= 60 else f"{seconds} s"
