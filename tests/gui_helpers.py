"""Helpers shared by the window tests: wait bounds, a Train page, the wizard's background
steps, and driving a modal dialog from inside its own event loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QTimer

# ms. LONG bounds work through the real engine on a loaded CI machine (never waited out
# normally); SHORT bounds conditions of the window alone, so a regression there fails
# in seconds instead of hiding behind a ten-minute wait.
LONG = 600_000
SHORT = 10_000


def make_train_page(qtbot: Any) -> Any:  # -> gui.train_page.TrainPage
    """A Train page over a fresh catalog (the test's data directory), with its own
    catalog events."""
    from engine.catalog.store import Catalog
    from engine.curated import setup
    from gui.catalog_events import CatalogEvents
    from gui.controllers.training import TrainingController
    from gui.train_page import TrainPage

    catalog = Catalog()
    setup.first_run(catalog)
    events = CatalogEvents()
    widget = TrainPage(TrainingController(catalog, events))
    widget._events = events  # kept alive with the page
    qtbot.addWidget(widget)
    return widget


def wait_step(qtbot: Any, dialog: Any) -> None:
    """Wait until the import wizard's step work (inspection, validation) was applied."""
    if dialog.step_task is not None:
        with qtbot.waitSignal(dialog.stepReady, timeout=LONG):
            pass


def drive_modal(find: Callable[[], Any], act: Callable[[Any], None]) -> None:
    """Run `act(dialog)` once the modal dialog that `find()` returns is up; a dialog
    still open afterwards is rejected, so its exec() can never hang the test."""
    def attempt() -> None:
        dialog = find()
        if dialog is None or not dialog.isVisible():
            QTimer.singleShot(0, attempt)  # the next turn of the dialog's own event loop
            return
        try:
            act(dialog)
        finally:
            if dialog.isVisible():
                dialog.reject()

    QTimer.singleShot(0, attempt)
