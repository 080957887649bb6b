"""Sessions keyed by identity, and generation as tasks that advance a step at a time.

Runs only on the engine thread of the engine process. One resident model per base
file; any number of sessions (contexts) over it, each with its own adapter set and KV
cache, looked up by identity key, so warm state (the prefix cache of a context) is
reused only for an identical identity. An identity may have several sessions when
requests for it run at once; a session serves one request at a time (`acquire` /
`release`). The number of live sessions is bounded; the least recently used idle one
closes first. Before anything native touches a file, its digest is checked against
the spec and adapters are validated against the base in Python.

A `GenerationTask` is one generate or compare request: the host's scheduler calls
`advance` on every running task in turn, and each call decodes one prompt chunk or
one token per side, so a long generation never blocks a short one.
"""

from __future__ import annotations

import itertools
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.catalog import digest, validation
from engine.catalog.profiles import Sampling
from engine.catalog.resolve import SessionSpec
from engine.errors import Cancelled, ContextOverflowError, EngineError, RefusedError
from engine.formats import artifacts
from engine.formats.artifacts import AdapterInfo, BaseModelInfo
from engine.formats.templates import Message, plain_prompt, render
from engine.runtime import replay
from engine.runtime.backend import (
    AdapterSet,
    Context,
    ResidentModel,
    TextStream,
    common_prefix,
    load_model,
)
from engine.runtime.messages import Prompt
from engine.runtime.sampler import Sampler, StopMatcher, log_softmax, token_logprob
from engine.runtime.signing import SignatureGate

Emit = Callable[..., None]
CancelCheck = Callable[[], bool]


@dataclass
class OpenSession:
    spec: SessionSpec
    context: Context
    number: int = 0  # tells apart sessions of one identity
    busy: bool = False  # serving a request now
    opened_at: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.time)
    generations: int = 0


@dataclass
class Resident:
    name: str  # the catalog name it was opened under
    model: ResidentModel
    info: BaseModelInfo
    last_used: float = field(default_factory=time.time)


@dataclass
class SideState:
    """One side of a generation: its session, sampler and output so far."""

    name: str
    session: OpenSession
    sampler: Sampler
    stops: StopMatcher
    prompt: list[int]
    logits: np.ndarray | None = None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    finish: str | None = None
    decoder: TextStream | None = None
    prefill: Iterator[np.ndarray | None] | None = None
    top: list[list[list[Any]]] = field(default_factory=list)  # per token: [id, text, logprob]
    decode_seconds: float = 0.0
    prompt_seconds: float = 0.0
    reused_tokens: int = 0
    # What was asked for: a session serves every spec of its identity, and the variant's
    # own name is not in the identity, so the result is labelled from this spec.
    spec: SessionSpec | None = None


def resident_key(spec: SessionSpec) -> str:
    """Residents are per backend and the digest of the weights served (the same file may
    serve both backends; an OpenVINO base's profiles are separate residents)."""
    sha = spec.identity.served_sha256
    return sha if spec.backend == "llama" else f"{spec.backend}:{sha}"


