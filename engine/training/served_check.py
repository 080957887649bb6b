"""The adapter as served, measured at the end of every training run: parity and drift.

Parity: the trainer's next-token log-probabilities against llama.cpp's, with the new
adapter on both (`engine.training.parity`), so a run shows that what was trained is
what llama.cpp will serve. Drift: the mean negative log-likelihood per token of
unrelated prose (`UNRELATED_TEXTS`) under the base and under base + adapter, scored
by llama.cpp; a variant should do its job and leave other text alone.

Torch and llama.cpp: runs in the training worker (and in tests and benchmarks).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

# Thresholds the app flags (docs/training.md): a run whose drift is over DRIFT_LIMIT
# nats/token or whose next-token agreement is under TOP1_LIMIT is shown as a warning.
DRIFT_LIMIT = 0.05
TOP1_LIMIT = 0.93

# Unrelated text for the drift check: prose on other subjects, never used in training
# (the demo's data is tool calls; no training set of ours contains these).
UNRELATED_TEXTS = (
    "The river rose slowly through the night, and by morning the low fields along its "
    "banks had become a wide, still lake. Farmers gathered on the bridge to watch the "
    "water and to guess how long it would take to fall again.",
    "Bread is one of the oldest prepared foods. Early bakers mixed ground grain with "
    "water and baked the dough on hot stones; leavened loaves came later, when wild "
    "yeasts were allowed to ferment the dough before it was baked.",
    "The committee met on Tuesday to review the proposal. After a long discussion, the "
    "members agreed that the plan needed a clearer budget and a more realistic "
    "timetable, and they asked the authors to return with a revised version next month.",
    "A comet is a small icy body that, when it passes close to the Sun, warms and "
    "begins to release gases. This produces a visible atmosphere, the coma, and "
    "sometimes a long tail that always points away from the Sun.",
    "She learned to play the violin as a child, practising every evening after school. "
    "Years later, when she joined the city orchestra, she still remembered the patient "
    "teacher who had first shown her how to hold the bow.",
    "Good documentation explains not only what a program does but why it was built "
    "that way. Future maintainers can then change it with confidence, knowing which "
    "decisions were deliberate and which were accidents of history.",
)


def drift(model_path: Path, adapter_path: Path, texts: tuple[str, ...] = UNRELATED_TEXTS,
          threads: int = 2) -> dict[str, Any]:
    """Mean NLL per token of `texts` under the base and under base + adapter (llama.cpp);
    `delta` is variant minus base (nats per token)."""
    from engine.catalog.digest import sha256_file
    from engine.catalog.resolve import AdapterFile
    from engine.runtime.llama.backend import LlamaContext, LlamaModel

    model = LlamaModel(str(model_path), "drift")
    adapter = AdapterFile("drift", str(adapter_path), sha256_file(adapter_path), 1.0)
    out: dict[str, Any] = {"texts": len(texts)}
    try:
        for label, adapters in (("base", ()), ("variant", (adapter,))):
            context = LlamaContext(model, adapters, n_ctx=512, n_batch=512, n_threads=threads)
            total, count = 0.0, 0
            try:
                for text in texts:
                    ids = model.tokenize(text, add_special=False, parse_special=False)
                    context.reset()
                    for logits, token in zip(context.score(ids[:1], ids[1:]), ids[1:],
                                             strict=True):
                        shifted = logits.astype(np.float64) - logits.max()
                        total -= shifted[token] - np.log(np.exp(shifted).sum())
                        count += 1
            finally:
                context.close()
            out[label] = float(total / count)
        out["tokens"] = count
        out["delta"] = out["variant"] - out["base"]
    finally:
        model.close()
    return out


def measure(model_path: Path, adapter_path: Path, model: Any, threads: int) -> dict[str, Any]:
    """Parity (on `model`, the run's trainer model, with the written adapter loaded into
    it) and drift; a part that cannot be measured carries {"error": message} instead, so
    a finished run is never lost to its check."""
    from engine.errors import StudioError
    from engine.training import parity

    out: dict[str, Any] = {}
    try:
        out["parity"] = parity.measure(model_path, adapter_path, model=model,
                                       threads=threads).to_dict()
    except (StudioError, RuntimeError, ValueError, OSError) as exc:
        out["parity"] = {"error": str(exc)}
    try:
        out["drift"] = drift(model_path, adapter_path, threads=threads)
    except (StudioError, RuntimeError, ValueError, OSError) as exc:
        out["drift"] = {"error": str(exc)}
    return out


def verdict(checks: dict[str, Any] | None) -> dict[str, Any]:
    """Whether a run's served check passed, as the catalog records it on the adapter
    (`served_check`): {"passed": bool, "reason": str}. It passes only when both parts
    were measured and are within the limits; otherwise `reason` says, part by part, what
    fell short or why it was not measured (a failed or missing check is never a silent
    success)."""
    reasons = []
    parity = (checks or {}).get("parity")
    if not parity or "error" in parity:
        reasons.append("parity with llama.cpp was not measured" + _why(parity))
    elif parity["top1_agreement"] < TOP1_LIMIT:
        reasons.append(f"the trainer and llama.cpp agree on the next token "
                       f"{parity['top1_agreement']:.1%} of the time, under {TOP1_LIMIT:.0%}")
    drift_ = (checks or {}).get("drift")
    if not drift_ or "error" in drift_:
        reasons.append("drift on unrelated text was not measured" + _why(drift_))
    elif drift_["delta"] > DRIFT_LIMIT:
        reasons.append(f"drift on unrelated text is {drift_['delta']:+.3f} nats/token, over "
                       f"+{DRIFT_LIMIT}")
    return {"passed": not reasons, "reason": "; ".join(reasons)}


def summary_lines(checks: dict[str, Any]) -> list[str]:
    """The checks in words, one line each, with a warning mark past the limits."""
    lines = []
    parity = checks.get("parity")
    if not parity or "error" in parity:
        lines.append("parity with llama.cpp: not measured" + _why(parity))
    else:
        top1 = parity["top1_agreement"]
        mark = "" if top1 >= TOP1_LIMIT else f"  [below {TOP1_LIMIT:.0%}]"
        lines.append(f"parity with llama.cpp: the next token agrees {top1:.1%}, mean "
                     f"|Δ log p| {parity['mean_abs_logprob_diff']:.3f} nats{mark}")
    drift_ = checks.get("drift")
    if not drift_ or "error" in drift_:
        lines.append("drift on unrelated text: not measured" + _why(drift_))
    else:
        delta = drift_["delta"]
        mark = "" if delta <= DRIFT_LIMIT else (f"  [over +{DRIFT_LIMIT} nats/token: "
                                                 "--kl with --kl-text holds it down]")
        lines.append(f"drift on unrelated text: {drift_['base']:.3f} → {drift_['variant']:.3f} "
                     f"nats/token ({delta:+.3f}){mark}")
    return lines


def _why(part: dict[str, Any] | None) -> str:
    return f" ({part['error']})" if part and "error" in part else ""
