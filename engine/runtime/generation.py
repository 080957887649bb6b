"""Generation as tasks that advance a step at a time: generate and compare requests.

Runs only on the engine thread of the engine process. A `GenerationTask` is one
generate or compare request: the host's scheduler calls `advance` on every running
task in turn, and each call decodes one prompt chunk or one token per side, so a long
generation never blocks a short one. A side is one sequence (`Side`): its session
(from the registry, `engine.runtime.sessions`), its prompt tokens (`engine.runtime.
prompting`), its sampler and its output so far; when it ends it becomes a typed
`GenerationResult` with its replay record. A comparison adds the first divergence and
the adapter effect (`adapter_effect`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from engine.catalog.profiles import Sampling
from engine.catalog.resolve import SessionSpec
from engine.errors import Cancelled, EngineError, RefusedError
from engine.formats import tool_calls
from engine.formats.tool_calls import CallParser, Constraint
from engine.runtime import contention, prompting, replay
from engine.runtime.backend import ResidentModel, TextStream
from engine.runtime.constraint import Matcher
from engine.runtime.messages import Prompt
from engine.runtime.results import (
    Alternative,
    CompareResult,
    GenerationResult,
    adapters_of,
)
from engine.runtime.sampler import Sampler, StopMatcher, log_softmax, token_logprob
from engine.runtime.sessions import CancelCheck, Emit, OpenSession, SessionRegistry
from engine.runtime.tokens import first_divergence


@dataclass
class Side:
    """One side of a generation: its session, sampler and output so far."""

    name: str
    session: OpenSession
    model: ResidentModel
    sampler: Sampler
    stops: StopMatcher
    prompt: list[int]
    # What was asked for: a session serves every spec of its identity, and the variant's
    # own name is not in the identity, so the result is labelled from this spec.
    spec: SessionSpec
    decoder: TextStream
    logits: np.ndarray | None = None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    finish: str | None = None
    prefill: Iterator[np.ndarray | None] | None = None
    top: list[tuple[Alternative, ...]] = field(default_factory=list)
    decode_seconds: float = 0.0
    prompt_seconds: float = 0.0
    reused_tokens: int = 0
    # With tools: splits the answer into content and tool calls as it streams.
    parser: CallParser | None = None

    def step(self, sampling: Sampling, emit: Emit, cancelled: CancelCheck,
             top_logprobs: int = 0) -> None:
        """One step: a chunk of the prompt, or one token chosen and fed back; sets
        `finish` when done."""
        context, model = self.session.context, self.model
        start = time.perf_counter()
        if self.logits is None:
            if self.prefill is None:
                self.prefill = context.prefill_steps(self.prompt, reserve=sampling.max_tokens)
            logits = next(self.prefill)
            self.prompt_seconds += time.perf_counter() - start
            if logits is None:
                return  # more of the prompt to decode: the next step goes on
            self.logits = logits
            self.reused_tokens = context.reused
            start = time.perf_counter()
        token = self.sampler.choose(self.logits, self.prompt + self.tokens)
        # The whole log-softmax row only when top log-probabilities are asked for; the
        # chosen token's alone costs a third of it (docs/performance.md, "Our loop").
        row = log_softmax(self.logits) if top_logprobs else None
        logprob = float(row[token]) if row is not None else token_logprob(self.logits, token)
        if model.is_end(token):
            self.finish = "eos"
            self.decode_seconds += time.perf_counter() - start
            return
        self.tokens.append(token)
        self.logprobs.append(logprob)
        top: tuple[Alternative, ...] = ()
        if row is not None:
            best = np.argpartition(-row, top_logprobs)[:top_logprobs]
            best = best[np.lexsort((best, -row[best]))]
            top = tuple((int(t), model.token_text(int(t)).decode("utf-8", "replace"),
                         float(row[t])) for t in best)
            self.top.append(top)
        piece = self.decoder.feed(token)
        text, hit = self.stops.feed(piece)
        self.text += text
        if cancelled():
            raise Cancelled("cancelled")
        event = {"side": self.name, "token_id": token, "text": text, "logprob": logprob,
                 "index": len(self.tokens) - 1}
        if top:
            event["top"] = [list(t) for t in top]
            event["piece"] = model.token_text(token).decode("utf-8", "replace")
        if self.parser is not None:
            content, deltas = self.parser.feed(text)
            event["content"] = content
            if deltas:
                event["calls"] = [d.to_dict() for d in deltas]
        emit("token", **event)
        if hit:
            self.finish = "stop"
        elif self.sampler.finished:  # the constraint is complete: only the end may follow
            self.finish = "eos"
        elif len(self.tokens) >= sampling.max_tokens:
            self.finish = "length"
        elif len(self.prompt) + len(self.tokens) >= context.n_ctx:
            self.finish = "context"
        else:
            self.logits = context.step(token)
        self.decode_seconds += time.perf_counter() - start

    def result(self, prompt: Prompt, sampling: Sampling,
               constraint: Constraint | None = None) -> GenerationResult:
        """The finished side, with what regenerates it (`engine.runtime.replay`)."""
        tail = self.stops.feed(self.decoder.finish())[0]
        if self.finish != "stop":
            tail += self.stops.flush()
        self.text += tail
        content = calls = None
        if self.parser is not None:
            self.parser.feed(tail)
            self.parser.finish()
            content, calls = self.parser.content, tuple(self.parser.calls)
        spec = self.spec
        self.session.generations += 1
        tps = len(self.tokens) / self.decode_seconds if self.decode_seconds > 0 else 0.0
        texts = [self.model.token_text(t).decode("utf-8", "replace") for t in self.tokens]
        return GenerationResult(
            name=spec.name, kind=spec.kind, backend=spec.backend, text=self.text,
            token_ids=tuple(self.tokens), logprobs=tuple(self.logprobs),
            identity=spec.identity.key, identity_short=spec.identity.short,
            adapters=adapters_of(spec), prompt_tokens=len(self.prompt),
            reused_tokens=self.reused_tokens, prompt_seconds=self.prompt_seconds,
            finish_reason=self.finish, tokens_per_second=tps,
            top_logprobs=tuple(self.top) if self.top else None,
            replay=replay.record(self.session.spec, prompt, sampling, self.prompt,
                                 self.tokens, texts, self.text, self.finish, constraint),
            content=content, tool_calls=calls, machine_load=contention.machine_load())


class GenerationTask:
    """One generate or compare request, advanced a step at a time (see the module doc).

    `advance` returns None while the task goes on (or waits for a free session) and
    the result when it is done; `close` releases its sessions (always call it, also
    after an error or a cancel)."""

    def __init__(self, registry: SessionRegistry, kind: str, spec: SessionSpec,
                 prompt: Prompt, sampling: Sampling, emit: Emit, cancelled: CancelCheck,
                 top_logprobs: int = 0, constraint: Constraint | None = None) -> None:
        if kind == "compare" and not spec.adapters:
            raise RefusedError(f"{spec.name} is a base model; compare needs a variant")
        self.registry = registry
        self.kind = kind
        self.prompt = prompt
        self.sampling = sampling
        self.emit = emit
        self.cancelled = cancelled
        self.top_logprobs = top_logprobs
        self.constraint = constraint
        # The variant opens first: on OpenVINO, registering its adapters may rebuild the
        # compiled model, which closes that base's sessions; the base side then joins it.
        self.wanted = ([("main", spec)] if kind == "generate"
                       else [("variant", spec), ("base", spec.base_spec())])
        self.sides: list[Side] = []

    @property
    def started(self) -> bool:
        return bool(self.sides)

    def _start(self) -> bool:
        sides: list[Side] = []
        for name, spec in self.wanted:
            resident = self.registry.resident(spec, self.cancelled)
            tokens = prompting.prompt_tokens(resident.model, resident.info, spec, self.prompt)
            fmt = prompting.tool_format(resident.info, spec, self.prompt)
            try:
                # Compiled before a session is taken: a grammar that does not compile is
                # refused, never served unconstrained.
                matcher = self._matcher(resident.model, fmt)
                session = self.registry.acquire(spec, tokens, self.cancelled)
            except BaseException:
                for side in sides:
                    self.registry.release(side.session)
                raise
            if session is None:
                for side in sides:
                    self.registry.release(side.session)
                return False
            session.context.cancelled = self.cancelled
            model = self.registry.model(spec)
            choice = self.constraint.tool_choice if self.constraint else None
            parser = (CallParser(fmt, replay.token_digest(tokens))
                      if fmt is not None and self.prompt.tools and choice != "none" else None)
            sides.append(Side(name, session, model, Sampler(self.sampling, matcher),
                              StopMatcher(self.sampling.stop), tokens, spec,
                              model.text_stream(), parser=parser))
        self.sides = sides
        return True

    def _matcher(self, model: ResidentModel, fmt: str | None) -> Matcher | None:
        """The request's constraint as a grammar state for one side (None: none)."""
        if self.constraint is None or not self.constraint.active:
            return None
        grammar = tool_calls.grammar(self.constraint, self.prompt.tools or (),
                                     fmt or "generic")
        return Matcher(model, grammar) if grammar is not None else None

    def advance(self) -> GenerationResult | CompareResult | None:
        if self.cancelled():
            raise Cancelled("cancelled")
        if not self.sides and not self._start():
            return None
        for side in self.sides:
            if side.finish is None:
                side.step(self.sampling, self.emit, self.cancelled, self.top_logprobs)
        if any(side.finish is None for side in self.sides):
            return None
        if self.kind == "generate":
            return self.sides[0].result(self.prompt, self.sampling, self.constraint)
        variant, base = self.sides
        return CompareResult(base=base.result(self.prompt, self.sampling, self.constraint),
                             variant=variant.result(self.prompt, self.sampling,
                                                    self.constraint),
                             first_divergence=first_divergence(base.tokens, variant.tokens),
                             adapter_effect=adapter_effect(base, variant))

    def close(self) -> None:
        for side in self.sides:
            self.registry.release(side.session)
        self.sides = []


def run_task(task: GenerationTask) -> GenerationResult | CompareResult:
    """Advance `task` to its end (nothing else is running)."""
    try:
        while True:
            result = task.advance()
            if result is not None:
                return result
            if not task.started:
                raise EngineError("every session is busy")
    finally:
        task.close()


def adapter_effect(base: Side, variant: Side) -> float | None:
    """Mean |log p_base - log p_variant| over the base's tokens, teacher-forced.

    Both sides are scored the same way (the same aligned chunks), so a variant that
    changes nothing scores exactly 0 and any real adapter shows up, even when the
    greedy text happens to agree.
    """
    if not base.tokens:
        return None
    rows_base = base.session.context.score(base.prompt, base.tokens)
    rows_variant = variant.session.context.score(base.prompt, base.tokens)
    diffs = [abs(log_softmax(b)[t] - log_softmax(v)[t])
             for b, v, t in zip(rows_base, rows_variant, base.tokens, strict=True)]
    return float(np.mean(diffs))
