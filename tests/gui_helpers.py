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


class FakeRun:
    """A request started on a `FakeEngine`: remembers being stopped."""

    def __init__(self, request: Any, sink: Any) -> None:
        self.request = request
        self.sink = sink  # deliver its events by hand: sink.tokens(...), sink.finished(...)
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True


class FakeEngine:
    """The engine as a view's controller sees it (`gui.controllers.engine_port.Engine`),
    with no engine process: it keeps each request; the test delivers its events."""

    def __init__(self) -> None:
        self.runs: list[FakeRun] = []

    def start(self, request: Any, sink: Any) -> FakeRun:
        run = FakeRun(request, sink)
        self.runs.append(run)
        return run

    @property
    def last(self) -> FakeRun:
        return self.runs[-1]


def generation_result(text: str, name: str = "model", tokens: list[str] | None = None,
                      finish: str = "eos", **fields: Any) -> Any:
    """A `GenerationResult` as the engine would send it for `text` (one token per piece
    of `tokens`, else one per character)."""
    from engine.runtime.results import GenerationResult

    pieces = tokens if tokens is not None else list(text)
    return GenerationResult.from_dict({
        "name": name, "kind": "variant", "text": text,
        "token_ids": list(range(len(pieces))), "logprobs": [-0.5] * len(pieces),
        "tokens_per_second": 12.0, "finish_reason": finish, "identity": "f" * 64,
        "identity_short": "f" * 12, "backend": "llama", "prompt_tokens": 3,
        "reused_tokens": 0, "prompt_seconds": 0.01,
        "adapters": [{"name": "tool-calls-lora", "scale": 1.0, "sha256": "a" * 64}],
        **fields})
