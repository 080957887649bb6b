"""The variant composer: a base, an ordered list of adapters with scales, a profile.

Scales are edited with a slider and a spin box kept in step and range-checked; the
identity key preview updates live, so the user sees that order and scale make a
different model before saving. When an adapter listed was trained with a system prompt
(its training run's provenance records it), the composer offers that prompt: the
variant answers as the adapter was trained to when it has it. Saving announces the
variant (`CatalogEvents`).
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSlider,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from engine.catalog import resolve, validation
from engine.catalog.profiles import DEFAULT_PROFILE
from engine.catalog.store import AdapterSpec, Catalog
from engine.curated import demo
from engine.errors import StudioError
from engine.formats.tool_calls import FORMAT_LABELS, FORMATS
from gui.catalog_events import CatalogEvents

SLIDER_STEPS = 100  # slider units per 1.0 of scale


class AdapterRow(QWidget):
    changed = Signal()
    moveRequested = Signal(object, int)
    removeRequested = Signal(object)

    def __init__(self, adapters: list[str], name: str, scale: float) -> None:
        super().__init__()
        self.combo = QComboBox()
        self.combo.addItems(adapters)
        self.combo.setCurrentText(name)
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setRange(0, int(validation.MAX_SCALE * SLIDER_STEPS / 4))
        self.spin = QDoubleSpinBox()
        self.spin.setRange(0.0, validation.MAX_SCALE)
        self.spin.setDecimals(2)
        self.spin.setSingleStep(0.05)
        self.spin.setValue(scale)
        self.slider.setValue(round(scale * SLIDER_STEPS))
        self.slider.valueChanged.connect(lambda v: self.spin.setValue(v / SLIDER_STEPS))
        self.spin.valueChanged.connect(self._spin_changed)
        self.combo.currentTextChanged.connect(lambda _t: self.changed.emit())
        up, down, remove = QPushButton("↑"), QPushButton("↓"), QPushButton("✕")
        for button, tip in ((up, "Move up"), (down, "Move down"), (remove, "Remove")):
            button.setToolTip(tip)
            button.setFixedWidth(30)
        up.clicked.connect(lambda: self.moveRequested.emit(self, -1))
        down.clicked.connect(lambda: self.moveRequested.emit(self, 1))
        remove.clicked.connect(lambda: self.removeRequested.emit(self))
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.combo, 2)
        layout.addWidget(self.slider, 2)
        layout.addWidget(self.spin)
        for button in (up, down, remove):
            layout.addWidget(button)

    def _spin_changed(self, value: float) -> None:
        self.slider.blockSignals(True)
        self.slider.setValue(round(value * SLIDER_STEPS))
        self.slider.blockSignals(False)
        self.changed.emit()

    def spec(self) -> AdapterSpec:
        return AdapterSpec(self.combo.currentText(), self.spin.value())


class ComposerDialog(QDialog):
    """Create or edit a variant. `saved_name` holds the result after accept()."""

    def __init__(self, catalog: Catalog, events: CatalogEvents, editing: str | None = None,
                 duplicate_of: str | None = None, adapter: str | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.catalog = catalog
        self.events = events
        self.editing = editing
        self.saved_name: str | None = None
        self.setWindowTitle("Edit variant" if editing else "Compose a variant")
        self.resize(720, 620)
        data = catalog.data()
        source = data["variants"].get(editing or duplicate_of or "", None)
        profile = dict(DEFAULT_PROFILE, **(source or {}).get("profile", {}))

        self.name = QLineEdit(editing or (f"{duplicate_of}-copy" if duplicate_of else ""))
        self.name.setReadOnly(editing is not None)
        self.base = QComboBox()
        self.base.addItems(sorted(data["models"]))
        if source:
            self.base.setCurrentText(source["base"])
        elif adapter:
            self.base.setCurrentText(data["adapters"][adapter]["base"])
        self.base.currentTextChanged.connect(self._base_changed)
        self.rows_box = QVBoxLayout()
        add = QPushButton("Add adapter")
        add.setToolTip("Add the next adapter of this base not yet in the list")
        add.clicked.connect(lambda: self._add_row(None, 1.0))
        self.add_button = add
        adapters_group = QGroupBox("Adapters, applied in this order")
        group_layout = QVBoxLayout(adapters_group)
        group_layout.addLayout(self.rows_box)
        group_layout.addWidget(add, 0, Qt.AlignmentFlag.AlignLeft)

        self.system = QPlainTextEdit(profile["system_prompt"])
        self.system.setMaximumHeight(80)
        # The system prompt an adapter listed was trained with, offered (`_update_offer`).
        self.offer = QLabel()
        self.offer.setWordWrap(True)
        self.offer.setTextFormat(Qt.TextFormat.PlainText)
        self.use_offer = QPushButton("Use this prompt")
        self.use_offer.clicked.connect(self._use_offer)
        self.offer_row = QWidget()
        offer_layout = QHBoxLayout(self.offer_row)
        offer_layout.setContentsMargins(0, 0, 0, 0)
        offer_layout.addWidget(self.offer, 1)
        offer_layout.addWidget(self.use_offer, 0, Qt.AlignmentFlag.AlignTop)
        self.offer_row.hide()
        self.offered: str | None = None  # the prompt offered now
        self.system.textChanged.connect(self._update_offer)
        self.n_ctx = QSpinBox()
        self.n_ctx.setRange(256, 131072)
        self.n_ctx.setSingleStep(256)
        self.n_ctx.setValue(profile["n_ctx"])
        self.temperature = _double(0.0, 5.0, profile["temperature"])
        self.top_p = _double(0.0, 1.0, profile["top_p"])
        self.top_k = _int(0, 100000, profile["top_k"])
        self.repeat = _double(0.5, 5.0, profile["repeat_penalty"])
        self.max_tokens = _int(1, 32768, profile["max_tokens"])
        self.seed = _int(0, 2**31 - 1, profile["seed"])
        # The tool-call format its adapters were trained to write (docs/serving.md).
        self.tool_format = QComboBox()
        self.tool_format.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.tool_format.addItem("As the base's chat template says", None)
        for fmt in FORMATS:
            self.tool_format.addItem(FORMAT_LABELS[fmt], fmt)
        self.tool_format.setCurrentIndex(max(0, self.tool_format.findData(
            profile.get("tool_format"))))
        self.tool_format.setToolTip("How this variant writes tool calls, for requests with "
                                    "tools: as its base's chat template says, or the format "
                                    "its adapter was trained on")
        profile_group = QGroupBox("Profile")
        form = QFormLayout(profile_group)
        form.addRow("System prompt", self.system)
        form.addRow("", self.offer_row)
        form.addRow("Context size", self.n_ctx)
        for label, widget in (("Temperature", self.temperature), ("Top-p", self.top_p),
                              ("Top-k", self.top_k), ("Repeat penalty", self.repeat),
                              ("Max tokens", self.max_tokens), ("Seed", self.seed),
                              ("Tool calls", self.tool_format)):
            form.addRow(label, widget)
        self.n_ctx.valueChanged.connect(self._preview)

        self.identity = QLabel()
        self.identity.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.error = QLabel()
        self.error.setStyleSheet("color:#d23c3c")
        self.error.setWordWrap(True)
        # Messages quote names: plain text, never escaped entities such as &#x27;.
        self.error.setTextFormat(Qt.TextFormat.PlainText)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save |
                                   QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.save)
        buttons.rejected.connect(self.reject)
        self.save_button = buttons.button(QDialogButtonBox.StandardButton.Save)

        top = QFormLayout()
        top.addRow("Name", self.name)
        top.addRow("Base model", self.base)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(adapters_group)
        layout.addWidget(profile_group)
        layout.addWidget(self.identity)
        layout.addWidget(self.error)
        layout.addWidget(buttons)
        self.name.textChanged.connect(self._preview)

        self.rows: list[AdapterRow] = []
        if source:
            for a in source["adapters"]:
                self._add_row(a["name"], a["scale"])
        elif adapter:
            self._add_row(adapter, data["adapters"][adapter].get("default_scale", 1.0))
        else:
            self._add_row(None, 1.0)
        self._preview()

    def _adapters_for_base(self) -> list[str]:
        base = self.base.currentText()
        return sorted(n for n, r in self.catalog.data()["adapters"].items()
                      if r.get("base") == base)

    def _add_row(self, name: str | None, scale: float) -> None:
        options = self._adapters_for_base()
        if not options:
            self.error.setText("No adapter is installed for this base yet: import one first.")
            return
        used = {row.combo.currentText() for row in self.rows}
        unused = [o for o in options if o not in used]
        if name is None and not unused:
            return  # every adapter of this base is listed (the button says so)
        row = AdapterRow(options, name or unused[0], scale)
        row.changed.connect(self._preview)
        row.moveRequested.connect(self._move)
        row.removeRequested.connect(self._remove)
        self.rows.append(row)
        self.rows_box.addWidget(row)
        self._preview()

    def _move(self, row: AdapterRow, delta: int) -> None:
        i = self.rows.index(row)
        j = max(0, min(len(self.rows) - 1, i + delta))
        if i == j:
            return
        self.rows[i], self.rows[j] = self.rows[j], self.rows[i]
        for r in self.rows:
            self.rows_box.removeWidget(r)
        for r in self.rows:
            self.rows_box.addWidget(r)
        self._preview()

    def _remove(self, row: AdapterRow) -> None:
        self.rows.remove(row)
        row.setParent(None)
        row.deleteLater()
        self._preview()

    def _update_add(self) -> None:
        left = set(self._adapters_for_base()) - {row.combo.currentText() for row in self.rows}
        self.add_button.setEnabled(bool(left))
        self.add_button.setToolTip("Add the next adapter of this base not yet in the list"
                                   if left else "Every adapter of this base is in the list")

    def _base_changed(self, _base: str) -> None:
        for row in list(self.rows):
            self._remove(row)
        self._add_row(None, 1.0)

    def specs(self) -> list[AdapterSpec]:
        return [row.spec() for row in self.rows]

    def profile(self) -> dict[str, Any]:
        return {"system_prompt": self.system.toPlainText(), "n_ctx": self.n_ctx.value(),
                "temperature": self.temperature.value(), "top_p": self.top_p.value(),
                "top_k": self.top_k.value(), "repeat_penalty": self.repeat.value(),
                "max_tokens": self.max_tokens.value(), "seed": self.seed.value(),
                **({"tool_format": self.tool_format.currentData()}
                   if self.tool_format.currentData() else {})}

    def _preview(self) -> None:
        try:
            ident = resolve.identity_of_parts(self.catalog, self.base.currentText(),
                                              self.specs(), self.n_ctx.value())
            self.identity.setText(f"Identity key: <code>{ident.key}</code>")
            problem = self._problem()
        except StudioError as exc:
            self.identity.setText("Identity key: —")
            problem = exc.message
        self.error.setText(problem or "")
        self.save_button.setEnabled(problem is None)
        if hasattr(self, "add_button"):
            self._update_add()
        self._update_offer()

    def trained_prompt(self) -> tuple[str, str] | None:
        """(adapter, prompt): the first adapter listed that was trained with a system
        prompt, and that prompt."""
        try:
            adapters = self.catalog.data()["adapters"]
        except StudioError:
            return None
        for spec in self.specs():
            record = adapters.get(spec.name)
            prompt = demo.trained_system_prompt(record) if record else None
            if prompt:
                return spec.name, prompt
        return None

    def _update_offer(self) -> None:
        found = self.trained_prompt()
        self.offered = (found[1] if found and self.system.toPlainText() != found[1]
                        else None)
        if found and self.offered:
            short = " ".join(self.offered.split())
            if len(short) > 160:
                short = short[:159] + "…"
            self.offer.setText(f"{found[0]} was trained with this system prompt: “{short}” "
                               "It answers as trained when the variant has it too.")
            self.offer.setToolTip(self.offered)
        self.offer_row.setVisible(self.offered is not None)

    def _use_offer(self) -> None:
        if self.offered is not None:
            self.system.setPlainText(self.offered)

    def _problem(self) -> str | None:
        if not self.rows:
            return "add at least one adapter"
        names = [s.name for s in self.specs()]
        if len(set(names)) != len(names):
            return "the same adapter is listed twice"
        if not self.editing and self.name.text().strip() in self._taken():
            return f"the name {self.name.text().strip()!r} is already used"
        return None

    def _taken(self) -> set[str]:
        data = self.catalog.data()
        return {n for k in ("models", "adapters", "variants") for n in data[k]}

    def save(self) -> None:
        name = self.name.text().strip()
        try:
            self.catalog.add_variant(name, self.base.currentText(), self.specs(),
                                     self.profile(), replace=self.editing is not None)
        except StudioError as exc:
            self.error.setText(exc.message)
            return
        self.saved_name = name
        self.events.changed(["variant"], [name])
        self.accept()


def _double(low: float, high: float, value: float) -> QDoubleSpinBox:
    box = QDoubleSpinBox()
    box.setRange(low, high)
    box.setDecimals(2)
    box.setSingleStep(0.05)
    box.setValue(value)
    return box


def _int(low: int, high: int, value: int) -> QSpinBox:
    box = QSpinBox()
    box.setRange(low, high)
    box.setValue(value)
    return box
