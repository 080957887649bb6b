"""The Train page's plot for the reinforcement loop: per round, the mean reward (with
its min–max band) and how well the trainer agrees with the sampler (the share of
sampled tokens whose log-probabilities are within the tolerance), drawn as each
`round` event arrives (QtCharts; values on hover).

The reward has an axis of its own (left): rewards are often 0..1 but a Python reward
may return any finite number, so the axis is 0..1 only while every value fits. The
agreement is a share, always on a 0..100 % axis (right).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from PySide6.QtCharts import QAreaSeries, QLineSeries, QValueAxis
from PySide6.QtCore import QPointF, Qt
from PySide6.QtGui import QColor, QPen
from PySide6.QtWidgets import QWidget

from gui.widgets.charting import ChartView

REWARD_COLOR = QColor("#2b7de0")
AGREEMENT_COLOR = QColor("#2e9e5b")


@dataclass(frozen=True)
class RoundPoint:
    """One round's figures, as the plot keeps them."""

    round: int
    rounds: int
    mean: float
    low: float
    high: float
    within: float  # share of sampled tokens with |trainer - sampler| <= tolerance
    mean_abs: float  # nats
    tolerance: float  # nats

    @staticmethod
    def from_event(event: dict[str, Any]) -> RoundPoint | None:
        """The figures of a `round` event, or None when they are not finite numbers
        (nothing sensible to draw; the page still shows the event's text)."""
        try:
            reward, agree = event["reward"], event["agreement"]
            values = (float(reward["mean"]), float(reward.get("min", reward["mean"])),
                      float(reward.get("max", reward["mean"])), float(agree["within"]),
                      float(agree["mean_abs"]), float(agree.get("tolerance", 0.05)))
            point = RoundPoint(int(event["round"]), int(event.get("rounds", 0)), *values)
        except (KeyError, TypeError, ValueError):
            return None
        return point if all(math.isfinite(v) for v in values) else None


def _number(value: float) -> str:
    # Rewards are mostly 0..1 (two decimals read well) but may be any size.
    return f"{value:.2f}" if abs(value) < 100 else f"{value:.4g}"


def round_line(point: RoundPoint) -> str:
    """The round in one line: "round 2/4 · reward 0.81 (0.00–1.00) · agreement 97 %
    within 0.05 nats (mean |Δ| 0.040)"."""
    band = (f" ({_number(point.low)}–{_number(point.high)})"
            if point.low != point.high else "")
    of = f"/{point.rounds}" if point.rounds else ""
    return (f"round {point.round}{of} · reward {_number(point.mean)}{band} · agreement "
            f"{100 * point.within:.0f} % within {point.tolerance:g} nats "
            f"(mean |Δ| {point.mean_abs:.3f})")


class RoundsChart(ChartView):
    """`reset(rounds)` before a run, `add(event)` per `round` event; `points` holds
    them (one RoundPoint per round)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        # Set before the base class colours the axes (it calls _apply_palette).
        self.agree_axis = QValueAxis()
        super().__init__("reward and agreement per round appear here while the loop runs",
                         "round", "reward", parent)
        self.setMinimumHeight(200)
        self.points: list[RoundPoint] = []
        self.rounds = 0
        # The min-max band under the mean: where a round's samples scored.
        self.band_upper, self.band_lower = QLineSeries(), QLineSeries()
        self.band = QAreaSeries(self.band_upper, self.band_lower)
        self.band.setName("reward min–max")
        fill = QColor(REWARD_COLOR)
        fill.setAlpha(45)
        self.band.setBrush(fill)
        edge = QColor(REWARD_COLOR)
        edge.setAlpha(90)  # a faint edge: the legend's marker shows the band's colour
        self.band.setPen(QPen(edge, 0.8))
        self.attach(self.band)
        self.reward = self.line("mean reward", REWARD_COLOR, 2.0)
        self.reward.setPointsVisible(True)  # round 1 alone is a point, not a line
        self.agreement = QLineSeries()
        self.agreement.setName("agreement (share within tolerance)")
        pen = QPen(AGREEMENT_COLOR, 1.8)
        pen.setStyle(Qt.PenStyle.DashLine)
        self.agreement.setPen(pen)
        self.agreement.setPointsVisible(True)
        self.chart_.addSeries(self.agreement)
        self.agree_axis.setTitleText("agreement")
        self.agree_axis.setLabelsFont(self.y_axis.labelsFont())
        self.agree_axis.setTitleFont(self.y_axis.titleFont())
        self.agree_axis.setRange(0.0, 100.0)  # a share: plotted in percent
        self.agree_axis.setLabelFormat("%.0f%%")
        self.agree_axis.setTickCount(3)
        self.chart_.addAxis(self.agree_axis, Qt.AlignmentFlag.AlignRight)
        self.agreement.attachAxis(self.x_axis)
        self.agreement.attachAxis(self.agree_axis)
        self.chart_.legend().setAlignment(Qt.AlignmentFlag.AlignBottom)
        self.y_axis.setLabelFormat("%.2f")
        for series in (self.reward, self.agreement):
            series.hovered.connect(lambda point, state: state and self._hover(point))
        self._apply_palette()
        self.reset(0)

    def reset(self, rounds: int) -> None:
        self.points, self.rounds = [], rounds
        for series in (self.reward, self.agreement, self.band_upper, self.band_lower):
            series.clear()
        self._update()

    def add(self, event: dict[str, Any]) -> RoundPoint | None:
        """Plot a `round` event; returns its figures (None when it had none to plot)."""
        point = RoundPoint.from_event(event)
        if point is None:
            return None
        self.points.append(point)
        self.rounds = max(self.rounds, point.rounds)
        self.reward.append(QPointF(point.round, point.mean))
        self.band_upper.append(QPointF(point.round, point.high))
        self.band_lower.append(QPointF(point.round, point.low))
        self.agreement.append(QPointF(point.round, 100.0 * point.within))
        self._update()
        return point

    def reward_range(self) -> tuple[float, float]:
        """The reward axis: 0..1 while every value fits, else the values' span padded."""
        values = [v for p in self.points for v in (p.low, p.high, p.mean)]
        if not values or (min(values) >= 0.0 and max(values) <= 1.0):
            return 0.0, 1.0
        low, high = min(values), max(values)
        pad = 0.05 * (high - low) if high > low else max(abs(high) * 0.1, 1.0)
        return low - pad, high + pad

    def _update(self) -> None:
        last = max(self.rounds, self.points[-1].round if self.points else 0, 2)
        self.set_x_range(1, last)
        self.y_axis.setRange(*self.reward_range())
        self.show_hint(not self.points)

    def _hover(self, point: QPointF) -> None:
        if not self.points:
            return
        nearest = min(self.points, key=lambda p: abs(p.round - point.x()))
        self.tooltip(round_line(nearest))

    def _apply_palette(self) -> None:
        super()._apply_palette()
        axis = getattr(self, "agree_axis", None)
        if axis is not None:
            # The second axis follows the theme like the base class's two.
            axis.setLabelsColor(self.x_axis.labelsColor())
            axis.setTitleBrush(self.x_axis.titleBrush())
            axis.setGridLineVisible(False)  # the reward axis's grid is enough
            axis.setLinePenColor(self.x_axis.linePenColor())
