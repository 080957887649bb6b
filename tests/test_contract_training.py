"""Contract tier: a three-step training on a tiny family model, end to end.

`variant-studio train` starts the real training worker (PyTorch) on the tiny llama model
of tests/families.py (Q8_0, served numerics: the default), three steps of batch 1: the
adapter is written in the family's GGUF naming with finite losses, imported with its
provenance and the served check's verdict (llama.cpp loaded it), and a variant over it
answers through a real engine process with the adapter reported applied and its
log-probabilities apart from the base's. The acceptance matrix
(tests/test_matrix_training.py, slow) trains every family and type.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from engine.catalog import imports, resolve
from engine.catalog.store import Catalog
from engine.runtime import messages
from engine.runtime.client import EngineClient
from engine.training import provenance
from tests import families
from tests.engine_helpers import sampling
from tests.factories import sft_data
from tests.matrix_helpers import run_cli

pytestmark = pytest.mark.contract

BASE = "fixture-llama"
FLAGS = ["--steps", "3", "--batch", "1", "--seq-len", "48", "--rank", "4", "--threads", "1"]
PROMPT = messages.Prompt("The old lighthouse keeper climbed the spiral stairs", chat=False)
TIMEOUT = 120  # a hang bound only


def test_three_steps_train_an_adapter_the_engine_applies(
        studio_home: Path, tmp_path: Path, family_files: dict[str, families.FamilyFiles],
        capsys: pytest.CaptureFixture) -> None:
    files = family_files["llama"]
    catalog = Catalog()
    imports.add_model(catalog, BASE, files.base("Q8_0"))
    code, out, err = run_cli(capsys, "train", "t3", "--base", BASE, "--data",
                             str(sft_data(tmp_path / "data.jsonl")), *FLAGS, "--variant",
                             "v3", "--json")
    assert code == 0, err[-3000:]
    result = json.loads(out)

    record = result["provenance"]
    assert record["format"] == provenance.FORMAT and record["steps"] == 3
    assert record["config"]["numerics"] == "served"
    assert record["config"]["targets"] == ["attn_q", "attn_v"]  # the family's default
    assert math.isfinite(record["loss"]["first"]) and math.isfinite(record["loss"]["last"])
    stored = Catalog().adapter("t3")
    assert stored["base"] == BASE and stored["sha256"] == result["files"]["gguf"]["sha256"]
    assert "error" not in result["checks"]["parity"], result["checks"]
    assert stored["served_check"] == result["served_check"]

    client = EngineClient()
    try:
        answers = {name: client.call(messages.Generate(
            resolve.resolve(Catalog(), name), PROMPT, sampling(max_tokens=4)),
            timeout=TIMEOUT) for name in (BASE, "v3")}
    finally:
        client.close()
    assert answers["v3"]["adapters"] == [{"name": "t3", "sha256": stored["sha256"],
                                          "scale": 1.0}]
    assert answers[BASE]["adapters"] == []
    assert answers["v3"]["logprobs"] != answers[BASE]["logprobs"]
