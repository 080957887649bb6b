"""The Train page's plot: the training loss per step, drawn as it arrives (QtCharts;
values on hover)."""

from __future__ import annotations

import math

from PySide6.QtCharts import QScatterSeries
from PySide6.QtCore import QPointF
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QWidget

from gui.widgets.charting import ChartView

LOSS_COLOR = QColor("#e0762b")


class LossChart(ChartView):
    """`reset(steps)` before a run, `add(step, loss)` per step; `points` holds them."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("the loss appears here while training runs", "step", "loss", parent)
        self.setMinimumHeight(180)
        self.setToolTip("training loss per step")
        self.points: list[tuple[int, float]] = []
        self.steps = 0
        self.series = self.line("loss", LOSS_COLOR, 1.8)
        self.last = QScatterSeries()  # a dot on the newest step
        self.last.setMarkerSize(7)
        self.last.setColor(LOSS_COLOR)
        self.last.setBorderColor(LOSS_COLOR)
        self.attach(self.last, legend=False)
        self.chart_.legend().hide()  # one line: the axis title says what it is
        self.y_axis.setLabelFormat("%.2f")
        self.y_axis.setTickCount(5)
        self.series.hovered.connect(lambda point, state: state and self._hover(point))
        self.reset(0)

    def reset(self, steps: int) -> None:
        self.points, self.steps = [], steps
        self.series.clear()
        self._update()

    def add(self, step: int, loss: float) -> None:
        if math.isfinite(loss):
            self.points.append((step, loss))
            self.series.append(QPointF(step, loss))
            self._update()

    def _update(self) -> None:
        last = max(self.steps, self.points[-1][0] if self.points else 0, 2)
        values = [v for _, v in self.points]
        high = max(values, default=1.0)
        low = min(min(values, default=0.0), 0.0)
        self.set_x_range(1, last)
        self.y_axis.setRange(low, high if high > low else low + 1.0)
        self.last.replace([QPointF(*self.points[-1])] if self.points else [])
        self.show_hint(not self.points)

    def _hover(self, point: QPointF) -> None:
        if not self.points:
            return
        step, loss = min(self.points, key=lambda p: abs(p[0] - point.x()))
        self.tooltip(f"step {step}: loss {loss:.4f}")
