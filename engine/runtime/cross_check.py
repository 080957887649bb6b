"""The cross-check: the same model or variant on two backends, on the same token ids.

Runs only on the engine thread of the engine process, alone (the host runs it when no
other task does). Per prompt both sides decode `tokens` greedily (no repeat penalty)
from the first side's prompt tokens; then both score the first side's greedy
continuation teacher-forced, and the next-token distributions are compared position
by position: KL(first || second) in nats, and whether their top tokens agree.
"""

from __future__ import annotations

import numpy as np

from engine.catalog.resolve import SessionSpec
from engine.runtime import prompting
from engine.runtime.backend import Context, ResidentModel
from engine.runtime.messages import CrossCheck, Prompt
from engine.runtime.results import CheckedSide, CrossCheckResult, CrossCheckRow
from engine.runtime.sampler import log_softmax
from engine.runtime.sessions import CancelCheck, SessionRegistry
from engine.runtime.tokens import first_divergence


def run(registry: SessionRegistry, request: CrossCheck, cancelled: CancelCheck
        ) -> CrossCheckResult:
    first, second, n_tokens = request.first, request.second, request.tokens
    rows = []
    for prompt in request.prompts:
        a = registry.open(first, cancelled)
        # Opening the second side must not evict the first's base (with OpenVINO's
        # profiles more bases than `max_bases` take turns: a freed model under `a`
        # crashed the engine with SIGSEGV).
        with registry.pinned(first):
            b = registry.open(second, cancelled)
        for session in (a, b):
            session.context.cancelled = cancelled
        tokens = tokens_for(registry, first, prompt, cancelled)
        same_ids = tokens_for(registry, second, prompt, cancelled) == tokens
        greedy_a = greedy(registry.model(first), a.context, tokens, n_tokens)
        greedy_b = greedy(registry.model(second), b.context, tokens, n_tokens)
        continuation = greedy_a or greedy_b[:1]
        scored_a = a.context.score(tokens, continuation)
        scored_b = b.context.score(tokens, continuation)
        kls, top1 = [], []
        for row_a, row_b in zip(scored_a, scored_b, strict=True):
            lp_a, lp_b = log_softmax(row_a), log_softmax(row_b)
            kls.append(float(np.sum(np.exp(lp_a) * (lp_a - lp_b))))
            top1.append(int(np.argmax(row_a)) == int(np.argmax(row_b)))
        div = first_divergence(greedy_a, greedy_b)
        rows.append(CrossCheckRow(
            prompt_tokens=len(tokens), same_token_ids=same_ids, first=tuple(greedy_a),
            second=tuple(greedy_b), agreeing_tokens=len(greedy_a) if div is None else div,
            kl=tuple(kls), max_kl=max(kls), mean_kl=float(np.mean(kls)),
            top1_agreement=float(np.mean(top1))))
    return CrossCheckResult(
        first=_side(first), second=_side(second), tokens=n_tokens, prompts=tuple(rows),
        max_kl=max(r.max_kl for r in rows),
        mean_kl=float(np.mean([r.mean_kl for r in rows])),
        top1_agreement=float(np.mean([r.top1_agreement for r in rows])),
        first_token_agreement=float(np.mean([r.first[:1] == r.second[:1] for r in rows])),
        min_agreeing_tokens=min(r.agreeing_tokens for r in rows))


def _side(spec: SessionSpec) -> CheckedSide:
    return CheckedSide(spec.name, spec.backend, spec.identity.key, spec.base_name)


def tokens_for(registry: SessionRegistry, spec: SessionSpec, prompt: Prompt,
               cancelled: CancelCheck) -> list[int]:
    """`prompt`'s tokens as `spec` is served (its resident loaded if need be)."""
    resident = registry.resident(spec, cancelled)
    return prompting.prompt_tokens(resident.model, resident.info, spec, prompt)


def greedy(model: ResidentModel, context: Context, prompt: list[int], n_tokens: int
           ) -> list[int]:
    """Up to `n_tokens` argmax tokens after `prompt` (fewer at an end token)."""
    logits = context.prefill(prompt, reserve=n_tokens)
    out: list[int] = []
    while len(out) < n_tokens:
        token = int(np.argmax(logits))
        if model.is_end(token):
            break
        out.append(token)
        if len(out) < n_tokens:
            logits = context.step(token)
    return out
