"""The first window opens offscreen and lists the catalog."""

from __future__ import annotations

from pathlib import Path

from engine.catalog import Catalog
from engine.defaults import DEFAULT_MODEL_NAME


def test_main_window_lists_the_embedded_base(studio_home: Path, qtbot) -> None:
    from gui.app import MainWindow

    catalog = Catalog()
    catalog.ensure_initialized()
    window = MainWindow(catalog)
    qtbot.addWidget(window)
    assert window.windowTitle() == "Variant Studio"
    models = window.tree.topLevelItem(0)
    assert models.child(0).text(0) == DEFAULT_MODEL_NAME
