"""Serving benchmarks, each measured side by side in one run (writes
benchmarks/out/serve.json).

1. The cost of turn N of a chat: time to first token after a ~3,000-token conversation
   plus a short new message, through the engine (its prefix cache) against
   llama-cpp-python's `Llama` (its own prefix reuse), same file, same token ids, both
   warm from the previous turn (aim: ours / theirs <= 1.2). The cold time (nothing
   cached) is reported beside it.
2. The local server under load: 1, 4 and 8 concurrent clients over the base and three
   variants, against the same load on the base alone: requests/s, aggregate tok/s and
   p50/p95 time to first token.
3. The server's decode speed against the engine client driven directly with the same
   request (aim >= 0.95).

Usage: .venv/bin/python -m benchmarks.bench_serve [--rounds N] [--requests N] [--threads N]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import median, scratch_home, write

FILLER = ("The harbour was quiet that evening. Boats rocked against the pier, gulls "
          "argued over scraps, and the old keeper walked the length of the breakwater as "
          "he had every night for thirty years, counting the lamps along the shore. ")


def conversation(tokens_wanted: int, count: Any) -> str:
    """A ChatML conversation of about `tokens_wanted` tokens, ending with a user turn
    and the assistant's header."""
    parts = []
    turn = 0
    text = ""
    while count(text) < tokens_wanted:
        turn += 1
        parts.append(f"<|im_start|>user\nTell me part {turn} of the story.<|im_end|>\n")
        parts.append(f"<|im_start|>assistant\n{FILLER * 3}<|im_end|>\n")
        text = "".join(parts)
    return text + "<|im_start|>user\nGo on.<|im_end|>\n<|im_start|>assistant\n"


def turn_n(catalog: Any, base: str, model_path: str, rounds: int, tokens: int,
           threads: int) -> dict[str, Any]:
    import llama_cpp

    from engine.catalog import resolve
    from engine.catalog.profiles import Sampling
    from engine.runtime import messages as m
    from engine.runtime.client import EngineClient

    # n_threads_batch too: `Llama` would decode prompts on every core by default, where
    # the engine uses `threads` for both.
    llm = llama_cpp.Llama(model_path, n_ctx=4096, n_threads=threads,
                          n_threads_batch=threads, n_batch=512, verbose=False)

    def count(text: str) -> int:
        return len(llm.tokenize(text.encode(), add_bos=False, special=True))

    history = conversation(tokens, count)
    follow = (history + "It was a long night.<|im_end|>\n<|im_start|>user\n"
              "What did he find in the end?<|im_end|>\n<|im_start|>assistant\n")
    ids_a = llm.tokenize(history.encode(), add_bos=False, special=True)
    ids_b = llm.tokenize(follow.encode(), add_bos=False, special=True)
    client = EngineClient()
    spec = resolve.resolve(catalog, base)
    greedy = Sampling(temperature=0.0, repeat_penalty=1.0, max_tokens=16)

    def ours(text: str) -> tuple[float, dict[str, Any]]:
        first: list[float] = []
        start = time.perf_counter()
        handle = client.submit(m.Generate(spec, m.Prompt(text), greedy), lambda e: (
            first.append(time.perf_counter()) if isinstance(e, m.Token) and not first
            else None))
        result = handle.wait(600)
        return first[0] - start, result

    def theirs(ids: list[int]) -> float:
        start = time.perf_counter()
        for _chunk in llm.create_completion(ids, max_tokens=1, temperature=0.0,
                                            stream=True):
            return time.perf_counter() - start
        return time.perf_counter() - start

    ours_warm, theirs_warm, ours_cold, reused = [], [], [], []
    try:
        ours(history)  # load the model
        for _ in range(rounds):
            client.call(m.CloseAll(), timeout=600)
            cold, _ = ours(follow)
            ours_cold.append(cold)
            client.call(m.CloseAll(), timeout=600)
            ours(history)  # turn N-1: its prompt is now cached
            warm, result = ours(follow)
            ours_warm.append(warm)
            reused.append(result["reused_tokens"])
            llm.reset()
            list(llm.create_completion(ids_a, max_tokens=16, temperature=0.0))  # turn N-1
            theirs_warm.append(theirs(ids_b))
    finally:
        client.close()
    ratio = median(ours_warm) / median(theirs_warm)
    return {"conversation_tokens": len(ids_a), "turn_tokens": len(ids_b),
            "reused_tokens": median(reused),
            # What each side decodes for turn N: ours from the last whole aligned chunk
            # (bit-exact reuse), theirs from the end of the longest common prefix.
            "ours_decoded_tokens": len(ids_b) - median(reused),
            "theirs_decoded_tokens": len(ids_b) - common(ids_a, ids_b),
            "ours_warm_ttft_s": median(ours_warm),
            "llama_cpp_python_warm_ttft_s": median(theirs_warm),
            "ours_cold_ttft_s": median(ours_cold), "ratio_ours_over_theirs": ratio,
            "target": "<= 1.2", "rounds": rounds}


