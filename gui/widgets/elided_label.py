"""A one-line label that never pushes its layout: the text is elided to the width it
is given (at the end, or in the middle for paths and names whose end tells them
apart), with the whole text as its tooltip whenever it is cut."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QPainter, QPaintEvent
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget


class ElidedLabel(QLabel):
    """Plain text only (`setText` takes the full text; `text()` returns it)."""

    def __init__(self, text: str = "", mode: Qt.TextElideMode = Qt.TextElideMode.ElideRight,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.mode = mode
        self._full = ""
        self._tip = ""
        self.setTextFormat(Qt.TextFormat.PlainText)
        # Takes the width it is given, asks for almost none: a long text cannot widen
        # the window or move a splitter.
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.setText(text)

    def setText(self, text: str) -> None:  # noqa: N802 (Qt's name)
        self._full = text or ""
        super().setText(self._full)
        self._update_tip()

    def text(self) -> str:
        return self._full

    def setToolTip(self, tip: str) -> None:  # noqa: N802
        """An explicit tooltip, shown whether or not the text is cut."""
        self._tip = tip
        super().setToolTip(tip)

    def elided(self) -> str:
        """What is drawn at the current width."""
        return self.fontMetrics().elidedText(self._full, self.mode, max(0, self.width()))

    def is_elided(self) -> bool:
        return self.elided() != self._full

    def minimumSizeHint(self) -> QSize:  # noqa: N802
        return QSize(self.fontMetrics().horizontalAdvance("…") * 3,
                     super().minimumSizeHint().height())

    def sizeHint(self) -> QSize:  # noqa: N802
        return QSize(min(self.fontMetrics().horizontalAdvance(self._full) + 4, 400),
                     super().sizeHint().height())

    def resizeEvent(self, event) -> None:  # noqa: N802, ANN001
        super().resizeEvent(event)
        self._update_tip()

    def _update_tip(self) -> None:
        if not self._tip:
            QLabel.setToolTip(self, self._full if self.is_elided() else "")

    def paintEvent(self, _event: QPaintEvent) -> None:  # noqa: N802
        painter = QPainter(self)
        painter.setPen(self.palette().color(self.foregroundRole()))
        painter.drawText(self.contentsRect(), int(self.alignment() | Qt.AlignmentFlag.AlignVCenter),
                         self.elided())
