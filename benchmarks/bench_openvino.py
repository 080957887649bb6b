"""OpenVINO engine benchmarks, each measured side by side in one run (the OpenVINO profiles).

1. Each OpenVINO profile (docs/formats.md, "Profiles": `fast` int4, `fast-int8`,
   `exact` F16 at f32) against llama.cpp on the embedded Q4_1 default, the same source.
2. Each profile's variant (rank-8 q/v PEFT adapter: LoRA inputs in the prompt graph,
   static-rank branch inputs in its one-token graph) against that profile's base, and
   llama.cpp's variant against its base.
3. Our engine loop (InferRequest + numpy sampler) against OpenVINO GenAI's own
   `LLMPipeline` decoding the same IR (the fast profile's, at the precisions and thread
   count our engine compiled it with): client-observed, and as each loop times itself.
4. Resident memory of each profile (a fresh engine after a base generation, and with a
   variant session beside it), and session costs (the base's first load, the first
   variant's), each profile on a fresh engine.
5. KL of each profile's next-token distributions against llama.cpp on the same prompts.

Each profile has an engine of its own (no profile evicts another between rounds); odd
rounds run the sides in reverse order; medians and ratios of medians are reported (this
machine is shared: single runs are noise). Writes benchmarks/out/openvino.json.
Usage: VARIANT_STUDIO_THREADS=1 .venv/bin/python -m benchmarks.bench_openvino
       [--rounds N] [--tokens N] [--no-parity]
"""

from __future__ import annotations

import argparse
import functools
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

    # One engine per OpenVINO profile (and one for llama.cpp), as a user serving one profile
    # has it: no profile evicts another's resident between rounds.
    llama_client = EngineClient()
    clients = {"llama": llama_client} | {profile: EngineClient() for profile in PROFILES}

    cpu_ms: dict[str, list[float]] = {}

    loop_tps: dict[str, list[float]] = {}  # the engine's own decode loop, as it reports

    def tps(backend: str, name: str, profile: str | None, label: str) -> float:
        """Client-observed tokens/s; also records the engine loop's own tokens/s and the
        engine's CPU milliseconds per token."""
        stamps: list[float] = []
        client = clients[profile or backend]
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
        loop_tps.setdefault(label, []).append(result["tokens_per_second"])
        return (count - 1) / (stamps[-1] - stamps[0])

    # Session costs, each profile on its fresh engine: the base's first load, then the
    # first variant (its adapter's LoRA branches: the prompt graph rebuilt, a one-token
    # graph compiled).
    timings = {}
    compiled: dict[str, dict[str, str]] = {}  # what OpenVINO compiled, per profile
    for profile in PROFILES:
        client = clients[profile]
        for label, name in (("load_base_s", ov), ("first_variant_s", "vb")):
            start = time.perf_counter()
            client.call(messages.Open(resolve(catalog, name, ov_profile=profile)), timeout=1800)
            timings[f"{profile}_{label}"] = time.perf_counter() - start
        compiled[profile] = client.call(messages.Describe(), timeout=60)["residents"][0][
            "compiled"]
    for name in (llama, "va"):  # warm up llama.cpp
        llama_client.call(request(name, tokens=2), timeout=1800)
    for profile in PROFILES:  # and each profile's base and variant (a generation each)
        for name in (ov, "vb"):
            clients[profile].call(request(name, profile, tokens=8), timeout=1800)

    runs = [("llama_q4_1", "llama", llama, None), ("llama_variant_q4_1", "llama", "va", None)]
    for profile in PROFILES:
        key = profile.replace("-", "_")
        runs += [(f"ov_{key}", "openvino", ov, profile),
                 (f"ov_{key}_variant", "openvino", "vb", profile)]
    fast_spec = resolve(catalog, ov, ov_profile="fast")
    # GenAI on the fast IR with the precisions and thread count our engine compiled it with.
    genai = _GenaiPipeline(fast_spec.base_path, args.tokens, compiled["fast"])

    def genai_tps() -> float:
        before = time.process_time()
        speed = genai.tps(PROMPT)
        cpu_ms.setdefault("genai_fast", []).append(
            (time.process_time() - before) * 1000 / args.tokens)
        return speed

    measures = [(label, functools.partial(tps, backend, name, profile, label))
                for label, backend, name, profile in runs]
    measures.append(("genai_fast", genai_tps))
    sides: dict[str, list[float]] = {label: [] for label, _ in measures}
    # Odd rounds run the sides in reverse order, so a drift of the machine's speed over a
    # round favours no side.
    for round_ in range(args.rounds):
        for label, measure in (measures if round_ % 2 == 0 else measures[::-1]):
            sides[label].append(measure())
    genai_props = genai.props
    genai.close()
    for profile in PROFILES:
        if profile != "fast":
            clients[profile].close()
    ov_client = clients["fast"]
    ov_client.call(messages.CloseAll(), timeout=120)

    memory = {}
    for profile in PROFILES:
        base_rss = _fresh_rss([request(ov, profile, tokens=8)])
        # The variant first, so both sessions stay open over one prompt graph (opening
        # the variant second would rebuild it and close the base session).
        both_rss = _fresh_rss([request("vb", profile, tokens=8), request(ov, profile, tokens=8)])
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
        "openvino_compiled": compiled, "genai_properties": genai_props,
        "tokens_per_second": sides,
        "medians": {k: median(v) for k, v in sides.items()},
        "engine_loop_tokens_per_second": loop_tps,
        "engine_loop_medians": {k: median(v) for k, v in loop_tps.items()},
        # Our loop as the engine times it (sampling, log-probability, text, the step)
        # against GenAI's own time per output token: both in-process, no IPC.
        "engine_loop_fast_vs_genai_pipeline_fast": median(loop_tps["ov_fast"])
        / median(sides["genai_fast"]),
        "cpu_ms_per_token_medians": {k: median(v) for k, v in cpu_ms.items()},
        "ratios": {k: ratio(a, b) for k, (a, b) in pairs.items()},
        "cpu_efficiency_ratios": {k: cpu_ratio(a, b) for k, (a, b) in pairs.items()},
        "sessions": {**timings, "build_or_register_default_s": build_or_register_s},
        "memory": memory,
        "parity_kl_nats": parity,
    })


class _GenaiPipeline:
    """OpenVINO GenAI's LLMPipeline on the same IR, greedy, timed per streamed token."""

    def __init__(self, folder: str, tokens: int, compiled: dict[str, str]) -> None:
        import openvino_genai

        # `compiled` is what our engine's OpenVINO reports ("<Type: 'bfloat16'>", "1").
        names = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
        props = {key: next(v for k, v in names.items() if k in compiled[key])
                 for key in ("INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION")}
        props["INFERENCE_NUM_THREADS"] = compiled["INFERENCE_NUM_THREADS"]
        props["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = compiled["DYNAMIC_QUANTIZATION_GROUP_SIZE"]
        self.props = props
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
