"""Decode speed when another process takes a core (issue 28, item 12).

A desktop app shares its machine. This benchmark decodes the same greedy request
through the engine process under several thread settings, and through raw
llama-cpp-python (`Llama`, in a process of its own) with one thread as the reference,
each on a quiet machine and with a CPU hog (one busy-looping child process, like a
build or a video call beside the app) running at the same time.

The settings (`CONFIGS`) are the engine's thread count and libgomp's wait policy:
this llama.cpp build runs its threads under OpenMP (`ggml_barrier` is `GOMP_barrier`),
so a thread that reaches the barrier after every graph node spins `GOMP_SPINCOUNT`
times (300,000 by default) before it sleeps; ggml's own `poll` setting applies only
to builds without OpenMP (docs/notes.md). libgomp reads its environment once, when it
is loaded, so each setting runs in its own engine process, all of them alive at once.

Rounds interleave everything: each round runs the quiet and the busy condition (their
order alternating), and within each condition every setting (rotated order). Ratios
are of medians, measured side by side in this one run.

Usage: .venv/bin/python -m benchmarks.bench_contention [--rounds N] [--tokens N]
       [--hog unpinned|pinned] [--configs t1,t2-default,...]
Writes benchmarks/out/contention.json.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from benchmarks.common import median, scratch_home, write

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."
# A busy loop in its own process: one core's worth of someone else's work.
HOG_CODE = "while True:\n    pass\n"
# Raw llama-cpp-python with one thread: for each line N on stdin, decode N greedy tokens
# and print tok/s from the first token to the last (as bench_llama measures it).
RAW_CODE = """
import sys, time, llama_cpp
raw = llama_cpp.Llama(sys.argv[1], n_ctx=4096, n_batch=512, n_threads=1,
                      n_threads_batch=1, verbose=False)
tokens = raw.tokenize(sys.argv[2].encode(), add_bos=False)
for line in sys.stdin:
    count = int(line)
    raw.reset()
    stamps = []
    for i, _ in enumerate(raw.generate(tokens, temp=0.0, repeat_penalty=1.0)):
        stamps.append(time.perf_counter())
        if i + 1 >= count:
            break
    print((len(stamps) - 1) / (stamps[-1] - stamps[0]), flush=True)
"""


@dataclass(frozen=True)
class Config:
    """One engine setting: threads and the environment that sets libgomp's waiting."""

    name: str
    threads: int
    env: dict[str, str]
    description: str


# GOMP_SPINCOUNT=300000 is libgomp's own default written out, so the row measures
# llama.cpp's behaviour whatever the engine's default later becomes.
CONFIGS = {
    c.name: c for c in (
        Config("t1", 1, {"GOMP_SPINCOUNT": "300000"}, "1 thread"),
        Config("t2-default", 2, {"GOMP_SPINCOUNT": "300000"},
               "2 threads, libgomp's default spin (300k)"),
        Config("t2-spin10k", 2, {"GOMP_SPINCOUNT": "10000"}, "2 threads, spin 10k"),
        Config("t2-passive", 2, {"OMP_WAIT_POLICY": "PASSIVE"},
               "2 threads, no spinning (OMP_WAIT_POLICY=PASSIVE)"),
        Config("auto", 0, {}, "the engine's default (no setting)"),
    )
}


def start_hog(pinned: bool) -> subprocess.Popen[bytes]:
    """A child that busy-loops; pinned to the last CPU when asked."""
    hog = subprocess.Popen([sys.executable, "-c", HOG_CODE])
    if pinned and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(hog.pid, {max(os.sched_getaffinity(0))})
    time.sleep(0.3)  # let the scheduler see it as a running task
    return hog


def stop_hog(hog: subprocess.Popen[bytes]) -> None:
    hog.kill()
    hog.wait()


