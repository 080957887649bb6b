"""Measuring the demo: held-out exact-match accuracy, base against variant, as served.

llama.cpp: each held-out request goes through the engine process's `compare` (the
comparison view's own path): the base and the variant side by side, greedy, with the
demo's system prompt on both sides. OpenVINO: the same, with the variant served on
the OpenVINO counterpart of the base and the adapter's PEFT export.
Drift on unrelated text is `engine.training.served_check.drift` (every run measures it).

No torch here; this runs in a test or benchmark process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.catalog.store import Catalog
from engine.training import demo

# Greedy; 48 tokens hold every expected call (the longest is about 35 tokens).
SAMPLING = {"temperature": 0.0, "max_tokens": 48, "repeat_penalty": 1.0, "top_k": 40,
            "top_p": 0.95, "seed": 0}


def evaluate(catalog: Catalog, variant: str, rows: list[dict[str, Any]],
             backend: str | None = None,
             progress: Callable[[int, int], None] | None = None,
             threads: int = 1) -> dict[str, Any]:
    """Greedy answers of base and variant for each row, scored (see `demo.score`).

    The engine runs with `threads` threads (1 by default: on a busy 2-core machine
    llama.cpp's two spinning threads decoded about 10x slower than one).
    """
    import os

    from engine.catalog.profiles import Sampling
    from engine.catalog.resolve import resolve
    from engine.runtime import messages
    from engine.runtime.client import EngineClient

    spec = resolve(catalog, variant, backend=backend)
    sampling = Sampling.from_dict(SAMPLING)
    client = EngineClient(env={**os.environ, "VARIANT_STUDIO_THREADS": str(threads)})
    base_out, variant_out = [], []
    try:
        for i, row in enumerate(rows):
            prompt = messages.Prompt(demo.request_of(row), chat=True, system=demo.SYSTEM_PROMPT)
            result = client.call(messages.Compare(spec, prompt, sampling), timeout=600)
            base_out.append(result["base"]["text"])
            variant_out.append(result["variant"]["text"])
            if progress:
                progress(i + 1, len(rows))
    finally:
        client.close()
    return {
        "backend": spec.backend,
        "threads": threads,
        "base": demo.score(base_out, rows),
        "variant": demo.score(variant_out, rows),
        "samples": [{"request": demo.request_of(r), "expected": demo.expected_call(r),
                     "base": b, "variant": v}
                    for r, b, v in list(zip(rows, base_out, variant_out, strict=True))[:6]],
    }
