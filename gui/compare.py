"""A/B comparison: the base and a variant streaming side by side.

The view of `gui.controllers.compare.CompareController`, which owns the run (one
`Compare` request: same prompt, same sampling settings and seed on both sides), each
side's tokens, the result, the recent comparisons and the exports: this widget lays out
the settings, both texts and the plot, forwards the user's actions and draws what the
controller reports (`CompareListener`).

When both sides finish, the first token where they differ is marked in both texts, each
side's speed is shown, and the engine's adapter-effect figure (the base's tokens
teacher-forced through the variant: mean |Δ log p| per token) is stated in words (none,
small, moderate, large: how much the adapter changes the model's next-word choices on
this answer), the figures in the summary's tooltip. A plot
(QtCharts, `gui.widgets.logprob_chart`) shows each side's per-token log-probability,
with the values on hover. The comparison exports as Markdown or JSON. Switching the
variant or the backend stops a run and drops it. The variant list follows catalog
changes (`CatalogEvents`: variants), the backend picker follows models and adapters (a
conversion or the OpenVINO build adds a backend).

Both sides are rendered Markdown (`gui.markdown`); while they stream, each finished
block is drawn once (`gui.render.StreamingMarkdown` in a `StreamRegion`). The first
differing token is marked on its own in both texts and the rest of each divergent tail
is shaded lighter: the texts are rendered with private-use marker characters around
those places (`gui.render.marked_markdown`), and the markers are turned into formats
once the HTML is in the document (so a mark can cross paragraphs and code blocks). Each
side says how it ended (a side cut at max tokens says so). Recent comparisons are kept
(newest first, across restarts) so an import, a new variant, a switch or a restart does
not lose one, and a variant chosen again shows its latest comparison.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QKeySequence, QPalette, QShortcut, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from engine.catalog.store import Catalog
from engine.runtime.results import CompareResult, GenerationResult
from gui.backend_picker import BackendPicker
from gui.catalog_events import CatalogEvents, touches
from gui.controllers.compare import (
    CompareController,
    SideState,
    comparison_markdown,
    effect_scale,
    finish_text,
    summary_details,
    summary_text,
)
from gui.engine_client import QtEngineClient, Reply
from gui.markdown import fence_for
from gui.markdown import render as render_markdown
from gui.render import TAIL_START, TOKEN_START, StreamingMarkdown, marked_markdown
from gui.widgets.logprob_chart import LogprobChart
from gui.widgets.stream_region import StreamRegion

# Older callers import these from here.
__all__ = ["CompareView", "comparison_markdown", "effect_scale", "fence_for", "finish_text",
           "summary_details", "summary_text"]

TOKEN_COLOR = QColor(224, 118, 43, 150)  # the first differing token, on its own
TAIL_COLOR = QColor(224, 118, 43, 46)  # the rest of the divergent tail, lighter
PLOT_INTERVAL_MS = 250  # between redraws of the plot while both sides stream
TEXT_INTERVAL_MS = 100  # between draws of a side's new text while it streams


class _Side:
    """One side's title and text on screen, over its `SideState` (the controller's)."""

    def __init__(self, state: SideState, dark: Callable[[], bool]) -> None:
        self.state = state
        self._dark = dark  # whether the view is drawn in a dark theme
        self.title = QLabel(state.title)
        # Wrapped to its column: a finished run's figures make a header longer than the
        # column, which as one line raised the window's minimum width (the window grew
        # by itself and squeezed the library).
        self.title.setWordWrap(True)
        self.browser = QTextBrowser()
        self.browser.setOpenLinks(False)
        self.marks: tuple[str, str] = ("", "")  # (the token marked, the tail shaded)
        self.drawn_dark: bool | None = None  # the theme the text was drawn for
        self._stream: StreamingMarkdown | None = None  # while it streams
        self._region: StreamRegion | None = None
        self._pending = ""  # arrived, not drawn yet

    @property
    def tokens(self) -> list[list[Any]]:
        return self.state.tokens

    @tokens.setter
    def tokens(self, tokens: list[list[Any]]) -> None:
        self.state.tokens = tokens

    @property
    def text(self) -> str:
        return self.state.text

    @text.setter
    def text(self, text: str) -> None:
        self.state.text = text

    @property
    def result(self) -> GenerationResult | None:
        return self.state.result

    def reset(self, title: str) -> None:
        self.state.reset(title)
        self.clear()

    def clear(self) -> None:
        """The state's title, no text."""
        self.title.setText(self.state.title)
        self.marks = ("", "")
        self._stream = self._region = None
        self._pending = ""
        self.browser.setPlainText("")

    def grow(self, text: str) -> None:
        self._pending += text

    def draw_stream(self) -> None:
        """What arrived since the last draw: finished blocks appended, the tail redrawn."""
        if not self._pending:
            return
        if self._stream is None or self._region is None:
            dark = self.drawn_dark = self._dark()
            self._stream = StreamingMarkdown(
                lambda text: render_markdown(text, dark, copy_links=False).html)
            self.browser.setPlainText("")
            self._region = StreamRegion(self.browser.document())
        pending, self._pending = self._pending, ""
        self._region.show(self._stream.feed(pending))

    def render(self, divergence: int | None = None) -> None:
        """Rendered Markdown, whole; from `divergence` on, the token marked, the tail
        shaded."""
        self._stream = self._region = None
        self._pending = ""
        self.drawn_dark = self._dark()
        if divergence is None or divergence >= len(self.tokens):
            self.browser.setHtml(render_markdown(self.text, self.drawn_dark,
                                                 copy_links=False).html)
            self.marks = ("", "")
            return
        source = marked_markdown([t[2] for t in self.tokens], divergence)
        self.browser.setHtml(render_markdown(source, self.drawn_dark, copy_links=False).html)
        document = self.browser.document()
        positions = []
        for marker in (TOKEN_START, TAIL_START):
            found = document.find(marker)
            if found.isNull():
                positions.append(None)
                continue
            positions.append(found.selectionStart())
            found.removeSelectedText()
        first, tail = positions
        if first is None or tail is None:
            return
        cursor = QTextCursor(document)
        last = document.characterCount() - 1
        marked = []
        for low, high, color in ((first, tail, TOKEN_COLOR), (tail, last, TAIL_COLOR)):
            if high <= low:
                marked.append("")
                continue
            cursor.setPosition(low)
            cursor.setPosition(high, QTextCursor.MoveMode.KeepAnchor)
            marked.append(cursor.selectedText())
            style = QTextCharFormat()
            style.setBackground(color)
            cursor.mergeCharFormat(style)
        self.marks = (marked[0], marked[1])


