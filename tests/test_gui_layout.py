"""The layout holds on laptop screens (1366×768, 1280×800): no view asks for more than
the screen, opening Train's advanced settings scrolls instead of growing the window, a
long chat footer is elided (tooltip: the whole line) without moving a splitter, and the
library keeps long names apart. A finished comparison's long headers neither grow the
window (1024×700, 1280×800) nor squeeze the library, which cannot be collapsed; at
1280×800 the library shows its names whole."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QSize
from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import QApplication

from engine.curated.demo import VARIANT_NAME
from engine.runtime.results import CompareResult
from gui.library import display_name, name_font, name_room
from gui.main_window import MainWindow
from tests.gui_helpers import SHORT
from tests.test_gui_compare import side

LIBRARY_MIN = 180  # px: the library's names stay readable (about 30 characters)


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


def finish_a_comparison(window: MainWindow) -> None:
    """A comparison as a run ends it: the titles the view gives the chosen variant, then
    the result with both sides cut at max tokens and each side's first-token time."""
    view = window.compare
    window.tabs.setCurrentWidget(view)
    view.select_variant(VARIANT_NAME)
    view._choice_changed()
    view.params = {"prompt": {"text": "Describe the sea in a long paragraph " * 4,
                              "chat": True},
                   "sampling": {"max_tokens": 64, "temperature": 0.0, "stop": []}}
    view.first_token_seconds = {"base": 9.48, "variant": 10.21}
    result = CompareResult.from_dict({
        "base": side([" the sea"] * 64, "smollm2-135m-instruct", "length"),
        "variant": side([" waves"] * 64, VARIANT_NAME, "length"),
        "first_divergence": 0, "adapter_effect": 0.72})
    view.show_result(result)
    for _ in range(3):
        QApplication.processEvents()
    assert "first token 9.48 s · cut at max tokens (64)" in view.base_side.title.text()


@pytest.mark.parametrize("width,height", [(1024, 700), (1280, 800)])
def test_a_finished_comparison_neither_grows_the_window_nor_squeezes_the_library(
        window: MainWindow, qtbot, width: int, height: int) -> None:
    size = QSize(width, height)
    window.resize(size)
    qtbot.waitUntil(lambda: window.size() == size, timeout=SHORT)
    finish_a_comparison(window)
    assert window.minimumSizeHint().width() <= width, window.minimumSizeHint()
    assert window.size() == size
    assert window.library.width() >= LIBRARY_MIN, window.splitter.sizes()
    # A drag cannot collapse the library.
    window.splitter.moveSplitter(0, 1)
    QApplication.processEvents()
    assert window.library.width() >= LIBRARY_MIN, window.splitter.sizes()
    # Nor can a state saved with it collapsed (as the window could before): restored,
    # the library is back at its minimum and a drag still cannot collapse it.
    window.splitter.setChildrenCollapsible(True)
    window.splitter.moveSplitter(0, 1)
    assert window.splitter.sizes()[0] == 0
    window.save_state()
    restored = MainWindow()
    qtbot.addWidget(restored)
    restored.show()
    QApplication.processEvents()
    assert restored.library.width() >= LIBRARY_MIN, restored.splitter.sizes()
    restored.splitter.moveSplitter(0, 1)
    QApplication.processEvents()
    assert restored.library.width() >= LIBRARY_MIN, restored.splitter.sizes()
    restored.close()


def assert_names_whole(window: MainWindow) -> None:
    """Every section title and entry name is drawn whole in its row."""
    tree = window.library.tree
    model = tree.model()
    plain = QFontMetrics(tree.font())
    bold = QFontMetrics(name_font(tree.font()))
    names = []
    for section in range(model.rowCount()):
        index = model.index(section, 0)
        title = str(index.data())
        assert plain.horizontalAdvance(title) <= tree.visualRect(index).width(), title
        for row in range(model.rowCount(index)):
            entry = model.index(row, 0, index)
            name = str(entry.data())
            names.append(name)
            room = name_room(tree.visualRect(entry).width())
            assert bold.horizontalAdvance(name) <= room, (name, room, window.splitter.sizes())
            assert display_name(bold, name, room) == name
    assert "smollm2-135m-instruct-openvino" in names


def test_the_library_shows_whole_names_at_1280(window: MainWindow, qtbot) -> None:
    size = QSize(1280, 800)
    window.resize(size)
    qtbot.waitUntil(lambda: window.size() == size, timeout=SHORT)
    QApplication.processEvents()
    assert_names_whole(window)
    # Made narrow and widened again, after a finished comparison, on every tab.
    small = QSize(1024, 700)
    window.resize(small)
    qtbot.waitUntil(lambda: window.size() == small, timeout=SHORT)
    finish_a_comparison(window)
    window.resize(size)
    qtbot.waitUntil(lambda: window.size() == size, timeout=SHORT)
    for index in range(window.tabs.count()):
        window.tabs.setCurrentIndex(index)
        QApplication.processEvents()
        assert_names_whole(window)
