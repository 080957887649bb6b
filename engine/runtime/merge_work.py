"""The merge worker: a child process (`python -m engine.runtime.merge_work`) that folds a
variant's adapters into a standalone GGUF and measures what survived.

Why a process of its own: llama.cpp calls `abort()` on some bad inputs, so no native
merge work may run in a front end's process (the window, a CLI command), and a merge
holds the engine thread for a while, so it does not run inside the shared engine
process either. It is a worker of the one worker service (`runtime.service`: ids,
`progress`, cancel, exactly one of `finished`, `failed` or `cancelled` per request, a
crash failing the request), and its requests are typed here:

- `MergeRequest` ("merge"): re-verify the base and adapter files by digest, write the
  merge (`formats.merge.write_merged`), quantize it with llama.cpp's own quantizer
  (`runtime.llama.quantize`: a child of this process, killed on cancel) unless the
  type is the base's own, check the result with our strict reader, and compare its
  adapted tensors with the base on the same grid (`formats.merge.measure_weights`).
- `CheckRequest` ("check"): the merged model (a plain base), the dynamic variant and
  its base in sessions of this process's own `SessionRegistry`, on the same token ids:
  next-token KL per position, teacher-forced on each evaluation item's answer (or on
  the variant's greedy continuation when there is none), and greedy answers of all
  three for the task figures.

Progress comes from every heavy step (writing tensor by tensor, llama.cpp's log while
quantizing, measuring tensor by tensor, evaluation item by item); a cancel takes effect
between tensors or items, and kills the quantizer child at once.

`MergeWorker` is the parent's end (used by `engine.runtime.merge_job`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.catalog.profiles import Sampling
from engine.catalog.resolve import SessionSpec
from engine.errors import Cancelled, RefusedError, StudioError
from engine.formats import merge
from engine.runtime import prompting, service
from engine.runtime.messages import Progress, Prompt
from engine.runtime.service import Job
from engine.runtime.worker import ChildChannel

if TYPE_CHECKING:
    from engine.runtime.sessions import SessionRegistry

MODULE = "engine.runtime.merge_work"
MAX_ITEMS = 256
EXTRA_TOKENS = 16  # greedy tokens an exact-match answer may take beyond the expected ones
# Greedy decoding for the task figures, as the demo's own evaluation does it (each answer
# gets its expected length plus EXTRA_TOKENS, at most max_tokens).
TASK_SAMPLING = {"temperature": 0.0, "max_tokens": 512, "repeat_penalty": 1.0, "top_k": 40,
                 "top_p": 0.95, "seed": 0}

ProgressFn = Callable[[str, float], None]
CancelCheck = Callable[[], bool]


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class MergeAdapter:
    """One adapter folded in: its stored GGUF (verified by digest) and its scale."""

    name: str
    path: str
    sha256: str
    scale: float


@dataclass(frozen=True)
class MergeRequest:
    OP = "merge"
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
        for adapter in self.adapters:
            if isinstance(adapter.scale, bool) or not isinstance(adapter.scale, int | float) \
                    or not np.isfinite(adapter.scale):
                raise RefusedError(f"adapter {adapter.name}: the scale must be a finite number")

    def to_params(self) -> dict[str, Any]:
        return {"base_path": self.base_path, "base_sha256": self.base_sha256,
                "adapters": [dict(a.__dict__) for a in self.adapters], "out": self.out,
                "type": self.type, "provenance": self.provenance}

    @staticmethod
    def from_params(params: dict[str, Any]) -> MergeRequest:
        adapters = tuple(MergeAdapter(str(a["name"]), str(a["path"]), str(a["sha256"]),
                                      a["scale"]) for a in params["adapters"])
        provenance = params.get("provenance") or {}
        if not isinstance(provenance, dict):
            raise TypeError("provenance must be an object")
        return MergeRequest(str(params["base_path"]), str(params["base_sha256"]), adapters,
                            str(params["out"]), str(params["type"]), provenance)


EVAL_KINDS = ("chat", "pair", "text", "probe")


@dataclass(frozen=True)
class EvalItem:
    """One evaluation item, tokenized as `runtime.scoring` tokenizes a score item:

    - "chat": `prompt.messages` rendered with the chat template as served (no profile
      system prompt added), then `answer`, the last assistant turn;
    - "pair": `prompt.text` (raw) then `answer`, the completion;
    - "text": `answer` alone, every token but its first teacher-forced;
    - "probe": a prompt with no answer (served as a request is, the variant's system
      prompt included); the variant's own greedy continuation is teacher-forced.
    """

    kind: str
    prompt: Prompt = field(default_factory=Prompt)
    answer: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in EVAL_KINDS:
            raise RefusedError(f"evaluation items are {', '.join(EVAL_KINDS)}, not "
                               f"{self.kind!r}")
        if (self.kind == "probe") != (self.answer is None) or (
                self.answer is not None and not isinstance(self.answer, str)):
            raise RefusedError("an evaluation item has an answer (text) unless it is a probe")

    @property
    def exact(self) -> bool:
        """Does exact match apply (an answer after a prompt)?"""
        return self.kind in ("chat", "pair")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "prompt": self.prompt.to_dict(), "answer": self.answer}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> EvalItem:
        return EvalItem(str(data.get("kind")), Prompt.from_dict(data.get("prompt") or {}),
                        data.get("answer"))


@dataclass(frozen=True)
class CheckRequest:
    OP = "check"
    variant: SessionSpec
    base: SessionSpec
    merged: SessionSpec
    items: tuple[EvalItem, ...]
    greedy: int = 0  # the first `greedy` items are also answered greedily by all three
    probe_tokens: int = 16  # continuation length for items without an answer
    sampling: Sampling = field(default_factory=lambda: Sampling.from_dict(TASK_SAMPLING))

    def __post_init__(self) -> None:
        if not 1 <= len(self.items) <= MAX_ITEMS:
            raise RefusedError(f"a merge check needs 1 to {MAX_ITEMS} evaluation items")
        for value, what in ((self.greedy, "greedy"), (self.probe_tokens, "probe_tokens")):
            if isinstance(value, bool) or not isinstance(value, int) or not (
                    0 <= value <= MAX_ITEMS):
                raise RefusedError(f"merge check: {what} must be 0..{MAX_ITEMS}")
        if self.greedy > len(self.items):
            raise RefusedError("merge check: more greedy items than items")

    def to_params(self) -> dict[str, Any]:
        return {"variant": self.variant.to_dict(), "base": self.base.to_dict(),
                "merged": self.merged.to_dict(), "items": [i.to_dict() for i in self.items],
                "greedy": self.greedy, "probe_tokens": self.probe_tokens,
                "sampling": self.sampling.to_dict()}

    @staticmethod
    def from_params(params: dict[str, Any]) -> CheckRequest:
        items = params.get("items") or []
        if not isinstance(items, list):
            raise TypeError("items must be a list")
        sampling = dict(params.get("sampling") or TASK_SAMPLING)
        sampling["stop"] = tuple(sampling.get("stop") or ())
        return CheckRequest(SessionSpec.from_dict(params["variant"]),
                            SessionSpec.from_dict(params["base"]),
                            SessionSpec.from_dict(params["merged"]),
                            tuple(EvalItem.from_dict(i) for i in items),
                            params.get("greedy", 0), params.get("probe_tokens", 16),
                            Sampling(**sampling))


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


# ------------------------------------------------------------------------ the check


def run_check(request: CheckRequest, progress: ProgressFn, cancelled: CancelCheck,
              n_threads: int) -> dict[str, Any]:
    """KL and greedy answers of the variant, its base and the merged model."""
    from engine.runtime.cross_check import greedy
    from engine.runtime.generation import GenerationTask, run_task
    from engine.runtime.sessions import SessionRegistry

    registry = SessionRegistry(max_sessions=4, max_bases=2, n_threads=n_threads)
    sides = {"variant": request.variant, "base": request.base, "merged": request.merged}
    try:
        progress("loading models", 0.0)
        sessions = {k: registry.open(spec, cancelled) for k, spec in sides.items()}
        rows = []
        totals = {"kl_variant_base": 0.0, "kl_variant_merged": 0.0, "top1_merged": 0,
                  "top1_base": 0, "positions": 0}
        for index, item in enumerate(request.items):
            if cancelled():
                raise Cancelled("the merge check was cancelled")
            tokens, continuation = _tokens(registry, sides, item, cancelled)
            if item.kind == "probe":
                continuation = greedy(registry.model(request.variant),
                                      sessions["variant"].context, tokens,
                                      request.probe_tokens)
            if not continuation:
                continue
            scored = {k: sessions[k].context.score(tokens, continuation) for k in sides}
            kl_b = kl_m = 0.0
            for v, b, m in zip(scored["variant"], scored["base"], scored["merged"],
                               strict=True):
                kl_b += merge.kl_rows(v, b)
                kl_m += merge.kl_rows(v, m)
                top = int(np.argmax(v))
                totals["top1_merged"] += top == int(np.argmax(m))
                totals["top1_base"] += top == int(np.argmax(b))
            totals["kl_variant_base"] += kl_b
            totals["kl_variant_merged"] += kl_m
            totals["positions"] += len(continuation)
            rows.append({"kind": item.kind, "positions": len(continuation),
                         "kl_variant_base": kl_b, "kl_variant_merged": kl_m})
            progress("comparing distributions", (index + 1) / len(request.items))
        n = max(totals["positions"], 1)
        result: dict[str, Any] = {
            "items": len(rows), "positions": totals["positions"],
            "kl_variant_base": totals["kl_variant_base"] / n,
            "kl_variant_merged": totals["kl_variant_merged"] / n,
            "top1_merged": totals["top1_merged"] / n, "top1_base": totals["top1_base"] / n,
            "per_item": rows,
        }
        answers: dict[str, list[str]] = {k: [] for k in sides}
        for index, item in enumerate(request.items[:request.greedy]):
            if not item.exact:
                raise RefusedError("merge check: greedy items need a prompt and an answer")
            # Room for the answer and a little more: an answer that is longer than that
            # cannot match it exactly, and a base rambling on costs no more time.
            length = len(prompting.answer_tokens(registry.model(request.variant),
                                                 item.answer or ""))
            sampling = replace(request.sampling, max_tokens=min(length + EXTRA_TOKENS,
                                                                request.sampling.max_tokens))
            prompt = _served_prompt(item)
            for key, spec in sides.items():
                task = GenerationTask(registry, "generate", spec, prompt, sampling,
                                      lambda *a, **k: None, cancelled)
                answers[key].append(run_task(task).text)
            progress("answering", (index + 1) / request.greedy)
        result["answers"] = answers if request.greedy else None
        return result
    finally:
        registry.close_all()


def _served_prompt(item: EvalItem) -> Prompt:
    """The request an item's prompt is answered as (chat: the data's messages, no
    profile system prompt added; pair: the raw text)."""
    if item.kind == "chat":
        return Prompt(messages=item.prompt.messages, chat=True, system="")
    return Prompt(text=item.prompt.text)


def _tokens(registry: SessionRegistry, sides: dict[str, SessionSpec], item: EvalItem,
            cancelled: CancelCheck) -> tuple[list[int], list[int]]:
    """(context, teacher-forced tokens) of an item, the same for all three sides (the
    merged file's tokenizer is checked to agree); a probe's tokens come later."""
    found: list[tuple[list[int], list[int]]] = []
    for spec in sides.values():
        resident = registry.resident(spec, cancelled)
        model, info = resident.model, resident.info
        if item.kind == "text":
            ids = prompting.text_tokens(model, info, item.answer or "")
            found.append((ids[:1], ids[1:]))
            continue
        if item.kind == "probe":
            found.append((prompting.prompt_tokens(model, info, spec, item.prompt), []))
            continue
        if item.kind == "chat":
            prompt = prompting.prompt_tokens(model, info, spec, _served_prompt(item))
        else:
            prompt = prompting.text_tokens(model, info, item.prompt.text or "")
        target = prompting.answer_tokens(model, item.answer or "")
        found.append((prompt, target) if prompt else (target[:1], target[1:]))
    if any(f != found[0] for f in found[1:]):
        raise RefusedError("the merged model does not give the variant's token ids for the "
                           "same item: its tokenizer differs")
    return found[0]


# ------------------------------------------------------------------------- child side


def main() -> None:
    """Serve merge and check requests, one at a time (`runtime.service.serve`)."""
    threads = _threads()

    def handle(job: Job) -> dict[str, Any]:
        last = {"stage": "", "at": -1.0}

        def progress(stage: str, fraction: float) -> None:
            # At most one event per percent and stage: the pipe stays quiet.
            if stage != last["stage"] or fraction - last["at"] >= 0.01 or fraction >= 1:
                last.update(stage=stage, at=fraction)
                job.progress(stage, round(float(fraction), 4))

        try:
            if job.op == MergeRequest.OP:
                request: MergeRequest | CheckRequest = MergeRequest.from_params(job.params)
            elif job.op == CheckRequest.OP:
                request = CheckRequest.from_params(job.params)
            else:
                raise RefusedError(f"unknown merge worker request {job.op!r}")
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, StudioError):
                raise
            raise RefusedError(f"malformed {job.op} request: {type(exc).__name__}: "
                               f"{exc}") from exc
        if isinstance(request, MergeRequest):
            return run_merge(request, progress, job.cancelled, threads)
        return run_check(request, progress, job.cancelled, threads)

    service.serve(ChildChannel(), handle, "merge")


def _threads() -> int:
    try:
        value = int(os.environ.get("VARIANT_STUDIO_THREADS", "0"))
    except ValueError:
        value = 0
    return value if value > 0 else max(1, os.cpu_count() or 1)


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

        handle = self.client.submit_raw(request.OP, request.to_params(), on_event)
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
