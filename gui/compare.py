"""A/B comparison: the base and a variant streaming side by side.

Same prompt, same sampling settings and seed on both sides. When both finish, the
first token where they differ is marked in both texts, each side's speed is shown,
and the engine's adapter-effect figure (the base's tokens teacher-forced through the
variant: mean |Δ log p| per token) is stated plainly. A plot (QtCharts,
`gui.widgets.logprob_chart`) shows each side's per-token log-probability, with the
values on hover. The comparison exports as Markdown or JSON.

A run is one `Compare` request whose `Reply` this view holds; switching the variant or
the backend stops it and drops it, so nothing of it lands under the new labels. The
variant list follows catalog changes (`CatalogEvents`: variants), the backend picker
follows models and adapters (a conversion or the OpenVINO build adds a backend).

Both sides are rendered Markdown (`gui.markdown`). The first differing token is marked
on its own in both texts and the rest of each divergent tail is shaded lighter: the
texts are rendered with private-use marker characters around those places, and the
markers are turned into formats once the HTML is in the document (so a mark can cross
paragraphs and code blocks). Each side says how it ended (a side cut at max tokens says
so). Recent comparisons are kept (this session, newest first) so an import, a new
variant or a switch does not lose one.
"""

from __future__ import annotations

import html
import json
import re
import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal, Slot
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

from engine.catalog.resolve import SessionSpec
from engine.catalog.store import Catalog
from engine.errors import StudioError
from engine.runtime import assembly
from engine.runtime.messages import Compare, Prompt
from engine.runtime.results import CompareResult, GenerationResult
from gui.backend_picker import LABELS, BackendPicker
from gui.catalog_events import CatalogEvents, touches
from gui.engine_client import QtEngineClient, Reply
from gui.markdown import render as render_markdown
from gui.widgets.logprob_chart import LogprobChart

MARK = "background-color:rgba(224,118,43,0.28)"
TOKEN_COLOR = QColor(224, 118, 43, 150)  # the first differing token, on its own
TAIL_COLOR = QColor(224, 118, 43, 46)  # the rest of the divergent tail, lighter
TOKEN_START, TAIL_START = "\ue000", "\ue001"  # private use: survive the rendering
HISTORY = 20
# At a line's start, Markdown's block syntax must stay first on its line, or a marker
# would turn a heading, a list item or a code fence into a paragraph.
BLOCK_SYNTAX = re.compile(r"(?:[ \t]*(?:#{1,6}[ \t]|>[ \t]?|[-*+][ \t]|\d+[.)][ \t]|"
                          r"(?:`{3,}|~{3,})[^\n]*\n|\|))*")
# Adapter effect (mean |Δ log p| per token of the base's tokens under the variant):
# measured for the shipped demo variant (tool-calls, scale 1.0) on six requests of its
# task (five typed ones and the first held-out one): 0.86 to 2.08 nats/token.
DEMO_EFFECT = "about 0.9–2.1"
PLOT_INTERVAL_MS = 250  # between redraws of the plot while both sides stream
TEXT_INTERVAL_MS = 100  # between renders of a side's text while it streams
FINISH = {"eos": "ended (end of text)", "stop": "ended at a stop string",
          "length": "cut at max tokens", "context": "cut: the context is full"}


def finish_text(result: GenerationResult, max_tokens: int | None = None) -> str:
    reason = result.finish_reason or ""
    words = FINISH.get(reason, reason)
    if reason == "length" and max_tokens:
        words += f" ({max_tokens})"
    return words


def marked_source(tokens: list[str], divergence: int) -> tuple[str, int, int]:
    """The text with the marks' places: (text, token start, tail start) as positions
    where TOKEN_START and TAIL_START go, moved past block syntax at a line's start."""
    text = "".join(tokens)
    start = len("".join(tokens[:divergence]))
    end = start + len(tokens[divergence]) if divergence < len(tokens) else start
    if start == 0 or text[start - 1] == "\n":
        start += BLOCK_SYNTAX.match(text, start).end() - start
        line_end = text.find("\n", start)
        limit = len(text) if line_end < 0 else line_end
        end = min(max(end, start + 1), max(limit, start))
    return text, start, max(end, start)