def background_cores(seconds: float = 1.0) -> float | None:
    """CPU cores the rest of the machine uses while this benchmark's engines sit idle
    (how quiet "quiet" was: other people's work on a shared machine counts)."""
    from engine.runtime.contention import read_cpu_times

    first = read_cpu_times()
    time.sleep(seconds)
    second = read_cpu_times()
    if first is None or second is None:
        return None
    return max(0.0, (second.machine - first.machine) - (second.ours - first.ours)) / seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--hog", choices=("unpinned", "pinned"), default="unpinned")
    # t2-spin10k is left out by default: it collapses like t2-default (one collapsed run
    # costs about 20 s), so a default run stays within about 5 minutes at 3 rounds.
    parser.add_argument("--configs", default="t1,t2-default,t2-passive,auto",
                        help="comma-separated subset of: " + ", ".join(CONFIGS))
    args = parser.parse_args()
    chosen = [CONFIGS[name] for name in args.configs.split(",") if name]
    scratch_home()
    from engine.catalog.profiles import Sampling
    from engine.catalog.resolve import resolve
    from engine.catalog.store import Catalog
    from engine.curated import embedded as defaults
    from engine.curated import setup
    from engine.runtime import messages
    from engine.runtime.client import EngineClient

    catalog = Catalog()
    setup.first_run(catalog)
    base = defaults.DEFAULT_MODEL_NAME
    sampling = Sampling(temperature=0.0, repeat_penalty=1.0, max_tokens=args.tokens)
    request = messages.Generate(resolve(catalog, base), messages.Prompt(PROMPT), sampling)

    # The inherited environment minus any thread or wait setting of the caller's, so
    # each process gets exactly its configuration.
    clean = {k: v for k, v in os.environ.items()
             if k not in ("VARIANT_STUDIO_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    clients: dict[str, EngineClient] = {}
    threads_used: dict[str, int] = {}
    for config in chosen:
        env = {**clean, **config.env}
        if config.threads:
            env["VARIANT_STUDIO_THREADS"] = str(config.threads)
        client = EngineClient(env=env)
        client.call(request, timeout=600)  # load the model, warm the session
        clients[config.name] = client
        threads_used[config.name] = client.call(messages.Describe())["n_threads"]

    def engine_tps(name: str) -> float:
        stamps: list[float] = []
        handle = clients[name].submit(
            request, lambda e: stamps.append(time.perf_counter())
            if isinstance(e, messages.Token) else None)
        result = handle.wait(600)
        # Client-observed, first token event to last, as bench_llama measures.
        return (len(result["token_ids"]) - 1) / (stamps[-1] - stamps[0])

    # Raw llama-cpp-python in a child process of its own, as each engine is, so that
    # no side shares a process (and its scheduling) with this driver.
    raw = subprocess.Popen(
        [sys.executable, "-c", RAW_CODE, str(defaults.embedded_model_path()), PROMPT],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=clean)
    assert raw.stdin is not None and raw.stdout is not None
    raw_in, raw_out = raw.stdin, raw.stdout

    def raw_tps() -> float:
        raw_in.write(f"{args.tokens}\n")
        raw_in.flush()
        return float(raw_out.readline())

    raw_tps()  # warm up

    names = ["raw-t1", *clients]
    runs: dict[str, dict[str, list[float]]] = {
        cond: {name: [] for name in names} for cond in ("quiet", "busy")}
    loads: dict[str, list[float]] = {"quiet": [], "busy": []}
    background: dict[str, list[float | None]] = {"quiet": [], "busy": []}
    for round_no in range(args.rounds):
        conditions = ("quiet", "busy") if round_no % 2 == 0 else ("busy", "quiet")
        for cond in conditions:
            hog = start_hog(args.hog == "pinned") if cond == "busy" else None
            try:
                background[cond].append(background_cores())
                shift = round_no % len(names)
                for name in names[shift:] + names[:shift]:
                    tps = raw_tps() if name == "raw-t1" else engine_tps(name)
                    runs[cond][name].append(tps)
                    print(f"round {round_no + 1} {cond:5} {name:11} {tps:7.1f} tok/s",
                          flush=True)
                loads[cond].append(os.getloadavg()[0])
            finally:
                if hog is not None:
                    stop_hog(hog)
    raw_in.close()
    raw.wait(60)
    for client in clients.values():
        client.close()

    summary: dict[str, Any] = {}
    ref = {cond: median(runs[cond]["raw-t1"]) for cond in runs}
    for name in names:
        row: dict[str, Any] = {
            "threads": 1 if name == "raw-t1" else threads_used[name],
            "description": ("raw llama-cpp-python, 1 thread" if name == "raw-t1"
                            else CONFIGS[name].description),
            "env": {} if name == "raw-t1" else CONFIGS[name].env}
        for cond in runs:
            med = median(runs[cond][name])
            row[cond] = {"tps": runs[cond][name], "median_tps": med,
                         "vs_raw_t1": med / ref[cond]}
        row["busy_vs_quiet"] = row["busy"]["median_tps"] / row["quiet"]["median_tps"]
        summary[name] = row

    for cond, cores in background.items():
        shown = ", ".join("?" if c is None else f"{c:.2f}" for c in cores)
        print(f"{cond}: other programs used {shown} cores before the rounds")
    print(f"\n{'setting':11} {'quiet tok/s':>11} {'busy tok/s':>10} "
          f"{'quiet/raw1':>10} {'busy/raw1':>9}")
    for name, row in summary.items():
        print(f"{name:11} {row['quiet']['median_tps']:11.1f} "
              f"{row['busy']['median_tps']:10.1f} {row['quiet']['vs_raw_t1']:10.2f} "
              f"{row['busy']['vs_raw_t1']:9.2f}")
    write("contention", {
        "prompt": PROMPT, "tokens": args.tokens, "rounds": args.rounds, "hog": args.hog,
        "load_average_1m": loads, "background_cores": background, "settings": summary,
    })


if __name__ == "__main__":
    main()
