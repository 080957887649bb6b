"""What the window's QtCharts plots share: a chart view that follows the palette
(light and dark themes), shows a hint while it has no data, and tells the value under
the pointer in a tooltip."""

from __future__ import annotations

from PySide6.QtCharts import QChart, QChartView, QLineSeries, QValueAxis, QXYSeries
from PySide6.QtCore import QEvent, QMargins, QPointF, Qt
from PySide6.QtGui import QColor, QCursor, QPainter, QPalette, QPen
from PySide6.QtWidgets import QToolTip, QWidget


class ChartView(QChartView):
    """A chart with an x and a y value axis, coloured from the widget's palette."""

    def __init__(self, hint: str, x_title: str, y_title: str,
                 parent: QWidget | None = None) -> None:
        self.chart_ = QChart()
        super().__init__(self.chart_, parent)
        self.hint = hint
        self.setRenderHint(QPainter.RenderHint.Antialiasing)
        chart = self.chart_
        chart.setMargins(QMargins(4, 4, 4, 4))
        chart.setBackgroundRoundness(0)
        chart.legend().setAlignment(Qt.AlignmentFlag.AlignBottom)  # never over a line
        self.x_axis, self.y_axis = QValueAxis(), QValueAxis()
        self.x_axis.setTitleText(x_title)
        self.y_axis.setTitleText(y_title)
        self.x_axis.setLabelFormat("%d")
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