class _Side:
    def __init__(self, title: str) -> None:
        self.title = QLabel(title)
        # Wrapped to its column: a finished run's figures make a header longer than the
        # column, which as one line raised the window's minimum width (the window grew
        # by itself and squeezed the library).
        self.title.setWordWrap(True)
        self.browser = QTextBrowser()
        self.browser.setOpenLinks(False)
        self.tokens: list[list[Any]] = []  # [token id, logprob, text]
        self.text = ""
        self.result: GenerationResult | None = None
        self.marks: tuple[str, str] = ("", "")  # (the token marked, the tail shaded)

    def reset(self, title: str) -> None:
        self.title.setText(title)
        self.tokens, self.text, self.result = [], "", None
        self.marks = ("", "")
        self.browser.setPlainText("")

    def _dark(self) -> bool:
        return self.browser.palette().color(QPalette.ColorRole.Base).lightness() < 128

    def render(self, divergence: int | None = None) -> None:
        """Rendered Markdown; from `divergence` on, the token marked, the tail shaded."""
        texts = [t[2] for t in self.tokens]
        if divergence is None or divergence >= len(self.tokens):
            self.browser.setHtml(render_markdown(self.text, self._dark(),
                                                 copy_links=False).html)
            self.marks = ("", "")
            return
        text, start, end = marked_source(texts, divergence)
        source = text[:start] + TOKEN_START + text[start:end] + TAIL_START + text[end:]
        self.browser.setHtml(render_markdown(source, self._dark(), copy_links=False).html)
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
        self.reply: Reply | None = None  # the run in progress
        self.result: CompareResult | None = None
        self.params: dict[str, Any] | None = None
        # Each side's first token, seconds after the run was asked for: both sides are
        # timed the same way, by this view's clock from the same start.
        self.first_token_seconds: dict[str, float] = {}
        self._started = 0.0
        # While streaming the plot is redrawn a few times a second, not at every batch
        # of either side (each redraw costs milliseconds the engine needs on a small
        # machine); the finished run draws the final figures.
        self._plot_timer = QTimer(self)
        self._plot_timer.setSingleShot(True)
        self._plot_timer.setInterval(PLOT_INTERVAL_MS)
        self._plot_timer.timeout.connect(self._plot_stream)
        # Likewise each side's text (rendered Markdown, whole, each time): its first
        # token at once, then at most ten times a second.
        self._dirty: set[str] = set()
        self._text_timer = QTimer(self)
        self._text_timer.setSingleShot(True)
        self._text_timer.setInterval(TEXT_INTERVAL_MS)
        self._text_timer.timeout.connect(self._render_dirty)

        self.variant = QComboBox()
        self.variant.setToolTip("Switch the variant to compare against its base")
        self.backend = BackendPicker()
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
        # Recent comparisons (this session): an import or a switch does not lose one.
        self.history: list[dict[str, Any]] = []
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

        self.base_side = _Side("Base")
        self.variant_side = _Side("Variant")
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
        layout.addWidget(self.split, 1)

        events.catalogChanged.connect(self._catalog_changed)
        self.set_variants(self._catalog_variants())

    # ---------------------------------------------------------------- variants

    def _catalog_variants(self) -> list[str]:
        try:
            return sorted(self.catalog.data()["variants"], key=str.lower)
        except StudioError:
            return []

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
            self.set_variants(self._catalog_variants())
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
        """Another variant (or backend) is chosen: the sides say what the next run
        compares, and texts of the previous choice are not left under its labels."""
        shown = bool(self.result or self.base_side.text or self.variant_side.text)
        if self.reply is not None:
            # A run of the previous choice: stop it and drop it, so nothing it still
            # delivers lands under the new choice's labels.
            self._drop_reply().stop()
            self.busyChanged.emit(False)
        name = self.variant.currentText()
        base_title, variant_title = "Base", "Variant"
        if name:
            try:
                base_title, variant_title = self._titles(
                    name, assembly.spec(self.catalog, name, backend=self.backend.backend()))
            except StudioError as exc:
                variant_title = (f"<b>Variant</b> · {html.escape(name)} · <span "
                                 f"style='color:#d23c3c'>{html.escape(exc.message)}</span>")
        self.base_side.reset(base_title)
        self.variant_side.reset(variant_title)
        self.result = None
        self.plot.set_data([], [], None)
        if not name:  # an empty state that says what to do next
            text = ("No variant to compare yet: compose one (Ctrl+Shift+N) or import an "
                    "adapter (Ctrl+I).")
        elif shown:
            text = f"Now comparing {html.escape(name)}: run it (Ctrl+Enter)."
        else:
            text = (f"Write a prompt and run it (Ctrl+Enter): the base and "
                    f"{html.escape(name)} answer side by side, and the first token where "
                    "they differ is marked.")
        self.summary.setText(text)
        self._update_buttons()

    @staticmethod
    def _titles(name: str, spec: SessionSpec) -> tuple[str, str]:
        runtime = LABELS.get(spec.backend, spec.backend)
        return (f"<b>Base</b> · {html.escape(spec.base_name)} · {runtime} · "
                f"<code>{spec.identity.base_only().short}</code>",
                f"<b>Variant</b> · {html.escape(name)} · {runtime} · "
                f"<code>{spec.identity.short}</code>")

    def select_variant(self, name: str) -> None:
        index = self.variant.findText(name)
        if index >= 0:
            self.variant.setCurrentIndex(index)

    # ---------------------------------------------------------------- running

    def run(self) -> None:
        name = self.variant.currentText()
        prompt = self.prompt.toPlainText().strip()
        if not name or not prompt or self.reply is not None:
            if not prompt:
                self.summary.setText("Write a prompt first.")
            return
        chat = self.chat.isChecked()
        try:
            request = assembly.request(self.catalog, name, Prompt(text=prompt, chat=chat),
                                       kind=Compare, backend=self.backend.backend(),
                                       max_tokens=self.max_tokens.value(),
                                       temperature=self.temperature.value(),
                                       seed=self.seed.value())
        except StudioError as exc:
            self.summary.setText(f"<span style='color:#d23c3c'>{html.escape(exc.message)}"
                                 "</span>")
            return
        # What the exports say was asked: the prompt and every sampling setting.
        self.params = {"prompt": {"text": prompt, "chat": chat},
                       "sampling": request.sampling.to_dict()}
        base_title, variant_title = self._titles(name, request.spec)
        self.base_side.reset(base_title)
        self.variant_side.reset(variant_title)
        self.result = None
        self.plot.set_data([], [], None)
        self.summary.setText("running both sides…")
        self.first_token_seconds = {}
        self._dirty.clear()
        self._started = time.perf_counter()
        reply = self.client.submit(request)
        reply.tokens.connect(self._on_tokens)
        reply.finished.connect(self._on_finished)
        reply.failed.connect(self._on_failed)
        reply.cancelled.connect(self._on_cancelled)
        self.reply = reply
        self._update_buttons()
        self.busyChanged.emit(True)

    def stop(self) -> None:
        if self.reply is not None:
            self.reply.stop()

    def _drop_reply(self) -> Reply:
        """Stop listening to the current run (it is no longer this view's business)."""
        reply = self.reply
        assert reply is not None
        for signal, slot in ((reply.tokens, self._on_tokens),
                             (reply.finished, self._on_finished),
                             (reply.failed, self._on_failed),
                             (reply.cancelled, self._on_cancelled)):
            signal.disconnect(slot)
        self.reply = None
        self._plot_timer.stop()
        self._render_dirty()  # what arrived last is shown (a stop keeps the texts)
        return reply

    def _side(self, name: str) -> _Side | None:
        return {"base": self.base_side, "variant": self.variant_side}.get(name)

    def _token_texts(self) -> dict[str, list[str]]:
        """Each side's token texts, for the plot's hover."""
        return {"base": [t[2] for t in self.base_side.tokens],
                "variant": [t[2] for t in self.variant_side.tokens]}

    @Slot(str, str, list)
    def _on_tokens(self, side: str, text: str, tokens: list) -> None:
        target = self._side(side)
        if target is None:
            return
        first = side not in self.first_token_seconds
        self.first_token_seconds.setdefault(side, time.perf_counter() - self._started)
        target.tokens.extend(tokens)
        target.text += text
        if first:
            target.render()
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
                target.render()
        self._dirty.clear()

    def _plot_stream(self) -> None:
        if self.reply is not None:
            self.plot.set_data([t[1] for t in self.base_side.tokens],
                               [t[1] for t in self.variant_side.tokens], None,
                               self._token_texts())

    @Slot(object)
    def _on_finished(self, result: Any) -> None:
        self._dirty.clear()  # show_result renders both sides, marked
        self._drop_reply()
        self.show_result(result)
        self.busyChanged.emit(False)

    def show_result(self, result: CompareResult) -> None:
        """A finished comparison: both texts marked, speeds, endings, plot, summary;
        kept in the recent comparisons."""
        self.result = result
        div = result.first_divergence
        for side in (self.base_side, self.variant_side):
            side.result = result.base if side is self.base_side else result.variant
            side.text = side.result.text
            side.render(div)
        base, variant = result.base, result.variant
        limit = (self.params or {}).get("sampling", {}).get("max_tokens")
        # Both sides' figures are measured the same way: the engine's decode rate of
        # that side, and this view's clock to that side's first token.
        for side, figures in ((self.base_side, base), (self.variant_side, variant)):
            first = self.first_token_seconds.get("base" if side is self.base_side
                                                 else "variant")
            side.title.setText(side.title.text() +
                               f" · {figures.tokens_per_second:.1f} tok/s · "
                               + (f"first token {first:.2f} s · " if first is not None
                                  else "") + finish_text(figures, limit))
        # The final figures: the engine's log-probabilities, whole.
        self.plot.set_data(list(base.logprobs), list(variant.logprobs), div,
                           self._token_texts())
        self.summary.setText(summary_text(result))
        self._remember()
        self._update_buttons()

    # ---------------------------------------------------------------- history

    def _remember(self) -> None:
        assert self.result is not None
        entry = {"time": time.time(), "variant": self.variant.currentText(),
                 "params": self.params, "result": self.result,
                 "titles": (self.base_side.title.text(), self.variant_side.title.text()),
                 "tokens": (list(self.base_side.tokens), list(self.variant_side.tokens))}
        self.history.insert(0, entry)
        del self.history[HISTORY:]
        self.recent.clear()
        for item in self.history:
            prompt = " ".join(str(item["params"]["prompt"]["text"]).split())
            self.recent.addItem(time.strftime("%H:%M:%S", time.localtime(item["time"])) +
                                f" · {item['variant']} · {prompt[:40]}")
        self.recent.setCurrentIndex(0)
        self.recent.setEnabled(True)

    def _show_recent(self, index: int) -> None:
        if not 0 <= index < len(self.history) or self.reply is not None:
            return
        entry = self.history[index]
        self.result, self.params = entry["result"], entry["params"]
        div = self.result.first_divergence
        for side, name, title, tokens in ((self.base_side, "base", entry["titles"][0],
                                           entry["tokens"][0]),
                                          (self.variant_side, "variant", entry["titles"][1],
                                           entry["tokens"][1])):
            side.title.setText(title)
            side.tokens = list(tokens)
            side.result = self.result.side(name)
            side.text = side.result.text
            side.render(div)
        self.plot.set_data(list(self.result.base.logprobs),
                           list(self.result.variant.logprobs), div, self._token_texts())
        self.summary.setText(summary_text(self.result))
        self._update_buttons()

    @Slot(str, list)
    def _on_failed(self, message: str, _details: list) -> None:
        self._drop_reply()
        self.summary.setText(f"<span style='color:#d23c3c'>{html.escape(message)}</span>")
        self._update_buttons()
        self.busyChanged.emit(False)

    @Slot()
    def _on_cancelled(self) -> None:
        self._drop_reply()
        self.summary.setText("stopped")
        self._update_buttons()
        self.busyChanged.emit(False)

    def _update_buttons(self) -> None:
        busy = self.reply is not None
        self.run_button.setEnabled(not busy and self.variant.count() > 0)
        self.stop_button.setEnabled(busy)
        self.export_md.setEnabled(self.result is not None)
        self.export_json.setEnabled(self.result is not None)

    # ---------------------------------------------------------------- export

    def export_text(self, kind: str) -> str:
        assert self.result is not None and self.params is not None
        if kind == "json":
            return json.dumps({"prompt": self.params["prompt"],
                               "sampling": self.params["sampling"], **self.result.to_dict()},
                              indent=2, ensure_ascii=False)
        return comparison_markdown(self.params, self.result)

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


