"""The comparison's plot: per-token log-probability of the chosen token, base and
variant, with the first divergence marked (QtCharts; values on hover; drag to zoom
into a range of tokens, right-click to zoom out, double-click to see everything).
The y axis has room below the lowest value and above 0, so no point sits on the edge
and no line is cut."""

from __future__ import annotations

import math

from PySide6.QtCharts import QChartView
from PySide6.QtCore import QPointF, Qt
from PySide6.QtGui import QColor, QMouseEvent
from PySide6.QtWidgets import QWidget

from gui.widgets.charting import ChartView

BASE_COLOR = QColor("#2f6fdf")
VARIANT_COLOR = QColor("#e0762b")


class LogprobChart(ChartView):
    """`set_data(base, variant, divergence)`: log p per token of each side (token
    index on x, 0 at the top), a dashed line at the first divergence."""

    def __init__(self, parent: QWidget | None = None) -> None:
        # In words on the plot itself; the figures' names (log-probability per token)
        # in its tooltip and on hover.
        super().__init__("run a comparison to see how sure each side was of each word",
                         "position in the answer", "how sure (higher: surer)", parent)
        self.setMinimumHeight(220)
        self.setRubberBand(QChartView.RubberBand.HorizontalRubberBand)
        self.setToolTip("log-probability of each chosen token (higher = more confident); "
                        "the dashed line marks the first divergence. Drag to zoom, "
                        "right-click to zoom out, double-click to see every token")
        self.base: list[float] = []
        self.variant: list[float] = []
        self.divergence: int | None = None
        self.texts: dict[str, list[str]] = {"base": [], "variant": []}
        grid = QColor("#888888")
        self.divergence_line = self.line("first divergence", grid, 1.0,
                                         Qt.PenStyle.DashLine, legend=False)
        self.base_series = self.line("base", BASE_COLOR)
        self.variant_series = self.line("variant", VARIANT_COLOR)
        self.base_series.hovered.connect(
            lambda point, state: state and self._hover("base", point))
        self.variant_series.hovered.connect(
            lambda point, state: state and self._hover("variant", point))
        self.set_data([], [], None)

    def set_data(self, base: list[float], variant: list[float], divergence: int | None,
                 texts: dict[str, list[str]] | None = None) -> None:
        self.base, self.variant, self.divergence = list(base), list(variant), divergence
        self.texts = texts or {"base": [], "variant": []}
        finite = [v for v in self.base + self.variant if math.isfinite(v)]
        lowest = min(min(finite, default=-1.0), -1.0)
        # -inf (a token the sampler could never pick) is drawn at the floor, not lost.
        floor = lowest - max(0.08 * -lowest, 0.1)
        self.base_series.replace([QPointF(i, v if math.isfinite(v) else floor)
                                  for i, v in enumerate(self.base)])
        self.variant_series.replace([QPointF(i, v if math.isfinite(v) else floor)
                                     for i, v in enumerate(self.variant)])
        count = max(len(self.base), len(self.variant))
        self.chart_.zoomReset()
        self.set_x_range(0, max(count - 1, 1))
        top = max(0.05 * -lowest, 0.05)
        self.y_axis.setRange(floor, top)
        if divergence is not None and divergence < count:
            self.divergence_line.replace([QPointF(divergence, floor),
                                          QPointF(divergence, top)])
        else:
            self.divergence_line.clear()
        self.show_hint(count == 0)

    def mouseDoubleClickEvent(self, event: QMouseEvent) -> None:
        self.chart_.zoomReset()
        super().mouseDoubleClickEvent(event)

    def _hover(self, side: str, point: QPointF) -> None:
        values = self.base if side == "base" else self.variant
        index = self.nearest(point, len(values))
        if index is None:
            return
        texts = self.texts.get(side) or []
        token = f" {texts[index]!r}" if index < len(texts) else ""
        mark = " (first divergence)" if index == self.divergence else ""
        self.tooltip(f"{side} token {index}{token}: log p {values[index]:.3f}{mark}")
