"""Background work for the window (import, hashing), in the style of Orange's tasks.

A `Task` runs a function on a worker thread with progress and cancellation; its
signals arrive on the GUI thread. A cancelled task never delivers a result.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
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
            self.cancelled.emit()
        except StudioError as exc:
            if self._cancel.is_set():
                self.cancelled.emit()
            else:
                self.failed.emit(exc.message)
        except Exception as exc:  # a bug must not vanish silently
            traceback.print_exc()
            self.failed.emit(f"internal error: {type(exc).__name__}: {exc}")
        else:
            if self._cancel.is_set():
                self.cancelled.emit()
            else:
                self.succeeded.emit(result)
        self.done.emit()

    def wait(self, timeout: float | None = None) -> bool:
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()
