"""The training worker process: `python -m engine.training.worker`.

A worker of the one worker service (`engine.runtime.service`): one request, op
"train", whose params are a `TrainRequest` as a dict (or `rl.RLRequest`'s, which
carries `"kind": "rl"`: the reinforcement loop); a cancel, or closing stdin (the parent
went away), stops it after the current layer. Its events are `stage`, `data`,
`warning`, `load`, `memory`, `progress`, `checks`, `checkpoint`, `resumed`, `stopped`
and the loop's `round`, then exactly one of `finished` (with `result`), `failed` (with
`error`) or `cancelled`.

The determinism settings are put into the environment before torch is imported, and
the protocol has its own descriptor (`ChildChannel`), so native prints cannot corrupt it.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from engine.errors import StudioError, UsageError
from engine.runtime import service
from engine.runtime.worker import ChildChannel

OP = "train"


def _request(job: service.Job) -> Any:
    """The typed request of `job` (a reinforcement run says so: "kind": "rl")."""
    from engine.training import rl
    from engine.training.job import TrainRequest

    if job.op != OP:
        raise UsageError(f"unknown training worker request {job.op!r}")
    try:
        if isinstance(job.params, dict) and job.params.get("kind") == rl.KIND:
            return rl.RLRequest.from_dict(job.params)
        return TrainRequest.from_dict(job.params)
    except (ValueError, TypeError, KeyError) as exc:
        if isinstance(exc, StudioError):
            raise
        raise UsageError(f"malformed training request: {exc}") from exc


def handle(job: service.Job) -> dict[str, Any]:
    from engine.training import rl
    from engine.training.config import DETERMINISM_ENV

    request = _request(job)
    threads = int((request.settings or {}).get("threads", 2))
    os.environ.update(DETERMINISM_ENV)
    os.environ["OMP_NUM_THREADS"] = str(max(1, threads))
    # Idle OpenMP threads sleep instead of spinning: on a busy machine spinning threads
    # wait for descheduled siblings and a step takes several times longer. (No effect
    # on the numbers.)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from engine.training import memory
    from engine.training.job import execute

    memory.give_freed_memory_back()
    job.emit("started", pid=os.getpid())
    run = rl.execute if isinstance(request, rl.RLRequest) else execute
    return run(request, job.emit, job.cancelled)  # type: ignore[arg-type]


def main() -> int:
    service.serve(ChildChannel(), handle, "train")
    return 0


if __name__ == "__main__":
    sys.exit(main())
