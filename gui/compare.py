"""A/B comparison: the base and a variant streaming side by side.

Same prompt, same sampling settings and seed on both sides. When both finish, the
first token where they differ is marked in both texts, each side's speed is shown,
and the engine's adapter-effect figure (the base's tokens teacher-forced through the
variant: mean |Δ log p| per token) is stated plainly. A small plot shows each side's
per-token log-probability. The comparison exports as Markdown or JSON.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from PySide6.QtCore import QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QColor, QKeySequence, QPainter, QPainterPath, QPalette, QPen, QShortcut
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
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from engine.catalog.store import Catalog
from engine.errors import StudioError
from engine.catalog.resolve import SessionSpec, resolve
from gui.backend_picker import BackendPicker
from gui.engine_client import QtEngineClient

BASE_COLOR = QColor("#2f6fdf")
VARIANT_COLOR = QColor("#e0762b")
MARK = "background-color:rgba(224,118,43,0.28)"


class LogprobPlot(QWidget):
    """Per-token log-probability of the chosen token, base and variant."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.base: list[float] = []
        self.variant: list[float] = []
        self.divergence: int | None = None
        self.setMinimumHeight(130)
        self.setToolTip("log-probability of each chosen token (higher = more confident); "
                        "the dashed line marks the first divergence")

    def set_data(self, base: list[float], variant: list[float], divergence: int | None) -> None:
        self.base, self.variant, self.divergence = base, variant, divergence
        self.update()

    def paintEvent(self, _event: Any) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        rect = QRectF(self.rect()).adjusted(40, 8, -10, -22)
        text = self.palette().color(QPalette.ColorRole.Text)
        grid = QColor(text)
        grid.setAlpha(60)
        painter.setPen(QPen(grid, 1))
        painter.drawRect(rect)
        series = [s for s in (self.base, self.variant) if s]
        if not series:
            painter.setPen(text)
            painter.drawText(rect, Qt.AlignmentFlag.AlignCenter, "run a comparison to see "
                             "per-token log-probabilities")
            return
        low = min(min(s) for s in series)
        low = min(low, -1.0)
        n = max(len(s) for s in series)
        painter.setPen(text)
        painter.drawText(QRectF(0, rect.top() - 6, 38, 14), Qt.AlignmentFlag.AlignRight, "0")
        painter.drawText(QRectF(0, rect.bottom() - 8, 38, 14), Qt.AlignmentFlag.AlignRight,
                         f"{low:.0f}")
        painter.drawText(QRectF(rect.left(), rect.bottom() + 4, rect.width(), 14),
                         Qt.AlignmentFlag.AlignCenter, f"token (0–{n - 1}) · log p")

        def point(i: int, value: float) -> QPointF:
            x = rect.left() + (rect.width() * i / max(n - 1, 1))
            y = rect.top() + rect.height() * (value / low)
            return QPointF(x, y)

        if self.divergence is not None and self.divergence < n:
            pen = QPen(grid, 1, Qt.PenStyle.DashLine)
            painter.setPen(pen)
            x = point(self.divergence, 0).x()
            painter.drawLine(QPointF(x, rect.top()), QPointF(x, rect.bottom()))
        for values, color in ((self.base, BASE_COLOR), (self.variant, VARIANT_COLOR)):
            if not values:
                continue
            path = QPainterPath(point(0, values[0]))
            for i, value in enumerate(values[1:], start=1):
                path.lineTo(point(i, value))
            painter.setPen(QPen(color, 1.6))
            painter.drawPath(path)
        painter.setPen(BASE_COLOR)
        # The legend sits under the plot, so it never hides a line.
        painter.drawText(QRectF(rect.left(), rect.bottom() + 4, 80, 16),
                         Qt.AlignmentFlag.AlignLeft, "■ base")
        painter.setPen(VARIANT_COLOR)
        painter.drawText(QRectF(rect.left() + 70, rect.bottom() + 4, 90, 16),
                         Qt.AlignmentFlag.AlignLeft, "■ variant")


class _Side:
    def __init__(self, title: str) -> None:
        self.title = QLabel(title)
        self.browser = QTextBrowser()
        self.tokens: list[list[Any]] = []  # [token id, logprob, text]
        self.text = ""
        self.result: dict[str, Any] | None = None

    def reset(self, title: str) -> None:
        self.title.setText(title)
        self.tokens, self.text, self.result = [], "", None
        self.browser.setPlainText("")

    def render(self, divergence: int | None = None) -> None:
        if divergence is None or divergence >= len(self.tokens):
            self.browser.setHtml(f"<div style='white-space:pre-wrap'>"
                                 f"{html.escape(self.text)}</div>")
            return
        head = "".join(t[2] for t in self.tokens[:divergence])
        tail = "".join(t[2] for t in self.tokens[divergence:])
        self.browser.setHtml(f"<div style='white-space:pre-wrap'>{html.escape(head)}"
                             f"<span style='{MARK}'>{html.escape(tail)}</span></div>")


