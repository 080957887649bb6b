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
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtGui import QKeySequence, QShortcut
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

from engine.catalog import resolve
from engine.catalog.resolve import SessionSpec
from engine.catalog.store import Catalog
from engine.errors import StudioError
from engine.runtime.messages import Compare, Prompt
from gui.backend_picker import BackendPicker
from gui.catalog_events import CatalogEvents, touches
from gui.engine_client import QtEngineClient, Reply
from gui.widgets.logprob_chart import LogprobChart

MARK = "background-color:rgba(224,118,43,0.28)"


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

    def __init__(self, client: QtEngineClient, catalog: Catalog, events: CatalogEvents,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.client = client
        self.catalog = catalog
        self.reply: Reply | None = None  # the run in progress
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
        self.plot = LogprobChart()
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
                    name, resolve.resolve(self.catalog, name, backend=self.backend.backend()))
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
        if not name or not prompt or self.reply is not None:
            if not prompt:
                self.summary.setText("Write a prompt first.")
            return
        try:
            spec = resolve.resolve(self.catalog, name, backend=self.backend.backend())
            sampling = resolve.sampling(self.catalog, name,
                                        max_tokens=self.max_tokens.value(),
                                        temperature=self.temperature.value(),
                                        seed=self.seed.value())
        except StudioError as exc:
            self.summary.setText(f"<span style='color:#d23c3c'>{html.escape(exc.message)}"
                                 "</span>")
            return
        chat = self.chat.isChecked()
        # What the exports say was asked: the prompt and every sampling setting.
        self.params = {"prompt": {"text": prompt, "chat": chat},
                       "sampling": sampling.to_dict()}
        base_title, variant_title = self._titles(name, spec)
        self.base_side.reset(base_title)
        self.variant_side.reset(variant_title)
        self.result = None
        self.plot.set_data([], [], None)
        self.summary.setText("running both sides…")
        reply = self.client.submit(Compare(spec, Prompt(text=prompt, chat=chat), sampling))
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
        target.tokens.extend(tokens)
        target.text += text
        target.render()
        self.plot.set_data([t[1] for t in self.base_side.tokens],
                           [t[1] for t in self.variant_side.tokens], None, self._token_texts())

    @Slot(object)
    def _on_finished(self, result: Any) -> None:
        self._drop_reply()
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
        # The final figures: the engine's log-probabilities, whole.
        self.plot.set_data(base["logprobs"], variant["logprobs"], div, self._token_texts())
        self.summary.setText(summary_text(result))
        self._update_buttons()
        self.busyChanged.emit(False)

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
