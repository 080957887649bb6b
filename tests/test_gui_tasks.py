"""Background tasks: progress arrives on the GUI thread; a cancelled task never
delivers a result."""

from __future__ import annotations

import threading

from engine.errors import Cancelled
from gui.tasks import Task


def test_cancelled_task_delivers_no_result(qtbot) -> None:
    release = threading.Event()

    def work(progress, cancelled) -> str:
        progress(1, 4)
        release.wait(60)
        if cancelled():
            raise Cancelled("stop")
        return "result"

    task = Task(work)
    results: list[object] = []
    task.succeeded.connect(results.append)
    with qtbot.waitSignal(task.progress, timeout=60_000) as progress:
        task.start()
    assert progress.args == [250, 1000]
    with qtbot.waitSignal(task.cancelled, timeout=60_000):
        task.cancel()
        release.set()
    assert task.wait(60) and results == []


def test_failed_task_reports_the_message(qtbot) -> None:
    from engine.errors import RefusedError

    def work(progress, cancelled) -> None:
        raise RefusedError("nope: bad adapter")

    task = Task(work)
    with qtbot.waitSignal(task.failed, timeout=60_000) as failed:
        task.start()
    assert failed.args == ["nope: bad adapter"]


def test_signal_emit_keeps_bool_refcounts(qtbot) -> None:
    """PySide6 6.12.0 loses a reference to True per emit; the app would abort."""
    import sys

    from PySide6.QtCore import QObject, Signal

    class Emitter(QObject):
        ping = Signal(str, list)

    emitter = Emitter()
    emitter.ping.connect(lambda *_: None)
    before = sys.getrefcount(True)
    for _ in range(1000):
        emitter.ping.emit("x", [1])
    assert abs(sys.getrefcount(True) - before) < 50
