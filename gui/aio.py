"""Coroutines on the Qt event loop (qasync), for flows that await engine replies.

`gui.app` runs the application on a `qasync.QEventLoop`, so `await reply` (an engine
`Reply`) or `await task` (a background `Task`) inside a coroutine resumes on the GUI
thread when the work ends, and a flow of several steps reads top to bottom instead of
as chained callbacks. `spawn` starts one; an exception it raises reaches
`sys.excepthook` (it is never silently kept in an unread task).

When something else runs the Qt event loop (pytest-qt's `qtbot.waitSignal`, a script's
own `QEventLoop.exec`), `loop()` makes a qasync loop that shares it
(`already_running=True`): its callbacks are Qt timers, so they run in whichever Qt loop
is turning. That loop stays the GUI thread's running asyncio loop for the rest of the
process (qasync has no way to let go of a borrowed Qt loop without quitting it), so
nothing on that thread may call `asyncio.run` afterwards; other threads have their own
loops. Two rules keep coroutines safe: never open a modal `exec()` inside one (a
nested loop would run other coroutine steps inside this one's; use `QDialog.open()`),
and keep their Qt objects alive through their owner, not the coroutine.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine
from typing import Any

import qasync
from PySide6.QtWidgets import QApplication

_loop: qasync.QEventLoop | None = None


def install(app: QApplication) -> qasync.QEventLoop:
    """The loop `gui.app` runs (`run_forever`): made before the window, so the
    window's coroutines are scheduled on it."""
    global _loop
    _loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(_loop)
    return _loop


def loop() -> qasync.QEventLoop:
    """The qasync loop of the GUI thread (made on first use when another owner runs the
    Qt event loop, as under pytest-qt)."""
    global _loop
    if _loop is None or _loop.is_closed():
        app = QApplication.instance()
        assert app is not None, "a QApplication must exist before coroutines are started"
        _loop = qasync.QEventLoop(app, already_running=True)
        asyncio.set_event_loop(_loop)
    return _loop


def spawn(coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task:
    """Start `coroutine` on the GUI thread's loop; its exception goes to sys.excepthook."""
    task = loop().create_task(coroutine)
    task.add_done_callback(_report)
    return task


def _report(task: asyncio.Task) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        sys.excepthook(type(exc), exc, exc.__traceback__)
