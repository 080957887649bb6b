"""The background check of library entries whose files are new or changed on disk.

A library refresh only asks caches (digests keyed by path, size, mtime and inode; the
weight scan recorded at import), so it is instant; what the caches cannot answer (a
file that is new or changed: hashing it again, perhaps gigabytes) is listed by
`health.unchecked` and badged "unchecked" until this controller's `Task` has checked
it on a worker thread, with its own `Catalog` (none is shared across threads). A newer
refresh supersedes a running check (the old result would be stale); the user can stop
one and start it again from the status bar.

Signals: `status(text, button)` for the status bar (text "" hides it), `checked(dict)`
with the problems found (entry name -> reasons) when a check succeeded, and `ended()`
after any check ended (succeeded, failed or stopped) and its status was shown.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject, Signal

from engine.catalog import health
from engine.catalog.store import Catalog
from gui.tasks import Task


def _entries(count: int) -> str:
    return f"{count} entr{'y' if count == 1 else 'ies'}"


class LibraryCheck(QObject):
    status = Signal(str, str)  # text ("" hides it), button text ("Stop" or "Check now")
    checked = Signal(dict)  # name -> problems found, for the entries checked
    ended = Signal()

    def __init__(self, catalog: Catalog, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.catalog = catalog
        self.checking: set[str] = set()  # entries whose files are not checked yet
        self.task: Task | None = None

    def running(self) -> bool:
        return self.task is not None

    def start(self, checking: set[str]) -> Task | None:
        """Check `checking` (from `health.unchecked`) in the background; an empty set
        clears the status. A running check is superseded."""
        self.supersede()
        self.checking = set(checking)
        if not self.checking:
            self.status.emit("", "")
            return None
        worker = Catalog(self.catalog.state)  # its own: no memo shared across threads

        def work(progress: Any, cancelled: Any) -> dict[str, list[str]]:
            health.check_files(worker, progress, cancelled)
            return health.status_of_records(worker)

        task = Task(work, self)
        self.task = task
        what = _entries(len(self.checking))
        self.status.emit(f"checking {what} (files new or changed on disk)…", "Stop")
        task.progress.connect(lambda done, _total: task is self.task and self.status.emit(
            f"checking {what}… {done / 10:.0f} %", "Stop"))
        task.succeeded.connect(lambda problems: self._succeeded(task, problems))
        task.failed.connect(lambda message: self._stopped(task, f"check failed: {message}"))
        task.cancelled.connect(lambda: self._stopped(
            task, f"check stopped: {_entries(len(self.checking))} unchecked"))
        task.start()
        return task

    def cancel(self) -> None:
        """Stop the running check (its result is never applied)."""
        if self.task is not None:
            self.task.cancel()

    def supersede(self) -> None:
        """Forget the running check: a refresh checks again, the old result is stale."""
        if self.task is not None:
            self.task.cancel()
            self.task = None

    def report_left(self, left: set[str]) -> None:
        """After the library applied a check: whatever changed again while it ran stays
        unchecked (no endless loop of checks); say so."""
        self.checking = set(left)
        if left:
            self.status.emit(f"{_entries(len(left))} changed while they were checked",
                             "Check now")
        else:
            self.status.emit("", "")

    def _succeeded(self, task: Task, problems: dict[str, list[str]]) -> None:
        if task is not self.task:
            return  # a newer refresh replaced it
        self.task = None
        self.checked.emit(problems)
        self.ended.emit()

    def _stopped(self, task: Task, message: str) -> None:
        if task is not self.task:
            return
        self.task = None
        self.status.emit(message, "Check now")
        self.ended.emit()
