"""Acceptance matrix, merge: a variant of every fixture family merged into a standalone
GGUF that serves, or refused up front with the table's reason; one type per family,
rotating through F16, Q8_0 and Q4_K_M (every type on every third family), every type with
VARIANT_STUDIO_FULL_MATRIX=1.

The cells come from docs/models.md's table (tests/matrix_helpers.py). Per case, the
variant (the base and its fixture GGUF LoRA at scale 1) goes through `variant-studio
merge VARIANT --out NAME --type q8_0` (the merge worker, llama.cpp's quantizer in its
child, survival measured on one probe prompt, no task rows: the cheapest merge the
command runs). Where "merge adapters" is ok, the merge is accepted and added as a base
model recording what it was merged from, and it serves through the engine process: its
per-token log-probabilities of a text are much closer to the variant's than the base's
are (the adapter survived the fold). Where it is refused, the command exits 3 with the
reason and adds nothing, leaving no file in the model store.

Why one type per family: a merge costs about 6 s of CPU (about 15 s of wall time on this
shared 2-core machine), 2.6 s of it the gguf package's reader parsing the fixtures'
49k-token vocabulary (`formats.merge.write_merged`, the same for every type), the rest
the worker, llama.cpp's quantizer and the survival check: all 24 cases would add about
100 s of CPU to every CI run for what depends on the type alone (reading and
dequantizing the base's blocks), which runs here on each type on 2-3 families. One
catalog and one engine process for the module.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine.catalog import resolve
from engine.catalog.store import Catalog
from engine.formats import capabilities as cap
from engine.formats import gguf_file
from engine.runtime import messages
from engine.runtime.merge.work import MergeWorker
from engine.state import paths
from tests import families
from tests.matrix_helpers import (
    add_gguf_variant,
    assert_refused,
    expected,
    ids,
    name,
    rotation,
    run_cli,
)
from tests.world import Recipe, World

MERGE_TYPE = "q8_0"
FLAGS = ["--type", MERGE_TYPE, "--eval-rows", "1", "--task-rows", "0", "--json"]
TIMEOUT = 300  # a hang bound only


WORLD = Recipe(demo=True)


def logprobs(world: World, model: str) -> np.ndarray:
    """The per-token log-probabilities of the fixture text under `model` (teacher-forced)."""
    item = (messages.ScoreItem("text", families.PROMPT, line=1),)
    score = world.engine.call(messages.Score(resolve.resolve(world.catalog, model), item),
                                 timeout=TIMEOUT)
    return np.asarray(score["rows"][0]["logprobs"])


@pytest.mark.slow
@pytest.mark.parametrize(("variant", "kind"), rotation(), ids=ids(rotation()))
def test_a_merge_serves_or_is_refused_up_front(
        variant: str, kind: str, world: World,
        family_files: dict[str, families.FamilyFiles],
        capsys: pytest.CaptureFixture) -> None:
    files = family_files[variant]
    cells = expected(files, kind)
    catalog: Catalog = world.catalog
    base, adapter, var = add_gguf_variant(catalog, files, kind)
    merged = name("m", variant, kind)
    command = ["merge", var, "--out", merged, *FLAGS]
    store = paths.model_store(merged)

    if not cells[cap.MERGE].ok:
        assert_refused(capsys, command, cells[cap.MERGE].reason, [store],
                       forbid=[(MergeWorker, "__init__")])
        return
    code, out, err = run_cli(capsys, *command)
    assert code == 0, err[-3000:]
    report = json.loads(out)
    assert report["accepted"] and not report["erased"] and not report["refused"]
    assert report["survival"] >= report["threshold"]
    record = Catalog().model(merged)
    assert record["backend"] == "llama" and record["merged_from"]["variant"] == var
    assert [a["name"] for a in record["merged_from"]["adapters"]] == [adapter]
    path = Path(record["path"])
    assert path.is_file() and path.parent == store
    header = gguf_file.read_header(path)
    assert header.get("general.architecture") == files.arch
    assert "Q8_0" in {t.type_name for t in header.tensors.values()}

    # It serves, as the variant does: teacher-forced on the same text, the merged model's
    # log-probabilities are far closer to the variant's than the base's are.
    got = {n: logprobs(world, n) for n in (base, var, merged)}
    assert len({v.shape for v in got.values()}) == 1 and got[merged].size > 20
    apart = float(np.abs(got[base] - got[var]).mean())
    kept = float(np.abs(got[merged] - got[var]).mean())
    assert apart > 0.05 and kept < apart / 4, (apart, kept)