class CompareView(QWidget):
    busyChanged = Signal(bool)

    def __init__(self, client: QtEngineClient, catalog: Catalog, events: CatalogEvents,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.client = client
        self.catalog = catalog
        self.backend = BackendPicker()
        self.controller = CompareController(client, catalog, self,
                                            backend=self.backend.backend)
        # While streaming the plot is redrawn a few times a second, not at every batch
        # of either side (each redraw costs milliseconds the engine needs on a small
        # machine); the finished run draws the final figures.
        self._plot_timer = QTimer(self)
        self._plot_timer.setSingleShot(True)
        self._plot_timer.setInterval(PLOT_INTERVAL_MS)
        self._plot_timer.timeout.connect(self._plot_stream)
        # Likewise each side's new text: its first token at once, then at most ten
        # times a second.
        self._dirty: set[str] = set()
        self._text_timer = QTimer(self)
        self._text_timer.setSingleShot(True)
        self._text_timer.setInterval(TEXT_INTERVAL_MS)
        self._text_timer.timeout.connect(self._render_dirty)

        self.variant = QComboBox()
        self.variant.setToolTip("Switch the variant to compare against its base")
        self.variant.currentTextChanged.connect(self._variant_changed)
        self.backend.activated.connect(lambda _i: self._choice_changed())
        self.prompt = QPlainTextEdit()
        self.prompt.setPlaceholderText("Prompt for both sides…  (Ctrl+Enter to run)")
        self.prompt.setMaximumHeight(90)
        self.chat = QCheckBox("Chat template")
        self.chat.setChecked(True)
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, 4096)
        self.max_tokens.setValue(64)
        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(0.0, 5.0)
        self.temperature.setSingleStep(0.1)
        self.temperature.setValue(0.0)
        self.temperature.setToolTip("0 = greedy (reproducible)")
        self.seed = QSpinBox()
        self.seed.setRange(0, 2**31 - 1)
        self.run_button = QPushButton("Compare")
        self.run_button.setToolTip("Run base and variant side by side (Ctrl+Enter)")
        self.run_button.clicked.connect(self.run)
        self.stop_button = QPushButton("Stop")
        self.stop_button.clicked.connect(self.stop)
        self.export_md = QPushButton("Export Markdown…")
        self.export_md.clicked.connect(lambda: self._export("md"))
        self.export_json = QPushButton("Export JSON…")
        self.export_json.clicked.connect(lambda: self._export("json"))
        QShortcut(QKeySequence("Ctrl+Return"), self.prompt, activated=self.run)
        # Recent comparisons (kept across restarts): an import or a switch does not lose
        # one.
        self.recent = QComboBox()
        self.recent.setToolTip("Recent comparisons: choose one to show it again")
        self.recent.setAccessibleName("Recent comparisons")
        self.recent.setPlaceholderText("Recent comparisons")
        self.recent.activated.connect(self._show_recent)
        self.recent.setEnabled(False)
        # As wide as its placeholder, never as its longest entry: a long prompt in the
        # history must not widen the page (and with it the window).
        self.recent.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.recent.setMinimumContentsLength(12)
        for widget, name in ((self.variant, "Variant to compare"),
                             (self.prompt, "Prompt for both sides"),
                             (self.run_button, "Compare"), (self.max_tokens, "Max tokens"),
                             (self.temperature, "Temperature"), (self.seed, "Seed")):
            widget.setAccessibleName(name)

        settings = QFormLayout()
        top = QHBoxLayout()
        top.addWidget(self.variant, 1)
        top.addWidget(QLabel("served by"))
        top.addWidget(self.backend)
        settings.addRow("Variant", top)
        row = QHBoxLayout()
        for label, widget in (("max tokens", self.max_tokens),
                              ("temperature", self.temperature), ("seed", self.seed)):
            row.addWidget(QLabel(label))
            row.addWidget(widget)
        row.addWidget(self.chat)
        row.addStretch(1)
        row.addWidget(self.run_button)
        row.addWidget(self.stop_button)

        # The view's own palette tells the theme: it has the new one when it hears of a
        # switch (`changeEvent`), before the texts inside it do.
        self.base_side = _Side(self.controller.sides["base"], self._dark)
        self.variant_side = _Side(self.controller.sides["variant"], self._dark)
        grid = QGridLayout()
        grid.addWidget(self.base_side.title, 0, 0)
        grid.addWidget(self.variant_side.title, 0, 1)
        grid.addWidget(self.base_side.browser, 1, 0)
        grid.addWidget(self.variant_side.browser, 1, 1)
        grid.setColumnStretch(0, 1)  # both sides equally wide, whatever their headers
        grid.setColumnStretch(1, 1)
        self.summary = QLabel("")
        self.summary.setWordWrap(True)
        self.summary.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.plot = LogprobChart()
        bottom = QHBoxLayout()
        bottom.addWidget(self.summary, 1)
        bottom.addWidget(self.recent)
        bottom.addWidget(self.export_md)
        bottom.addWidget(self.export_json)

        layout = QVBoxLayout(self)
        layout.addLayout(settings)
        layout.addWidget(self.prompt)
        layout.addLayout(row)
        # The texts and the plot share the height: the plot can be made taller.
        texts = QWidget()
        texts_layout = QVBoxLayout(texts)
        texts_layout.setContentsMargins(0, 0, 0, 0)
        texts_layout.addLayout(grid, 1)
        texts_layout.addLayout(bottom)
        self.split = QSplitter(Qt.Orientation.Vertical)
        self.split.addWidget(texts)
        self.split.addWidget(self.plot)
        self.split.setStretchFactor(0, 3)
        self.split.setStretchFactor(1, 2)
        # The plot can be made shorter than the chart's own 220 px: at 1024×700 that
        # minimum took two thirds of the height and the answers showed three lines.
        self.plot.setMinimumHeight(140)
        self.split.setSizes([300, 200])
        layout.addWidget(self.split, 1)

        events.catalogChanged.connect(self._catalog_changed)
        if self.controller.history:  # kept by an earlier run
            self.show_history()
        self.set_variants(self.controller.variants())

    # ---------------------------------------------------------------- the controller's state

    @property
    def reply(self) -> Reply | None:
        """The run in progress (the request's `Reply`)."""
        return self.controller.reply  # type: ignore[return-value]

    @property
    def result(self) -> CompareResult | None:
        return self.controller.result

    @property
    def params(self) -> dict[str, Any] | None:
        return self.controller.params

    @params.setter
    def params(self, params: dict[str, Any] | None) -> None:
        self.controller.params = params

    @property
    def first_token_seconds(self) -> dict[str, float]:
        return self.controller.first_token_seconds

    @first_token_seconds.setter
    def first_token_seconds(self, seconds: dict[str, float]) -> None:
        self.controller.first_token_seconds = seconds

    @property
    def history(self) -> list[dict[str, Any]]:
        return self.controller.history

    # ---------------------------------------------------------------- variants

    def set_variants(self, names: list[str], current: str | None = None) -> None:
        before = self.variant.currentText()
        keep = current or before
        self.variant.blockSignals(True)
        self.variant.clear()
        self.variant.addItems(names)
        if keep in names:
            self.variant.setCurrentText(keep)
        self.variant.blockSignals(False)
        if self.variant.currentText() != before:
            self.backend.set_target(self.catalog, self.variant.currentText() or None)
            self._choice_changed()
        else:
            self._retarget_backend()
        self._update_buttons()

    def _catalog_changed(self, kinds: list[str], names: list[str]) -> None:
        if "variant" in kinds:
            shown = self.variant.currentText()
            self.set_variants(self.controller.variants())
            if shown and shown in names and self.variant.currentText() == shown:
                self._choice_changed()  # edited: its identity (the titles) changed
        elif touches(kinds, ("model", "adapter")):
            self._retarget_backend()

    def _retarget_backend(self) -> None:
        """Which backends serve the variant may have changed (a conversion, a build,
        an edit): list them again, keeping the chosen one while it can still serve."""
        chosen = self.backend.backend()
        self.backend.set_target(self.catalog, self.variant.currentText() or None)
        if chosen is not None and not self.backend.choose(chosen):
            self._choice_changed()  # the backend of the shown labels is gone

    def _variant_changed(self, name: str) -> None:
        self.backend.set_target(self.catalog, name or None)
        self._choice_changed()

    def _choice_changed(self) -> None:
        self.controller.choose(self.variant.currentText())
        self._update_buttons()

    def select_variant(self, name: str) -> None:
        index = self.variant.findText(name)
        if index >= 0:
            self.variant.setCurrentIndex(index)

    # ---------------------------------------------------------------- running

    def run(self) -> None:
        self.controller.run(self.variant.currentText(), self.prompt.toPlainText(),
                            self.chat.isChecked(), self.max_tokens.value(),
                            self.temperature.value(), self.seed.value())

    def stop(self) -> None:
        self.controller.stop()

    def _dark(self) -> bool:
        return self.palette().color(QPalette.ColorRole.Base).lightness() < 128

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 (Qt's name)
        super().changeEvent(event)
        # A theme switch: both texts' code is highlighted for one theme, so they are
        # drawn again (a run in progress is drawn whole when it ends).
        if (event.type() != QEvent.Type.PaletteChange
                or getattr(self, "variant_side", None) is None or self.reply is not None):
            return
        divergence = self.result.first_divergence if self.result is not None else None
        for side in (self.base_side, self.variant_side):
            if side.text and side.drawn_dark not in (None, side._dark()):
                side.render(divergence)

    def _side(self, name: str) -> _Side | None:
        return {"base": self.base_side, "variant": self.variant_side}.get(name)

    def show_titles(self) -> None:
        self._dirty.clear()
        self.base_side.clear()
        self.variant_side.clear()
        self.plot.set_data([], [], None)

    def show_summary(self, text: str) -> None:
        self.summary.setText(text)
        self.summary.setToolTip("")

    def side_grew(self, side: str, text: str, first: bool) -> None:
        target = self._side(side)
        if target is None:
            return
        target.grow(text)
        if first:
            target.draw_stream()
        else:
            self._dirty.add(side)
            if not self._text_timer.isActive():
                self._text_timer.start()
        if not self._plot_timer.isActive():
            self._plot_timer.start()

    def _render_dirty(self) -> None:
        self._text_timer.stop()
        for side in sorted(self._dirty):
            target = self._side(side)
            if target is not None:
                target.draw_stream()
        self._dirty.clear()

    def _plot_stream(self) -> None:
        if self.reply is not None:
            self.plot.set_data([t[1] for t in self.base_side.tokens],
                               [t[1] for t in self.variant_side.tokens], None,
                               self.controller.token_texts())

    def busy_changed(self, busy: bool) -> None:
        if not busy:
            self._plot_timer.stop()
            self._render_dirty()  # what arrived last is shown (a stop keeps the texts)
        self._update_buttons()
        self.busyChanged.emit(busy)

    def show_result(self, result: CompareResult) -> None:
        """A finished comparison: both texts marked, speeds, endings, plot, summary;
        kept in the recent comparisons."""
        self.controller.show_result(result)

    def show_comparison(self) -> None:
        shown = self.controller.result
        assert shown is not None
        self._dirty.clear()  # rendered whole, marked
        div = shown.first_divergence
        for side in (self.base_side, self.variant_side):
            side.render(div)
            side.title.setText(side.state.title)
        # The final figures: the engine's log-probabilities, whole.
        self.plot.set_data(list(shown.base.logprobs), list(shown.variant.logprobs), div,
                           self.controller.token_texts())
        self.summary.setText(summary_text(shown))
        self.summary.setToolTip(summary_details(shown))  # the figures, for experts
        self._update_buttons()

    # ---------------------------------------------------------------- history

    def show_history(self) -> None:
        self.recent.clear()
        self.recent.addItems(self.controller.history_labels())
        self.recent.setCurrentIndex(0)
        self.recent.setEnabled(True)

    def _show_recent(self, index: int) -> None:
        self.controller.recall(index)

    def _update_buttons(self) -> None:
        busy = self.reply is not None
        self.run_button.setEnabled(not busy and self.variant.count() > 0)
        self.stop_button.setEnabled(busy)
        self.export_md.setEnabled(self.result is not None)
        self.export_json.setEnabled(self.result is not None)

    # ---------------------------------------------------------------- export

    def export_text(self, kind: str) -> str:
        return self.controller.export_text(kind)

    def _export(self, kind: str) -> None:
        if self.result is None:
            return
        suffix = ".md" if kind == "md" else ".json"
        filters = "Markdown (*.md)" if kind == "md" else "JSON (*.json)"
        path, _ = QFileDialog.getSaveFileName(self, "Export comparison",
                                              f"comparison{suffix}",
                                              f"{filters};;All files (*)")
        if path:
            if not Path(path).suffix:
                path += suffix
            Path(path).write_text(self.export_text(kind), encoding="utf-8")
            self.summary.setText(self.summary.text() + f"<br>exported to {html.escape(path)}")
