"""OpenVINO engine benchmarks, each measured side by side in one run.

1. OpenVINO base against an OpenVINO variant (rank-8 q/v PEFT adapter, dynamic LoRA
   over the same compiled model), both through the engine.
2. OpenVINO against llama.cpp on the same model: the OpenVINO default (F16 IR) against
   llama.cpp on the F16 copy it was built from (the same weights) and on the embedded
   Q4_1 default, and the same converted adapter as a variant on both backends.
3. Our engine loop (InferRequest + numpy sampler) against OpenVINO GenAI's own
   `LLMPipeline` decoding the same IR, to show what driving the model ourselves costs.
4. Session costs: the first LoRA build (compile) against opening another variant on
   registered layers (no rebuild), and resident memory with base and variant sessions.
5. Parity numbers (KL of next-token distributions) for the record.

Rounds alternate the sides; medians and ratios of medians are reported (this machine
is shared: single runs are noise). Writes benchmarks/out/openvino.json.
Usage: .venv/bin/python -m benchmarks.bench_openvino [--rounds N] [--tokens N]
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=96)
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
    f16 = Path(catalog.model(ov)["built_from"]["f16_gguf"])
    imports.add_model(catalog, "llama-f16", f16, "llama")
    source = factories.write_gguf_lora(tmp / "a.gguf", info, seed=1, strength=0.05)
    imports.add_adapter(catalog, "bench-a", llama, source)
    imports.convert_adapter(catalog, "bench-a", "openvino")
    imports.add_adapter(catalog, "bench-a16", "llama-f16", source)
    imports.add_adapter(catalog, "bench-b", ov, factories.write_peft_lora(
        tmp / "b", info, seed=2, strength=0.05))
    catalog.add_variant("va", llama, [AdapterSpec("bench-a", 1.0)])
    catalog.add_variant("va16", "llama-f16", [AdapterSpec("bench-a16", 1.0)])
    catalog.add_variant("vb", ov, [AdapterSpec("bench-b", 1.0)])
    sampling = Sampling(temperature=0.0, repeat_penalty=1.0, max_tokens=args.tokens)

    def request(name: str, backend: str | None = None, tokens: int = args.tokens
                ) -> messages.Generate:
        return messages.Generate(resolve(catalog, name, backend=backend),
                                 messages.Prompt(PROMPT), replace(sampling, max_tokens=tokens))

    ov_client, llama_client = EngineClient(), EngineClient()
    clients = {"openvino": ov_client, "llama": llama_client}

    cpu_ms: dict[str, list[float]] = {}

    def tps(backend: str, name: str, serve_on: str | None = None, label: str = "") -> float:
        """Client-observed tokens/s; also records engine CPU milliseconds per token."""
        stamps: list[float] = []
        client = clients[backend]
        before = _cpu_seconds(client.pid)
        handle = client.submit(
            request(name, serve_on),
            lambda e: stamps.append(time.perf_counter())
            if isinstance(e, messages.Token) else None)
        result = handle.wait(1800)
        assert result["backend"] == backend
        count = len(result["token_ids"])
        cpu_ms.setdefault(label, []).append((_cpu_seconds(client.pid) - before) * 1000 / count)
        return (count - 1) / (stamps[-1] - stamps[0])

    # Session costs on a fresh OpenVINO engine: first load, first LoRA build, switch.
    timings = {}
    for label, name in (("load_base_s", ov), ("first_lora_build_s", "vb"),
                        ("open_other_variant_s", "va")):
        start = time.perf_counter()
        ov_client.call(messages.Open(resolve(catalog, name, backend="openvino")),
                       timeout=1800)
        timings[label] = time.perf_counter() - start
    for name in (llama, "llama-f16", "va", "va16"):  # warm up llama.cpp
        llama_client.call(request(name, tokens=2), timeout=1800)

    sides: dict[str, list[float]] = {k: [] for k in (
        "ov_base", "ov_variant", "ov_converted_variant", "llama_f16", "llama_q4_1",
        "llama_variant_q4_1", "llama_variant_f16", "genai_pipeline")}
    genai = _GenaiPipeline(catalog.model(ov)["path"], args.tokens)
    runs = (("ov_base", "openvino", ov, None), ("ov_variant", "openvino", "vb", None),
            ("llama_f16", "llama", "llama-f16", None),
            ("ov_converted_variant", "openvino", "va", "openvino"),
            ("llama_q4_1", "llama", llama, None), ("llama_variant_q4_1", "llama", "va", None),
            ("llama_variant_f16", "llama", "va16", None))
    for _ in range(args.rounds):
        for label, backend, name, serve_on in runs:
            sides[label].append(tps(backend, name, serve_on, label))
        before = time.process_time()
        sides["genai_pipeline"].append(genai.tps(PROMPT))
        cpu_ms.setdefault("genai_pipeline", []).append(
            (time.process_time() - before) * 1000 / args.tokens)
    genai.close()

    base_rss = _fresh_rss([request(ov, tokens=8)])
    both_rss = _fresh_rss([request(ov, tokens=8), request("vb", tokens=8)])

    prompts = tuple(messages.Prompt(p, chat=True) for p in (
        "Write a short poem about the sea.", "What is the capital of France?",
        "Give me three tips for learning to cook.",
        "Explain what a neural network is in one sentence."))

    def cross(first: str, second: str, first_backend: str | None = None) -> dict[str, Any]:
        result = ov_client.call(messages.CrossCheck(
            resolve(catalog, first, backend=first_backend),
            resolve(catalog, second, backend="openvino"), prompts, 8), timeout=1800)
        return {k: result[k] for k in ("max_kl", "mean_kl", "top1_agreement",
                                        "first_token_agreement", "min_agreeing_tokens")}

    parity = {"base_same_weights": cross("llama-f16", ov),
              "base_defaults": cross(llama, ov),
              "variant_same_weights": cross("va16", "va"),
              "variant_defaults": cross("va", "va", "llama")}
    described = ov_client.call(messages.Describe(), timeout=60)
    ov_client.close()
    llama_client.close()

    def ratio(a: str, b: str) -> float:
        return median(sides[a]) / median(sides[b])

    def cpu_ratio(a: str, b: str) -> float:  # > 1: a needs less CPU per token than b
        return median(cpu_ms[b]) / median(cpu_ms[a])

    write("openvino", {
        "prompt": PROMPT, "tokens": args.tokens, "rounds": args.rounds,
        "threads": os.environ.get("VARIANT_STUDIO_THREADS") or "all cores",
        "tokens_per_second": sides,
        "medians": {k: median(v) for k, v in sides.items()},
        "cpu_ms_per_token": cpu_ms,
        "cpu_ms_per_token_medians": {k: median(v) for k, v in cpu_ms.items()},
        "cpu_efficiency_ratios": {
            "ov_variant_vs_ov_base": cpu_ratio("ov_variant", "ov_base"),
            "ov_base_vs_llama_f16": cpu_ratio("ov_base", "llama_f16"),
            "ov_base_vs_llama_q4_1": cpu_ratio("ov_base", "llama_q4_1"),
            "ov_converted_variant_vs_llama_variant_f16": cpu_ratio("ov_converted_variant",
                                                                   "llama_variant_f16"),
            "ov_engine_vs_genai_pipeline": cpu_ratio("ov_base", "genai_pipeline"),
        },
        "ratios": {
            "ov_variant_vs_ov_base": ratio("ov_variant", "ov_base"),
            "ov_base_vs_llama_f16": ratio("ov_base", "llama_f16"),
            "ov_base_vs_llama_q4_1": ratio("ov_base", "llama_q4_1"),
            "ov_converted_variant_vs_llama_variant_q4_1": ratio("ov_converted_variant",
                                                                "llama_variant_q4_1"),
            "ov_converted_variant_vs_llama_variant_f16": ratio("ov_converted_variant",
                                                               "llama_variant_f16"),
            "ov_engine_vs_genai_pipeline": ratio("ov_base", "genai_pipeline"),
        },
        "sessions": {**timings, "build_or_register_default_s": build_or_register_s,
                     "pipeline_builds": next(r["pipeline_builds"] for r in described["residents"]
                                             if r["backend"] == "openvino")},
        "memory": {"base_rss_bytes": base_rss, "base_and_variant_rss_bytes": both_rss,
                   "ratio": both_rss / base_rss},
        "parity_kl_nats": parity,
    })


class _GenaiPipeline:
    """OpenVINO GenAI's LLMPipeline on the same IR, greedy, timed per streamed token."""

    def __init__(self, folder: str, tokens: int) -> None:
        import openvino_genai

        from engine.runtime.openvino.backend import COMPILE_CONFIG

        props = {k: v for k, v in COMPILE_CONFIG.items()
                 if k in ("INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION")}
        threads = int(os.environ.get("VARIANT_STUDIO_THREADS", "0"))
        if threads:  # the same thread budget as the engine
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