class CompareView(QWidget):
    busyChanged = Signal(bool)

    def __init__(self, client: QtEngineClient, catalog: Catalog,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.client = client
        self.catalog = catalog
        self.request_id: str | None = None
        self.result: dict[str, Any] | None = None
        self.params: dict[str, Any] | None = None

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
        self.summary = QLabel("")
        self.summary.setWordWrap(True)
        self.summary.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.plot = LogprobPlot()
        bottom = QHBoxLayout()
        bottom.addWidget(self.summary, 1)
        bottom.addWidget(self.export_md)
        bottom.addWidget(self.export_json)

        layout = QVBoxLayout(self)
        layout.addLayout(settings)
        layout.addWidget(self.prompt)
        layout.addLayout(row)
        layout.addLayout(grid, 1)
        layout.addLayout(bottom)
        layout.addWidget(self.plot)

        client.tokens.connect(self._on_tokens)
        client.finished.connect(self._on_finished)
        client.failed.connect(self._on_failed)
        client.cancelled.connect(self._on_cancelled)
        self._update_buttons()

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
        self.backend.set_target(self.catalog, self.variant.currentText() or None)
        if self.variant.currentText() != before:
            self._choice_changed()
        self._update_buttons()

    def _variant_changed(self, name: str) -> None:
        self.backend.set_target(self.catalog, name or None)
        self._choice_changed()

    def _choice_changed(self) -> None:
        """Another variant (or backend) is chosen: the sides say what the next run
        compares, and texts of the previous choice are not left under its labels."""
        shown = bool(self.result or self.base_side.text or self.variant_side.text)
        if self.request_id:
            # A run of the previous choice: stop it and ignore whatever it still
            # delivers, which would otherwise land under the new choice's labels.
            self.stop()
            self.request_id = None
            self.busyChanged.emit(False)
        name = self.variant.currentText()
        base_title, variant_title = "Base", "Variant"
        if name:
            try:
                base_title, variant_title = self._titles(
                    name, resolve(self.catalog, name, backend=self.backend.backend()))
            except StudioError as exc:
                variant_title = (f"<b>Variant</b> · {html.escape(name)} · <span "
                                 f"style='color:#d23c3c'>{html.escape(exc.message)}</span>")
        self.base_side.reset(base_title)
        self.variant_side.reset(variant_title)
        self.result = None
        self.plot.set_data([], [], None)
        self.summary.setText(f"Now comparing {html.escape(name)}: run it (Ctrl+Enter)."
                             if name and shown else "")
        self._update_buttons()

    @staticmethod
    def _titles(name: str, spec: SessionSpec) -> tuple[str, str]:
        return (f"<b>Base</b> · {html.escape(spec.base_name)} · {spec.backend} · "
                f"<code>{spec.identity.base_only().short}</code>",
                f"<b>Variant</b> · {html.escape(name)} · {spec.backend} · "
                f"<code>{spec.identity.short}</code>")

    def select_variant(self, name: str) -> None:
        index = self.variant.findText(name)
        if index >= 0:
            self.variant.setCurrentIndex(index)

    # ---------------------------------------------------------------- running

    def run(self) -> None:
        name = self.variant.currentText()
        prompt = self.prompt.toPlainText().strip()
        if not name or not prompt or self.request_id:
            if not prompt:
                self.summary.setText("Write a prompt first.")
            return
        try:
            spec = resolve(self.catalog, name, backend=self.backend.backend())
        except StudioError as exc:
            self.summary.setText(f"<span style='color:#d23c3c'>{html.escape(exc.message)}"
                                 "</span>")
            return
        sampling = spec.sampling.to_dict() | {
            "max_tokens": self.max_tokens.value(), "temperature": self.temperature.value(),
            "seed": self.seed.value()}
        self.params = {"spec": spec.to_dict(), "prompt": {"text": prompt,
                                                          "chat": self.chat.isChecked()},
                       "sampling": sampling}
        base_title, variant_title = self._titles(name, spec)
        self.base_side.reset(base_title)
        self.variant_side.reset(variant_title)
        self.result = None
        self.plot.set_data([], [], None)
        self.summary.setText("running both sides…")
        self.request_id = self.client.compare(self.params)
        self._update_buttons()
        self.busyChanged.emit(True)

    def stop(self) -> None:
        if self.request_id:
            self.client.stop(self.request_id)

    def _side(self, name: str) -> _Side | None:
        return {"base": self.base_side, "variant": self.variant_side}.get(name)

    def _on_tokens(self, request_id: str, side: str, text: str, tokens: list) -> None:
        target = self._side(side)
        if request_id != self.request_id or target is None:
            return
        target.tokens.extend(tokens)
        target.text += text
        target.render()
        self.plot.set_data([t[1] for t in self.base_side.tokens],
                           [t[1] for t in self.variant_side.tokens], None)

    def _on_finished(self, request_id: str, result: Any) -> None:
        if request_id != self.request_id:
            return
        self.request_id = None
        self.result = result
        div = result["first_divergence"]
        for side in (self.base_side, self.variant_side):
            side.result = result["base" if side is self.base_side else "variant"]
            side.text = side.result["text"]
            side.render(div)
        base, variant = result["base"], result["variant"]
        self.base_side.title.setText(self.base_side.title.text() +
                                     f" · {base['tokens_per_second']:.1f} tok/s")
        self.variant_side.title.setText(self.variant_side.title.text() +
                                        f" · {variant['tokens_per_second']:.1f} tok/s")
        self.plot.set_data(base["logprobs"], variant["logprobs"], div)
        self.summary.setText(summary_text(result))
        self._update_buttons()
        self.busyChanged.emit(False)

    def _on_failed(self, request_id: str, message: str, _details: list) -> None:
        if request_id != self.request_id:
            return
        self.request_id = None
        self.summary.setText(f"<span style='color:#d23c3c'>{html.escape(message)}</span>")
        self._update_buttons()
        self.busyChanged.emit(False)

    def _on_cancelled(self, request_id: str) -> None:
        if request_id != self.request_id:
            return
        self.request_id = None
        self.summary.setText("stopped")
        self._update_buttons()
        self.busyChanged.emit(False)

    def _update_buttons(self) -> None:
        busy = self.request_id is not None
        self.run_button.setEnabled(not busy and self.variant.count() > 0)
        self.stop_button.setEnabled(busy)
        self.export_md.setEnabled(self.result is not None)
        self.export_json.setEnabled(self.result is not None)

    # ---------------------------------------------------------------- export

    def export_text(self, kind: str) -> str:
        assert self.result is not None and self.params is not None
        if kind == "json":
            return json.dumps({"prompt": self.params["prompt"],
                               "sampling": self.params["sampling"], **self.result},
                              indent=2, ensure_ascii=False)
        return comparison_markdown(self.params, self.result)

    def _export(self, kind: str) -> None:
        if self.result is None:
            return
        suffix = ".md" if kind == "md" else ".json"
        path, _ = QFileDialog.getSaveFileName(self, "Export comparison",
                                              f"comparison{suffix}")
        if path:
            Path(path).write_text(self.export_text(kind), encoding="utf-8")
            self.summary.setText(self.summary.text() + f"<br>exported to {html.escape(path)}")


def summary_text(result: dict[str, Any]) -> str:
    div = result["first_divergence"]
    effect = result["adapter_effect"]
    where = ("the two sides never differ" if div is None else
             f"first divergence at token {div} (highlighted)")
    if effect is None:
        figure = "adapter effect: n/a (the base produced no tokens)"
    else:
        verdict = ("the adapter is applied" if effect > 1e-6 else
                   "no measurable effect: the adapter changes nothing here")
        figure = (f"<b>adapter effect {effect:.4f} nats/token</b> — the base's tokens scored "
                  f"by the variant differ by this much in log-probability on average; "
                  f"{verdict}")
    return f"{where} · {figure}"


def comparison_markdown(params: dict[str, Any], result: dict[str, Any]) -> str:
    lines = ["# Variant comparison", "", f"**Prompt:** {params['prompt']['text']}", "",
             "| setting | value |", "| --- | --- |"]
    for key, value in params["sampling"].items():
        lines.append(f"| {key} | {value} |")
    for side in ("base", "variant"):
        r = result[side]
        lines += ["", f"## {side.title()}: {r['name']}", "",
                  f"- identity: `{r['identity']}`", f"- backend: {r['backend']}",
                  f"- tokens: {len(r['token_ids'])}, {r['tokens_per_second']:.1f} tok/s, "
                  f"finish: {r['finish_reason']}"]
        for a in r.get("adapters", []):
            lines.append(f"- adapter {a['name']} scale {a['scale']:g} sha256 `{a['sha256']}`")
        lines += ["", "```text", r["text"], "```"]
    div = result["first_divergence"]
    effect = result["adapter_effect"]
    lines += ["", f"**First divergence:** {'none' if div is None else f'token {div}'}",
              "", f"**Adapter effect:** {'n/a' if effect is None else f'{effect:.4f}'} "
              "nats/token (mean |Δ log p| of the base's tokens under the variant)", ""]
    return "\n".join(lines)
