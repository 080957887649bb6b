"""Starting and watching a training worker, with no Qt and no torch.

`TrainingJob` runs one training request in `python -m engine.training.worker` (a
worker of the one worker service, `engine.runtime.service`, so serving and the window
stay responsive, and a native crash cannot take them down). Its events reach a callback
on a reader thread as plain dicts (`{"event": "progress", ...}`, the worker's own
shapes), and it ends exactly once: finished, failed or cancelled. If the worker dies,
the job fails with "training worker stopped: ..." and the last lines of its log. The CLI
uses it directly; the GUI wraps it in Qt signals.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from engine.errors import Cancelled, EngineError, StudioError
from engine.runtime import messages as m
from engine.runtime import protocol
from engine.runtime.service import RequestHandle, ServiceClient
from engine.training.job import TrainRequest
from engine.training.rl import RLRequest

EventCallback = Callable[[dict[str, Any]], None]
WORKER_MODULE = "engine.training.worker"
OP = "train"  # the worker's one request (engine.training.worker.OP)


def _decode(message: dict[str, Any], kind: Any) -> Any:
    """Terminal events as the service reads them; every other event as sent."""
    if message.get("event") in ("finished", "failed", "cancelled"):
        return m.decode_event(message)
    return {k: v for k, v in message.items() if k != "id"}


class TrainingJob:
    def __init__(self, request: TrainRequest | RLRequest, on_event: EventCallback | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.request = request
        self.on_event = on_event
        # Events the worker sends after a cancel still arrive: its `stopped` event says
        # where the checkpoint to resume from is.
        self._client = ServiceClient(WORKER_MODULE, what="the training worker",
                                     stopped="training worker",
                                     env=dict(os.environ if env is None else env),
                                     decode=_decode, quiet_after_cancel=False)
        self._handle: RequestHandle | None = None
        self.done = threading.Event()
        self.pid: int | None = None

    def start(self) -> TrainingJob:
        self._handle = self._client.submit_raw(OP, self.request.to_dict(), self._dispatch)
        self.pid = self._client.pid
        return self

    def _dispatch(self, event: Any) -> None:
        if isinstance(event, dict):
            self._deliver(event)
            return
        # The terminal event, once: the worker has nothing more to do, so it may go
        # (without waiting for it here, on the reader thread).
        self._client.release()
        message: dict[str, Any] = {"event": "cancelled"}
        if isinstance(event, m.Finished):
            message = {"event": "finished", "result": event.result}
        elif isinstance(event, m.Failed):
            message = {"event": "failed", "error": protocol.error_payload(event.error)}
        self._deliver(message)
        self.done.set()

    def _deliver(self, message: dict[str, Any]) -> None:
        if self.on_event is not None:
            self.on_event(message)  # the service catches and prints what it raises

    @property
    def outcome(self) -> str | None:
        """finished | failed | cancelled, once the job has ended."""
        return self._handle.outcome if self._handle is not None else None

    @property
    def result(self) -> dict[str, Any] | None:
        return self._handle.result if self._handle is not None else None

    @property
    def error(self) -> StudioError | None:
        return self._handle.error if self._handle is not None else None

    @property
    def cancel_requested(self) -> bool:
        return self._handle is not None and self._handle.cancel_requested

    def cancel(self) -> None:
        """Ask the worker to stop; it ends with `cancelled` after the current layer."""
        if self._handle is not None:
            self._client.cancel(self._handle)

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        """Block until the job ends; the result, or its error raised."""
        if not self.done.wait(timeout):
            raise EngineError(f"training did not finish within {timeout} s")
        self._client.close(30)
        assert self._handle is not None
        try:
            return self._handle.wait(0)
        except Cancelled:
            raise Cancelled("training cancelled") from None

    def kill(self) -> None:
        self._client.kill()

    def log_tail(self, count: int = 20) -> list[str]:
        return self._client.log_tail(count)
