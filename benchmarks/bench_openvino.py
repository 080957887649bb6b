"""OpenVINO engine benchmarks, each measured side by side in one run (issue 15).

1. Each OpenVINO profile (docs/formats.md, "Profiles": `fast` int4, `fast-int8`,
   `exact` F16 at f32) against llama.cpp on the embedded Q4_1 default, the same source.
2. Each profile's variant (rank-8 q/v PEFT adapter, dynamic LoRA over the same compiled
   model) against that profile's base, and llama.cpp's variant against its base.
3. Our engine loop (InferRequest + numpy sampler) against OpenVINO GenAI's own
   `LLMPipeline` decoding the same IR (the fast profile's, at the same precisions).
4. Resident memory of each profile (a fresh engine after a base generation, and with a
   variant beside it), and session costs (first load, first LoRA build, another variant).
5. KL of each profile's next-token distributions against llama.cpp on the same prompts.

Rounds alternate the sides; medians and ratios of medians are reported (this machine
is shared: single runs are noise). Writes benchmarks/out/openvino.json.
Usage: VARIANT_STUDIO_THREADS=1 .venv/bin/python -m benchmarks.bench_openvino
       [--rounds N] [--tokens N] [--no-parity]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.common import median, scratch_home, write

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."
PROFILES = ("fast", "fast-int8", "exact")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--no-parity", action="store_true", help="skip the KL cross-checks")
    args = parser.parse_args()
    scratch_home()
    from engine.catalog import imports
    from engine.catalog.profiles import Sampling
    from engine.catalog.resolve import resolve
    from engine.catalog.store import AdapterSpec, Catalog
    from engine.curated import embedded as defaults
    from engine.curated import openvino_default, setup
    from engine.formats import artifacts
    from engine.runtime import messages
    from engine.runtime.client import EngineClient
    from tests import factories

    catalog = Catalog()
    setup.first_run(catalog)
    started = time.perf_counter()
    ov = openvino_default.ensure_default(catalog)["name"]
    build_or_register_s = time.perf_counter() - started
    llama = defaults.DEFAULT_MODEL_NAME
    info = artifacts.inspect_path(defaults.embedded_model_path())
    tmp = Path(tempfile.mkdtemp())
    source = factories.write_gguf_lora(tmp / "a.gguf", info, seed=1, strength=0.05)
    imports.add_adapter(catalog, "bench-a", llama, source)
    imports.add_adapter(catalog, "bench-b", ov, factories.write_peft_lora(
        tmp / "b", info, seed=2, strength=0.05))
    catalog.add_variant("va", llama, [AdapterSpec("bench-a", 1.0)])
    catalog.add_variant("vb", ov, [AdapterSpec("bench-b", 1.0)])
    sampling = Sampling(temperature=0.0, repeat_penalty=1.0, max_tokens=args.tokens)

    def request(name: str, profile: str | None = None, tokens: int = args.tokens
                ) -> messages.Generate:
        return messages.Generate(resolve(catalog, name, ov_profile=profile),
                                 messages.Prompt(PROMPT, chat=True),
                                 replace(sampling, max_tokens=tokens))

    ov_client, llama_client = EngineClient(), EngineClient()
    clients = {"openvino": ov_client, "llama": llama_client}

    cpu_ms: dict[str, list[float]] = {}

    def tps(backend: str, name: str, profile: str | None, label: str) -> float:
        """Client-observed tokens/s; also records engine CPU milliseconds per token."""
        stamps: list[float] = []
        client = clients[backend]
        before = _cpu_seconds(client.pid)
        handle = client.submit(
            request(name, profile),
            lambda e: stamps.append(time.perf_counter())
            if isinstance(e, messages.Token) else None)
        result = handle.wait(1800)
        assert result["backend"] == backend
        count = len(result["token_ids"])
        if count < 2 or len(stamps) < 2:
            raise SystemExit(f"{label}: {count} tokens ({result.get('finish_reason')}): "
                             f"{result['text']!r}")
        cpu_ms.setdefault(label, []).append((_cpu_seconds(client.pid) - before) * 1000 / count)
        return (count - 1) / (stamps[-1] - stamps[0])

    # Session costs on a fresh OpenVINO engine (fast profile): first load, first LoRA
    # build, then the other profiles' first loads.
    timings = {}
    for label, name, profile in (("load_base_s", ov, "fast"),
                                 ("first_lora_build_s", "vb", "fast"),
                                 ("load_fast_int8_s", ov, "fast-int8"),
                                 ("load_exact_s", ov, "exact")):
        start = time.perf_counter()
        ov_client.call(messages.Open(resolve(catalog, name, ov_profile=profile)), timeout=1800)
        timings[label] = time.perf_counter() - start
    for name in (llama, "va"):  # warm up llama.cpp
        llama_client.call(request(name, tokens=2), timeout=1800)

    runs = [("llama_q4_1", "llama", llama, None), ("llama_variant_q4_1", "llama", "va", None)]
    for profile in PROFILES:
        key = profile.replace("-", "_")
        runs += [(f"ov_{key}", "openvino", ov, profile),
                 (f"ov_{key}_variant", "openvino", "vb", profile)]
    sides: dict[str, list[float]] = {label: [] for label, *_ in runs}
    sides["genai_fast"] = []
    fast_spec = resolve(catalog, ov, ov_profile="fast")
    genai = _GenaiPipeline(fast_spec.base_path, args.tokens, fast_spec.identity.compute)
    for _ in range(args.rounds):
        for label, backend, name, profile in runs:
            sides[label].append(tps(backend, name, profile, label))
        before = time.process_time()
        sides["genai_fast"].append(genai.tps(PROMPT))
        cpu_ms.setdefault("genai_fast", []).append(
            (time.process_time() - before) * 1000 / args.tokens)
    genai.close()
    ov_client.call(messages.CloseAll(), timeout=120)

    memory = {}
    for profile in PROFILES:
        base_rss = _fresh_rss([request(ov, profile, tokens=8)])
        both_rss = _fresh_rss([request(ov, profile, tokens=8), request("vb", profile, tokens=8)])
        memory[profile] = {"base_rss_bytes": base_rss, "base_and_variant_rss_bytes": both_rss,
                           "ratio": both_rss / base_rss,
                           "weights_bytes": catalog.model(ov)["profiles"][profile]["size"]}
    memory["llama_q4_1"] = {"base_rss_bytes": _fresh_rss([request(llama, tokens=8)])}

    prompts = tuple(messages.Prompt(p, chat=True) for p in (
        "Write a short poem about the sea.", "What is the capital of France?",
        "Give me three tips for learning to cook.",
        "Explain what a neural network is in one sentence."))

    def cross(profile: str) -> dict[str, Any]:
        result = ov_client.call(messages.CrossCheck(
            resolve(catalog, llama), resolve(catalog, ov, ov_profile=profile), prompts, 8),
            timeout=1800)
        return {k: result[k] for k in ("max_kl", "mean_kl", "top1_agreement",
                                        "first_token_agreement", "min_agreeing_tokens")}

    parity = {} if args.no_parity else {
        f"{profile}_vs_llama_q4_1": cross(profile) for profile in PROFILES}
    ov_client.close()
    llama_client.close()

    def ratio(a: str, b: str) -> float:
        return median(sides[a]) / median(sides[b])

    def cpu_ratio(a: str, b: str) -> float:  # > 1: a needs less CPU per token than b
        return median(cpu_ms[b]) / median(cpu_ms[a])

    pairs = {"llama_variant_vs_llama_base": ("llama_variant_q4_1", "llama_q4_1"),
             "ov_engine_fast_vs_genai_pipeline_fast": ("ov_fast", "genai_fast")}
    for profile in PROFILES:
        key = profile.replace("-", "_")
        pairs[f"ov_{key}_vs_llama_q4_1"] = (f"ov_{key}", "llama_q4_1")
        pairs[f"ov_{key}_variant_vs_ov_{key}_base"] = (f"ov_{key}_variant", f"ov_{key}")
    write("openvino", {
        "prompt": PROMPT, "tokens": args.tokens, "rounds": args.rounds,
        "threads": os.environ.get("VARIANT_STUDIO_THREADS") or "all cores",
        "profiles": {p: resolve(catalog, ov, ov_profile=p).identity.compute.label()
                     for p in PROFILES},
        "tokens_per_second": sides,
        "medians": {k: median(v) for k, v in sides.items()},
        "cpu_ms_per_token_medians": {k: median(v) for k, v in cpu_ms.items()},
        "ratios": {k: ratio(a, b) for k, (a, b) in pairs.items()},
        "cpu_efficiency_ratios": {k: cpu_ratio(a, b) for k, (a, b) in pairs.items()},
        "sessions": {**timings, "build_or_register_default_s": build_or_register_s},
        "memory": memory,
        "parity_kl_nats": parity,
    })


class _GenaiPipeline:
    """OpenVINO GenAI's LLMPipeline on the same IR, greedy, timed per streamed token."""

    def __init__(self, folder: str, tokens: int, compute: Any) -> None:
        import openvino_genai

        from engine.runtime.openvino.backend import compile_config

        threads = int(os.environ.get("VARIANT_STUDIO_THREADS", "0"))
        # The same precisions as our engine's for this profile, and the same thread budget.
        props = {k: v for k, v in compile_config(compute, threads or 1).items()
                 if k in ("INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION")}
        if threads:
            props["INFERENCE_NUM_THREADS"] = str(threads)
        self.pipeline = openvino_genai.LLMPipeline(folder, "CPU", **props)
        self.config = openvino_genai.GenerationConfig()
        self.config.max_new_tokens = tokens
        self.config.min_new_tokens = tokens
        self.config.do_sample = False
        self.config.apply_chat_template = False

    def tps(self, prompt: str) -> float:
        """Decode speed from OpenVINO GenAI's own metrics (time per output token)."""
        result = self.pipeline.generate([prompt], self.config)
        return 1000.0 / result.perf_metrics.get_tpot().mean

    def close(self) -> None:
        del self.pipeline


def _cpu_seconds(pid: int | None) -> float:
    """User + system CPU time of a process (the engine), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _fresh_rss(requests: list[Any]) -> int:
    """Engine RSS after `requests` (generations) in a fresh engine process."""
    from engine.runtime import messages
    from engine.runtime.client import EngineClient

    client = EngineClient()
    try:
        for request in requests:
            client.call(request, timeout=1800)
        return int(client.call(messages.Describe(), timeout=60)["memory"]["rss_bytes"])
    finally:
        client.close()


if __name__ == "__main__":
    main()
