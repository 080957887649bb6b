"""The training worker process: `python -m engine.training.worker`.

Protocol (JSON lines): the first line on stdin is the request (`TrainRequest` as a
dict, or `rl.RLRequest`'s, which carries `"kind": "rl"`: the reinforcement loop); later
lines may be `{"op": "cancel"}`; closing stdin also cancels (the parent went away). On
the protocol descriptor the worker writes events (`stage`, `data`, `warning`, `load`,
`progress`, `checkpoint`, `resumed`, `stopped`, and the loop's `round`) and then exactly
one of `finished` (with `result`), `failed` (with `error`) or `cancelled`.

The determinism settings are put into the environment before torch is imported, and
the protocol has its own descriptor (`ChildChannel`), so native prints cannot corrupt it.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import traceback
from typing import Any

from engine.errors import Cancelled, StudioError, UsageError
from engine.runtime import protocol
from engine.runtime.worker import ChildChannel


class Worker:
    def __init__(self, channel: ChildChannel) -> None:
        self.send = channel.send
        self.cancel = threading.Event()

    def emit(self, event: str, **payload: Any) -> None:
        self.send({"event": event, **payload})

    def _watch_stdin(self) -> None:
        for line in sys.stdin.buffer:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if isinstance(message, dict) and message.get("op") == "cancel":
                self.cancel.set()
        self.cancel.set()  # stdin closed: nobody is listening any more

    def run(self) -> int:
        from engine.training import rl
        from engine.training.config import DETERMINISM_ENV
        from engine.training.job import TrainRequest, execute

        line = sys.stdin.buffer.readline()
        try:
            raw = json.loads(line)
            # A reinforcement run says so ("kind": "rl"); every other request is SFT/DPO.
            if isinstance(raw, dict) and raw.get("kind") == rl.KIND:
                request: TrainRequest | rl.RLRequest = rl.RLRequest.from_dict(raw)
                run = rl.execute
            else:
                request = TrainRequest.from_dict(raw)
                run = execute
            threads = int((request.settings or {}).get("threads", 2))
        except (ValueError, TypeError, StudioError) as exc:
            error = exc if isinstance(exc, StudioError) else UsageError(
                f"malformed training request: {exc}")
            self.send({"event": "failed", "error": protocol.error_payload(error)})
            return 2
        os.environ.update(DETERMINISM_ENV)
        os.environ["OMP_NUM_THREADS"] = str(max(1, threads))
        # Idle OpenMP threads sleep instead of spinning: on a busy machine spinning
        # threads wait for descheduled siblings and a step takes several times longer.
        # (No effect on the numbers.)
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        from engine.training import memory

        memory.give_freed_memory_back()
        threading.Thread(target=self._watch_stdin, daemon=True, name="stdin").start()
        self.emit("started", pid=os.getpid())
        try:
            result = run(request, self.emit, self.cancel.is_set)  # type: ignore[arg-type]
        except Cancelled as exc:
            self.send({"event": "cancelled", "message": exc.message})
            return 0
        except Exception as exc:
            payload = protocol.error_payload(exc)
            if not isinstance(exc, StudioError):
                payload["details"] = traceback.format_exc().splitlines()[-12:]
            self.send({"event": "failed", "error": payload})
            return 1
        self.send({"event": "finished", "result": result})
        return 0


def main() -> int:
    return Worker(ChildChannel()).run()


if __name__ == "__main__":
    sys.exit(main())
