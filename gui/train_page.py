"""The Train page: pick a base and data, set the few settings that matter, start, watch
the loss fall, cancel, and land on the new variant.

Two methods: supervised (examples; DPO under Advanced) and the reinforcement loop
(`engine.training.rl`: prompts, a reward, rounds of sample, score, train). Fields that
do not apply to the chosen method are hidden; the LoRA settings the loop takes
(`rl.TRAIN_KEYS`) are shared. A Python reward is the user's own code, run in the
training worker: it starts only once the user ticked "I trust <file> and want it run".

A view over `gui.controllers.training.TrainingController`, which starts and cancels
the runs (in a worker process) and announces what a finished run added; the page
shows the run's events (`controller.client`'s signals): the loss in a QtCharts plot,
or for the loop the reward and the trainer–sampler agreement per round
(`gui.widgets.rounds_chart`), and after the run the served check (parity and drift,
`gui.widgets.served_check`), in a column of its own beside the form, so the plot stays
in view at 1024×700. The data field starts on the shipped demo data (a first run needs
only a name; "Use the demo data" brings it back). It reloads its base and adapter choices when the
catalog's models or adapters change (`CatalogEvents`). The form is not kept across a
restart. Nothing here imports torch or a native runtime.

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
    QSplitter,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from engine import training
from engine.curated import demo
from engine.errors import StudioError
from engine.formats import architecture
from engine.training import memory
from engine.training.config import TrainConfig
from engine.training.job import TrainRequest
from engine.training.rl import TRAIN_KEYS, PreparedRL, RLRequest, RLSettings
from gui.catalog_events import touches
from gui.controllers.training import TrainingController
from gui.widgets.loss_chart import LossChart
from gui.widgets.rounds_chart import RoundsChart, round_line
from gui.widgets.served_check import ServedCheckPanel
from gui.widgets.suggested_line import SuggestedLineEdit

SUPERVISED, REINFORCE = "supervised", "reinforce"
# The reward kinds the loop knows (engine.training.rewards.REWARD_KINDS), as offered.
REWARDS = (("Exact match (each line's answer)", "exact"),
           ("JSON schema file", "json-schema"),
           ("Python file (your own code)", "python"))
JSONL_FILTER = "JSON lines (*.jsonl *.json);;All files (*)"
DEMO_DATA = "train.jsonl"  # in the shipped demo's folder (resources/demo)
PLOT_MIN_HEIGHT = 180  # px: the loss plot's axes and a few ticks stay readable


class TrainPage(QWidget):
    """Train a LoRA adapter through the GGUF file that is served."""

    def __init__(self, controller: TrainingController, parent: QWidget | None = None
                 ) -> None:
        super().__init__(parent)
        self.controller = controller
        self.catalog = controller.catalog
        self.client = controller.client
        defaults = TrainConfig()
        rl_defaults = RLSettings()
        self.last_result: dict[str, Any] | None = None
        self.run_method = SUPERVISED  # of the run in progress or the last one
        self._checks_seen = False  # the running job sent its served check

        self.method = QComboBox()
        self.method.addItem("Supervised (learn from examples)", SUPERVISED)
        self.method.addItem("Reinforcement (sample, score, train)", REINFORCE)
        self.method.setToolTip(
            "Reinforcement: each round samples completions of every prompt with llama.cpp, "
            "scores them with the reward and trains towards the better ones (GRPO)")

        self.hint = QLabel()
        self.hint.setWordWrap(True)
        self.base = QComboBox()
        self.data = QLineEdit()
        self.data.setPlaceholderText("a JSONL file: text, prompt/completion, messages or "
                                     "token ids")
        self.browse = QPushButton("Browse…")
        self.browse.clicked.connect(self._browse)
        # The page starts on the shipped demo data, so a first run needs only a name (an
        # empty field left a new user looking for a file to try); the note under the
        # field says whose data it is, or offers it back ("Use the demo data") once the
        # field names another file.
        self.demo_data = demo.resources_dir() / DEMO_DATA
        # One line (wrapped in a form row it was drawn in the middle of a row twice its
        # height).
        self.data_note = QLabel()
        self.data_note.setTextFormat(Qt.TextFormat.RichText)
        self.data_note.linkActivated.connect(lambda _link: self.use_demo_data())
        data_row = QHBoxLayout()
        data_row.addWidget(self.data, 1)
        data_row.addWidget(self.browse)
        self.prompts = QLineEdit()
        self.prompts.setPlaceholderText("a JSONL file: one prompt or messages per line "
                                        "(and its answer, for exact match)")
        self.prompts_browse = QPushButton("Browse…")
        self.prompts_browse.clicked.connect(
            lambda: self._browse_into(self.prompts, "Prompts", JSONL_FILTER))
        prompts_row = QHBoxLayout()
        prompts_row.addWidget(self.prompts, 1)
        prompts_row.addWidget(self.prompts_browse)
        self.reward_kind = QComboBox()
        for label, kind in REWARDS:
            self.reward_kind.addItem(label, kind)
        self.reward_file = QLineEdit()
        self.reward_browse = QPushButton("Browse…")
        self.reward_browse.clicked.connect(self._browse_reward)
        reward_row = QHBoxLayout()
        reward_row.addWidget(self.reward_kind)
        reward_row.addWidget(self.reward_file, 1)
        reward_row.addWidget(self.reward_browse)
        # Bound to the file named: editing the name (or the kind) asks again.
        self.trust = QCheckBox()
        self.reward_kind.currentIndexChanged.connect(self._reward_changed)
        self.reward_file.textChanged.connect(self._reward_changed)
        self.rounds = _spin(1, 10_000, rl_defaults.rounds)
        self.samples = _spin(2, 256, rl_defaults.samples)
        self.samples.setToolTip("completions per prompt and round: GRPO's group")
        self.name = QLineEdit()
        self.name.setPlaceholderText("name of the new adapter")
        self.variant = SuggestedLineEdit()
        self.variant.setPlaceholderText("name of the new variant (empty: adapter only)")
        self.name.textEdited.connect(self._suggest_variant)
        self.steps = _spin(1, 100_000, defaults.steps)
        self.lr = QDoubleSpinBox()
        self.lr.setDecimals(5)
        self.lr.setRange(0.00001, 1.0)
        self.lr.setSingleStep(0.0001)
        self.lr.setValue(defaults.lr)
        self.rank = _spin(1, 256, defaults.rank)
        self.train_eot = QCheckBox("answers learn to stop")
        self.train_eot.setToolTip("train the end-of-turn token, so the adapter's answers "
                                  "end where the examples' do")
        self.train_eot.setChecked(True)
        main = QFormLayout()
        self.main_form = main
        main.addRow("Method", self.method)
        main.addRow("Base model", self.base)
        main.addRow("Training data", data_row)
        main.addRow("", self.data_note)
        main.addRow("Prompts", prompts_row)
        main.addRow("Reward", reward_row)
        main.addRow("", self.trust)
        main.addRow("Adapter name", self.name)
        main.addRow("Variant name", self.variant)
        main.addRow("Steps", self.steps)
        main.addRow("Rounds", self.rounds)
        main.addRow("Samples per prompt", self.samples)
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
        # Empty: the base family's default targets (job.prepare picks them).
        self.targets = QLineEdit()
        self.targets.setPlaceholderText("the family's default: "
                                        + architecture.default_targets_text())
        self.seq_len = _spin(8, 32768, defaults.seq_len)
        self.batch = _spin(1, 4096, defaults.batch)
        self.seed = _spin(0, 2**31 - 1, defaults.seed)
        self.threads = _spin(1, 1024, defaults.threads)
        self.save_every = _spin(0, 1_000_000, defaults.save_every)
        self.dpo = QCheckBox("preference training (DPO: chosen/rejected pairs)")
        self.dpo_beta = QDoubleSpinBox()
        self.dpo_beta.setRange(0.001, 100)
        self.dpo_beta.setValue(defaults.dpo_beta)
        self.kl = _double(0.0, 1000.0, defaults.kl, decimals=2, step=0.1)
        self.kl.setToolTip("weight of a KL penalty toward the base on the prompts' text: "
                           "keeps the adapter from changing what the model does elsewhere "
                           "(0 is off; each step also scores the batch with the base)")
        self.kl_text = QLineEdit()
        self.kl_text.setPlaceholderText("the prompts' text, or a file of unrelated prose "
                                        "(one passage per line)")
        self.kl_text.setToolTip("with a KL weight: hold the adapter to the base on this "
                                "text instead of the prompts (text it should leave alone)")
        self.kl_text_browse = QPushButton("Browse…")
        self.kl_text_browse.clicked.connect(
            lambda: self._browse_into(self.kl_text, "Text to leave alone",
                                      "Text (*.txt);;All files (*)"))
        kl_text_row = QHBoxLayout()
        kl_text_row.addWidget(self.kl_text, 1)
        kl_text_row.addWidget(self.kl_text_browse)
        self.init_adapter = QComboBox()
        # served: llama.cpp's own roundings in the forward pass; float: the old arithmetic.
        self.numerics = QComboBox()
        self.numerics.addItems(["served", "float"])
        self.numerics.setCurrentText(defaults.numerics)
        self.steps_per_round = _spin(1, 1000, rl_defaults.steps_per_round)
        self.max_tokens = _spin(1, 4096, rl_defaults.max_tokens)
        self.max_tokens.setToolTip("sampled tokens per completion at most (the end token "
                                   "counts); prompt + this must fit the sequence length")
        self.clip = _double(0.001, 10.0, rl_defaults.clip, decimals=3, step=0.05)
        self.kl_beta = _double(0.0, 100.0, rl_defaults.kl_beta, decimals=3, step=0.01)
        adv = QFormLayout(self.advanced)
        # A field too wide for its column goes under its label instead of widening the
        # form (which squeezed the plot beside it).
        adv.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
        self.advanced_form = adv
        adv.addRow("Alpha", self.alpha)
        adv.addRow("Targets", self.targets)
        adv.addRow("Sequence length", self.seq_len)
        adv.addRow("Batch", self.batch)
        adv.addRow("Seed", self.seed)
        adv.addRow("CPU threads", self.threads)
        adv.addRow("Checkpoint every", self.save_every)
        adv.addRow("", self.dpo)
        adv.addRow("DPO beta", self.dpo_beta)
        adv.addRow("Stay near the base (KL)", self.kl)
        adv.addRow("KL measured on", kl_text_row)
        adv.addRow("Steps per round", self.steps_per_round)
        adv.addRow("Max tokens per sample", self.max_tokens)
        adv.addRow("Ratio clip", self.clip)
        adv.addRow("KL weight (to the base)", self.kl_beta)
        adv.addRow("Continue adapter", self.init_adapter)
        adv.addRow("Numerics", self.numerics)
        self.advanced.hide()
        # (form, field) rows of one method only; the others are shared.
        self._supervised_rows = [(main, data_row), (main, self.data_note),
                                 (main, self.variant), (main, self.steps),
                                 (main, self.train_eot), (adv, self.batch),
                                 (adv, self.save_every), (adv, self.dpo), (adv, self.dpo_beta),
                                 (adv, self.kl), (adv, kl_text_row)]
        self._rl_rows = [(main, prompts_row), (main, reward_row), (main, self.rounds),
                         (main, self.samples), (adv, self.steps_per_round),
                         (adv, self.max_tokens), (adv, self.clip), (adv, self.kl_beta)]

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
        # The run's estimated peak memory (before the base loads), then the measured
        # seconds per step: stays while the status line changes with every step.
        self.memory = QLabel()
        self.memory.setWordWrap(True)
        self.memory.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.memory.hide()
        self.warnings = QLabel()
        self.warnings.setWordWrap(True)
        self.warnings.setStyleSheet("color:#b36b00")
        self.warnings.hide()
        self.round_summary = QLabel()  # the newest round in words
        self.round_summary.setTextInteractionFlags(
            Qt.TextInteractionFlag.TextSelectableByMouse)
        self.round_summary.hide()
        self.served = ServedCheckPanel()
        self.plot = LossChart()
        self.rounds_plot = RoundsChart()

        # The form on the left, the run on the right (its buttons, progress, served
        # check and plot): one column put the plot below the form, so at 1024×700 its
        # axis was below the fold, further still once the served check showed. Each
        # side scrolls on its own: opening the advanced settings (or a long warning)
        # scrolls instead of growing the window past a laptop screen, and never moves
        # the plot.
        content = QWidget()
        layout = QVBoxLayout(content)
        layout.addWidget(self.hint)
        layout.addLayout(main)
        layout.addWidget(self.advanced_toggle)
        layout.addWidget(self.advanced)
        layout.addStretch(1)
        # The form scrolls down, never sideways: the splitter keeps it at least as wide
        # as its fields need.
        self.scroll = _column_scroll(content)
        self.form_content = content
        # Choices are shown whole in their drop-down list; closed, they may elide (their
        # longest item made the form 530 px wide, the plot beside it a strip).
        for combo in (self.method, self.base, self.reward_kind, self.init_adapter,
                      self.numerics):
            combo.setSizeAdjustPolicy(
                QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            combo.setMinimumContentsLength(16)
        # The run's column: buttons, progress and status on top, the plot taking the
        # height, and below it (a splitter) what a run reports at length, the warnings
        # and the served check (a flag explains itself in a paragraph), in a scroll area
        # of their own, so they never push the plot out of view.
        self.plot.setMinimumHeight(PLOT_MIN_HEIGHT)
        self.rounds_plot.setMinimumHeight(PLOT_MIN_HEIGHT)
        plots = QWidget()
        plots_layout = QVBoxLayout(plots)
        plots_layout.setContentsMargins(0, 0, 0, 0)
        plots_layout.addWidget(self.plot)
        plots_layout.addWidget(self.rounds_plot)
        reports = QWidget()
        reports_layout = QVBoxLayout(reports)
        reports_layout.setContentsMargins(0, 0, 0, 0)
        reports_layout.addWidget(self.round_summary)
        reports_layout.addWidget(self.warnings)
        reports_layout.addWidget(self.served)
        reports_layout.addStretch(1)
        self.reports = _column_scroll(reports)
        self.reports.setMinimumHeight(60)
        self.run_split = QSplitter(Qt.Orientation.Vertical)
        self.run_split.addWidget(plots)
        self.run_split.addWidget(self.reports)
        self.run_split.setChildrenCollapsible(False)
        self.run_split.setStretchFactor(0, 3)
        self.run_split.setStretchFactor(1, 2)
        run = QWidget()
        run_layout = QVBoxLayout(run)
        run_layout.addLayout(buttons)
        run_layout.addWidget(self.progress)
        run_layout.addWidget(self.status)
        run_layout.addWidget(self.memory)
        run_layout.addWidget(self.run_split, 1)
        self.run_column = run
        self.splitter = QSplitter()
        self.splitter.addWidget(self.scroll)
        self.splitter.addWidget(run)
        self.splitter.setChildrenCollapsible(False)
        self.splitter.setStretchFactor(0, 1)
        self.splitter.setStretchFactor(1, 1)
        # Scaled to the page's width when shown: the form's fields and the plot about
        # equal (by their size hints alone the form took three quarters).
        self.splitter.setSizes([450, 550])
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(self.splitter)
        self.data.textChanged.connect(self._data_changed)
        if self.demo_data.is_file():
            self.data.setText(str(self.demo_data))
        # A refusal ("give the new adapter a name") is stale once the user acts on it.
        for field in (self.name, self.data, self.prompts, self.reward_file):
            field.textChanged.connect(self._clear_refusal)
        self.trust.toggled.connect(self._clear_refusal)
        self.method.currentIndexChanged.connect(self._apply_method)
        self._reward_changed()
        self._apply_method()

        c = self.client
        c.stage.connect(lambda stage: self._status(f"{stage[:1].upper()}{stage[1:]}…"))
        c.dataLoaded.connect(self._data_loaded)
        c.warning.connect(self._warning)
        c.loading.connect(lambda f: self._status(f"Loading the base weights… {f:.0%}"))
        c.memory.connect(self._memory)
        c.progress.connect(self._progress)
        c.round.connect(self._round)
        c.checks.connect(self._checks)
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
        kl_text = None
        if not settings["dpo"]:
            settings["kl"] = self.kl.value()  # DPO has its own reference (its beta)
            kl_text = self.kl_text.text().strip() or None
        init = self.init_adapter.currentText() or None
        if init:  # the starting adapter decides rank, alpha and targets
            for key in ("rank", "alpha", "targets"):
                settings.pop(key)
        return TrainRequest(name=self.name.text().strip(), base=self.base.currentText(),
                            data=self.data.text().strip(), settings=settings,
                            init_adapter=init, variant=self.variant.text().strip() or None,
                            kl_text=kl_text)

    def is_rl(self) -> bool:
        return self.method.currentData() == REINFORCE

    def reward_spec(self) -> str:
        """The reward as `--reward` spells it: exact, json-schema:FILE or python:FILE."""
        kind = str(self.reward_kind.currentData())
        return kind if kind == "exact" else f"{kind}:{self.reward_file.text().strip()}"

    def rl_request(self) -> RLRequest:
        """The reinforcement request the form describes (not yet checked): the shared
        LoRA settings the loop takes (`TRAIN_KEYS`) and the loop's own."""
        settings: dict[str, Any] = {
            "lr": self.lr.value(), "rank": self.rank.value(), "alpha": self.alpha.value(),
            "targets": self.targets.text(), "seq_len": self.seq_len.value(),
            "seed": self.seed.value(), "threads": self.threads.value(),
            "numerics": self.numerics.currentText(),
        }
        assert set(settings) <= TRAIN_KEYS
        init = self.init_adapter.currentText() or None
        if init:  # the starting adapter decides rank, alpha and targets
            for key in ("rank", "alpha", "targets"):
                settings.pop(key)
        rl = {"rounds": self.rounds.value(), "samples": self.samples.value(),
              "steps_per_round": self.steps_per_round.value(),
              "max_tokens": self.max_tokens.value(), "clip": self.clip.value(),
              "kl_beta": self.kl_beta.value()}
        return RLRequest(name=self.name.text().strip(), base=self.base.currentText(),
                         prompts=self.prompts.text().strip(), reward=self.reward_spec(),
                         settings=settings, rl=rl, init_adapter=init)

    @Slot()
    def start(self) -> None:
        if self.busy():
            return
        if not training.torch_available():
            self._status(training.ENABLE_HINT, error=True)
            return
        rl_run = self.is_rl()
        try:
            if not self.name.text().strip():
                raise StudioError("give the new adapter a name")
            if rl_run:
                if not self.prompts.text().strip():
                    raise StudioError("choose a prompts file")
                if self.reward_kind.currentData() != "exact" and \
                        not self.reward_file.text().strip():
                    raise StudioError(f"choose the reward's {self.reward_kind.currentText()}")
                prepared: Any = self.controller.start_rl(
                    self.rl_request(), trust_python=self.trust.isChecked())
            else:
                if not self.data.text().strip():
                    raise StudioError("choose a training data file")
                prepared = self.controller.start(self.request())
        except StudioError as exc:
            # A refused start is not the last run: its finished bar would read as this
            # attempt's progress.
            self.progress.setValue(0)
            self._status(exc.message, error=True)
            return
        self.last_result = None
        self.run_method = REINFORCE if rl_run else SUPERVISED
        self._checks_seen = False
        self.served.clear()
        self.round_summary.clear()
        self.round_summary.hide()
        if isinstance(prepared, PreparedRL):
            total = prepared.rl.rounds  # the bar counts rounds, the plot has one per round
            self.rounds_plot.reset(total)
        else:
            total = prepared.config.steps
            self.plot.reset(total)
        self.progress.setRange(0, total)
        self.progress.setValue(0)
        self.warnings.clear()
        self.warnings.hide()
        self.memory.clear()
        self.memory.hide()
        self._set_running(True)
        self._show_plot()
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
        for widget in (self.method, self.base, self.data, self.browse, self.data_note,
                       self.name,
                       self.variant, self.steps, self.lr, self.rank, self.train_eot,
                       self.advanced, self.prompts, self.prompts_browse, self.reward_kind,
                       self.reward_file, self.reward_browse, self.trust, self.rounds,
                       self.samples):
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
        self._fit_reports()

    @Slot(dict)
    def _memory(self, event: dict) -> None:
        self.memory.setText(f"Memory: {memory.summary(event)}.")
        self.memory.show()

    @Slot(dict)
    def _progress(self, event: dict) -> None:
        step, steps = int(event["step"]), int(event["steps"])
        self.progress.setRange(0, steps)
        self.progress.setValue(step)
        self.plot.steps = steps
        self.plot.add(step, float(event["loss"]))
        extra = (f" · reward accuracy {event['reward_accuracy']:.2f}"
                 if "reward_accuracy" in event else "")
        per_step = float(event.get("step_seconds", 0.0))
        self._status(f"Step {step}/{steps} · loss {float(event['loss']):.4f}{extra} · "
                     f"{per_step:.1f} s/step · {_duration(event.get('seconds', 0))} elapsed, "
                     f"about {_duration(event.get('eta', 0))} left")

    @Slot(dict)
    def _round(self, event: dict) -> None:
        point = self.rounds_plot.add(event)
        if point is None:
            return
        self.progress.setRange(0, max(point.rounds, point.round))
        self.progress.setValue(point.round)
        self.round_summary.setText(f"{round_line(point)} · {_duration(event.get('seconds', 0))}")
        self.round_summary.show()

    @Slot(dict)
    def _checks(self, checks: dict) -> None:
        self._checks_seen = True
        self.served.show_checks(checks)
        self._fit_reports()

    def _fit_reports(self) -> None:
        """The served check and warnings get the height they need under the plot, as
        far as the plot keeps its minimum (they scroll beyond it): by the splitter's
        first sizes they had two lines at 1600×1000 beside a plot of 600 px."""
        total = sum(self.run_split.sizes())
        if total <= 0:
            return
        self.reports.widget().adjustSize()
        want = self.reports.widget().sizeHint().height() + 2 * self.reports.frameWidth()
        bottom = max(self.reports.minimumHeight(), min(want, total - PLOT_MIN_HEIGHT))
        self.run_split.setSizes([total - bottom, bottom])

    @Slot(dict)
    def _finished(self, result: dict) -> None:
        self.last_result = result
        self._set_running(False)
        record = result.get("provenance", {})
        gguf = result.get("files", {}).get("gguf", {})
        rounds = (record.get("rl") or {}).get("rounds") or []
        if rounds:
            summary = (f"mean reward {rounds[0]['reward']['mean']:.3f} → "
                       f"{rounds[-1]['reward']['mean']:.3f} over {len(rounds)} round"
                       f"{'s' if len(rounds) != 1 else ''}")
        else:
            summary = (f"loss {record.get('loss', {}).get('first', 0):.4f} → "
                       f"{record.get('loss', {}).get('last', 0):.4f}")
        self._status(f"Done: adapter {result.get('adapter')} (sha256 "
                     f"{str(gguf.get('sha256', ''))[:16]}…), {summary}"
                     + (f", variant {result['variant']}." if result.get("variant") else "."))
        # The result's copy is the final word; a run that reported none says so.
        if isinstance(result.get("checks"), dict):
            self.served.show_checks(result["checks"])
        elif not self._checks_seen:
            self.served.show_checks({})
        self._fit_reports()

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
        self._fit_form()
        self.advanced_toggle.setArrowType(Qt.ArrowType.DownArrow if shown
                                          else Qt.ArrowType.RightArrow)

    def _apply_method(self) -> None:
        """Show the fields of the chosen method only (the shared ones stay)."""
        rl_on = self.is_rl()
        for form, field in self._supervised_rows:
            form.setRowVisible(field, not rl_on)
        for form, field in self._rl_rows:
            form.setRowVisible(field, rl_on)
        self._reward_fields()
        self._data_changed()
        self._fit_form()
        self.start_button.setText("Start the loop" if rl_on else "Start training")
        if not self.busy():
            self.run_method = REINFORCE if rl_on else SUPERVISED
            self._show_plot()

    def _show_plot(self) -> None:
        rl_plot = self.run_method == REINFORCE
        self.plot.setVisible(not rl_plot)
        self.rounds_plot.setVisible(rl_plot)

    def _fit_form(self) -> None:
        """The splitter keeps the form as wide as the fields shown need (it has no
        horizontal scroll bar)."""
        self.scroll.setMinimumWidth(self.form_content.minimumSizeHint().width()
                                    + self.scroll.verticalScrollBar().sizeHint().width())

    def use_demo_data(self) -> None:
        self.data.setText(str(self.demo_data))

    def _data_changed(self) -> None:
        """The note under the data field: whose data the demo is, or the way back to it
        (after the method's rows were shown, as for the reward's file)."""
        shipped = self.demo_data.is_file()
        if self.data.text().strip() == str(self.demo_data):
            self.data_note.setText(f"The demo data {demo.ADAPTER_NAME} was trained on")
            self.data_note.setToolTip("Shipped with Variant Studio: conversations "
                                      "answered with a JSON tool call")
        else:
            self.data_note.setText('<a href="demo">Use the demo data</a>')
        self.main_form.setRowVisible(self.data_note, shipped and not self.is_rl())

    def _reward_changed(self) -> None:
        # A new file (or kind) needs a new confirmation: the tick is for the file named.
        self.trust.setChecked(False)
        name = Path(self.reward_file.text().strip()).name or "this Python file"
        self.trust.setText(f"I trust {name} and want it run (your code, run in the "
                           "training worker)")
        self._reward_fields()

    def _reward_fields(self) -> None:
        """The reward's file only for a kind that has one, the trust box only for code
        (after the method's rows were shown: showing a row shows all of its widgets)."""
        kind = self.reward_kind.currentData()
        with_file = self.is_rl() and kind != "exact"
        self.reward_file.setVisible(with_file)
        self.reward_browse.setVisible(with_file)
        self.reward_file.setPlaceholderText(
            "the JSON schema a completion's first JSON object must match"
            if kind == "json-schema" else "a .py file with reward(prompt, completion) -> float")
        self.main_form.setRowVisible(self.trust, self.is_rl() and kind == "python")

    def _browse_reward(self) -> None:
        python = self.reward_kind.currentData() == "python"
        self._browse_into(self.reward_file, "Reward", "Python (*.py);;All files (*)" if python
                          else "JSON schema (*.json);;All files (*)")

    def _browse_into(self, field: QLineEdit, title: str, filters: str) -> None:
        text = field.text().strip()
        start = str(Path(text).parent) if text else os.getcwd()
        path, _ = QFileDialog.getOpenFileName(self, title, start, filters)
        if path:
            field.setText(path)

    def _suggest_variant(self, text: str) -> None:
        self.variant.suggest(f"{text}-variant" if text else "")

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


def _double(low: float, high: float, value: float, decimals: int, step: float
            ) -> QDoubleSpinBox:
    spin = QDoubleSpinBox()
    spin.setDecimals(decimals)
    spin.setRange(low, high)
    spin.setSingleStep(step)
    spin.setValue(value)
    return spin


def _column_scroll(content: QWidget) -> QScrollArea:
    """A frameless area that scrolls `content` down, never sideways."""
    area = QScrollArea()
    area.setWidgetResizable(True)
    area.setFrameShape(QScrollArea.Shape.NoFrame)
    area.setWidget(content)
    area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    return area


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}:{seconds % 60:02d}" if seconds >= 60 else f"{seconds} s"