class SessionManager:
    def __init__(self, max_sessions: int = 3, max_bases: int = 2,
                 n_threads: int | None = None) -> None:
        self.max_sessions = max_sessions
        self.max_bases = max_bases
        self.n_threads = n_threads or max(1, os.cpu_count() or 1)
        self.residents: OrderedDict[str, Resident] = OrderedDict()
        # Residents a request holds a session on while it opens another (`cross_check`):
        # never evicted then, though the session is not generating (not `busy`).
        self._pinned: set[str] = set()
        self.sessions: list[OpenSession] = []  # least recently used first
        self._numbers = itertools.count(1)
        self.signatures = SignatureGate()  # the signature policy, checked per request

    # ------------------------------------------------------------------ lifecycle

    def acquire(self, spec: SessionSpec, prompt: list[int] | None = None,
                cancelled: CancelCheck = lambda: False,
                progress: Callable[[str, float], None] | None = None) -> OpenSession | None:
        """An idle session of `spec`'s identity, marked busy: the one whose cache shares
        the longest prefix with `prompt`, else a new one. None when every session is
        busy and no more may open (the caller waits and asks again)."""
        # Signatures first, for a new session and a warm one alike (a policy set to
        # require, or a file changed on disk, takes effect at the next request).
        self.signatures.check(spec)
        key = spec.identity.key
        idle = [s for s in self.sessions if s.spec.identity.key == key and not s.busy]
        if idle:
            session = max(idle, key=lambda s: common_prefix(s.context.tokens, prompt or []))
        else:
            session = self._new_session(spec, cancelled, progress)
            if session is None:
                return None
        session.busy = True
        self._touch(session)
        return session

    def release(self, session: OpenSession) -> None:
        session.busy = False
        session.context.cancelled = lambda: False
        self._touch(session)
        self._trim()

    def open(self, spec: SessionSpec, cancelled: CancelCheck = lambda: False,
             progress: Callable[[str, float], None] | None = None) -> OpenSession:
        """A session of `spec`'s identity for work that runs alone on the engine thread
        (warming, cross-checks): an existing one or a new one, not held busy."""
        session = self.acquire(spec, None, cancelled, progress)
        if session is None:
            raise EngineError("every session is busy")
        self.release(session)
        return session

    def _new_session(self, spec: SessionSpec, cancelled: CancelCheck,
                     progress: Callable[[str, float], None] | None) -> OpenSession | None:
        resident = self._resident(spec, cancelled, progress)
        adapters = self._verify_adapters(spec, resident.info)
        base = resident_key(spec)
        if resident.model.needs_rebuild(adapters):
            # OpenVINO recompiles its model for new LoRA layers: the contexts on the old
            # compiled model close first, so wait until none of them is serving.
            on_base = [s for s in self.sessions if resident_key(s.spec) == base]
            if any(s.busy for s in on_base):
                return None
            for other in on_base:
                self._close_session(other)
        if len(self.sessions) >= self.max_sessions:
            idle = [s for s in self.sessions if not s.busy]
            if not idle:
                return None
            self._close_session(idle[0])
        context = resident.model.new_context(adapters, spec.identity.context.n_ctx,
                                             spec.identity.context.n_batch)
        session = OpenSession(spec, context, next(self._numbers))
        self.sessions.append(session)
        return session

    def _touch(self, session: OpenSession) -> None:
        session.last_used = time.time()
        self.sessions.remove(session)
        self.sessions.append(session)

    def _trim(self) -> None:
        """Close the least recently used idle sessions beyond `max_sessions`."""
        for session in [s for s in self.sessions if not s.busy]:
            if len(self.sessions) <= self.max_sessions:
                break
            self._close_session(session)

    def _resident(self, spec: SessionSpec, cancelled: CancelCheck,
                  progress: Callable[[str, float], None] | None) -> Resident:
        sha = spec.identity.served_sha256
        key = resident_key(spec)
        if key in self.residents:
            self.residents.move_to_end(key)
            return self.residents[key]
        path = Path(spec.base_path)
        try:
            current = digest.content_digest(
                path, (lambda d, t: progress("verifying base", d / max(t, 1)))
                if progress else None, cancelled)
        except artifacts.InspectionError as exc:
            raise RefusedError(f"base {spec.base_name}: {exc.message}") from None
        if current != sha:
            raise RefusedError(f"base {spec.base_name} changed on disk since it was added "
                               f"(sha256 {current[:16]}…, recorded {sha[:16]}…); not serving it")
        info = artifacts.inspect_path(path)
        formats = ("gguf", "openvino") if spec.backend == "openvino" else ("gguf",)
        if not isinstance(info, BaseModelInfo) or info.format not in formats:
            raise RefusedError(f"base {spec.base_name}: not a base model {spec.backend} serves")
        while len(self.residents) >= self.max_bases:
            # The least recently used base whose sessions are all idle goes.
            unused = [k for k in self.residents if k not in self._pinned and not any(
                s.busy for s in self.sessions if resident_key(s.spec) == k)]
            if not unused:
                break
            self._drop_resident(unused[0])
        model = load_model(spec.backend, str(path), sha, self.n_threads,
                           (lambda f: progress("loading model", f)) if progress else None,
                           cancelled, spec.identity.compute)
        self.residents[key] = Resident(spec.base_name, model, info)
        return self.residents[key]

    def _verify_adapters(self, spec: SessionSpec, base: BaseModelInfo) -> AdapterSet:
        """Digest re-check and full validation of every adapter, before a runtime sees it."""
        verified: list[tuple[Any, AdapterInfo]] = []
        for adapter in spec.adapters:
            validation.require_scale(adapter.scale, f"adapter {adapter.name}")
            try:
                sha = digest.sha256_file(Path(adapter.path))
            except artifacts.InspectionError as exc:
                raise RefusedError(f"adapter {adapter.name}: {exc.message}") from None
            if sha != adapter.sha256:
                raise RefusedError(f"adapter {adapter.name} changed on disk after import "
                                   f"(sha256 {sha[:16]}…, recorded {adapter.sha256[:16]}…); "
                                   "not serving it")
            config = Path(adapter.path).with_name("adapter_config.json")
            if adapter.config_sha256 and (not config.is_file() or digest.sha256_file(
                    config) != adapter.config_sha256):
                raise RefusedError(f"adapter {adapter.name}: adapter_config.json changed on "
                                   "disk after import; not serving it")
            info = artifacts.inspect_path(Path(adapter.path))
            if not isinstance(info, AdapterInfo):
                raise RefusedError(f"adapter {adapter.name}: stored file is not an adapter")
            report = validation.check_adapter(info, base, spec.backend,
                                              spec.identity.base_sha256)
            if not report.ok:
                raise RefusedError(f"adapter {adapter.name}: {report.reason()}")
            verified.append((adapter, info))
        return verified

    def _close_session(self, session: OpenSession) -> None:
        self.sessions.remove(session)
        session.context.close()

    def _drop_resident(self, key: str) -> None:
        for session in [s for s in self.sessions if resident_key(s.spec) == key]:
            self._close_session(session)
        self.residents.pop(key).model.close()

    def close_all(self) -> None:
        for session in list(self.sessions):
            self._close_session(session)
        for key in list(self.residents):
            self._drop_resident(key)

    # ------------------------------------------------------------------ prompts

    def prompt_tokens(self, spec: SessionSpec, prompt: Prompt,
                      cancelled: CancelCheck = lambda: False) -> list[int]:
        """`prompt` rendered (chat template, system prompt) and tokenized for `spec`."""
        resident = self._resident(spec, cancelled, None)
        model, info = resident.model, resident.info
        if prompt.chat or prompt.messages:
            messages = list(prompt.messages) or [Message("user", prompt.text or "")]
            system = prompt.system if prompt.system is not None else spec.system_prompt
            if system and messages[0].role != "system":
                messages.insert(0, Message("system", system))
            if info.chat_template:
                text = render(info.chat_template, messages,
                              bos_token=_special(model, info.bos_token_id),
                              eos_token=_special(model, info.eos_token_id))
            else:
                text = plain_prompt(messages)
        else:
            if not prompt.text:
                raise RefusedError("empty prompt")
            text = prompt.text
        tokens = model.tokenize(text, add_special=info.add_bos, parse_special=True)
        n_ctx = spec.identity.context.n_ctx
        if len(tokens) >= n_ctx - 1:
            raise ContextOverflowError(f"prompt of {len(tokens)} tokens does not fit the "
                                       f"context ({n_ctx})")
        return tokens

    # ------------------------------------------------------------------ generation

    def _advance(self, side: SideState, sampling: Sampling, emit: Emit,
                 cancelled: CancelCheck, top_logprobs: int = 0) -> None:
        """One step of `side`: a chunk of its prompt, or one token chosen and fed back;
        sets `finish` when done."""
        session = side.session
        model = self.residents[resident_key(session.spec)].model
        start = time.perf_counter()
        if side.logits is None:
            if side.prefill is None:
                side.prefill = session.context.prefill_steps(side.prompt,
                                                             reserve=sampling.max_tokens)
            logits = next(side.prefill)
            side.prompt_seconds += time.perf_counter() - start
            if logits is None:
                return  # more of the prompt to decode: the next step goes on
            side.logits = logits
            side.reused_tokens = session.context.reused
            start = time.perf_counter()
        token = side.sampler.choose(side.logits, side.prompt + side.tokens)
        # The whole log-softmax row only when top log-probabilities are asked for; the
        # chosen token's alone costs a third of it (docs/performance.md, "Our loop").
        row = log_softmax(side.logits) if top_logprobs else None
        logprob = float(row[token]) if row is not None else token_logprob(side.logits, token)
        if model.is_end(token):
            side.finish = "eos"
            side.decode_seconds += time.perf_counter() - start
            return
        side.tokens.append(token)
        side.logprobs.append(logprob)
        top: list[list[Any]] = []
        if top_logprobs:
            best = np.argpartition(-row, top_logprobs)[:top_logprobs]
            best = best[np.lexsort((best, -row[best]))]
            top = [[int(t), model.token_text(int(t)).decode("utf-8", "replace"),
                    float(row[t])] for t in best]
            side.top.append(top)
        assert side.decoder is not None
        piece = side.decoder.feed(token)
        text, hit = side.stops.feed(piece)
        side.text += text
        if cancelled():
            raise Cancelled("cancelled")
        event: dict[str, Any] = {"side": side.name, "token_id": token, "text": text,
                                 "logprob": logprob, "index": len(side.tokens) - 1}
        if top:
            event["top"] = top
            event["piece"] = model.token_text(token).decode("utf-8", "replace")
        emit("token", **event)
        if hit:
            side.finish = "stop"
        elif len(side.tokens) >= sampling.max_tokens:
            side.finish = "length"
        elif len(side.prompt) + len(side.tokens) >= session.context.n_ctx:
            side.finish = "context"
        else:
            side.logits = session.context.step(token)
        side.decode_seconds += time.perf_counter() - start

    def _result(self, side: SideState) -> dict[str, Any]:
        assert side.decoder is not None
        side.text += side.stops.feed(side.decoder.finish())[0]
        if side.finish != "stop":
            side.text += side.stops.flush()
        spec = side.spec or side.session.spec
        side.session.generations += 1
        tps = len(side.tokens) / side.decode_seconds if side.decode_seconds > 0 else 0.0
        result = {
            "name": spec.name,
            "kind": spec.kind,
            "backend": spec.backend,
            "text": side.text,
            "token_ids": side.tokens,
            "logprobs": side.logprobs,
            "identity": spec.identity.key,
            "identity_short": spec.identity.short,
            "adapters": [{"name": a.name, "sha256": a.sha256, "scale": a.scale}
                         for a in spec.adapters],
            "prompt_tokens": len(side.prompt),
            "reused_tokens": side.reused_tokens,
            "prompt_seconds": side.prompt_seconds,
            "finish_reason": side.finish,
            "tokens_per_second": tps,
        }
        if side.top:
            result["top_logprobs"] = side.top
        return result

    def generate(self, spec: SessionSpec, prompt: Prompt, sampling: Sampling, emit: Emit,
                 cancelled: CancelCheck) -> dict[str, Any]:
        """A whole generation at once (when nothing else runs: tests, tools)."""
        return run_task(GenerationTask(self, "generate", spec, prompt, sampling, emit,
                                       cancelled))

    def compare(self, spec: SessionSpec, prompt: Prompt, sampling: Sampling, emit: Emit,
                cancelled: CancelCheck) -> dict[str, Any]:
        """A whole comparison at once (see `generate`)."""
        return run_task(GenerationTask(self, "compare", spec, prompt, sampling, emit,
                                       cancelled))

    def adapter_effect(self, base: SideState, variant: SideState) -> float | None:
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

    # ------------------------------------------------------------------ across backends

    def cross_check(self, first: SessionSpec, second: SessionSpec, prompts: list[Prompt],
                    n_tokens: int, cancelled: CancelCheck) -> dict[str, Any]:
        """The same model or variant on two backends, on the same token ids.

        Per prompt: both sides decode `n_tokens` greedily (no repeat penalty) from the
        first side's tokens; then both score the first side's greedy continuation
        teacher-forced, and the next-token distributions are compared position by
        position (KL(first || second) in nats, and whether their top tokens agree).
        """
        rows = []
        for prompt in prompts:
            a = self.open(first, cancelled)
            # Opening the second side must not evict the first's base (with OpenVINO's
            # profiles more bases than `max_bases` take turns: a freed model under `a`
            # crashed the engine with SIGSEGV).
            self._pinned.add(resident_key(first))
            try:
                b = self.open(second, cancelled)
            finally:
                self._pinned.discard(resident_key(first))
            for session in (a, b):
                session.context.cancelled = cancelled
            tokens = self.prompt_tokens(first, prompt)
            same_ids = self.prompt_tokens(second, prompt) == tokens
            greedy_a = self._greedy(a, tokens, n_tokens)
            greedy_b = self._greedy(b, tokens, n_tokens)
            continuation = greedy_a or greedy_b[:1]
            scored_a = a.context.score(tokens, continuation)
            scored_b = b.context.score(tokens, continuation)
            kls, top1 = [], []
            for row_a, row_b in zip(scored_a, scored_b, strict=True):
                lp_a, lp_b = log_softmax(row_a), log_softmax(row_b)
                kls.append(float(np.sum(np.exp(lp_a) * (lp_a - lp_b))))
                top1.append(int(np.argmax(row_a)) == int(np.argmax(row_b)))
            div = first_divergence(greedy_a, greedy_b)
            rows.append({"prompt_tokens": len(tokens), "same_token_ids": same_ids,
                         "first": greedy_a, "second": greedy_b,
                         "agreeing_tokens": len(greedy_a) if div is None else div,
                         "kl": kls, "max_kl": max(kls), "mean_kl": float(np.mean(kls)),
                         "top1_agreement": float(np.mean(top1))})
        return {
            "first": {"name": first.name, "backend": first.backend,
                      "identity": first.identity.key, "base": first.base_name},
            "second": {"name": second.name, "backend": second.backend,
                       "identity": second.identity.key, "base": second.base_name},
            "tokens": n_tokens,
            "prompts": rows,
            "max_kl": max(r["max_kl"] for r in rows),
            "mean_kl": float(np.mean([r["mean_kl"] for r in rows])),
            "top1_agreement": float(np.mean([r["top1_agreement"] for r in rows])),
            "first_token_agreement": float(np.mean([r["first"][:1] == r["second"][:1]
                                                    for r in rows])),
            "min_agreeing_tokens": min(r["agreeing_tokens"] for r in rows),
        }

    def _greedy(self, session: OpenSession, prompt: list[int], n_tokens: int) -> list[int]:
        model = self.residents[resident_key(session.spec)].model
        logits = session.context.prefill(prompt, reserve=n_tokens)
        out: list[int] = []
        while len(out) < n_tokens:
            token = int(np.argmax(logits))
            if model.is_end(token):
                break
            out.append(token)
            if len(out) < n_tokens:
                logits = session.context.step(token)
        return out

    # ------------------------------------------------------------------ status

    def describe(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "residents": [
                {"base": r.name, "model_name": r.info.name, "path": r.model.path,
                 "sha256": r.model.sha256, "backend": r.model.backend,
                 "size_bytes": r.model.size_bytes, **r.model.details()}
                for r in self.residents.values()
            ],
            "sessions": [
                {"name": s.spec.name, "kind": s.spec.kind, "identity": s.spec.identity.key,
                 "number": s.number, "busy": s.busy,
                 "backend": s.spec.backend, "base": s.spec.base_name,
                 "adapters": [{"name": a.name, "sha256": a.sha256, "scale": a.scale}
                              for a in s.spec.adapters],
                 "n_ctx": s.context.n_ctx, "cached_tokens": len(s.context.tokens),
                 "kv_capacity": s.context.kv_capacity, "kv_bytes": s.context.kv_bytes,
                 "generations": s.generations}
                for s in self.sessions
            ],
            "memory": memory_usage(),
            "max_sessions": self.max_sessions,
            "n_threads": self.n_threads,
        }


