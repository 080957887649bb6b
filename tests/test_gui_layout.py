"""The layout holds on laptop screens (1366×768, 1280×800): no view asks for more than
the screen, opening Train's advanced settings scrolls instead of growing the window, a
long chat footer is elided (tooltip: the whole line) without moving a splitter, and the
library keeps long names apart."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QSize
from PySide6.QtWidgets import QApplication

from gui.main_window import MainWindow
from tests.gui_helpers import SHORT


def settle(qtbot, window: MainWindow, size: QSize) -> None:  # noqa: ANN001
    QApplication.processEvents()
    qtbot.waitUntil(lambda: window.layout().totalMinimumSize().height() <= size.height(),
                    timeout=SHORT)


@pytest.mark.parametrize("width,height", [(1366, 768), (1280, 800)])
def test_every_view_fits_a_laptop_screen_and_nothing_grows_the_window(
        window: MainWindow, qtbot, width: int, height: int) -> None:
    size = QSize(width, height)
    window.resize(size)
    qtbot.waitUntil(lambda: window.size() == size, timeout=SHORT)
    for index in range(window.tabs.count()):
        window.tabs.setCurrentIndex(index)
        settle(qtbot, window, size)
        hint = window.minimumSizeHint()
        assert hint.width() <= width and hint.height() <= height, \
            (window.tabs.tabText(index), hint)
        assert window.size() == size

    window.tabs.setCurrentWidget(window.train)
    window.train.advanced_toggle.setChecked(True)
    assert window.train.advanced.isVisibleTo(window.train)
    settle(qtbot, window, size)
    assert window.minimumSizeHint().height() <= height and window.size() == size

    window.tabs.setCurrentWidget(window.chat)
    QApplication.processEvents()
    sizes = window.splitter.sizes()
    chat_sizes = window.chat.splitter.sizes()
    line = "smollm2-135m-instruct · llama.cpp · " + "a very long footer " * 60 + "· the end"
    window.chat.status.setText(line)
    QApplication.processEvents()
    assert window.splitter.sizes() == sizes and window.chat.splitter.sizes() == chat_sizes
    assert window.size() == size
    status = window.chat.status
    assert status.is_elided() and status.toolTip() == line and status.text() == line
    assert status.elided().endswith("…")
