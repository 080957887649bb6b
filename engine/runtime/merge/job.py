"""Merging a variant into a standalone model, survival checked: the client side.

`merge_variant` is what `variant-studio merge` runs:

1. the variant is resolved and its files verified (`records.source`), the new name
   checked (`Catalog.check_store_free`), the type checked (`formats.merge.check_type`);
   nothing is written before all three pass;
2. in a merge worker process (`runtime.merge.work`): the merge is written into a
   staging folder of `<data>/models/` and quantized by llama.cpp, and its adapted
   tensors are compared with the base on the same grid (the weight figures);
3. in the same worker (`runtime.merge.check`): the merged file, served as a plain base
   from a temporary spec, the dynamic variant and its base, on the same token ids of an
   evaluation set: behaviour survival `1 - KL(variant||merged) / KL(variant||base)`
   (next-token distributions, teacher-forced), and, when the set has answers, greedy
   exact-match accuracy of all three on its first `task_rows` items;
4. a merge whose survival is below `formats.merge.SURVIVAL_THRESHOLD` is refused
   (`MergeRefused`, exit 3, carrying the figures) and the staging folder removed,
   unless `allow_erased`: it is then added labelled `erased`. An accepted merge is
   added as a base model with `merged_from` (`records.add_merged`).

`measure` (steps 2-3 into any folder) is shared with the OpenVINO Model Server export,
which merges into its own staging folder and never adds anything to the catalog.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from engine import __version__
from engine.catalog import evaluation
from engine.catalog.store import Catalog, now_iso
from engine.errors import RefusedError
from engine.formats import merge
from engine.runtime.merge import records
from engine.runtime.merge.eval_sets import EvalSet, answered
from engine.runtime.merge.work import CheckRequest, MergeAdapter, MergeRequest, MergeWorker

ProgressFn = Callable[[str, float], None]
CancelCheck = Callable[[], bool]
DEFAULT_TASK_ROWS = 16


class MergeRefused(RefusedError):
    """Survival below the threshold: nothing was added; `report` has every figure."""

    def __init__(self, report: dict[str, Any]) -> None:
        survival = report["survival"]
        shown = "not measurable (the adapter changes nothing on the evaluation set)" \
            if survival is None else f"{survival:.2f}"
        super().__init__(
            f"merge refused: behaviour survival {shown} is below {report['threshold']:g}: "
            f"the fine-tune does not survive a {report['type']} merge (nothing was added; "
            "--allow-erased keeps it, labelled erased)")
        self.report = report


# ------------------------------------------------------------------------- scoring


def _json(text: str) -> Any:
    try:
        return json.loads(text.strip())
    except ValueError:
        return _NOT_JSON


_NOT_JSON = object()


def exact_match(text: str, expected: str) -> tuple[bool, bool]:
    """(strict, lenient): strict is the whole answer equal to the expected one (as JSON
    when the expected answer is JSON, else as text); lenient is the first JSON object
    in the answer equal to it (or, for text, the expected text inside the answer).
    For the demo this is `training.demo.score`'s rule."""
    want = _json(expected)
    if want is _NOT_JSON:
        return text.strip() == expected.strip(), expected.strip() in text
    found = evaluation.first_json_object(text)
    return _json(text) == want, found is not None and found == want


def score(texts: Sequence[str], answers: Sequence[str]) -> dict[str, Any]:
    matches = [exact_match(t, a) for t, a in zip(texts, answers, strict=True)]
    n = max(len(matches), 1)
    return {"n": len(matches), "strict": sum(s for s, _ in matches) / n,
            "lenient": sum(lenient for _, lenient in matches) / n}


# ----------------------------------------------------------------------- measuring


