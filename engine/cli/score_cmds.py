"""The commands that measure and check answers: score, eval attach and replay."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from engine.catalog import evaluation
from engine.catalog.store import Catalog
from engine.cli.output import emit_json
from engine.runtime import replay
from engine.runtime.client import run_once
from engine.runtime.results import GenerationResult
from engine.training import score_sets


def _progress() -> Any:
    """A progress line on stderr, only on a terminal."""
    if not sys.stderr.isatty():
        return None

    def report(stage: str, fraction: float) -> None:
        print(f"\r{stage}: {fraction:.0%}", end="\n" if fraction >= 1 else "",
              file=sys.stderr, flush=True)

    return report


def _num(value: float | None, digits: int = 4) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def cmd_score(catalog: Catalog, args: argparse.Namespace) -> int:
    data = score_sets.read_set(args.data)
    results = score_sets.score_models(catalog, list(args.names), data, backend=args.backend,
                                      exact_match=args.exact_match, per_token=args.json,
                                      ov_profile=args.profile,
                                      progress=None if args.json else _progress())
    if args.json:
        emit_json({"data": {"file": Path(data.path).name, "sha256": data.sha256,
                            "format": data.format, "kind": data.kind, "rows": data.rows},
                   "results": [r.to_dict() for r in results]})
        return 0
    print(f"data: {Path(data.path).name} ({data.rows} items, {data.kind}, sha256 "
          f"{data.sha256[:12]}…)")
    width = max(len("model"), *(len(r.name) for r in results))
    # An OpenVINO row names its profile: `openvino/fast-int8`.
    served = [r.backend + (f"/{r.openvino_profile}" if r.openvino_profile else "")
              for r in results]
    column = max(len("backend"), *(len(s) for s in served))
    # The tool-call exact match, beside exact match, when the set has tool-call items.
    calls = any(r.tool_call_exact is not None for r in results)
    exact = max(len("exact match"), *(len(r.exact_text) for r in results))
    print(f"{'model':<{width}}  {'backend':<{column}}  items   tokens  mean NLL  perplexity  "
          + (f"{'exact match':<{exact}}  tool-call exact" if calls else "exact match"))
    for r, backend in zip(results, served, strict=True):
        print(f"{r.name:<{width}}  {backend:<{column}} {r.items:>6} {r.tokens:>8}  "
              f"{_num(r.mean_nll):>8}  {_num(r.perplexity):>10}  "
              + (f"{r.exact_text:<{exact}}  {r.tool_call_text}" if calls else r.exact_text))
    kept = sorted({name for r in results for name in r.recorded_on or ()})
    if kept:
        print("kept as the latest scores of the evaluation set of " + ", ".join(kept))
    return 0


def cmd_eval(catalog: Catalog, args: argparse.Namespace) -> int:
    entry = score_sets.attach(catalog, args.adapter, args.data)
    if args.json:
        emit_json({"adapter": args.adapter, **entry})
        return 0
    print(f"attached {args.data.name} to {args.adapter} as its evaluation set: "
          f"{entry['rows']} items ({entry['kind']}), sha256 {entry['sha256'][:12]}…, "
          f"stored as {entry['file']}")
    print(f"score it with: variant-studio score NAME --data "
          f"{evaluation.store_folder(catalog.adapter(args.adapter)) / entry['file']}")
    return 0


def cmd_replay(catalog: Catalog, args: argparse.Namespace) -> int:
    record = replay.load(args.file)
    plan = replay.plan(catalog, record)
    result: GenerationResult | None = (run_once(plan.request) if plan.request is not None
                                       else None)
    found = replay.verdict(plan, result)
    if args.json:
        emit_json(found)
    else:
        print(f"{record.name} on {record.identity.backend} [{record.identity.short}]: "
              f"{replay.verdict_line(found)}")
        for change in found["identity_changes"]:
            print(f"  identity: {change}")
    # Like cmp(1): 0 identical, 1 diverged or not replayable.
    return 0 if found["identical"] else 1
