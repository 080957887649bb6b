"""The shipped demo: its data regenerate byte for byte, its record is complete, a fresh
catalog offers it as a curated variant, retraining it from its recorded configuration
writes its recorded sha256 (the slowest test in the suite), and served through
llama.cpp the variant beats the base on held-out requests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine import cli
from engine.catalog import digest
from engine.catalog.store import Catalog
from engine.curated import demo as shipped
from engine.curated import setup
from engine.curated.embedded import DEFAULT_MODEL_NAME as BASE
from engine.formats import lora_io
from engine.training import demo
from engine.training.client import TrainingJob
from engine.training.config import record_settings
from engine.training.job import TrainRequest

FOLDER = shipped.resources_dir()
RECORD = json.loads((FOLDER / shipped.SHIPPED_PROVENANCE).read_text())


def test_demo_data_regenerate_byte_for_byte() -> None:
    train = demo.jsonl_bytes(demo.make_split("train", demo.TRAIN_SIZE))
    held = demo.jsonl_bytes(demo.make_split("heldout", demo.HELDOUT_SIZE))
    assert (FOLDER / "train.jsonl").read_bytes() == train
    assert (FOLDER / "heldout.jsonl").read_bytes() == held
    assert digest.hash_uncached(FOLDER / "train.jsonl")[0] == RECORD["data_sha256"]
    kl_text = FOLDER / shipped.DEMO_KL_TEXT
    assert digest.hash_uncached(kl_text)[0] == RECORD["kl_text"]["sha256"]
    # The KL text is not the drift check's prose, or the check would measure its training.
    from engine.training.served_check import UNRELATED_TEXTS

    prose = kl_text.read_text(encoding="utf-8").splitlines()
    assert len(prose) == RECORD["kl_text"]["passages"] == 20
    assert not set(prose) & set(UNRELATED_TEXTS)
    # Held-out entities never appear in training.
    train_text = train.decode()
    held_out = {"get_weather": "city", "send_email": "to", "play_music": "artist"}
    checked = 0
    for row in demo.make_split("heldout", demo.HELDOUT_SIZE):
        call = demo.expected_call(row)
        if call["tool"] in held_out:
            value = call["args"][held_out[call["tool"]]]
            assert f'"{value}"' not in train_text and value not in train_text, value
            checked += 1
    assert checked == 36


def test_shipped_adapter_matches_its_record(base_info) -> None:
    for key in ("base_sha256", "data_sha256", "adapter_sha256", "seed", "config",
                "versions", "platform", "steps", "time", "loss"):
        assert key in RECORD, key
    gguf = FOLDER / shipped.SHIPPED_ADAPTER
    assert digest.hash_uncached(gguf)[0] == RECORD["adapter_sha256"]
    peft = FOLDER / shipped.SHIPPED_PEFT / "adapter_model.safetensors"
    assert digest.hash_uncached(peft)[0] == RECORD["adapter_files"]["peft"]["sha256"]
    recorded = record_settings(RECORD["config"])
    assert recorded == {**recorded, **demo.DEMO_SETTINGS}
    assert RECORD["loss"]["last"] < RECORD["loss"]["first"] / 10
    weights = lora_io.read_gguf(gguf)
    assert weights.base_sha256 == RECORD["base_sha256"]
    expected = lora_io.gguf_to_peft(weights, base_info.head_count, base_info.head_count_kv)
    exported = lora_io.read_peft(FOLDER / shipped.SHIPPED_PEFT)
    for module, (a, b) in expected.layers.items():
        assert np.array_equal(exported.layers[module][0], a)
        assert np.array_equal(exported.layers[module][1], b)


def test_fresh_catalog_offers_the_curated_demo(studio_home: Path,
                                               capsys: pytest.CaptureFixture) -> None:
    # The first command that writes sets the catalog up (read-only `list` writes nothing).
    setup.first_run(Catalog(), with_demo=True)
    assert cli.main(["list", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    variants = {v["name"]: v for v in listing["variants"]}
    assert variants[demo.VARIANT_NAME]["curated"] is True
    assert [a["name"] for a in variants[demo.VARIANT_NAME]["adapters"]] == [demo.ADAPTER_NAME]
    assert cli.main(["show", demo.ADAPTER_NAME, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["curated"] is True and shown["verified"] is True
    assert shown["status"] == "pass" and shown["sha256"] == RECORD["adapter_sha256"]
    assert shown["provenance"] == RECORD
    profile = Catalog().variant(demo.VARIANT_NAME)["profile"]
    assert profile["system_prompt"] == demo.SYSTEM_PROMPT and profile["temperature"] == 0.0
    # Stored beside the copy, outside the user-adapter store; removable like any entry.
    stored = Path(shown["path"])
    assert stored.parent == studio_home / "shipped" / demo.ADAPTER_NAME
    assert json.loads((stored.parent / "provenance.json").read_text()) == RECORD
    assert not (studio_home / "adapters" / demo.ADAPTER_NAME).exists()
    assert cli.main(["remove", demo.VARIANT_NAME]) == 0
    assert cli.main(["remove", demo.ADAPTER_NAME]) == 0
    assert not stored.parent.exists()


def test_a_bare_library_catalog_has_no_demo(studio_home: Path) -> None:
    catalog = Catalog()
    setup.first_run(catalog)  # library use (tests, tools): only the embedded base
    data = catalog.data()
    assert list(data["models"]) == [BASE] and not data["adapters"] and not data["variants"]


@pytest.mark.slow
@pytest.mark.release
def test_retraining_the_demo_reproduces_its_sha256(studio_home: Path) -> None:
    request = TrainRequest("retrained", BASE, str(FOLDER / "train.jsonl"),
                           record_settings(RECORD["config"]), register=False,
                           kl_text=str(FOLDER / shipped.DEMO_KL_TEXT))
    result = TrainingJob(request).start().wait(3000)
    assert result["files"]["gguf"]["sha256"] == RECORD["adapter_sha256"]
    assert result["files"]["peft"]["sha256"] == RECORD["adapter_files"]["peft"]["sha256"]
    assert result["provenance"]["loss"]["curve"] == RECORD["loss"]["curve"]


@pytest.mark.slow  # 66 s measured: the embedded model scores the prose four times, two ways
def test_the_scoring_tool_and_the_served_check_measure_the_same_drift(
        studio_home: Path, capsys: pytest.CaptureFixture) -> None:
    """Drift on unrelated prose, by the scoring tool on the shipped text file and by the
    served check every training run makes (the same six paragraphs): the same figure."""
    from engine.training import served_check

    text = FOLDER / "unrelated.txt"
    assert tuple(text.read_text(encoding="utf-8").splitlines()) == \
        served_check.UNRELATED_TEXTS
    catalog = Catalog()
    setup.first_run(catalog, with_demo=True)
    assert cli.main(["score", BASE, demo.VARIANT_NAME, "--data", str(text), "--json"]) == 0
    base, variant = json.loads(capsys.readouterr().out)["results"]
    checked = served_check.drift(Path(catalog.model(BASE)["path"]),
                                 Path(catalog.adapter(demo.ADAPTER_NAME)["path"]))
    assert base["tokens"] == variant["tokens"] == checked["tokens"] == 261
    assert base["mean_nll"] == pytest.approx(checked["base"], abs=0.005)
    assert variant["mean_nll"] - base["mean_nll"] == pytest.approx(checked["delta"], abs=0.005)
    # The shipped demo, trained with the KL penalty on other prose, leaves this prose
    # alone (without the penalty it moved it by +0.20 nats per token).
    assert abs(checked["delta"]) <= served_check.DRIFT_LIMIT


@pytest.mark.slow
def test_the_variant_beats_the_base_on_held_out_requests(studio_home: Path) -> None:
    from engine.training import demo_eval

    catalog = Catalog()
    setup.first_run(catalog, with_demo=True)
    rows = [json.loads(line) for line in (FOLDER / "heldout.jsonl").read_text().splitlines()]
    result = demo_eval.evaluate(catalog, demo.VARIANT_NAME, rows[::6])  # 10, all tools
    assert result["variant"]["lenient"] >= 0.8, result
    assert result["base"]["lenient"] <= 0.1, result
    assert result["variant"]["strict"] >= 0.8, result
