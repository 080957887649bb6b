"""Which evaluation set a merge's survival is measured on, for a given variant.

In order: the evaluation set attached to one of the variant's adapters (`eval attach`;
the shipped demo adapter carries its held-out set this way), read back and checked
against its recorded digest by `score_sets.stored_set`; for a catalog made before sets
could be attached, the demo's held-out file (resources/demo/heldout.jsonl) for
variants of the demo adapter; otherwise the fixed probe prompts
(`runtime.merge.eval_sets.probe_set`), on which the variant's own greedy continuation
is the teacher-forced text and no task accuracy is measured.

Why this choice lives in training and not in the merge room (`runtime.merge`): it reads
score sets through the training data's own parser (`training.score_sets`) and the
demo's files (`curated.demo`), and both sit above `runtime`. The sets it returns are the
room's `EvalSet`s of the engine's `ScoreItem`s, as the score sets hold them.
"""

from __future__ import annotations

from typing import Any

from engine.catalog import evaluation
from engine.catalog.store import Catalog
from engine.curated import demo
from engine.errors import StudioError
from engine.runtime.merge.eval_sets import EvalSet, probe_set
from engine.training import score_sets

HELDOUT = "heldout.jsonl"


def eval_set_for(catalog: Catalog, variant: str, limit: int | None = None) -> EvalSet:
    """The evaluation set for `variant` (see the module docstring); at most `limit` items."""
    try:
        record: dict[str, Any] | None = catalog.variant(variant)
    except StudioError:
        record = None  # the merge itself refuses it, with its own message
    found = attached_set(catalog, record) if record else None
    if found is None and record is not None and _is_demo(catalog, record):
        found = heldout_set()
    if found is None:
        found = probe_set((record or {}).get("profile", {}).get("system_prompt") or None)
    return found if limit is None else found.first(limit)


def attached_set(catalog: Catalog, record: dict[str, Any]) -> EvalSet | None:
    """The evaluation set of the first of the variant's adapters that has one."""
    for entry in record.get("adapters", []):
        try:
            if evaluation.set_path(catalog, entry["name"]) is None:
                continue
            loaded = score_sets.stored_set(catalog, entry["name"])
        except StudioError:
            continue  # a missing or changed set: the next source is used
        return EvalSet(f"the evaluation set of {entry['name']} ({loaded.rows} rows, sha256 "
                       f"{loaded.sha256[:12]}…)", "eval", loaded.items)
    return None


def heldout_set() -> EvalSet:
    """The demo's held-out requests with their expected tool calls."""
    loaded = score_sets.read_set(demo.resources_dir() / HELDOUT, "jsonl")
    return EvalSet(f"the demo's held-out set (resources/demo/{HELDOUT})", "heldout",
                   loaded.items)


def _is_demo(catalog: Catalog, record: dict[str, Any]) -> bool:
    if [a["name"] for a in record.get("adapters", [])] != [demo.ADAPTER_NAME]:
        return False
    try:
        return bool(catalog.adapter(demo.ADAPTER_NAME).get("curated"))
    except StudioError:
        return False