def common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def load(server: Any, models: list[str], clients: int, requests: int) -> dict[str, Any]:
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0,
                           timeout=600)

    def one(index: int) -> tuple[float, int]:
        start = time.perf_counter()
        first = None
        count = 0
        stream = client.chat.completions.create(
            model=models[index % len(models)], stream=True, temperature=0, max_tokens=32,
            stream_options={"include_usage": True},
            messages=[{"role": "user", "content": f"Write a sentence about topic {index}."}])
        for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter() - start
            if chunk.usage is not None:
                count = chunk.usage.completion_tokens
        return first or 0.0, count

    total = clients * requests
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(one, range(total)))
    wall = time.perf_counter() - start
    ttfts = sorted(r[0] for r in results)
    return {"clients": clients, "requests": total, "seconds": wall,
            "requests_per_second": total / wall,
            "tokens_per_second": sum(r[1] for r in results) / wall,
            "ttft_p50_s": statistics.median(ttfts),
            "ttft_p95_s": ttfts[min(len(ttfts) - 1, int(round(0.95 * (len(ttfts) - 1))))]}


def server_vs_engine(server: Any, catalog: Any, rounds: int) -> dict[str, Any]:
    import openai

    from engine.catalog import resolve
    from engine.catalog.profiles import Sampling
    from engine.runtime import messages as m
    from engine.runtime.client import EngineClient

    question = "Write a long story about a lighthouse keeper."
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0,
                           timeout=600)
    direct = EngineClient()
    spec = resolve.resolve(catalog, "va")
    request = m.Generate(spec, m.Prompt(messages=(m.Message("user", question),), chat=True),
                         Sampling(temperature=0.0, repeat_penalty=1.0, max_tokens=128))

    def via_server() -> float:
        times = []
        for chunk in client.chat.completions.create(
                model="va", stream=True, temperature=0, max_tokens=128,
                extra_body={"repeat_penalty": 1.0},
                messages=[{"role": "user", "content": question}]):
            if chunk.choices and chunk.choices[0].delta.content:
                times.append(time.perf_counter())
        return (len(times) - 1) / (times[-1] - times[0])

    def via_engine() -> float:
        times: list[float] = []
        direct.submit(request, lambda e: times.append(time.perf_counter())
                      if isinstance(e, m.Token) and e.text else None).wait(600)
        return (len(times) - 1) / (times[-1] - times[0])

    served, engine = [], []
    try:
        via_engine()
        via_server()
        for _ in range(rounds):
            served.append(via_server())
            engine.append(via_engine())
    finally:
        direct.close()
    return {"server_tokens_per_second": median(served),
            "engine_client_tokens_per_second": median(engine),
            "ratio_server_over_engine": median(served) / median(engine), "target": ">= 0.95",
            "rounds": rounds}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=2, help="requests per client")
    parser.add_argument("--conversation", type=int, default=3000, help="tokens before turn N")
    parser.add_argument("--threads", type=int, default=1,
                        help="engine threads (1: stable on a shared 2-core machine, where two "
                             "threads wait on each other whenever another process runs)")
    args = parser.parse_args()
    scratch_home()
    os.environ["VARIANT_STUDIO_THREADS"] = str(args.threads)
    from engine.catalog import imports
    from engine.catalog.store import AdapterSpec, Catalog
    from engine.curated import embedded, setup
    from engine.formats import artifacts
    from engine.runtime.host import configured_threads
    from engine.serve.config import ServeConfig
    from engine.serve.server import ServerThread
    from tests import factories

    catalog = Catalog()
    setup.first_run(catalog)
    base = embedded.DEFAULT_MODEL_NAME
    path = embedded.embedded_model_path()
    assert path is not None
    info = artifacts.inspect_path(path)
    tmp = Path(tempfile.mkdtemp())
    for index, name in enumerate(("va", "vb", "vc"), 1):
        imports.add_adapter(catalog, f"bench-{name}", base, factories.write_gguf_lora(
            tmp / f"{name}.gguf", info, seed=index, strength=0.05))
        catalog.add_variant(name, base, [AdapterSpec(f"bench-{name}", 1.0)])

    data: dict[str, Any] = {"turn_n": turn_n(catalog, base, str(path), args.rounds,
                                             args.conversation, configured_threads())}
    server = ServerThread(ServeConfig(port=0, max_sessions=8), catalog).start()
    try:
        load(server, [base], 1, 1)  # load the model
        mixed, alone = [], []
        for clients in (1, 4, 8):
            mixed.append(load(server, [base, "va", "vb", "vc"], clients, args.requests))
            alone.append(load(server, [base], clients, args.requests))
        data["load"] = {"base_and_three_variants": mixed, "base_alone": alone,
                        "tokens_per_second_ratio_mixed_over_alone": [
                            a["tokens_per_second"] / b["tokens_per_second"]
                            for a, b in zip(mixed, alone, strict=True)]}
        data["server_vs_engine"] = server_vs_engine(server, catalog, args.rounds)
    finally:
        server.stop()
    write("serve", data)


if __name__ == "__main__":
    main()
