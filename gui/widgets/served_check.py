"""The Train page's "Served check" panel: after a run wrote its adapter, how the adapter
measures as it is served, in plain words.

Two figures come from the training worker (its `checks` event, and the finished
result's `checks`):

- parity: the trainer's next-token log-probabilities against llama.cpp's on the same
  tokens, the adapter applied on both (engine/training/parity.py);
- drift: mean NLL per token of unrelated prose under the base and under base + adapter
  (llama.cpp), and the difference in nats per token.

A line is flagged when top-1 agreement is below the parity gate's 0.93 or the drift
is above +0.05 nats/token (docs/training.md). A part that is missing or reports
`{"error": ...}` is said so plainly, never shown as a pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QGridLayout, QGroupBox, QLabel, QWidget

# The engine's thresholds (its CLI output flags with the same ones); the module imports
# neither torch nor a runtime.
from engine.training.served_check import DRIFT_LIMIT, TOP1_LIMIT

OK, FLAG, MISSING = "ok", "flag", "missing"
FLAG_COLOR, OK_COLOR, MISSING_COLOR = "#c0392b", "#2e8b57", "#7f7f7f"


@dataclass(frozen=True)
class CheckLine:
    """One line of the panel: its text and whether it passed, is flagged or is absent."""

    text: str
    state: str  # OK, FLAG or MISSING


def _finite(part: dict[str, Any], key: str) -> float:
    value = float(part[key])
    if not math.isfinite(value):
        raise ValueError(key)
    return value


def _absent(what: str, part: Any) -> CheckLine | None:
    """The line for a part that was not measured, or None when it has figures."""
    if part is None:
        return CheckLine(f"{what}: not measured for this run.", MISSING)
    if not isinstance(part, dict):
        return CheckLine(f"{what}: the worker sent no figures.", MISSING)
    if "error" in part:
        return CheckLine(f"{what} could not be measured: {part['error']}", MISSING)
    return None


def parity_line(parity: Any) -> CheckLine:
    absent = _absent("Parity (trainer vs llama.cpp)", parity)
    if absent is not None:
        return absent
    try:
        top1 = _finite(parity, "top1_agreement")
        mean_abs = _finite(parity, "mean_abs_logprob_diff")
        max_abs = parity.get("max_abs_logprob_diff")
        positions = parity.get("positions")
    except (KeyError, TypeError, ValueError):
        return CheckLine("Parity (trainer vs llama.cpp): the worker's figures are "
                         "incomplete.", MISSING)
    extra = f", max {float(max_abs):.2f}" if isinstance(max_abs, int | float) else ""
    where = f" over {int(positions):,} positions" if isinstance(positions, int) else ""
    text = (f"Trainer and llama.cpp agree on the next token {100 * top1:.1f} % of the "
            f"time{where} (mean |Δ log p| {mean_abs:.3f} nats{extra}), the adapter on both.")
    if top1 < TOP1_LIMIT:
        return CheckLine(f"{text} Below the {100 * TOP1_LIMIT:.0f} % the parity gate "
                         "requires: the served adapter may not do what training measured.",
                         FLAG)
    return CheckLine(text, OK)


def drift_line(drift: Any) -> CheckLine:
    absent = _absent("Drift on unrelated text", drift)
    if absent is not None:
        return absent
    try:
        base, variant = _finite(drift, "base"), _finite(drift, "variant")
        delta = _finite(drift, "delta") if "delta" in drift else variant - base
        tokens = drift.get("tokens")
    except (KeyError, TypeError, ValueError):
        return CheckLine("Drift on unrelated text: the worker's figures are incomplete.",
                         MISSING)
    where = f" over {int(tokens):,} tokens" if isinstance(tokens, int) else ""
    text = f"Unrelated text: {base:.3f} → {variant:.3f} nats/token ({delta:+.3f}){where}."
    if delta > DRIFT_LIMIT:
        return CheckLine(f"{text} More than +{DRIFT_LIMIT:g}: the adapter also changes "
                         "how the model reads text outside its task; \"Stay near the "
                         "base (KL)\", measured on a file of such text, under Advanced "
                         "settings holds it down.", FLAG)
    return CheckLine(text, OK)


class ServedCheckPanel(QGroupBox):
    """`show_checks(checks)` after a run, `clear()` before the next; `lines` holds the
    two CheckLines shown (parity, drift), `parity` and `drift` their text labels."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Served check", parent)
        self.setToolTip("The new adapter measured as it is served: the trainer against "
                        "llama.cpp (parity) and unrelated prose (drift)")
        layout = QGridLayout(self)
        layout.setColumnStretch(1, 1)
        self.marks = (QLabel(), QLabel())
        self.parity, self.drift = QLabel(), QLabel()
        for row, (mark, label) in enumerate(zip(self.marks, (self.parity, self.drift),
                                                strict=True)):
            label.setWordWrap(True)
            # Error messages come from the worker: never interpreted as rich text.
            label.setTextFormat(Qt.TextFormat.PlainText)
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            mark.setAlignment(Qt.AlignmentFlag.AlignTop)
            layout.addWidget(mark, row, 0)
            layout.addWidget(label, row, 1)
        self.lines: tuple[CheckLine, ...] = ()
        self.clear()

    def clear(self) -> None:
        self.lines = ()
        for label in (*self.marks, self.parity, self.drift):
            label.clear()
        self.hide()

    def flagged(self) -> bool:
        return any(line.state == FLAG for line in self.lines)

    def show_checks(self, checks: Any) -> None:
        checks = checks if isinstance(checks, dict) else {}
        self.lines = (parity_line(checks.get("parity")), drift_line(checks.get("drift")))
        for mark, label, line in zip(self.marks, (self.parity, self.drift), self.lines,
                                     strict=True):
            mark.setText({OK: "✓", FLAG: "⚠", MISSING: "–"}[line.state])
            mark.setStyleSheet("font-weight:bold;color:"
                               + {OK: OK_COLOR, FLAG: FLAG_COLOR, MISSING: MISSING_COLOR}
                               [line.state])
            label.setText(line.text)
            # A flag in bold red, seen without reading every figure; a pass in the
            # palette's text colour (dark and light themes), an absence greyed.
            label.setStyleSheet({OK: "", FLAG: f"color:{FLAG_COLOR};font-weight:bold",
                                 MISSING: f"color:{MISSING_COLOR}"}[line.state])
        self.setTitle("Served check: needs a look" if self.flagged() else "Served check")
        self.show()
