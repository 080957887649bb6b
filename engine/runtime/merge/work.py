"""The merge worker: a child process (`python -m engine.runtime.merge.work`) that folds a
variant's adapters into a standalone GGUF and measures what survived.

Why a process of its own: llama.cpp calls `abort()` on some bad inputs, so no native
merge work may run in a front end's process (the window, a CLI command), and a merge
holds the engine thread for a while, so it does not run inside the shared engine
process either. It is a worker of the one worker service (`runtime.service`: ids,
`progress`, cancel, exactly one of `finished`, `failed` or `cancelled` per request, a
crash failing the request), and its requests are typed, checked by `engine.wire` as the
engine's are:

- `MergeRequest` ("merge"): re-verify the base and adapter files by digest, write the
  merge (`formats.merge.write_merged`), quantize it with llama.cpp's own quantizer
  (`runtime.llama.quantize`: a child of this process, killed on cancel) unless the
  type is the base's own, check the result with our strict reader, and compare its
  adapted tensors with the base on the same grid (`formats.merge.measure_weights`).
- `CheckRequest` ("check"): the survival check (`runtime.merge.check`).

Progress comes from every heavy step (writing tensor by tensor, llama.cpp's log while
quantizing, measuring tensor by tensor, evaluation item by item); a cancel takes effect
between tensors or items, and kills the quantizer child at once.

`MergeWorker` is the parent's end (used by `engine.runtime.merge.job`).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from engine import wire
from engine.errors import RefusedError, StudioError
from engine.formats import merge
from engine.runtime import contention, service
from engine.runtime.merge.check import CheckRequest, run_check
from engine.runtime.messages import Progress, Request
from engine.runtime.service import Job
from engine.runtime.worker import ChildChannel

MODULE = "engine.runtime.merge.work"

ProgressFn = Callable[[str, float], None]
CancelCheck = Callable[[], bool]


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class MergeAdapter(wire.Wire):
    """One adapter folded in: its stored GGUF (verified by digest) and its scale."""

    name: str
    path: str
    sha256: str
    scale: float

    def __post_init__(self) -> None:
        if isinstance(self.scale, bool) or not isinstance(self.scale, int | float) \
                or not math.isfinite(self.scale):
            raise RefusedError(f"adapter {self.name}: the scale must be a finite number")
        wire.check(self)


@dataclass(frozen=True)
class MergeRequest(Request):
    OP: ClassVar[str] = "merge"
    base_path: str
    base_sha256: str
    adapters: tuple[MergeAdapter, ...]
    out: str
    type: str
    provenance: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        merge.check_type(self.type)
        if not self.adapters:
            raise RefusedError("a merge needs at least one adapter")
        wire.check(self)


REQUESTS: dict[str, type[MergeRequest] | type[CheckRequest]] = {
    MergeRequest.OP: MergeRequest, CheckRequest.OP: CheckRequest}


# ------------------------------------------------------------------------ the merge


def run_merge(request: MergeRequest, progress: ProgressFn, cancelled: CancelCheck,
              n_threads: int) -> dict[str, Any]:
    """Write and measure the merge (see the module docstring); the file is removed on
    any failure or cancel."""
    from engine.catalog import digest
    from engine.formats import artifacts, gguf_file, lora_io
    from engine.runtime.llama import quantize

    started = time.monotonic()
    base, out = Path(request.base_path), Path(request.out)
    if out.exists() or not out.parent.is_dir():
        raise RefusedError(f"{out}: the merge writes only a new file in an existing folder")
    progress("verifying files", 0.0)
    if digest.content_digest(base, None, cancelled) != request.base_sha256:
        raise RefusedError(f"the base {base.name} changed on disk since it was added")
    parts = []
    for adapter in request.adapters:
        path = Path(adapter.path)
        digest.require_unchanged(adapter.name, path, adapter.sha256, cancelled)
        info = artifacts.inspect_path(path)
        if not isinstance(info, artifacts.AdapterInfo) or info.format != "gguf":
            raise RefusedError(f"adapter {adapter.name}: not a GGUF LoRA")
        if info.problems:
            raise RefusedError(f"adapter {adapter.name}: {info.problems[0]}")
        parts.append(merge.MergePart(adapter.name, lora_io.read_gguf(path),
                                     float(adapter.scale)))
    ftype = merge.MERGE_TYPES[request.type]
    intermediate = out.with_name(f".{out.name}.f16-intermediate")
    timings: dict[str, float] = {}
    try:
        mark = time.monotonic()
        if ftype is None:
            merge.write_merged(base, parts, out, "base", quantize.quantize_rows,
                               request.provenance, lambda f: progress("merging", f),
                               cancelled)
            timings["merge"] = time.monotonic() - mark
        else:
            merge.write_merged(base, parts, intermediate, "f16", None, request.provenance,
                               lambda f: progress("merging", f), cancelled)
            timings["merge"] = time.monotonic() - mark
            mark = time.monotonic()
            progress("quantizing", 0.0)
            quantize.quantize_file(intermediate, out, ftype, n_threads,
                                   lambda f: progress("quantizing", f), cancelled)
            timings["quantize"] = time.monotonic() - mark
            intermediate.unlink()
        # What llama.cpp wrote goes through our strict reader before anything else.
        header = gguf_file.read_header(out)
        info = artifacts.inspect_path(out)
        if not isinstance(info, artifacts.BaseModelInfo) or info.format != "gguf":
            raise RefusedError("the merged file is not a GGUF base model")
        mark = time.monotonic()
        weights = merge.measure_weights(base, out, parts, "base" if ftype is None else "f16",
                                        quantize.quantize_rows,
                                        lambda f: progress("measuring weights", f),
                                        cancelled)
        timings["measure"] = time.monotonic() - mark
        progress("hashing", 0.0)
        sha = digest.content_digest(out, None, cancelled)
    except BaseException:
        out.unlink(missing_ok=True)
        intermediate.unlink(missing_ok=True)
        raise
    types: dict[str, int] = {}
    for tensor in header.tensors.values():
        types[tensor.type_name] = types.get(tensor.type_name, 0) + 1
    timings["total"] = time.monotonic() - started
    return {"path": str(out), "sha256": sha, "size": out.stat().st_size,
            "type": request.type, "file_type": info.file_type, "tensor_types": types,
            "weights": weights.to_dict(),
            "seconds": {k: round(v, 2) for k, v in timings.items()}}


# ------------------------------------------------------------------------- child side


def main() -> None:
    """Serve merge and check requests, one at a time (`runtime.service.serve`)."""
    threads, _automatic = contention.configured()  # the engine's thread setting

    def handle(job: Job) -> dict[str, Any]:
        last = {"stage": "", "at": -1.0}

        def progress(stage: str, fraction: float) -> None:
            # At most one event per percent and stage: the pipe stays quiet.
            if stage != last["stage"] or fraction - last["at"] >= 0.01 or fraction >= 1:
                last.update(stage=stage, at=fraction)
                job.progress(stage, round(float(fraction), 4))

        cls = REQUESTS.get(job.op)
        if cls is None:
            raise RefusedError(f"unknown merge worker request {job.op!r}")
        try:
            request = cls.from_params(job.params)
        except StudioError as exc:
            raise RefusedError(f"malformed {job.op} request: {exc.message}") from None
        if isinstance(request, MergeRequest):
            return run_merge(request, progress, job.cancelled, threads)
        assert isinstance(request, CheckRequest)
        return run_check(request, progress, job.cancelled, threads)

    service.serve(ChildChannel(), handle, "merge")


# ------------------------------------------------------------------------ parent side


class MergeWorker:
    """The parent's end: one merge worker process; `call` runs one request in it."""

    def __init__(self, threads: int | None = None) -> None:
        env = dict(os.environ)
        if threads:
            env["VARIANT_STUDIO_THREADS"] = str(threads)
        self.client = service.ServiceClient(MODULE, what="the merge worker",
                                            stopped="merge worker", env=env)

    def call(self, request: MergeRequest | CheckRequest,
             progress: ProgressFn | None = None, cancelled: CancelCheck | None = None
             ) -> dict[str, Any]:
        """Run `request`; progress and cancel as the module docstring says. A cancel
        that the worker does not honour within 30 s kills it."""

        def on_event(event: object) -> None:
            if progress and isinstance(event, Progress):
                progress(event.stage, event.fraction)

        handle = self.client.submit(request, on_event)
        # The caller's cancel is a question (`cancelled()`), asked while we wait.
        while not handle.done.wait(0.2):
            if cancelled and cancelled() and not handle.cancel_requested:
                self.client.cancel(handle)
                if not handle.done.wait(30):
                    self.client.kill()
                    handle.done.wait()
        result = handle.wait()
        return result or {}

    def close(self) -> None:
        self.client.close(timeout=30)

    def __enter__(self) -> MergeWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    main()
