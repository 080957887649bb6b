"""llama.cpp engine benchmarks, each measured side by side in one run.

1. Decode speed through the engine process against raw llama-cpp-python (`Llama`) on
   the same prompt and token budget (target >= 0.95).
2. A rank-8 q/v variant against its base, both through the engine (target >= 0.90).
3. Switching variant with the base resident against a full model reload.
4. Engine resident memory with base and variant sessions side by side against the base
   alone (target <= 1.15x; loading the model twice would be about 2x), for a chat turn
   and for requests that fill 1024, 2048 and 4096 KV cells.

Runs alternate A and B several times and report medians and the ratio of medians.
Usage: .venv/bin/python -m benchmarks.bench_llama [--rounds N] [--tokens N]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from benchmarks.common import median, scratch_home, write

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    scratch_home()
    from engine.catalog import imports
    from engine.catalog.profiles import Sampling
    from engine.catalog.resolve import resolve
    from engine.catalog.store import AdapterSpec, Catalog
    from engine.curated import embedded as defaults
    from engine.curated import setup
    from engine.formats import artifacts
    from engine.runtime import messages
    from engine.runtime.client import EngineClient
    from tests import factories

    catalog = Catalog()
    setup.first_run(catalog)
    base = defaults.DEFAULT_MODEL_NAME
    info = artifacts.inspect_path(defaults.embedded_model_path())
    import tempfile
    from pathlib import Path

    tmp = Path(tempfile.mkdtemp())
    for name, seed in (("bench-a", 1), ("bench-b", 2)):
        imports.add_adapter(catalog, name, base, factories.write_gguf_lora(
            tmp / f"{name}.gguf", info, seed=seed, strength=0.05))
    catalog.add_variant("va", base, [AdapterSpec("bench-a", 1.0)])
    catalog.add_variant("vb", base, [AdapterSpec("bench-b", 1.0)])
    # Greedy with no repeat penalty and EOS ignored by a long budget: both sides decode
    # exactly `tokens` tokens unless the model ends its answer.
    sampling = Sampling(temperature=0.0, repeat_penalty=1.0, max_tokens=args.tokens)

    def request(name: str, text: str = PROMPT) -> messages.Generate:
        return messages.Generate(resolve(catalog, name), messages.Prompt(text), sampling)

    client = EngineClient()
    client.call(request(base), timeout=600)  # warm up: load the model

    def engine_tps(name: str) -> float:
        stamps: list[float] = []
        handle = client.submit(request(name),
                               lambda e: stamps.append(time.perf_counter())
                               if isinstance(e, messages.Token) else None)
        result = handle.wait(600)
        # Client-observed: first token event to last, including the IPC.
        return (len(result["token_ids"]) - 1) / (stamps[-1] - stamps[0])

    import llama_cpp

    raw = llama_cpp.Llama(str(defaults.embedded_model_path()), n_ctx=4096, n_batch=512,
                          n_threads=client.call(messages.Describe())["n_threads"],
                          verbose=False)
    raw_tokens = raw.tokenize(PROMPT.encode(), add_bos=False)

    def raw_tps() -> float:
        raw.reset()
        stamps = []
        for i, _token in enumerate(raw.generate(raw_tokens, temp=0.0, repeat_penalty=1.0)):
            stamps.append(time.perf_counter())
            if i + 1 >= args.tokens:
                break
        return (len(stamps) - 1) / (stamps[-1] - stamps[0])

    engine_runs, raw_runs, base_runs, variant_runs = [], [], [], []
    for _ in range(args.rounds):
        engine_runs.append(engine_tps(base))
        raw_runs.append(raw_tps())
        base_runs.append(engine_tps(base))
        variant_runs.append(engine_tps("va"))
    raw.close()

    # Switching: base resident (open a new variant session) against a full reload.
    switch, reload = [], []
    for i in range(args.rounds):
        target = "va" if i % 2 else "vb"
        client.call(messages.CloseAll(), timeout=600)
        start = time.perf_counter()
        client.call(messages.Open(resolve(catalog, base)), timeout=600)
        reload.append(time.perf_counter() - start)
        start = time.perf_counter()
        client.call(messages.Open(resolve(catalog, target)), timeout=600)
        switch.append(time.perf_counter() - start)

    # Memory: a fresh engine with the base session, then the variant beside it, both at
    # the default n_ctx 4096. A session allocates the KV cells its requests need, so we
    # measure at several request sizes: the benchmark's prompt (a chat turn), and long
    # prompts that need 1024, 2048 and all 4096 cells on both sessions. For scale: the
    # same process holding two copies of the model.
    client.close()
    memory: dict[str, Any] = {}
    filler = "The lighthouse keeper counted the waves and wrote them down. "
    for label, repeats in (("chat turn", 0), ("1024 cells", 70), ("2048 cells", 150),
                           ("4096 cells", 300)):
        text = filler * repeats if repeats else PROMPT

        fresh = EngineClient()
        first = fresh.call(request(base, text), timeout=600)
        alone = fresh.call(messages.Describe(), timeout=60)
        fresh.call(request("va", text), timeout=600)
        both = fresh.call(messages.Describe(), timeout=60)
        fresh.close()
        memory[label] = {"prompt_tokens": first["prompt_tokens"],
                         "kv_capacity": [s["kv_capacity"] for s in both["sessions"]],
                         "base_rss_bytes": alone["memory"]["rss_bytes"],
                         "base_and_variant_rss_bytes": both["memory"]["rss_bytes"],
                         "sessions": len(both["sessions"]),
                         "ratio": both["memory"]["rss_bytes"] / alone["memory"]["rss_bytes"]}
    memory["model_twice"] = _model_twice(str(defaults.embedded_model_path()))
    memory["target"] = 1.15

    write("llama", {
        "prompt": PROMPT, "tokens": args.tokens, "rounds": args.rounds,
        "engine_vs_raw": {"engine_tps": engine_runs, "raw_tps": raw_runs,
                          "ratio": median(engine_runs) / median(raw_runs), "target": 0.95},
        "variant_vs_base": {"base_tps": base_runs, "variant_tps": variant_runs,
                            "ratio": median(variant_runs) / median(base_runs),
                            "target": 0.90},
        "switch_vs_reload": {"switch_s": switch, "reload_s": reload,
                             "ratio": median(switch) / median(reload)},
        "memory": memory,
    })


def _model_twice(path: str) -> dict[str, float]:
    """RSS of a process with one model and one context, then a second full copy."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from engine.runtime.llama.backend import LlamaModel, LlamaContext\n"
        "def rss():\n"
        "    return int(open('/proc/self/status').read().split('VmRSS:')[1].split()[0])"
        " * 1024\n"
        f"m1 = LlamaModel({path!r}, 'a'); c1 = LlamaContext(m1, (), 4096, 512, 2)\n"
        "c1.prefill(m1.tokenize('Hello there', False)); one = rss()\n"
        f"m2 = LlamaModel({path!r}, 'b'); c2 = LlamaContext(m2, (), 4096, 512, 2)\n"
        "c2.prefill(m2.tokenize('Hello there', False)); two = rss()\n"
        "print(one, two)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    one, two = int(out[0]), int(out[1])
    return {"one_copy_rss_bytes": one, "two_copies_rss_bytes": two, "ratio": two / one}


if __name__ == "__main__":
    main()