def effect_scale(effect: float) -> str:
    """What an adapter effect (nats/token) means, in words."""
    if effect <= 1e-6:
        return "none"
    if effect < 0.05:
        return "small"
    if effect < 0.5:
        return "moderate"
    return "large"


def summary_text(result: CompareResult) -> str:
    div = result.first_divergence
    effect = result.adapter_effect
    where = ("the two sides never differ" if div is None else
             f"first divergence at token {div} (highlighted: that token on its own, the rest "
             "lighter)")
    scales = [a.scale for a in result.variant.adapters]
    at = ", ".join(f"{s:g}" for s in scales)
    if effect is None:
        figure = "adapter effect: n/a (the base produced no tokens)"
    elif scales and all(s == 0 for s in scales):
        figure = (f"<b>adapter effect {effect:.4f} nats/token</b> at scale 0: the adapter "
                  "is switched off, so 0 is expected")
    else:
        verdict = ("the adapter is applied" if effect > 1e-6 else
                   "no measurable effect: the adapter changes nothing here")
        figure = (f"<b>adapter effect {effect:.4f} nats/token</b>"
                  + (f" at scale {at}" if at else "") +
                  f" — {effect_scale(effect)}: the base's own tokens, scored by the variant, "
                  f"change log-probability by this much on average (under 0.05 is small, "
                  f"over 0.5 large; the demo variant at scale 1: {DEMO_EFFECT}); {verdict}")
    return f"{where} · {figure}"


