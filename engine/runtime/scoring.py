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
two steps, not a whole answer.

The task is interleaved with generations by the host's scheduler, not run alone: each
`advance` is one item's teacher-forced pass, one prompt chunk or one greedy token, and
the session is released between items, so a chat or a server request keeps streaming
while a long evaluation runs (and a cancel takes effect at the next step).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.catalog.profiles import Sampling
from engine.errors import Cancelled, ContextOverflowError, RefusedError, StudioError
from engine.runtime import prompting
from engine.runtime.backend import ResidentModel, TextStream
from engine.runtime.messages import Prompt, Score, ScoreItem
from engine.runtime.results import ScoreResult, ScoreRow, adapters_of
from engine.runtime.sampler import Sampler, log_softmax
from engine.runtime.sessions import CancelCheck, Emit, OpenSession, SessionRegistry

# Per-token log-probabilities in one result at most (a result is one protocol line).
MAX_PER_TOKEN = 1_000_000
# Greedy tokens an exact-match answer may take beyond the target's own count (another
# tokenization of the same text may need a few more).
EXTRA_ANSWER_TOKENS = 16
# Greedy as in the demo's measurement: argmax, no repeat penalty.
GREEDY = Sampling(temperature=0.0, repeat_penalty=1.0)


@dataclass
class Prepared:
    """One item, tokenized: the unscored context and the scored tokens."""

    item: ScoreItem
    prompt: list[int]
    target: list[int]
    exact: bool  # does exact match apply (a pair or chat item with a prompt)


@dataclass
class Greedy:
    """The greedy answer of one item, decoded a step at a time."""

    sampler: Sampler
    decoder: TextStream
    limit: int
    prefill: Any = None
    logits: np.ndarray | None = None
    tokens: list[int] = field(default_factory=list)
    text: str = ""


def _line(item: ScoreItem) -> str:
    return f"line {item.line}: " if item.line else ""


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
        n_ctx = self.spec.identity.context.n_ctx
        out: list[Prepared] = []
        total = 0
        for item in self.request.items:
            if self.cancelled():
                raise Cancelled("cancelled")
            try:
                prepared = self._tokenize(item)
            except Cancelled:
                raise
            except ContextOverflowError as exc:
                raise ContextOverflowError(_line(item) + exc.message) from None
            except StudioError as exc:
                raise RefusedError(_line(item) + exc.message) from None
            size = len(prepared.prompt) + len(prepared.target)
            if size >= n_ctx:
                raise ContextOverflowError(f"{_line(item)}{size} tokens do not fit the "
                                           f"context ({n_ctx})")
            total += len(prepared.target)
            out.append(prepared)
        if self.request.per_token and total > MAX_PER_TOKEN:
            raise RefusedError(f"{total} scored tokens: more than {MAX_PER_TOKEN} per-token "
                               "log-probabilities in one result; score without them")
        return out

    def _tokenize(self, item: ScoreItem) -> Prepared:
        spec = self.spec
        # Loads the resident (and checks the base's digest) on first use.
        resident = self.registry.resident(spec, self.cancelled)
        model, info = resident.model, resident.info
        prompt: list[int] = []
        if item.kind == "chat":
            if not item.prompt.messages:
                raise RefusedError("a chat item needs the messages before its answer")
            # The conversation as the data gives it: no profile system prompt is added,
            # so the base and every variant score the same tokens.
            prompt = prompting.prompt_tokens(
                model, info, spec, Prompt(messages=item.prompt.messages, chat=True,
                                          system=""))
        elif item.kind == "text":
            ids = prompting.text_tokens(model, info, item.target)
            return Prepared(item, ids[:1], ids[1:], False)
        if item.kind == "pair" and item.prompt.text:
            prompt = prompting.text_tokens(model, info, item.prompt.text)
        # The answer's own tokens, as training tokenizes a completion.
        target = prompting.answer_tokens(model, item.target)
        if not prompt:  # an empty prompt: the first token has nothing to predict it
            return Prepared(item, target[:1], target[1:], False)
        return Prepared(item, prompt, target, True)

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
                model = self._model()
                room = self.session.context.n_ctx - len(current.prompt) - 1
                self.greedy = Greedy(Sampler(GREEDY), model.text_stream(),
                                     max(1, min(len(current.target) + EXTRA_ANSWER_TOKENS,
                                                room)))
                return None
        elif self.greedy is not None and not self._greedy_step(current):
            return None
        return self._next_item()

    def _score(self, current: Prepared) -> dict[str, Any]:
        assert self.session is not None
        logprobs: list[float] = []
        if current.target:
            rows = self.session.context.score(current.prompt, current.target)
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

    def _greedy_step(self, current: Prepared) -> bool:
        """One step of the greedy answer; True when the verdict is known."""
        assert self.session is not None and self.greedy is not None and self.row is not None
        greedy, context = self.greedy, self.session.context
        if greedy.logits is None:
            if greedy.prefill is None:
                greedy.prefill = context.prefill_steps(current.prompt, reserve=greedy.limit)
            logits = next(greedy.prefill)
            if logits is None:
                return False
            greedy.logits = logits
        token = greedy.sampler.choose(greedy.logits, current.prompt + greedy.tokens)
        target = current.item.target
        if self._model().is_end(token):
            greedy.text += greedy.decoder.finish()
            return self._verdict(greedy.text == target)
        greedy.tokens.append(token)
        greedy.text += greedy.decoder.feed(token)
        if not target.startswith(greedy.text) or len(greedy.tokens) >= greedy.limit:
            return self._verdict(False)  # it can no longer be the target
        greedy.logits = context.step(token)
        return False

    def _verdict(self, exact: bool) -> bool:
        assert self.row is not None and self.greedy is not None
        self.row["exact"] = exact
        self.row["answer"] = self.greedy.text
        return True

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
        return ScoreResult(
            name=spec.name, kind=spec.kind, backend=spec.backend,
            identity=spec.identity.key, identity_short=spec.identity.short,
            openvino_profile=spec.identity.compute.name if spec.identity.compute else None,
            adapters=adapters_of(spec), items=len(self.rows), tokens=tokens, nll=nll,
            mean_nll=mean, perplexity=perplexity(mean), exact_items=len(judged),
            exact_matches=sum(judged), exact_match=sum(judged) / len(judged) if judged
            else None, seconds=time.perf_counter() - self.started_at, rows=tuple(self.rows))


def perplexity(mean_nll: float | None) -> float | None:
    """exp(mean NLL per token); None without tokens (JSON has no infinity)."""
    if mean_nll is None:
        return None
    return math.exp(min(mean_nll, 700.0))
