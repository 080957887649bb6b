"""The merge command: fold a variant's adapters into a standalone GGUF base model, with
what survived measured and shown, and a merge that erased the fine-tune refused."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from engine.catalog.store import Catalog
from engine.cli.output import emit_json
from engine.errors import UsageError
from engine.runtime.merge import job as merge_job
from engine.runtime.merge.check import MAX_ITEMS
from engine.training import merge_eval


def cmd_merge(catalog: Catalog, args: argparse.Namespace) -> int:
    if args.eval_rows is not None and not 1 <= args.eval_rows <= MAX_ITEMS:
        raise UsageError(f"--eval-rows must be 1..{MAX_ITEMS}")
    if args.task_rows < 0:
        raise UsageError("--task-rows must be 0 or more")
    eval_set = merge_eval.eval_set_for(catalog, args.name,
                                         limit=args.eval_rows or MAX_ITEMS)
    progress = stage_progress("merge")
    try:
        report = merge_job.merge_variant(catalog, args.name, args.out, args.type, eval_set,
                                         task_rows=args.task_rows,
                                         allow_erased=args.allow_erased, progress=progress)
    except merge_job.MergeRefused as refused:
        if args.json:
            emit_json({**_public(refused.report), "refused": True})
        else:
            print_report(refused.report)
        print(f"error: {refused.message}", file=sys.stderr)
        return refused.exit_code
    finally:
        if progress is not None:
            print(file=sys.stderr)
    if args.json:
        emit_json({**_public(report), "refused": False, "record": report["record"]})
        return 0
    record = report["record"]
    label = "ERASED (kept with --allow-erased)" if report["erased"] else "accepted"
    print(f"merged {report['variant']} into base model {record['name']} ({report['type']}, "
          f"{record['size'] / 1e6:.1f} MB, sha256 {record['sha256'][:16]}…): {label}")
    print("  a standalone model, not a dynamic variant: the adapters are folded into its "
          "weights; serve it with the variant's system prompt (recorded in merged_from)")
    print_report(report)
    print(f"  file: {record['path']}")
    return 0


def print_report(report: dict[str, Any]) -> None:
    """The figures of a merge, accepted or refused, as a few readable lines."""
    weights, behaviour = report["weights"], report["behaviour"]
    types = ", ".join(f"{n} {t}" for t, n in sorted(weights["types"].items()))
    print(f"  weights ({weights['tensors']} adapted tensors: {types}): "
          f"{weights['rounded_back']:.1%} of the adapted weights round back to the base's "
          f"code on this grid; the stored change carries {weights['delta_retained']:.1%} of "
          "the adapters' delta")
    survival = report["survival"]
    shown = "not measurable" if survival is None else f"{survival:.3f}"
    print(f"  behaviour: survival {shown} (threshold {report['threshold']:g}) = 1 - "
          f"KL(variant||merged) {behaviour['kl_variant_merged']:.4f} / KL(variant||base) "
          f"{behaviour['kl_variant_base']:.4f} nats per token, over {behaviour['positions']} "
          f"tokens of {behaviour['items']} items ({report['eval_set']['name']}); top-1 "
          f"agreement with the variant {behaviour['top1_merged']:.2f} (base "
          f"{behaviour['top1_base']:.2f})")
    task = report.get("task")
    if task:
        print(f"  task: exact match base {task['base']['strict']:.2f}, variant "
              f"{task['variant']['strict']:.2f}, merged {task['merged']['strict']:.2f} "
              f"(greedy, first {task['rows']} of {task['of']} rows with answers)")
    else:
        print("  task: no answers in the evaluation set, no exact-match figures")


def _public(report: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in report.items() if k != "record"}


def stage_progress(label: str) -> Callable[[str, float], None] | None:
    """Stage and percentage lines on stderr, only on a terminal."""
    if not sys.stderr.isatty():
        return None
    last = {"stage": "", "percent": -1}

    def report(stage: str, fraction: float) -> None:
        percent = int(fraction * 100)
        if stage != last["stage"] or percent != last["percent"]:
            end = "\n" if stage != last["stage"] and last["stage"] else ""
            print(f"{end}\r{label}: {stage} {percent}%", end="", file=sys.stderr, flush=True)
            last.update(stage=stage, percent=percent)

    return report
