"""Sessions keyed by identity, and the generate / compare loops.

Runs only on the engine thread of the engine process. One resident model per base
file; any number of sessions (contexts) over it, each with its own adapter set and KV
cache, looked up by identity key, so warm state is reused only for an identical
identity. The number of live contexts is bounded; the least recently used closes
first. Before anything native touches a file, its digest is checked against the
spec and adapters are validated against the base in Python.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.catalog import digest, validation
from engine.catalog.profiles import Sampling
from engine.catalog.resolve import SessionSpec
from engine.errors import Cancelled, RefusedError
from engine.formats import artifacts
from engine.formats.artifacts import AdapterInfo, BaseModelInfo
from engine.formats.templates import Message, plain_prompt, render
from engine.runtime.backend import AdapterSet, Context, ResidentModel, TextStream, load_model
from engine.runtime.messages import Prompt
from engine.runtime.sampler import Sampler, StopMatcher, log_softmax

Emit = Callable[..., None]
CancelCheck = Callable[[], bool]


@dataclass
class OpenSession:
    spec: SessionSpec
    context: Context
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
    decode_seconds: float = 0.0


def resident_key(spec: SessionSpec) -> str:
    """Residents are per backend and base digest (the same file may serve both)."""
    sha = spec.identity.base_sha256
    return sha if spec.backend == "llama" else f"{spec.backend}:{sha}"


class SessionManager:
    def __init__(self, max_sessions: int = 3, max_bases: int = 2,
                 n_threads: int | None = None, n_batch: int = 512) -> None:
        self.max_sessions = max_sessions
        self.max_bases = max_bases
        self.n_threads = n_threads or max(1, os.cpu_count() or 1)
        self.n_batch = n_batch
        self.residents: OrderedDict[str, Resident] = OrderedDict()
        self.sessions: OrderedDict[str, OpenSession] = OrderedDict()

    # ------------------------------------------------------------------ lifecycle

    def open(self, spec: SessionSpec, cancelled: CancelCheck = lambda: False,
             progress: Callable[[str, float], None] | None = None) -> OpenSession:
        key = spec.identity.key
        if key in self.sessions:
            self.sessions.move_to_end(key)
            session = self.sessions[key]
            session.last_used = time.time()
            return session
        resident = self._resident(spec, cancelled, progress)
        adapters = self._verify_adapters(spec, resident.info)
        if resident.model.needs_rebuild(adapters):
            # OpenVINO recompiles its model for new LoRA layers: the contexts on the old
            # compiled model go first.
            base = resident_key(spec)
            for other in [k for k, s in self.sessions.items() if resident_key(s.spec) == base]:
                self._close_session(other)
        while len(self.sessions) >= self.max_sessions:
            self._close_session(next(iter(self.sessions)))
        context = resident.model.new_context(adapters, spec.identity.context.n_ctx)
        session = OpenSession(spec, context)
        self.sessions[key] = session
        return session

    def _resident(self, spec: SessionSpec, cancelled: CancelCheck,
                  progress: Callable[[str, float], None] | None) -> Resident:
        sha = spec.identity.base_sha256
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
            self._drop_resident(next(iter(self.residents)))
        model = load_model(spec.backend, str(path), sha, self.n_threads,
                           (lambda f: progress("loading model", f)) if progress else None,
                           cancelled)
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

    def _close_session(self, key: str) -> None:
        session = self.sessions.pop(key)
        session.context.close()

    def _drop_resident(self, key: str) -> None:
        for session in [k for k, s in self.sessions.items() if resident_key(s.spec) == key]:
            self._close_session(session)
        self.residents.pop(key).model.close()

    def close_all(self) -> None:
        for key in list(self.sessions):
            self._close_session(key)
        for key in list(self.residents):
            self._drop_resident(key)

    # ------------------------------------------------------------------ prompts

    def prompt_tokens(self, session: OpenSession, prompt: Prompt) -> list[int]:
        resident = self.residents[resident_key(session.spec)]
        model, info = resident.model, resident.info
        if prompt.chat or prompt.messages:
            messages = list(prompt.messages) or [Message("user", prompt.text or "")]
            system = prompt.system if prompt.system is not None else session.spec.system_prompt
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
        limit = session.context.n_ctx - 1
        if len(tokens) >= limit:
            raise RefusedError(f"prompt of {len(tokens)} tokens does not fit the context "
                               f"({session.context.n_ctx})")
        return tokens

    # ------------------------------------------------------------------ generation

    def _side(self, name: str, spec: SessionSpec, prompt: Prompt, sampling: Sampling,
              cancelled: CancelCheck) -> SideState:
        session = self.open(spec, cancelled)
        session.context.cancelled = cancelled
        tokens = self.prompt_tokens(session, prompt)
        model = self.residents[resident_key(session.spec)].model
        return SideState(name, session, Sampler(sampling), StopMatcher(sampling.stop), tokens,
                         decoder=model.text_stream())

    def _advance(self, side: SideState, sampling: Sampling, emit: Emit,
                 cancelled: CancelCheck) -> None:
        """Choose one token for `side` and feed it back; sets `finish` when done."""
        session = side.session
        model = self.residents[resident_key(session.spec)].model
        start = time.perf_counter()
        if side.logits is None:
            side.logits = session.context.prefill(side.prompt, reserve=sampling.max_tokens)
            start = time.perf_counter()
        token = side.sampler.choose(side.logits, side.prompt + side.tokens)
        logprob = float(log_softmax(side.logits)[token])
        if model.is_end(token):
            side.finish = "eos"
            side.decode_seconds += time.perf_counter() - start
            return
        side.tokens.append(token)
        side.logprobs.append(logprob)
        assert side.decoder is not None
        piece = side.decoder.feed(token)
        text, hit = side.stops.feed(piece)
        side.text += text
        if cancelled():
            raise Cancelled("cancelled")
        emit("token", side=side.name, token_id=token, text=text, logprob=logprob,
             index=len(side.tokens) - 1)
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
        spec = side.session.spec
        side.session.generations += 1
        tps = len(side.tokens) / side.decode_seconds if side.decode_seconds > 0 else 0.0
        return {
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
            "finish_reason": side.finish,
            "tokens_per_second": tps,
        }

    def generate(self, spec: SessionSpec, prompt: Prompt, sampling: Sampling, emit: Emit,
                 cancelled: CancelCheck) -> dict[str, Any]:
        side = self._side("main", spec, prompt, sampling, cancelled)
        while side.finish is None:
            self._advance(side, sampling, emit, cancelled)
        return self._result(side)

    def compare(self, spec: SessionSpec, prompt: Prompt, sampling: Sampling, emit: Emit,
                cancelled: CancelCheck) -> dict[str, Any]:
        """Base and variant over one copy of the weights, streamed side by side."""
        if not spec.adapters:
            raise RefusedError(f"{spec.name} is a base model; compare needs a variant")
        # The variant opens first: on OpenVINO, registering its adapters may rebuild the
        # compiled model, which closes that base's sessions; the base side then joins it.
        variant = self._side("variant", spec, prompt, sampling, cancelled)
        base = self._side("base", spec.base_spec(), prompt, sampling, cancelled)
        while base.finish is None or variant.finish is None:
            for side in (base, variant):
                if side.finish is None:
                    self._advance(side, sampling, emit, cancelled)
        results = {"base": self._result(base), "variant": self._result(variant)}
        results["first_divergence"] = first_divergence(base.tokens, variant.tokens)
        results["adapter_effect"] = self._adapter_effect(base, variant)
        return results

    def _adapter_effect(self, base: SideState, variant: SideState) -> float | None:
        """Mean |log p_base - log p_variant| over the base's tokens, teacher-forced.

        Both sides are scored the same way (one batch each), so a variant that changes
        nothing scores exactly 0 and any real adapter shows up, even when the greedy
        text happens to agree.
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
            b = self.open(second, cancelled)
            for session in (a, b):
                session.context.cancelled = cancelled
            tokens = self.prompt_tokens(a, prompt)
            same_ids = self.prompt_tokens(b, prompt) == tokens
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
                {"name": s.spec.name, "kind": s.spec.kind, "identity": key,
                 "backend": s.spec.backend, "base": s.spec.base_name,
                 "adapters": [{"name": a.name, "sha256": a.sha256, "scale": a.scale}
                              for a in s.spec.adapters],
                 "n_ctx": s.context.n_ctx, "cached_tokens": len(s.context.tokens),
                 "kv_capacity": s.context.kv_capacity,
                 "generations": s.generations}
                for key, s in self.sessions.items()
            ],
            "memory": memory_usage(),
            "max_sessions": self.max_sessions,
            "n_threads": self.n_threads,
        }


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

