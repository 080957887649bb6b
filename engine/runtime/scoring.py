"""Scoring through the served numerics: teacher-forced log-probabilities, and exact match.

Runs only on the engine thread of the engine process. A `ScoreTask` is one `Score`
request: every item is tokenized first (the chat template rendered exactly as a served
request renders it, so a malformed item or one that does not fit the context is refused
with its line before anything is scored), then each item is scored by the session's own
`context.score` — the same call, the same aligned chunks and the same adapters as the
comparison's adapter effect and the cross-check — so the figures are the served ones,
on llama.cpp and OpenVINO alike.

Exact match decodes the greedy answer the way a served generation does (the prompt's
prefill, then one token per step, through the same `Sampler` at temperature 0 and no
repeat penalty) and stops as soon as the answer can no longer equal the target: a
mismatching character, or an end token. So a base that answers in prose costs one or
two steps, not a whole answer. An item whose answer is a tool call (`ScoreItem.
tool_calls`, or a target that parses as one: `engine.formats.tool_match`) is decoded to
its end instead, and its calls compared with the expected ones by function name and
JSON-equal arguments (`tool_call_exact`): a call written with other spacing or key
order is the same call.

The task is interleaved with generations by the host's scheduler, not run alone: each
`advance` is one item's teacher-forced pass, one prompt chunk or one greedy token, and
the session is released between items, so a chat or a server request keeps streaming
while a long evaluation runs (and a cancel takes effect at the next step).

The merge's survival check (`engine.runtime.merge.check`, in the merge worker) is built
on the same three pieces: `prepare` (an item's tokens), `teacher_forced` (the
next-token distributions behind a score) and `Greedy` (exact match's greedy loop, there
run to the whole answer).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.catalog.profiles import Sampling
from engine.catalog.resolve import SessionSpec
from engine.errors import Cancelled, ContextOverflowError, RefusedError, StudioError
from engine.formats.templates import Message, ToolCall
from engine.formats.tool_calls import answer_text, write_calls
from engine.formats.tool_match import parse_any, same_calls
from engine.runtime import prompting
from engine.runtime.backend import Context, ResidentModel, TextStream
from engine.runtime.messages import Prompt, Score, ScoreItem
from engine.runtime.results import ScoreResult, ScoreRow, adapters_of
from engine.runtime.sampler import Sampler, log_softmax
from engine.runtime.sessions import CancelCheck, Emit, OpenSession, SessionRegistry

# Per-token log-probabilities in one result at most (a result is one protocol line).
MAX_PER_TOKEN = 1_000_000
# Greedy tokens an exact-match answer may take beyond the target's own count (another
# tokenization of the same text may need a few more).
EXTRA_ANSWER_TOKENS = 16
# Greedy tokens a tool-call answer may take, per token of the target (its arguments may
# be written with other spacing or key order).
TOOL_ANSWER_FACTOR = 2
# Greedy as in the demo's measurement: argmax, no repeat penalty.
GREEDY = Sampling(temperature=0.0, repeat_penalty=1.0)


@dataclass(frozen=True)
class Prepared:
    """One item, tokenized: the unscored context and the scored tokens."""

    item: ScoreItem
    prompt: list[int]
    target: list[int]
    exact: bool  # does exact match apply (a pair or chat item with a prompt)
    # The calls the answer must make (None: not a tool-call item).
    calls: tuple[ToolCall, ...] | None = None
    # A tool-call item's answer as the scored model writes it (`served_target`).
    served: str | None = None


def _line(item: ScoreItem) -> str:
    return f"line {item.line}: " if item.line else ""


def prepare(registry: SessionRegistry, spec: SessionSpec, item: ScoreItem,
            cancelled: CancelCheck) -> Prepared:
    """`item` tokenized as served for `spec`: the one tokenization of a score item (a
    `Score` request's and the merge check's); refused with the item's line when it
    cannot be scored or does not fit the context."""
    try:
        prepared = _tokenize(registry, spec, item, cancelled)
    except Cancelled:
        raise
    except ContextOverflowError as exc:
        raise ContextOverflowError(_line(item) + exc.message) from None
    except StudioError as exc:
        raise RefusedError(_line(item) + exc.message) from None
    size = len(prepared.prompt) + len(prepared.target)
    n_ctx = spec.identity.context.n_ctx
    if size >= n_ctx:
        raise ContextOverflowError(f"{_line(item)}{size} tokens do not fit the "
                                   f"context ({n_ctx})")
    return prepared


def _tokenize(registry: SessionRegistry, spec: SessionSpec, item: ScoreItem,
              cancelled: CancelCheck) -> Prepared:
    # Loads the resident (and checks the base's digest) on first use.
    resident = registry.resident(spec, cancelled)
    model, info = resident.model, resident.info
    prompt: list[int] = []
    if item.kind == "chat":
        if not item.prompt.messages:
            raise RefusedError("a chat item needs the messages before its answer")
        # The conversation as the data gives it (with its tools): no profile system
        # prompt is added, so the base and every variant score the same conversation.
        chat = Prompt(messages=item.prompt.messages, chat=True, system="",
                      tools=item.prompt.tools)
        prompt = prompting.prompt_tokens(model, info, spec, chat)
        if item.tool_calls:
            served = served_target(item, prompting.tool_format(info, spec, chat) or "generic")
            return Prepared(item, prompt, prompting.answer_tokens(model, served), True,
                            item.tool_calls, served)
    elif item.kind == "text":
        ids = prompting.text_tokens(model, info, item.target)
        return Prepared(item, ids[:1], ids[1:], False)
    if item.kind == "pair" and item.prompt.text:
        prompt = prompting.text_tokens(model, info, item.prompt.text)
    # The answer's own tokens, as training tokenizes a completion.
    target = prompting.answer_tokens(model, item.target)
    if not prompt:  # an empty prompt: the first token has nothing to predict it
        return Prepared(item, target[:1], target[1:], False)
    return Prepared(item, prompt, target, True, item.tool_calls or parse_any(item.target))


def served_target(item: ScoreItem, fmt: str) -> str:
    """A tool-call item's answer as a model served in format `fmt` writes it (the item
    holds it in the generic format: its content, then its calls on a line of their own)."""
    assert item.tool_calls
    calls = write_calls(item.tool_calls, "generic")
    content = item.target.removesuffix(calls).removesuffix("\n")
    return answer_text(Message("assistant", content, tool_calls=item.tool_calls), fmt)


def teacher_forced(context: Context, prompt: list[int], target: list[int]
                   ) -> list[np.ndarray]:
    """The next-token logits at each of `target`'s positions after `prompt`,
    teacher-forced in the session's aligned chunks (as a cold decode of both): the pass
    behind a score's log-probabilities and the merge check's distributions."""
    return context.score(prompt, target) if target else []


@dataclass
class Greedy:
    """A greedy answer decoded a step at a time, as a served generation decodes it: the
    prompt's prefill in aligned chunks, then one token per step through the `Sampler` at
    temperature 0 with no repeat penalty, to an end token or `limit` tokens.

    With a `target` (exact match) it stops as soon as the answer can no longer be the
    target (a mismatching character), so a base that answers in prose costs one or two
    steps, and `exact` is the verdict; without one it decodes the whole answer."""

    model: ResidentModel
    prompt: list[int]
    limit: int
    target: str | None = None
    sampler: Sampler = field(default_factory=lambda: Sampler(GREEDY))
    decoder: TextStream = field(init=False)
    prefill: Iterator[np.ndarray | None] | None = None
    logits: np.ndarray | None = None
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    exact: bool | None = None

    def __post_init__(self) -> None:
        self.decoder = self.model.text_stream()

    def step(self, context: Context) -> bool:
        """One prompt chunk or one token; True once the answer is finished."""
        if self.logits is None:
            if self.prefill is None:
                self.prefill = context.prefill_steps(self.prompt, reserve=self.limit)
            logits = next(self.prefill)
            if logits is None:
                return False
            self.logits = logits
        token = self.sampler.choose(self.logits, self.prompt + self.tokens)
        if self.model.is_end(token):
            self.text += self.decoder.finish()
            return self._end(self.text == self.target)
        self.tokens.append(token)
        self.text += self.decoder.feed(token)
        if self.target is not None and (not self.target.startswith(self.text)
                                        or len(self.tokens) >= self.limit):
            return self._end(False)  # it can no longer be the target
        if len(self.tokens) >= self.limit:
            self.text += self.decoder.finish()
            return self._end(False)
        self.logits = context.step(token)
        return False

    def run(self, context: Context, cancelled: CancelCheck) -> Greedy:
        """Step to the end at once (for work that has the engine to itself)."""
        while not self.step(context):
            if cancelled():
                raise Cancelled("cancelled")
        return self

    def _end(self, exact: bool) -> bool:
        if self.target is not None:
            self.exact = exact
        return True


class ScoreTask:
    """One `Score` request, advanced a step at a time (the host's scheduler calls
    `advance` like a `GenerationTask`'s; `close` releases its session)."""

    def __init__(self, registry: SessionRegistry, request: Score, emit: Emit,
                 cancelled: CancelCheck) -> None:
        self.registry = registry
        self.request = request
        self.spec = request.spec
        self.emit = emit
        self.cancelled = cancelled
        self.prepared: list[Prepared] | None = None
        self.index = 0
        self.session: OpenSession | None = None
        self.row: dict[str, Any] | None = None  # the current item's figures so far
        self.greedy: Greedy | None = None
        self.rows: list[ScoreRow] = []
        self.started_at = time.perf_counter()

    @property
    def started(self) -> bool:
        return self.prepared is not None

    def _model(self) -> ResidentModel:
        return self.registry.model(self.spec)

    # ------------------------------------------------------------------ preparing

    def _prepare(self) -> list[Prepared]:
        """Every item tokenized as served; refuses the first that cannot be scored."""
        out: list[Prepared] = []
        total = 0
        for item in self.request.items:
            if self.cancelled():
                raise Cancelled("cancelled")
            prepared = prepare(self.registry, self.spec, item, self.cancelled)
            total += len(prepared.target)
            out.append(prepared)
        if self.request.per_token and total > MAX_PER_TOKEN:
            raise RefusedError(f"{total} scored tokens: more than {MAX_PER_TOKEN} per-token "
                               "log-probabilities in one result; score without them")
        return out

    # ------------------------------------------------------------------ stepping

    def advance(self) -> ScoreResult | None:
        if self.cancelled():
            raise Cancelled("cancelled")
        if self.prepared is None:
            self.prepared = self._prepare()
            return None
        current = self.prepared[self.index]
        if self.session is None:
            session = self.registry.acquire(self.spec, current.prompt, self.cancelled)
            if session is None:
                return None  # every session of this identity is busy: wait
            session.context.cancelled = self.cancelled
            self.session = session
        if self.row is None:
            self.row = self._score(current)
            if self.request.exact_match and current.exact:
                room = self.session.context.n_ctx - len(current.prompt) - 1
                wanted = len(current.target) * (1 if current.calls is None
                                                else TOOL_ANSWER_FACTOR)
                # A tool-call answer is decoded whole (no target to stop early at): its
                # calls may equal the target's in another spelling.
                self.greedy = Greedy(self._model(), current.prompt,
                                     max(1, min(wanted + EXTRA_ANSWER_TOKENS, room)),
                                     current.item.target if current.calls is None else None)
                return None
        elif self.greedy is not None:
            if not self.greedy.step(self.session.context):
                return None
            self.row["answer"] = self.greedy.text
            if current.calls is None:
                self.row["exact"] = self.greedy.exact
            else:
                self.row["exact"] = self.greedy.text == (current.served or current.item.target)
                self.row["tool_call_exact"] = same_calls(
                    parse_any(self.greedy.text) or (), current.calls)
        return self._next_item()

    def _score(self, current: Prepared) -> dict[str, Any]:
        assert self.session is not None
        logprobs: list[float] = []
        if current.target:
            rows = teacher_forced(self.session.context, current.prompt, current.target)
            logprobs = [float(log_softmax(row)[token])
                        for row, token in zip(rows, current.target, strict=True)]
        nll = -sum(logprobs)
        row: dict[str, Any] = {
            "line": current.item.line, "kind": current.item.kind,
            "tokens": len(logprobs), "nll": nll,
            "mean_nll": nll / len(logprobs) if logprobs else None,
            "exact": None, "answer": None,
        }
        if self.request.per_token:
            row["logprobs"] = logprobs
        return row

    def _next_item(self) -> ScoreResult | None:
        assert self.row is not None and self.prepared is not None
        self.rows.append(ScoreRow.from_dict(self.row))
        self.row, self.greedy = None, None
        self._release()
        self.index += 1
        self.emit("progress", stage=f"scoring {self.spec.name}",
                  fraction=self.index / len(self.prepared))
        return self._result() if self.index == len(self.prepared) else None

    def _release(self) -> None:
        if self.session is not None:
            self.registry.release(self.session)
        self.session = None

    def close(self) -> None:
        self._release()

    # ------------------------------------------------------------------ result

    def _result(self) -> ScoreResult:
        spec = self.spec
        tokens = sum(r.tokens for r in self.rows)
        nll = sum(r.nll for r in self.rows)
        mean = nll / tokens if tokens else None
        judged = [r.exact for r in self.rows if r.exact is not None]
        calls = [r.tool_call_exact for r in self.rows if r.tool_call_exact is not None]
        return ScoreResult(
            name=spec.name, kind=spec.kind, backend=spec.backend,
            identity=spec.identity.key, identity_short=spec.identity.short,
            openvino_profile=spec.identity.compute.name if spec.identity.compute else None,
            adapters=adapters_of(spec), items=len(self.rows), tokens=tokens, nll=nll,
            mean_nll=mean, perplexity=perplexity(mean), exact_items=len(judged),
            exact_matches=sum(judged), exact_match=sum(judged) / len(judged) if judged
            else None, seconds=time.perf_counter() - self.started_at, rows=tuple(self.rows),
            tool_call_items=len(calls), tool_call_matches=sum(calls),
            tool_call_exact=sum(calls) / len(calls) if calls else None)


def perplexity(mean_nll: float | None) -> float | None:
    """exp(mean NLL per token); None without tokens (JSON has no infinity)."""
    if mean_nll is None:
        return None
    return math.exp(min(mean_nll, 700.0))
