"""The Train page at first sight (issue 28, item 6): it starts on the shipped demo data
(a note says whose it is; once another file is named, "Use the demo data" brings it
back), and at 1024×700 the loss plot stays whole in view beside the form, with the
served check, the memory line and a warning shown."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QRect, QSize
from PySide6.QtWidgets import QApplication, QWidget

from engine.curated import demo
from gui.main_window import MainWindow
from tests.gui_helpers import SHORT, make_train_page

DEMO_DATA = demo.resources_dir() / "train.jsonl"
# A flagged drift explains itself at length: the tallest served check there is.
CHECKS = {"parity": {"top1_agreement": 0.984, "mean_abs_logprob_diff": 0.057,
                     "max_abs_logprob_diff": 0.41, "positions": 4096},
          "drift": {"base": 2.9, "variant": 3.1, "delta": 0.2, "tokens": 2000}}


def test_the_page_starts_on_the_demo_data_and_offers_it_back(qtbot, studio_home: Path,
                                                            tmp_path: Path) -> None:
    page = make_train_page(qtbot)
    page.show()
    assert DEMO_DATA.is_file()
    assert page.data.text() == str(DEMO_DATA)
    assert page.request().data == str(DEMO_DATA)
    assert page.data_note.isVisibleTo(page)
    assert page.data_note.text() == f"The demo data {demo.ADAPTER_NAME} was trained on"

    mine = tmp_path / "mine.jsonl"
    page.data.setText(str(mine))
    assert page.data_note.isVisibleTo(page) and "Use the demo data" in page.data_note.text()
    page.data_note.linkActivated.emit("demo")
    assert page.data.text() == str(DEMO_DATA)
    assert page.data_note.text() == f"The demo data {demo.ADAPTER_NAME} was trained on"

    # The reinforcement method has no data field, nor its note.
    page.method.setCurrentIndex(page.method.findData("reinforce"))
    assert not page.data_note.isVisibleTo(page) and not page.data.isVisibleTo(page)
    page.method.setCurrentIndex(page.method.findData("supervised"))
    assert page.data_note.isVisibleTo(page)


def visible_in(widget: QWidget, window: QWidget) -> QRect:
    """`widget`'s rectangle in `window`'s coordinates."""
    return QRect(widget.mapTo(window, widget.rect().topLeft()), widget.size())


def test_the_loss_plot_stays_in_view_at_1024x700_with_the_served_check(
        window: MainWindow, qtbot) -> None:
    size = QSize(1024, 700)
    window.resize(size)
    qtbot.waitUntil(lambda: window.size() == size, timeout=SHORT)
    assert window.banner.isVisible()  # the first run's welcome takes its height too
    page = window.train
    window.tabs.setCurrentWidget(page)
    page.plot.reset(100)
    page.progress.setRange(0, 100)
    page.progress.setValue(100)
    page._status("Finished: step 100 of 100, loss 0.123.")
    page.memory.setText("Estimated peak memory 1.2 GiB (base mapped, 0.4 GiB of "
                        "activations); 0.8 s per step.")
    page.memory.show()
    page._warning("3 examples were cut at the sequence length")
    page._checks(CHECKS)  # as the training worker's event delivers it
    assert page.served.flagged()
    page.advanced_toggle.setChecked(True)  # the form's own height never moves the plot
    for _ in range(3):
        QApplication.processEvents()

    assert window.size() == size and window.minimumSizeHint().height() <= size.height()
    plot = visible_in(page.plot, window)
    viewport = visible_in(page.run_column, window)
    assert page.plot.height() >= 180, page.plot.height()
    assert viewport.contains(plot), (plot, viewport)
    assert window.rect().contains(plot), (plot, window.rect())
    # The served check is there, below the plot (its own area scrolls to it), and the
    # plot's column keeps a sensible width beside the form.
    assert page.served.isVisibleTo(page)
    assert visible_in(page.reports, window).top() >= plot.bottom()
    assert page.plot.width() >= 300, page.splitter.sizes()
    # The form is not cut sideways: its fields are inside its column.
    form = visible_in(page.scroll.viewport(), window)
    assert form.contains(visible_in(page.data, window)), (form, page.data.geometry())
    assert page.scroll.horizontalScrollBar().maximum() == 0


def test_the_served_check_gets_the_height_it_needs_where_there_is_room(
        window: MainWindow, qtbot) -> None:
    size = QSize(1600, 1000)
    window.resize(size)
    qtbot.waitUntil(lambda: window.size() == size, timeout=SHORT)
    page = window.train
    window.tabs.setCurrentWidget(page)
    QApplication.processEvents()
    page._checks(CHECKS)
    for _ in range(3):
        QApplication.processEvents()
    # Whole in view (no scrolling to read it), the plot still taller than its minimum.
    assert page.reports.verticalScrollBar().maximum() == 0, page.run_split.sizes()
    assert visible_in(page.reports.viewport(), window).contains(
        visible_in(page.served, window))
    assert page.plot.height() > 180