def measure(src: records.MergeSource, out: Path, type_: str, eval_set: EvalSet,
            task_rows: int, worker: MergeWorker, name: str,
            progress: ProgressFn | None = None, cancelled: CancelCheck | None = None
            ) -> dict[str, Any]:
    """Write the merge of `src` to `out` and measure it (steps 2-3 of the module doc);
    the report says whether it passes the threshold but adds nothing anywhere."""
    type_ = merge.check_type(type_)
    request = MergeRequest(
        src.base_path, src.base_sha256,
        tuple(MergeAdapter(a.name, a.path, a.sha256, a.scale) for a in src.adapters),
        str(out), type_,
        {"format": merge.FORMAT, "variant": src.variant, "base_sha256": src.base_sha256,
         "adapters": [{"name": a.name, "sha256": a.sha256, "scale": a.scale}
                      for a in src.adapters], "type": type_})
    made = worker.call(request, progress, cancelled)
    spec = records.temporary_spec(src, Path(made["path"]), made["sha256"], name)
    # Items with a prompt and an answer first, so the task rows are the first `greedy`.
    items = tuple(item for item in eval_set.items if answered(item)) + tuple(
        item for item in eval_set.items if not answered(item))
    of = sum(answered(item) for item in items)
    greedy = min(max(task_rows, 0), of)
    check = worker.call(CheckRequest(src.spec, src.spec.base_spec(), spec, items,
                                     eval_set.probes, greedy), progress, cancelled)
    survival = merge.survival(check["kl_variant_merged"], check["kl_variant_base"])
    task = None
    if greedy:
        expected = [items[i].target for i in range(greedy)]
        answers = check["answers"]
        task = {"rows": greedy, "of": of,
                **{side: score(answers[side], expected) for side in ("base", "variant",
                                                                     "merged")},
                "samples": [{"expected": expected[i],
                             **{side: answers[side][i] for side in ("base", "variant",
                                                                    "merged")}}
                            for i in range(min(3, greedy))]}
    accepted = survival is not None and survival >= merge.SURVIVAL_THRESHOLD
    return {
        "variant": src.variant, "name": name, "type": type_, "base": src.base_name,
        "adapters": [{"name": a.name, "sha256": a.sha256, "scale": a.scale}
                     for a in src.adapters],
        "file": {k: made[k] for k in ("path", "sha256", "size", "file_type",
                                       "tensor_types", "seconds")},
        "weights": made["weights"],
        "behaviour": {k: check[k] for k in ("kl_variant_base", "kl_variant_merged",
                                            "top1_merged", "top1_base", "positions",
                                            "items", "per_item")},
        "survival": survival, "threshold": merge.SURVIVAL_THRESHOLD, "accepted": accepted,
        "task": task, "eval_set": eval_set.describe(), "merged_at": now_iso(),
        "tool": {"variant-studio": __version__, "llama-cpp-python": _version()},
    }


def _version() -> str:
    try:
        return metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        return "missing"


# ------------------------------------------------------------------------- merging


def merge_variant(catalog: Catalog, variant: str, name: str, type_: str, eval_set: EvalSet,
                  task_rows: int = DEFAULT_TASK_ROWS, allow_erased: bool = False,
                  threads: int | None = None, progress: ProgressFn | None = None,
                  cancelled: CancelCheck | None = None) -> dict[str, Any]:
    """Merge `variant` into a new base model `name` of type `type_` (see the module
    docstring); returns the report with the added `record`. Raises `MergeRefused`
    below the survival threshold unless `allow_erased`; nothing is added then."""
    type_ = merge.check_type(type_)
    src = records.source(catalog, variant)
    catalog.check_store_free(name)
    staging = records.staging_dir()
    try:
        out = staging / f"{name}.gguf"
        with MergeWorker(threads) as worker:
            report = measure(src, out, type_, eval_set, task_rows, worker, name, progress,
                             cancelled)
        erased = not report["accepted"]
        report["erased"] = erased
        if erased and not allow_erased:
            raise MergeRefused(report)
        catalog.check_store_free(name)  # again: the catalog may have changed
        record = records.add_merged(catalog, name, staging, out,
                                    records.merged_from(src, report, erased))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    report["file"]["path"] = record["path"]
    report["record"] = record
    return report
