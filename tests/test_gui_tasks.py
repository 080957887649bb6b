"""Background tasks: progress arrives on the GUI thread; a cancelled task never
delivers a result."""

from __future__ import annotations

import threading

import pytest

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


def test_tasks_are_awaited_in_coroutines_on_the_qt_loop(qtbot) -> None:
    """The window's coroutines (gui.aio, qasync) run while pytest-qt turns the Qt loop:
    an awaited task resumes the coroutine on the GUI thread with its result, or raises
    its failure or its cancellation."""
    from engine.errors import RefusedError, StudioError
    from gui import aio

    def refuse(progress, cancelled) -> None:
        raise RefusedError("nope: bad adapter")

    def stop(progress, cancelled) -> None:
        raise Cancelled("stopped")

    seen: list[object] = []

    async def flow() -> str:
        seen.append(await Task(lambda progress, cancelled: 41 + 1))
        seen.append(threading.current_thread() is threading.main_thread())
        try:
            await Task(refuse)
        except StudioError as exc:
            seen.append(exc.message)
        try:
            await Task(stop)
        except Cancelled:
            seen.append("cancelled")
        return "done"

    running = aio.spawn(flow())
    qtbot.waitUntil(running.done, timeout=60_000)
    assert running.result() == "done"
    assert seen == [42, True, "nope: bad adapter", "cancelled"]


def test_catalog_events_name_kinds_and_entries(qtbot) -> None:
    from gui.catalog_events import CatalogEvents, touches

    events = CatalogEvents()
    with qtbot.waitSignal(events.catalogChanged) as changed:
        events.changed(["variant", "adapter", "variant"], ["poet", "", "smol-poet", "poet"])
    assert changed.args == [["adapter", "variant"], ["poet", "smol-poet"]]
    assert touches(["adapter"], ("model", "adapter")) and not touches(["default"], ("model",))
    with pytest.raises(ValueError, match="unknown"):
        events.changed(["models"])
