"""Starting and watching a training worker, with no Qt and no torch.

`TrainingJob` runs `python -m engine.training.worker` in its own process (a
`ChildProcess`, the same primitive as the engine host's) (so serving
and the window stay responsive, and a native crash cannot take them down), delivers
its events to a callback on a reader thread, and guarantees that every job ends
exactly once: finished, failed or cancelled. If the worker dies, the job fails with
the last lines of its log. The CLI uses it directly; the GUI wraps it in Qt signals.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from engine.errors import Cancelled, EngineError, StudioError
from engine.runtime import protocol
from engine.runtime.worker import ChildProcess, describe_exit
from engine.training.job import TrainRequest
from engine.training.rl import RLRequest

EventCallback = Callable[[dict[str, Any]], None]
WORKER_MODULE = "engine.training.worker"


class TrainingJob:
    def __init__(self, request: TrainRequest | RLRequest, on_event: EventCallback | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.request = request
        self.on_event = on_event
        self._env = env
        self._lock = threading.Lock()
        self._child: ChildProcess | None = None
        self.done = threading.Event()
        self.outcome: str | None = None  # finished | failed | cancelled
        self.result: dict[str, Any] | None = None
        self.error: StudioError | None = None
        self.cancel_requested = False
        self.pid: int | None = None

    def start(self) -> TrainingJob:
        env = dict(os.environ if self._env is None else self._env)
        self._child = ChildProcess(WORKER_MODULE, env, self._dispatch, self._exited, "train")
        self.pid = self._child.pid
        self._child.write(self.request.to_dict())
        return self

    def _exited(self, code: int) -> None:
        if not self.done.is_set():
            tail = tuple(self.log_tail(8))
            reason = describe_exit(code, "the training worker")
            self._end("failed", None, EngineError(f"training worker stopped: {reason}",
                                                  details=tail))

    def _dispatch(self, message: dict[str, Any]) -> None:
        event = message.get("event")
        if event == "finished":
            self._end("finished", message.get("result"), None)
        elif event == "failed":
            self._end("failed", None, protocol.error_from_payload(message.get("error") or {}))
        elif event == "cancelled":
            self._end("cancelled", None, None)
        elif not self.done.is_set():
            self._deliver(message)

    def _end(self, outcome: str, result: Any, error: StudioError | None) -> None:
        with self._lock:
            if self.done.is_set():
                return
            if self.cancel_requested and outcome == "failed":
                outcome, error = "cancelled", None
            self.outcome, self.result, self.error = outcome, result, error
        message: dict[str, Any] = {"event": outcome}
        if result is not None:
            message["result"] = result
        if error is not None:
            message["error"] = protocol.error_payload(error)
        self._deliver(message)
        self.done.set()

    def _deliver(self, message: dict[str, Any]) -> None:
        if self.on_event is not None:
            try:
                self.on_event(message)
            except Exception:  # a failing callback must not kill the reader
                import traceback

                traceback.print_exc()

    def cancel(self) -> None:
        """Ask the worker to stop; it ends with `cancelled` after the current layer."""
        with self._lock:
            if self.done.is_set():
                return
            self.cancel_requested = True
        if self._child is not None:
            self._child.write({"op": "cancel"})

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        """Block until the job ends; the result, or its error raised."""
        if not self.done.wait(timeout):
            raise EngineError(f"training did not finish within {timeout} s")
        if self._child is not None:
            self._child.finish(30)
        if self.outcome == "finished":
            assert self.result is not None
            return self.result
        if self.outcome == "cancelled":
            raise Cancelled("training cancelled")
        assert self.error is not None
        raise self.error

    def kill(self) -> None:
        if self._child is not None:
            self._child.kill()

    def log_tail(self, count: int = 20) -> list[str]:
        return self._child.tail(count) if self._child is not None else []
