"""The QtCharts plots (gui/widgets), offscreen: what they plot, the hint while empty,
and the value under the pointer."""

from __future__ import annotations

import math

from PySide6.QtCore import QPointF

from gui.widgets.logprob_chart import LogprobChart
from gui.widgets.loss_chart import LossChart


def points(series) -> list[tuple[float, float]]:
    return [(p.x(), p.y()) for p in series.points()]


def test_logprob_chart_plots_both_sides_and_marks_the_divergence(qtbot, monkeypatch) -> None:
    chart = LogprobChart()
    qtbot.addWidget(chart)
    assert chart.chart_.title().startswith("run a comparison")  # the hint while empty
    chart.set_data([-0.5, -2.5, -0.25], [-0.125, -0.75], 1,
                   {"base": ["The", " sea", "!"], "variant": ["A", " wave"]})
    assert points(chart.base_series) == [(0, -0.5), (1, -2.5), (2, -0.25)]
    assert points(chart.variant_series) == [(0, -0.125), (1, -0.75)]
    # Room below the lowest value and above 0: no point on the edge, no line cut.
    low, high = chart.y_axis.min(), chart.y_axis.max()
    assert -3.0 < low < -2.5 and 0.0 < high < 0.5
    assert points(chart.divergence_line) == [(1, low), (1, high)]
    assert chart.minimumHeight() >= 220
    assert chart.rubberBand() == chart.RubberBand.HorizontalRubberBand  # drag to zoom
    assert (chart.x_axis.min(), chart.x_axis.max()) == (0, 2) and chart.chart_.title() == ""
    shown: list[str] = []
    monkeypatch.setattr(chart, "tooltip", shown.append)
    chart._hover("base", QPointF(1.2, -2.0))
    chart._hover("variant", QPointF(0.4, -0.1))
    assert shown == ["base token 1 ' sea': log p -2.500 (first divergence)",
                     "variant token 0 'A': log p -0.125"]
    chart.set_data([], [], None)
    assert points(chart.base_series) == [] and points(chart.divergence_line) == []
    assert chart.chart_.title().startswith("run a comparison")


def test_loss_chart_draws_the_loss_as_it_arrives(qtbot, monkeypatch) -> None:
    chart = LossChart()
    qtbot.addWidget(chart)
    assert chart.chart_.title().startswith("the loss appears here")
    chart.reset(10)
    for step, loss in ((1, 2.5), (2, math.nan), (3, 1.25)):  # a NaN step is not drawn
        chart.add(step, loss)
    assert chart.points == [(1, 2.5), (3, 1.25)]
    assert points(chart.series) == [(1, 2.5), (3, 1.25)] and points(chart.last) == [(3, 1.25)]
    assert (chart.x_axis.min(), chart.x_axis.max()) == (1, 10)
    assert (chart.y_axis.min(), chart.y_axis.max()) == (0.0, 2.5)
    shown: list[str] = []
    monkeypatch.setattr(chart, "tooltip", shown.append)
    chart._hover(QPointF(2.8, 1.3))
    assert shown == ["step 3: loss 1.2500"]
    chart.reset(5)
    assert chart.points == [] and points(chart.series) == [] and points(chart.last) == []
