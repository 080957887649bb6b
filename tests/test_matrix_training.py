"""Acceptance matrix, training: every fixture family × {F16, Q8_0, Q4_K_M} trains a LoRA
adapter a couple of steps, or is refused up front with the table's reason.

The cells come from docs/models.md's table (tests/matrix_helpers.py). Per case:

- "train in served numerics" is `train`'s default (`--numerics served`). Where the table
  refuses it (a weight type whose arithmetic the trainer does not simulate), `variant-
  studio train` must exit 3 with that reason before any process starts, leaving no
  adapter record and no run directory; then, where "train adapters" is ok, the same
  command with `--numerics float` trains. Where "train adapters" is refused, both
  numerics are refused up front.
- A run that trains writes the adapter in the family's GGUF naming (its default targets:
  q and v, Phi-3's fused qkv) with finite losses, imports it into the catalog with its
  provenance and the served check's verdict (llama.cpp loaded the adapter: parity and
  drift measured; in served numerics the check passes), and the adapter serves: a
  variant over it generates through the engine process, its log-probabilities apart
  from the base's.

What runs where, and why: the tiniest runs (2 steps of batch 1, seq-len 32, rank 4, one
thread). A run through the command line and the training worker costs about 11 s of
CPU here, most of it the worker's start (importing PyTorch, 3.3 s) and the served check
(2.8 s), against about 4.5 s for `engine.training.job.execute` (the function the worker
runs) in this process. So three cases, one per type, go through `variant-studio train`
and the worker (`WORKER_CASES`), the others through `job.execute` here; refusals always
go through the command, which refuses before it starts the worker. About 90 s of CPU
for the module. One catalog and one engine process for the module.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from engine.catalog import imports, resolve
from engine.catalog.store import AdapterSpec, Catalog
from engine.formats import capabilities as cap
from engine.formats import lora_io
from engine.runtime import messages
from engine.training.client import TrainingJob
from tests import families
from tests.engine_helpers import sampling
from tests.matrix_helpers import CASES, IDS, assert_refused, expected, name, run_cli
from tests.world import Recipe, World

SETTINGS = {"steps": 2, "batch": 1, "seq_len": 32, "rank": 4, "threads": 1}
FLAGS = ["--steps", "2", "--batch", "1", "--seq-len", "32", "--rank", "4", "--threads", "1"]
# Through the command line and the training worker, one per type (see the docstring).
WORKER_CASES = {("llama", "F16"), ("llama3", "Q8_0"), ("llama-linear", "Q4_K_M")}
PROMPT = messages.Prompt("The old lighthouse keeper climbed the spiral stairs", chat=False)
TIMEOUT = 300  # a hang bound only


def _data(world: World) -> None:
    data = world.out / "sums.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Q: what is {i} plus {i}?\nA:",
                                        "completion": f" {2 * i}"}) + "\n"
                            for i in range(4)))
    world.extra["data"] = data


WORLD = Recipe(demo=True, furnish=_data)


def train_in_process(base: str, adapter: str, data: Path, numerics: str) -> dict[str, Any]:
    """`job.execute`, the training worker's own function, in this process."""
    from engine.training import job

    settings = {**SETTINGS, "numerics": numerics}
    return job.execute(job.TrainRequest(adapter, base, str(data), settings),
                       lambda kind, **fields: None, lambda: False)


def train_command(capsys: pytest.CaptureFixture, base: str, adapter: str, data: Path,
                  numerics: str) -> dict[str, Any]:
    """`variant-studio train ... --json`: the training worker, its JSON result."""
    code, out, err = run_cli(capsys, "train", adapter, "--base", base, "--data", str(data),
                             *FLAGS, "--numerics", numerics, "--json")
    assert code == 0, err[-3000:]
    return json.loads(out)


@pytest.mark.slow
@pytest.mark.parametrize(("variant", "kind"), CASES, ids=IDS)
def test_training_works_or_is_refused_up_front(
        variant: str, kind: str, world: World,
        family_files: dict[str, families.FamilyFiles],
        capsys: pytest.CaptureFixture) -> None:
    files = family_files[variant]
    cells = expected(files, kind)
    catalog: Catalog = world.catalog
    base, adapter = name("b", variant, kind), name("t", variant, kind)
    imports.add_model(catalog, base, files.base(kind))
    data: Path = world.extra["data"]
    train, served = cells[cap.TRAIN], cells[cap.TRAIN_SERVED]
    command = ["train", adapter, "--base", base, "--data", str(data), *FLAGS]

    no_worker = [(TrainingJob, "start")]
    if not train.ok:
        for numerics in ("served", "float"):
            assert_refused(capsys, [*command, "--numerics", numerics], train.reason,
                           forbid=no_worker)
        return
    if not served.ok:
        # The default is served numerics: refused before any process starts (no run
        # directory under <data>/training, no record: the data directory is unchanged).
        assert_refused(capsys, command, served.reason, forbid=no_worker)
    numerics = "served" if served.ok else "float"
    if (variant, kind) in WORKER_CASES:
        result = train_command(capsys, base, adapter, data, numerics)
    else:
        result = train_in_process(base, adapter, data, numerics)

    # ---- what was trained, and written
    record = result["provenance"]
    assert result["adapter"] == adapter and record["config"]["numerics"] == numerics
    targets = ["attn_qkv"] if files.spec.fused else ["attn_q", "attn_v"]
    assert record["config"]["targets"] == targets
    assert record["steps"] == 2 and math.isfinite(record["loss"]["first"]) and math.isfinite(
        record["loss"]["last"])
    run_dir = Path(result["run_dir"])
    weights = lora_io.read_gguf(run_dir / "adapter.gguf")
    assert (weights.architecture, weights.rank) == (files.arch, 4)
    roles = {m.rsplit(".", 1)[1] for m in weights.layers}
    assert roles == ({"qkv_proj"} if files.spec.fused else {"q_proj", "v_proj"}), roles
    assert len(weights.layers) == files.n_layer * len(targets)
    assert (run_dir / "peft" / "adapter_config.json").is_file()

    # ---- imported, and loaded by llama.cpp in the served check
    stored = Catalog().adapter(adapter)
    assert stored["base"] == base and stored["format"] == "gguf"
    assert stored["sha256"] == result["files"]["gguf"]["sha256"]
    checks = result["checks"]
    assert "error" not in checks["parity"] and checks["parity"]["positions"] > 0, checks
    assert "error" not in checks["drift"], checks
    assert checks["drift"]["variant"] != checks["drift"]["base"]  # the adapter applied
    assert stored["served_check"] == result["served_check"]
    if numerics == "served":
        assert stored["served_check"]["passed"], stored["served_check"]

    # ---- it serves, as a variant, through the engine process
    variant_name = name("tv", variant, kind)
    catalog.add_variant(variant_name, base, [AdapterSpec(adapter, 1.0)])
    greedy = sampling(max_tokens=4)
    answers = {n: world.engine.call(messages.Generate(resolve.resolve(catalog, n), PROMPT,
                                                         greedy), timeout=TIMEOUT)
               for n in (base, variant_name)}
    assert answers[variant_name]["token_ids"] and answers[base]["token_ids"]
    assert answers[variant_name]["adapters"][0]["sha256"] == stored["sha256"]
    assert answers[variant_name]["logprobs"] != answers[base]["logprobs"]
