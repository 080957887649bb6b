"""The training flows of the window: start a run from the Train page's form, relay the
worker's events, cancel, announce what a finished run added, and stop a run when the
window closes.

Training runs in its own worker process (`engine.training.client.TrainingJob`);
`TrainingClient` turns the job's events (delivered on a reader thread) into Qt signals
on the GUI thread. `TrainingController` checks a request against the catalog
(`engine.training.job.prepare`) before it starts one, and when a run finished (the
worker has written the adapter and the variant to the catalog) it announces them
(`CatalogEvents.changed`), then emits `trained(result)` and `variantCreated(name)` /
`adapterCreated(name)`, so the page shows the result and the window lands on the new
variant. The reinforcement loop (`engine.training.rl`) goes the same way through
`start_rl`, which is also where a Python reward needs the user's explicit trust: the
file is the user's own code, run in the worker. Nothing here imports torch or a native
runtime.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal, Slot
from PySide6.QtWidgets import QMessageBox, QWidget

from engine.catalog.store import Catalog
from engine.errors import RefusedError
from engine.formats.safeio import printable
from engine.runtime.protocol import error_from_payload
from engine.training import rl
from engine.training.client import TrainingJob
from engine.training.job import Prepared, TrainRequest, prepare
from engine.training.rewards import parse_reward
from gui.catalog_events import CatalogEvents


class TrainingClient(QObject):
    """One training job at a time, its events as signals (delivered on the GUI thread).

    Every started job ends with exactly one of `finished`, `failed` or `cancelled`.
    """

    started = Signal(str)  # adapter name
    stage = Signal(str)
    dataLoaded = Signal(dict)  # examples, target_tokens, kinds, sha256, ...
    warning = Signal(str)
    loading = Signal(float)  # fraction of the base weights loaded
    # Before the base loads: the run's estimated peak memory and what is available
    # (engine.training.memory.check's report: total, parts, batch, seq_len, available, ...).
    memory = Signal(dict)
    progress = Signal(dict)  # step, steps, loss, lr, seconds, eta, ...
    # A reinforcement round: round, rounds, reward {mean, min, max}, agreement {tokens,
    # mean_abs, max_abs, exact, within, tolerance}, steps, step, loss [...], seconds.
    round = Signal(dict)
    # After the adapter is written: the served check, {"parity": {...}, "drift": {...}}
    # (either part missing or {"error": message} when it could not be measured).
    checks = Signal(dict)
    checkpoint = Signal(int, str)
    finished = Signal(dict)  # the job's result (adapter, variant, files, provenance)
    failed = Signal(str, list)  # message, details
    cancelled = Signal(str)  # checkpoint path to resume from, or ""
    _event = Signal(object)

    def __init__(self, parent: QObject | None = None, env: dict[str, str] | None = None
                 ) -> None:
        super().__init__(parent)
        self._env = env
        self._job: TrainingJob | None = None
        self._checkpoint = ""
        self._event.connect(self._on_event)

    def busy(self) -> bool:
        return self._job is not None

    def start(self, request: TrainRequest | rl.RLRequest) -> None:
        """Start `request` (already checked with `prepare`); raises if one is running."""
        if self._job is not None:
            raise RuntimeError("a training run is already in progress")
        self._checkpoint = ""
        job = TrainingJob(request, self._event.emit, self._env)
        self._job = job
        job.start()
        self.started.emit(request.name)

    def cancel(self) -> None:
        if self._job is not None:
            self._job.cancel()

    def shutdown(self) -> None:
        """Stop a running job and wait for its worker (window closing)."""
        job = self._job
        if job is not None:
            job.cancel()
            if not job.done.wait(30):
                job.kill()

    @Slot(object)
    def _on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "stage":
            self.stage.emit(str(event.get("stage", "")))
        elif kind == "data":
            self.dataLoaded.emit(event)
        elif kind == "warning":
            self.warning.emit(str(event.get("message", "")))
        elif kind == "load":
            self.loading.emit(float(event.get("fraction", 0.0)))
        elif kind == "memory":
            self.memory.emit({k: v for k, v in event.items() if k != "event"})
        elif kind == "progress":
            self.progress.emit(event)
        elif kind == "round":
            self.round.emit(event)
        elif kind == "checks":
            self.checks.emit({k: v for k, v in event.items() if k != "event"})
        elif kind == "checkpoint":
            self._checkpoint = str(event.get("path", ""))
            self.checkpoint.emit(int(event.get("step", 0)), self._checkpoint)
        elif kind == "stopped":
            self._checkpoint = str(event.get("checkpoint") or "")
        elif kind in ("finished", "failed", "cancelled"):
            self._job = None
            if kind == "finished":
                self.finished.emit(event.get("result") or {})
            elif kind == "failed":
                error = error_from_payload(event.get("error") or {})
                self.failed.emit(error.message, list(error.details))
            else:
                self.cancelled.emit(self._checkpoint)


class TrainingController(QObject):
    """Training for the window: `start(request)`, `cancel()`, `busy()`, and on closing
    `confirm_close(parent)` then `shutdown()`. `client` carries the run's events."""

    trained = Signal(dict)  # a finished run's result, after its entries were announced
    adapterCreated = Signal(str)
    variantCreated = Signal(str)

    def __init__(self, catalog: Catalog, events: CatalogEvents,
                 client: TrainingClient | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.catalog = catalog
        self.events = events
        self.client = client or TrainingClient(self)
        self.client.finished.connect(self._finished)

    def busy(self) -> bool:
        return self.client.busy()

    def start(self, request: TrainRequest) -> Prepared:
        """Check `request` against the catalog and start it; raises StudioError (nothing
        started) when it is refused."""
        prepared = prepare(self.catalog, request)
        self.client.start(prepared.request)
        return prepared

    def start_rl(self, request: rl.RLRequest, trust_python: bool = False) -> rl.PreparedRL:
        """Check a reinforcement request against the catalog and start it; raises
        StudioError (nothing started) when it is refused. A `python:FILE` reward runs the
        user's code in the worker, so it starts only with `trust_python` (the page's
        explicit confirmation), checked here so no caller can skip it."""
        reward = parse_reward(request.reward)  # an unknown kind is refused here too
        if reward.kind == "python" and not trust_python:
            name = printable(Path(reward.path or "").name, 80)
            raise RefusedError(f"the Python reward {name} runs as code in the training "
                               "worker: confirm that you trust the file and want it run")
        prepared = rl.prepare(self.catalog, request)
        self.client.start(prepared.request)
        return prepared

    def cancel(self) -> None:
        self.client.cancel()

    def confirm_close(self, parent: QWidget) -> bool:
        """May the window close? Asks first while a run is in progress."""
        if not self.busy():
            return True
        answer = QMessageBox.question(
            parent, "Training in progress",
            "A training run is in progress. Stop it and quit? (Its last checkpoint is "
            "kept and can be resumed.)")
        return answer == QMessageBox.StandardButton.Yes

    def shutdown(self) -> None:
        self.client.shutdown()

    @Slot(dict)
    def _finished(self, result: dict) -> None:
        adapter, variant = result.get("adapter"), result.get("variant")
        # The worker wrote them to the catalog: every view that lists them refreshes.
        self.events.changed(["adapter"] + (["variant"] if variant else []),
                            [n for n in (adapter, variant) if n])
        self.trained.emit(result)
        if adapter:
            self.adapterCreated.emit(adapter)
        if variant:
            self.variantCreated.emit(variant)
