"""What the window's QtCharts plots share: a chart view that follows the palette
(light and dark themes), shows a hint while it has no data, and tells the value under
the pointer in a tooltip."""

from __future__ import annotations

from PySide6.QtCharts import QChart, QChartView, QLineSeries, QValueAxis, QXYSeries
from PySide6.QtCore import QEvent, QMargins, QPointF, Qt
from PySide6.QtGui import QColor, QCursor, QFont, QPainter, QPalette, QPen
from PySide6.QtWidgets import QToolTip, QWidget


def nice_step(span: float, ticks: int) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, ... that cuts `span` into at most `ticks`."""
    step = 1
    while span / step > ticks:
        for factor in (2, 2.5, 2):  # 1 -> 2 -> 5 -> 10 -> 20 -> 50 ...
            step = int(step * factor)
            if span / step <= ticks:
                break
    return step


class ChartView(QChartView):
    """A chart with an x and a y value axis, coloured from the widget's palette."""

    def __init__(self, hint: str, x_title: str, y_title: str,
                 parent: QWidget | None = None) -> None:
        self.chart_ = QChart()
        super().__init__(self.chart_, parent)
        self.hint = hint
        self.setRenderHint(QPainter.RenderHint.Antialiasing)
        chart = self.chart_
        chart.setMargins(QMargins(2, 2, 2, 2))
        chart.setBackgroundRoundness(0)
        # Beside the plot, never over a line, and not taking height from a short plot.
        chart.legend().setAlignment(Qt.AlignmentFlag.AlignRight)
        self.x_axis, self.y_axis = QValueAxis(), QValueAxis()
        small = QFont(self.font())
        small.setPointSizeF(max(6.5, small.pointSizeF() * 0.85))
        for axis, title in ((self.x_axis, x_title), (self.y_axis, y_title)):
            axis.setTitleText(title)
            axis.setLabelsFont(small)
            axis.setTitleFont(small)
        chart.legend().setFont(small)
        self.x_axis.setLabelFormat("%d")
        self.y_axis.setLabelFormat("%.1f")
        self.y_axis.setTickCount(3)  # a short plot: more labels would not fit
        chart.addAxis(self.x_axis, Qt.AlignmentFlag.AlignBottom)
        chart.addAxis(self.y_axis, Qt.AlignmentFlag.AlignLeft)
        self._apply_palette()

    def line(self, name: str, color: QColor, width: float = 1.6,
             style: Qt.PenStyle = Qt.PenStyle.SolidLine, legend: bool = True
             ) -> QLineSeries:
        series = QLineSeries()
        series.setName(name)
        pen = QPen(color, width)
        pen.setStyle(style)
        series.setPen(pen)
        self.attach(series, legend)
        return series

    def attach(self, series: QXYSeries, legend: bool = True) -> None:
        self.chart_.addSeries(series)
        series.attachAxis(self.x_axis)
        series.attachAxis(self.y_axis)
        if not legend:
            for marker in self.chart_.legend().markers(series):
                marker.setVisible(False)

    def set_x_range(self, low: int, high: int) -> None:
        """An integer axis (tokens, steps) with ticks on round numbers: 1, 2, 5, 10, ..."""
        self.x_axis.setRange(low, high)
        self.x_axis.setTickType(QValueAxis.TickType.TicksDynamic)
        self.x_axis.setTickAnchor(0)
        self.x_axis.setTickInterval(nice_step(high - low, 8))

    def show_hint(self, empty: bool) -> None:
        """The hint as the chart's title while there is nothing to plot."""
        self.chart_.setTitle(self.hint if empty else "")

    def tooltip(self, text: str) -> None:
        QToolTip.showText(QCursor.pos(), text, self)

    @staticmethod
    def nearest(point: QPointF, count: int, first: int = 0) -> int | None:
        """The index of the sample nearest to a hovered point (x = first + index)."""
        if count == 0:
            return None
        return max(0, min(count - 1, round(point.x()) - first))

    # ------------------------------------------------------------------ palette

    def changeEvent(self, event: QEvent) -> None:
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange):
            self._apply_palette()
        super().changeEvent(event)

    def _apply_palette(self) -> None:
        palette = self.palette()
        text = palette.color(QPalette.ColorRole.Text)
        grid = QColor(text)
        grid.setAlpha(50)
        self.chart_.setBackgroundBrush(palette.color(QPalette.ColorRole.Base))
        self.chart_.setTitleBrush(text)
        self.chart_.legend().setLabelColor(text)
        for axis in (self.x_axis, self.y_axis):
            axis.setLabelsColor(text)
            axis.setTitleBrush(text)
            axis.setGridLineColor(grid)
            axis.setLinePenColor(grid)