def fence_for(text: str) -> str:
    """A code fence longer than any run of backticks in `text`: the text cannot close it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _setting(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ", ".join(json.dumps(v) for v in value) if value else "none"
    return str(value)


def comparison_markdown(params: dict[str, Any], result: CompareResult) -> str:
    prompt = str(params["prompt"]["text"])
    fence = fence_for(prompt)
    lines = ["# Variant comparison", "", "**Prompt:**", "", f"{fence}text", prompt, fence, "",
             "| setting | value |", "| --- | --- |"]
    for key, value in params["sampling"].items():
        lines.append(f"| {key} | {_setting(value).replace('|', chr(92) + '|')} |")
    limit = params["sampling"].get("max_tokens")
    for side in ("base", "variant"):
        r = result.side(side)
        lines += ["", f"## {side.title()}: {r.name}", "",
                  f"- identity: `{r.identity}`", f"- backend: {r.backend}",
                  f"- tokens: {len(r.token_ids)}, {r.tokens_per_second:.1f} tok/s, "
                  f"{finish_text(r, limit)}"]
        for a in r.adapters:
            lines.append(f"- adapter {a.name} scale {a.scale:g} sha256 `{a.sha256}`")
        fence = fence_for(r.text)
        lines += ["", f"{fence}text", r.text, fence]
    div = result.first_divergence
    effect = result.adapter_effect
    lines += ["", f"**First divergence:** {'none' if div is None else f'token {div}'}",
              "", f"**Adapter effect:** {'n/a' if effect is None else f'{effect:.4f}'} "
              "nats/token (mean |Δ log p| of the base's tokens under the variant)", ""]
    return "\n".join(lines)
