"""The merge's survival check: the merged model (a plain base), the dynamic variant and
its base on the same token ids, in sessions of the merge worker's own `SessionRegistry`.

Everything it computes is the engine's scoring (`runtime.scoring`): an item is tokenized
by `scoring.prepare`, the function a `Score` request tokenizes with (the merged file's
tokens are checked to equal the variant's); the next-token distributions come from
`scoring.teacher_forced`, the pass behind a score's log-probabilities; greedy text comes
from `scoring.Greedy`, exact match's own loop, decoded here to the whole answer (the
lenient figure reads all of it) rather than stopped at the first mismatch.

The figures: next-token KL per position of variant||base and variant||merged and top-1
agreement with the variant, teacher-forced on each item's answer (on a probe prompt, on
the variant's greedy continuation), and the greedy answers of all three to the first
`greedy` items for the task figures (`runtime.merge.job` judges them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, TypeVar

import numpy as np

from engine import wire
from engine.catalog.resolve import SessionSpec
from engine.errors import Cancelled, RefusedError
from engine.formats import merge
from engine.runtime import prompting, scoring
from engine.runtime.messages import Prompt, Request, ScoreItem
from engine.runtime.sessions import OpenSession, SessionRegistry

MAX_ITEMS = 256
# A greedy answer takes its expected tokens and as many more as exact match allows
# (scoring's EXTRA_ANSWER_TOKENS), within the context and never more than this (the cap
# the check's answers have always had: the task figures stay comparable).
MAX_ANSWER_TOKENS = 512

ProgressFn = Callable[[str, float], None]
CancelCheck = Callable[[], bool]
T = TypeVar("T")


@dataclass(frozen=True)
class CheckRequest(Request):
    """The check of one merge: `items` (score items) then `probes` (prompts with no
    answer); the first `greedy` items are also answered greedily by all three, and a
    probe's continuation is `probe_tokens` long at most."""

    OP: ClassVar[str] = "check"
    variant: SessionSpec
    base: SessionSpec
    merged: SessionSpec
    items: Annotated[tuple[ScoreItem, ...], wire.Size(0, MAX_ITEMS)] = ()
    probes: Annotated[tuple[Prompt, ...], wire.Size(0, MAX_ITEMS)] = ()
    greedy: Annotated[int, wire.Range(0, MAX_ITEMS)] = 0
    probe_tokens: Annotated[int, wire.Range(0, MAX_ITEMS)] = 16

    def __post_init__(self) -> None:
        wire.check(self)
        if not 1 <= len(self.items) + len(self.probes) <= MAX_ITEMS:
            raise RefusedError(f"a merge check needs 1 to {MAX_ITEMS} evaluation items")
        if self.greedy > len(self.items):
            raise RefusedError("merge check: more greedy items than items")


@dataclass(frozen=True)
class Case:
    """One item as compared: its kind and its tokens, the same on all three sides."""

    kind: str
    prompt: list[int]
    target: list[int]


def run_check(request: CheckRequest, progress: ProgressFn, cancelled: CancelCheck,
              n_threads: int) -> dict[str, Any]:
    """KL and greedy answers of the variant, its base and the merged model."""
    registry = SessionRegistry(max_sessions=4, max_bases=2, n_threads=n_threads)
    sides = {"variant": request.variant, "base": request.base, "merged": request.merged}
    try:
        progress("loading models", 0.0)
        sessions = {k: registry.open(spec, cancelled) for k, spec in sides.items()}
        for session in sessions.values():
            session.context.cancelled = cancelled
        prepared: list[scoring.Prepared] = []
        rows = []
        totals = {"kl_variant_base": 0.0, "kl_variant_merged": 0.0, "top1_merged": 0,
                  "top1_base": 0, "positions": 0}
        count = len(request.items) + len(request.probes)
        for index in range(count):
            if cancelled():
                raise Cancelled("the merge check was cancelled")
            if index < len(request.items):
                item = request.items[index]
                found = _same(scoring.prepare(registry, spec, item, cancelled)
                              for spec in sides.values())
                prepared.append(found)
                case = Case(item.kind, found.prompt, found.target)
            else:
                case = _probe(registry, sides, sessions["variant"],
                              request.probes[index - len(request.items)],
                              request.probe_tokens, cancelled)
            if not case.target:
                continue
            dist = {k: scoring.teacher_forced(sessions[k].context, case.prompt, case.target)
                    for k in sides}
            kl_b = kl_m = 0.0
            for v, b, m in zip(dist["variant"], dist["base"], dist["merged"], strict=True):
                kl_b += merge.kl_rows(v, b)
                kl_m += merge.kl_rows(v, m)
                top = int(np.argmax(v))
                totals["top1_merged"] += top == int(np.argmax(m))
                totals["top1_base"] += top == int(np.argmax(b))
            totals["kl_variant_base"] += kl_b
            totals["kl_variant_merged"] += kl_m
            totals["positions"] += len(case.target)
            rows.append({"kind": case.kind, "positions": len(case.target),
                         "kl_variant_base": kl_b, "kl_variant_merged": kl_m})
            progress("comparing distributions", (index + 1) / count)
        n = max(totals["positions"], 1)
        result: dict[str, Any] = {
            "items": len(rows), "positions": totals["positions"],
            "kl_variant_base": totals["kl_variant_base"] / n,
            "kl_variant_merged": totals["kl_variant_merged"] / n,
            "top1_merged": totals["top1_merged"] / n, "top1_base": totals["top1_base"] / n,
            "per_item": rows,
        }
        answers: dict[str, list[str]] = {k: [] for k in sides}
        for index, found in enumerate(prepared[:request.greedy]):
            if not found.exact:
                raise RefusedError("merge check: greedy items need a prompt and an answer")
            for key, spec in sides.items():
                context = sessions[key].context
                # Room for the answer and a little more: an answer longer than that cannot
                # match it exactly, and a base rambling on costs no more time.
                limit = min(len(found.target) + scoring.EXTRA_ANSWER_TOKENS,
                            MAX_ANSWER_TOKENS, context.n_ctx - len(found.prompt))
                greedy = scoring.Greedy(registry.model(spec), found.prompt, limit)
                answers[key].append(greedy.run(context, cancelled).text)
            progress("answering", (index + 1) / request.greedy)
        result["answers"] = answers if request.greedy else None
        return result
    finally:
        registry.close_all()


def _probe(registry: SessionRegistry, sides: dict[str, SessionSpec], variant: OpenSession,
           prompt: Prompt, length: int, cancelled: CancelCheck) -> Case:
    """A probe prompt served as a request is, and the variant's greedy continuation."""
    found = []
    for spec in sides.values():
        resident = registry.resident(spec, cancelled)
        found.append(prompting.prompt_tokens(resident.model, resident.info, spec, prompt))
    tokens = _same(found)
    continuation: list[int] = []
    if length:
        greedy = scoring.Greedy(registry.model(sides["variant"]), tokens, length)
        continuation = greedy.run(variant.context, cancelled).tokens
    return Case("probe", tokens, continuation)


def _same(found: Iterable[T]) -> T:
    """The one value all three sides gave (the merged file's tokenizer must agree)."""
    values = list(found)
    if any(v != values[0] for v in values[1:]):
        raise RefusedError("the merged model does not give the variant's token ids for the "
                           "same item: its tokenizer differs")
    return values[0]
