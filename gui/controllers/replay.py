"""Replaying a recorded answer from the window (the chat's Replay action).

The same three steps as `variant-studio replay` (`engine.runtime.replay`): plan the
record against today's catalog (on the GUI thread: resolving reads only the catalog),
run the plan's `Generate` through the window's engine client (a `Reply` of its own,
so the chat's streaming answer hears nothing of it), then give the verdict: identical,
or where it first diverged and why (the identity gone or changed, or the tokens
differing under the same identity).

Signals: `verdict(dict)` once per replay, with `replay.verdict`'s fields (and
`verdict: "failed"` with the engine's reason when the request failed or was stopped).
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject, Signal

from engine.catalog.store import Catalog
from engine.errors import StudioError
from engine.runtime import replay
from engine.runtime.results import GenerationResult
from gui.engine_client import QtEngineClient, Reply


class ReplayRunner(QObject):
    verdict = Signal(dict)

    def __init__(self, client: QtEngineClient, catalog: Catalog,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.client = client
        self.catalog = catalog
        self.reply: Reply | None = None  # the replay running now

    def running(self) -> bool:
        return self.reply is not None

    def replay(self, record: dict[str, Any]) -> Reply | None:
        """Replay `record` (a replay record as the engine made it); the verdict comes on
        `verdict` (at once when nothing can run)."""
        try:
            plan = replay.plan(self.catalog, replay.ReplayRecord.from_dict(record))
        except StudioError as exc:
            self.verdict.emit({"verdict": "failed", "identical": False, "reason": exc.message})
            return None
        if plan.request is None:
            self.verdict.emit(replay.verdict(plan, None))
            return None
        reply = self.client.submit(plan.request)
        self.reply = reply

        def finished(result: GenerationResult) -> None:
            self.verdict.emit(replay.verdict(plan, result))

        def failed(message: str, _details: list | None = None) -> None:
            self.verdict.emit({"verdict": "failed", "identical": False, "reason": message,
                               "identity_changes": list(plan.changes)})

        reply.finished.connect(finished)
        reply.failed.connect(failed)
        reply.cancelled.connect(lambda: failed("the replay was stopped"))
        reply.done.connect(self._done)
        return reply

    def _done(self) -> None:
        self.reply = None

    def stop(self) -> None:
        if self.reply is not None:
            self.reply.stop()


def verdict_text(found: dict[str, Any]) -> str:
    """The verdict in one line (the chat's status)."""
    if found.get("verdict") == "failed":
        return f"replay failed: {found.get('reason')}"
    return "replay: " + replay.verdict_line(found)
