"""Merging the demo variant `tool-calls` into standalone GGUFs: what survives each grid.

1. Types: F16, Q8_0, Q4_K_M and the base's own Q4_1 (`--type base`) at the variant's
   scale 1: the weight figures (share of adapted weights whose code rounds back to
   the base's on that grid, share of the delta the stored change carries), behaviour
   survival (1 - KL(variant||merged) / KL(variant||base), next-token distributions
   teacher-forced on the held-out answers) and held-out exact match of base, variant
   and merged model (greedy).
2. A scale sweep: the demo adapter at scales 0.5, 1, 2, 4 and 8 merged into the base's
   own grid and into Q8_0 (the variant at the same scale is the reference).

Every merge runs through `engine.runtime.merge.job.measure` (the code `variant-studio
merge` runs) in one merge worker process, into a scratch folder; nothing is added to
any catalog. KL is measured on `--kl-rows` held-out rows (all 60 by default), exact
match on the first `--task-rows` (20 for the types, `--sweep-task-rows` 12 for the
sweep): three greedy models per row are slow on a 2-core machine.
Writes benchmarks/out/merge.json.
Usage: .venv/bin/python -m benchmarks.bench_merge [--kl-rows N] [--task-rows N]
       [--sweep-task-rows N] [--threads N]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import scratch_home, write

TYPES = ("f16", "q8_0", "q4_k_m", "base")
SCALES = (0.5, 1.0, 2.0, 4.0, 8.0)
SWEEP_TYPES = ("base", "q8_0")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kl-rows", type=int, default=60)
    parser.add_argument("--task-rows", type=int, default=20)
    parser.add_argument("--sweep-task-rows", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", choices=("types", "sweep"), help="run one part")
    args = parser.parse_args()
    scratch_home()
    from engine.catalog.store import AdapterSpec, Catalog
    from engine.curated import demo, embedded, setup
    from engine.runtime.merge import job as merge_job
    from engine.runtime.merge import records
    from engine.runtime.merge.work import MergeWorker
    from engine.training import merge_eval

    catalog = Catalog()
    setup.first_run(catalog, with_demo=True)
    for scale in SCALES:
        if scale != 1.0:
            catalog.add_variant(_variant(scale), embedded.DEFAULT_MODEL_NAME,
                                [AdapterSpec(demo.ADAPTER_NAME, scale)], demo.DEMO_PROFILE)
    eval_set = merge_eval.eval_set_for(catalog, demo.VARIANT_NAME, limit=args.kl_rows)
    scratch = Path(tempfile.mkdtemp(prefix="vs-merge-bench-"))
    results: dict[str, Any] = {"types": [], "sweep": []}

    def run(variant: str, type_: str, task_rows: int) -> dict[str, Any]:
        src = records.source(catalog, variant)
        out = scratch / f"{variant}-{type_}.gguf"
        started = time.perf_counter()
        report = merge_job.measure(src, out, type_, eval_set, task_rows, worker,
                                   f"bench-{variant}-{type_}", _progress)
        out.unlink(missing_ok=True)
        row = _row(report, time.perf_counter() - started)
        print(f"{variant} {type_}: {row['summary']}", file=sys.stderr, flush=True)
        return row

    with MergeWorker(args.threads) as worker:
        if args.only in (None, "types"):
            for type_ in TYPES:
                results["types"].append(run(demo.VARIANT_NAME, type_, args.task_rows))
        if args.only in (None, "sweep"):
            for scale in SCALES:
                for type_ in SWEEP_TYPES:
                    row = run(_variant(scale), type_, args.sweep_task_rows)
                    results["sweep"].append({"scale": scale, **row})
    shutil.rmtree(scratch, ignore_errors=True)
    write("merge", {
        "model": embedded.DEFAULT_MODEL_NAME, "adapter": demo.ADAPTER_NAME,
        "eval_set": eval_set.describe(), "kl_rows": len(eval_set.items),
        "task_rows": args.task_rows, "sweep_task_rows": args.sweep_task_rows,
        "threads": args.threads, **results,
    })


def _variant(scale: float) -> str:
    from engine.curated import demo

    return demo.VARIANT_NAME if scale == 1.0 else f"tool-calls-x{scale:g}"


def _row(report: dict[str, Any], seconds: float) -> dict[str, Any]:
    weights, behaviour, task = report["weights"], report["behaviour"], report["task"]
    row = {
        "type": report["type"], "file_type": report["file"]["file_type"],
        "tensor_types": report["file"]["tensor_types"],
        "adapted_types": weights["types"], "size": report["file"]["size"],
        "rounded_back": weights["rounded_back"], "delta_retained": weights["delta_retained"],
        "weight_error": weights["error"], "survival": report["survival"],
        "kl_variant_base": behaviour["kl_variant_base"],
        "kl_variant_merged": behaviour["kl_variant_merged"],
        "top1_merged": behaviour["top1_merged"], "positions": behaviour["positions"],
        "accepted": report["accepted"],
        "task": None if task is None else {k: task[k] for k in ("rows", "base", "variant",
                                                                "merged")},
        "seconds": round(seconds, 1), "file_seconds": report["file"]["seconds"],
    }
    exact = "" if task is None else (f", exact match base {task['base']['strict']:.2f} "
                                     f"variant {task['variant']['strict']:.2f} merged "
                                     f"{task['merged']['strict']:.2f} ({task['rows']} rows)")
    row["summary"] = (f"rounded back {weights['rounded_back']:.4f}, delta retained "
                      f"{weights['delta_retained']:.3f}, survival {report['survival']:.3f}"
                      + exact)
    return row


def _progress(stage: str, fraction: float) -> None:
    if fraction in (0.0, 1.0):
        print(f"  {stage} {fraction:.0%}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
