"""What a merge's survival is measured on, for a given variant.

In order: the evaluation set attached to one of the variant's adapters (`eval attach`;
the shipped demo adapter carries its held-out set this way), read back and checked
against its recorded digest by `score_sets.stored_set`; for a catalog made before sets
could be attached, the demo's held-out file (resources/demo/heldout.jsonl) for
variants of the demo adapter; otherwise a fixed set of chat prompts with no answers
(`PROBE_PROMPTS`), on which the variant's own greedy continuation is the
teacher-forced text and no task accuracy is measured.
"""

from __future__ import annotations

from typing import Any

from engine.catalog import evaluation
from engine.catalog.store import Catalog
from engine.curated import demo
from engine.errors import StudioError
from engine.runtime.merge_job import EvalSet
from engine.runtime.merge_work import EvalItem
from engine.runtime.messages import Prompt, ScoreItem
from engine.training import score_sets

HELDOUT = "heldout.jsonl"
PROBE_PROMPTS = (
    "What will the weather be in Lisbon tomorrow?",
    "Write a short poem about the sea.",
    "Explain in two sentences what a LoRA adapter is.",
    "Set a timer for ten minutes.",
    "Translate 'good morning' into French.",
    "List three uses of a paperclip.",
    "Summarise the plot of Romeo and Juliet in one sentence.",
    "What is 17 times 23?",
)


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
        system = (record or {}).get("profile", {}).get("system_prompt") or None
        found = EvalSet("fixed chat prompts (no answers)", "probe",
                        tuple(EvalItem("probe", Prompt(text, chat=True, system=system))
                              for text in PROBE_PROMPTS))
    if limit is not None and limit < len(found.items):
        found = EvalSet(f"{found.name}, first {limit}", found.kind, found.items[:limit])
    return found


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
                       f"{loaded.sha256[:12]}…)", "eval",
                       tuple(from_score_item(item) for item in loaded.items))
    return None


def from_score_item(item: ScoreItem) -> EvalItem:
    """A score item (as `eval attach` keeps it) as an evaluation item, same tokens."""
    return EvalItem(item.kind, item.prompt, item.target)


def heldout_set() -> EvalSet:
    """The demo's held-out requests with their expected tool calls."""
    path = demo.resources_dir() / HELDOUT
    loaded = score_sets.read_set(path, "jsonl")
    return EvalSet(f"the demo's held-out set (resources/demo/{HELDOUT})", "heldout",
                   tuple(from_score_item(item) for item in loaded.items))


def _is_demo(catalog: Catalog, record: dict[str, Any]) -> bool:
    if [a["name"] for a in record.get("adapters", [])] != [demo.ADAPTER_NAME]:
        return False
    try:
        return bool(catalog.adapter(demo.ADAPTER_NAME).get("curated"))
    except StudioError:
        return False