class GenerationTask:
    """One generate or compare request, advanced a step at a time (see the module doc).

    `advance` returns None while the task goes on (or waits for a free session) and
    the result when it is done; `close` releases its sessions (always call it, also
    after an error or a cancel)."""

    def __init__(self, manager: SessionManager, kind: str, spec: SessionSpec, prompt: Prompt,
                 sampling: Sampling, emit: Emit, cancelled: CancelCheck,
                 top_logprobs: int = 0) -> None:
        if kind == "compare" and not spec.adapters:
            raise RefusedError(f"{spec.name} is a base model; compare needs a variant")
        self.manager = manager
        self.kind = kind
        self.prompt = prompt
        self.sampling = sampling
        self.emit = emit
        self.cancelled = cancelled
        self.top_logprobs = top_logprobs
        # The variant opens first: on OpenVINO, registering its adapters may rebuild the
        # compiled model, which closes that base's sessions; the base side then joins it.
        self.wanted = ([("main", spec)] if kind == "generate"
                       else [("variant", spec), ("base", spec.base_spec())])
        self.sides: list[SideState] = []

    @property
    def started(self) -> bool:
        return bool(self.sides)

    def _start(self) -> bool:
        sides = []
        for name, spec in self.wanted:
            tokens = self.manager.prompt_tokens(spec, self.prompt, self.cancelled)
            session = self.manager.acquire(spec, tokens, self.cancelled)
            if session is None:
                for side in sides:
                    self.manager.release(side.session)
                return False
            session.context.cancelled = self.cancelled
            model = self.manager.residents[resident_key(spec)].model
            sides.append(SideState(name, session, Sampler(self.sampling),
                                   StopMatcher(self.sampling.stop), tokens,
                                   decoder=model.text_stream(), spec=spec))
        self.sides = sides
        return True

    def advance(self) -> dict[str, Any] | None:
        if self.cancelled():
            raise Cancelled("cancelled")
        if not self.sides and not self._start():
            return None
        for side in self.sides:
            if side.finish is None:
                self.manager._advance(side, self.sampling, self.emit, self.cancelled,
                                      self.top_logprobs)
        if any(side.finish is None for side in self.sides):
            return None
        if self.kind == "generate":
            return self._with_replay(self.sides[0])
        variant, base = self.sides
        results: dict[str, Any] = {"base": self._with_replay(base),
                                   "variant": self._with_replay(variant)}
        results["first_divergence"] = first_divergence(base.tokens, variant.tokens)
        results["adapter_effect"] = self.manager.adapter_effect(base, variant)
        return results

    def _with_replay(self, side: SideState) -> dict[str, Any]:
        """The side's result with what regenerates it (`engine.runtime.replay`)."""
        result = self.manager._result(side)
        model = self.manager.residents[resident_key(side.session.spec)].model
        texts = [model.token_text(t).decode("utf-8", "replace") for t in side.tokens]
        result["replay"] = replay.record(side.session.spec, self.prompt, self.sampling,
                                         side.prompt, side.tokens, texts, result["text"],
                                         side.finish)
        return result

    def close(self) -> None:
        for side in self.sides:
            if side.session in self.manager.sessions:
                self.manager.release(side.session)
        self.sides = []


def run_task(task: GenerationTask) -> dict[str, Any]:
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


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _special(model: ResidentModel, token: int | None) -> str:
    if token is None or not 0 <= token < model.n_vocab:
        return ""
    return model.token_text(token).decode("utf-8", "replace")


def memory_usage() -> dict[str, int]:
    values = {}
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    values[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return {"rss_bytes": values.get("VmRSS", 0), "peak_rss_bytes": values.get("VmHWM", 0)}

