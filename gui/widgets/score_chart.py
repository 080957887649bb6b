"""The Evaluate view's plot, one per scored model: mean NLL per token of each item
(QtCharts), the items whose greedy answer missed the expected one marked, values on
hover."""

from __future__ import annotations

from PySide6.QtCharts import QScatterSeries
from PySide6.QtCore import QPointF
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QWidget

from engine.runtime.results import ScoreResult, ScoreRow
from gui.widgets.charting import ChartView

NLL_COLOR = QColor("#2f6fdf")
MISS_COLOR = QColor("#d23c3c")


class ScoreChart(ChartView):
    """`set_result(result)`: an engine `score` result; item number on x (1-based, in
    the data's order), mean NLL per token of that item on y (lower = more expected)."""

    def __init__(self, title: str = "", parent: QWidget | None = None) -> None:
        super().__init__("scores appear here", "item", "NLL/token", parent)
        self.setMinimumHeight(150)
        self.setToolTip("mean negative log-likelihood per token of each item (lower: the "
                        "model finds the expected text likelier); red: the greedy answer "
                        "differs from the expected one")
        self.name = title
        self.values: list[float] = []
        self.rows: list[ScoreRow] = []
        self.series = self.line(title or "mean NLL", NLL_COLOR)
        self.misses = QScatterSeries()
        self.misses.setName("exact match missed")
        self.misses.setColor(MISS_COLOR)
        self.misses.setMarkerSize(7.0)
        self.attach(self.misses)
        self.series.hovered.connect(lambda point, state: state and self._hover(point))
        self.misses.hovered.connect(lambda point, state: state and self._hover(point))
        self.set_result(None)

    def set_result(self, result: ScoreResult | None) -> None:
        self.rows = list(result.rows) if result is not None else []
        self.values = [r.mean_nll if r.mean_nll is not None else 0.0 for r in self.rows]
        self.series.replace([QPointF(i + 1, v) for i, v in enumerate(self.values)])
        self.misses.replace([QPointF(i + 1, self.values[i]) for i, r in enumerate(self.rows)
                             if r.exact is False])
        high = max(max(self.values, default=1.0), 0.1) * 1.1
        self.set_x_range(1, max(len(self.values), 2))
        self.y_axis.setRange(0.0, high)
        self.y_axis.setLabelFormat("%.2f" if high < 1 else "%.1f")
        self.show_hint(not self.values)

    def _hover(self, point: QPointF) -> None:
        index = self.nearest(point, len(self.values), first=1)
        if index is None:
            return
        row = self.rows[index]
        exact = {True: "exact match", False: "exact match missed", None: ""}[row.exact]
        where = f"line {row.line}" if row.line else f"item {index + 1}"
        self.tooltip(f"{self.name} · {where}: {self.values[index]:.4f} nats/token over "
                     f"{row.tokens} tokens" + (f" · {exact}" if exact else ""))
