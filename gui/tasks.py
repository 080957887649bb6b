"""Background work for the window (import, hashing), in the style of Orange's tasks.

A `Task` runs a function on a worker thread with progress and cancellation; its
signals arrive on the GUI thread. A cancelled task never delivers a result. Inside a
coroutine on the GUI thread's qasync loop (`gui.aio`), `result = await task` waits for
it: it raises `Cancelled` when it was cancelled and `StudioError` when it failed.

The work gets no Qt object and should get no object the GUI thread also uses: a task
that reads the catalog makes its own `Catalog(window_catalog.state)` (a catalog's
inspection memo is not shared across threads).
"""

from __future__ import annotations

import asyncio
import threading
import traceback
from collections.abc import Callable, Generator
from typing import Any

from PySide6.QtCore import QObject, Signal

from engine.errors import Cancelled, StudioError


class Task(QObject):
    progress = Signal(int, int)
    succeeded = Signal(object)
    failed = Signal(str)
    cancelled = Signal()
    done = Signal()

    def __init__(self, work: Callable[..., Any], parent: QObject | None = None) -> None:
        """`work(progress, cancelled)` is called on a worker thread."""
        super().__init__(parent)
        self._work = work
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None
        # Set on the worker before `done` is emitted: read them on the GUI thread after it.
        self.outcome: str | None = None  # succeeded | failed | cancelled
        self.result: Any = None
        self.error = ""

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True, name="gui-task")
        self._thread.start()

    def cancel(self) -> None:
        self._cancel.set()

    def is_cancelled(self) -> bool:
        return self._cancel.is_set()

    def _run(self) -> None:
        def progress(done: int, total: int) -> None:
            # Per-mille keeps multi-gigabyte sizes inside a Qt int.
            self.progress.emit(int(done * 1000 / max(total, 1)), 1000)

        try:
            result = self._work(progress, self._cancel.is_set)
        except Cancelled:
            self._end("cancelled")
        except StudioError as exc:
            self._end("cancelled" if self._cancel.is_set() else "failed", error=exc.message)
        except Exception as exc:  # a bug must not vanish silently
            traceback.print_exc()
            self._end("failed", error=f"internal error: {type(exc).__name__}: {exc}")
        else:
            self._end("cancelled" if self._cancel.is_set() else "succeeded", result)
        self.done.emit()

    def _end(self, outcome: str, result: Any = None, error: str = "") -> None:
        self.outcome, self.result, self.error = outcome, result, error
        if outcome == "succeeded":
            self.succeeded.emit(result)
        elif outcome == "failed":
            self.failed.emit(error)
        else:
            self.cancelled.emit()

    def is_done(self) -> bool:
        return self.outcome is not None

    def __await__(self) -> Generator[Any, None, Any]:
        """`result = await task` in a coroutine on the GUI thread (started if needed)."""
        future: asyncio.Future = asyncio.get_event_loop().create_future()

        def settle() -> None:
            if future.done():
                return
            if self.outcome == "succeeded":
                future.set_result(self.result)
            elif self.outcome == "failed":
                future.set_exception(StudioError(self.error))
            else:
                future.set_exception(Cancelled("cancelled"))

        # `done` is queued to this (GUI) thread: connected before the start, it cannot
        # be missed, and after it fired the outcome is already set.
        if self.outcome is not None:
            settle()
        else:
            self.done.connect(settle)
            if self._thread is None:
                self.start()
        return future.__await__()

    def wait(self, timeout: float | None = None) -> bool:
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()
