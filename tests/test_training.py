"""Training end to end through the worker process, with small settings: the same inputs
write the same bytes, a cancelled run resumes to the same bytes, records are complete,
DPO starts at log 2 against the frozen base, and an adapter can be continued."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine import cli
from engine.catalog.store import Catalog
from engine.curated.embedded import DEFAULT_MODEL_NAME as BASE
from engine.errors import Cancelled, UsageError
from engine.formats import lora_io
from engine.training.client import TrainingJob
from engine.training.job import TrainRequest
from tests.factories import sft_data

SMALL = {"steps": 3, "batch": 2, "seq_len": 48, "rank": 4, "alpha": 8.0, "lr": 5e-3,
         "train_eot": True}
REQUIRED = ("base_sha256", "data_sha256", "adapter_sha256", "seed", "config", "versions")


def run_job(request: TrainRequest, on_event: Any = None) -> tuple[dict, list[dict]]:
    events: list[dict] = []

    def record(event: dict) -> None:
        events.append(event)
        if on_event:
            on_event(event)

    result = TrainingJob(request, record).start().wait(600)
    return result, events


def run_cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_same_inputs_same_bytes_cancel_resume_and_provenance(
        studio_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
        base_info) -> None:
    data = sft_data(tmp_path / "data.jsonl")
    flags = ["--steps", "3", "--batch", "2", "--seq-len", "48", "--rank", "4", "--alpha",
             "8", "--lr", "5e-3", "--train-eot"]
    code, out, err = run_cli(capsys, "train", "a", "--base", BASE, "--data", str(data),
                             *flags, "--variant", "va", "--json")
    assert code == 0, err
    first = json.loads(out)
    assert "small data: 11 examples" in err  # warned before the first step
    assert first["adapter"] == "a" and first["variant"] == "va"
    again, _ = run_job(TrainRequest("b", BASE, str(data), dict(SMALL)))
    for kind in ("gguf", "peft"):
        assert again["files"][kind]["sha256"] == first["files"][kind]["sha256"], kind

    # A different seed is a different adapter.
    other, _ = run_job(TrainRequest("s", BASE, str(data), {**SMALL, "seed": 1},
                                    register=False))
    assert other["files"]["gguf"]["sha256"] != first["files"]["gguf"]["sha256"]

    # Cancel after the first checkpoint, then resume: the same bytes as uninterrupted.
    job_events: list[dict] = []
    job = TrainingJob(TrainRequest("c", BASE, str(data), {**SMALL, "save_every": 1}),
                      job_events.append)
    cancelled_once = threading.Event()

    def on_event(event: dict) -> None:
        if event.get("event") == "checkpoint" and not cancelled_once.is_set():
            cancelled_once.set()
            job.cancel()

    job.on_event = lambda e: (job_events.append(e), on_event(e))
    job.start()
    with pytest.raises(Cancelled):
        job.wait(600)
    stopped = [e for e in job_events if e["event"] == "stopped"]
    assert len(stopped) == 1 and 1 <= stopped[0]["step"] < 3
    checkpoint = Path(stopped[0]["checkpoint"])
    assert checkpoint.is_file()
    assert job_events[-1]["event"] == "cancelled"
    assert "c" not in Catalog().data()["adapters"]  # nothing imported on cancel
    resumed, events = run_job(TrainRequest("c", BASE, str(data), {**SMALL, "save_every": 1},
                                           resume=str(checkpoint)))
    assert [e for e in events if e["event"] == "resumed"][0]["step"] >= 1
    assert resumed["files"]["gguf"]["sha256"] == first["files"]["gguf"]["sha256"]
    assert resumed["files"]["peft"]["sha256"] == first["files"]["peft"]["sha256"]
    assert resumed["provenance"]["resumed_from"]["step"] >= 1

    # The record: in the run directory, beside the stored adapter, and in `show`.
    run_dir = Path(first["run_dir"])
    record = json.loads((run_dir / "provenance.json").read_text())
    for key in REQUIRED:
        assert key in record, key
    assert record["adapter_sha256"] == first["files"]["gguf"]["sha256"]
    assert record["base_sha256"] == Catalog().model(BASE)["sha256"]
    assert record["config"]["rank"] == 4 and record["config"]["train_eot"] is True
    assert set(record["versions"]) >= {"variant-studio", "torch", "gguf", "llama-cpp-python"}
    assert record["platform"]["cpu"] and record["steps"] == 3
    assert record["loss"]["steps"] == 3 and len(record["loss"]["curve"]) == 3
    assert record["init_adapter"] is None and record["time"]["train_seconds"] > 0
    stored = Path(Catalog().adapter("a")["path"])
    assert json.loads((stored.parent / "provenance.json").read_text()) == record
    code, out, _ = run_cli(capsys, "show", "a", "--json")
    shown = json.loads(out)
    assert code == 0 and shown["provenance"] == record and shown["status"] == "pass"
    code, out, _ = run_cli(capsys, "show", "a")
    assert code == 0 and "provenance:" in out and f"data_sha256: {record['data_sha256']}" in out
    variant = json.loads(run_cli(capsys, "show", "va", "--json")[1])
    assert [a["name"] for a in variant["adapters"]] == ["a"]

    # Both exports hold the same adapter: PEFT is the GGUF with q rows in HF order.
    gguf = lora_io.read_gguf(run_dir / "adapter.gguf")
    peft = lora_io.read_peft(run_dir / "peft")
    expected = lora_io.gguf_to_peft(gguf, base_info.head_count, base_info.head_count_kv)
    assert set(peft.layers) == set(gguf.layers) and len(gguf.layers) == 60
    for module, (a, b) in expected.layers.items():
        assert np.array_equal(peft.layers[module][0], a)
        assert np.array_equal(peft.layers[module][1], b)
    q = "model.layers.0.self_attn.q_proj"
    assert not np.array_equal(peft.layers[q][1], gguf.layers[q][1])  # permuted rows
    assert gguf.base_sha256 == record["base_sha256"] and gguf.alpha == 8.0


@pytest.mark.slow
def test_token_lines_train_exactly_the_ids_given(
        studio_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
        embedded_path: Path, base_info) -> None:
    from engine.training import data as data_mod
    from engine.training.tokenizer import Tokenizer

    pairs = sft_data(tmp_path / "pairs.jsonl")
    with Tokenizer(embedded_path, base_info) as tok:
        tokenized = data_mod.load(pairs, tok, SMALL["seq_len"], True, False, SMALL["steps"],
                                  SMALL["batch"])
    # Each prompt/completion (and the weighted chat) line as its own ids and mask.
    ids = tmp_path / "ids.jsonl"
    ids.write_text("".join(json.dumps({
        "tokens": list(s.tokens), "mask": [int(m) for m in s.targets],
        "weight": e.weight, "source": "rollout"}) + "\n"
        for e in tokenized.examples for s in e.sequences))
    flags = ["--steps", "3", "--batch", "2", "--seq-len", "48", "--rank", "4", "--alpha",
             "8", "--lr", "5e-3", "--train-eot"]
    code, out, err = run_cli(capsys, "train", "ids", "--base", BASE, "--data", str(ids),
                             *flags, "--json")
    assert code == 0, err
    assert "--train-eot does not apply to the 11 token lines" in err
    trained = json.loads(out)
    summary = trained["provenance"]["data"]
    assert summary["kinds"] == ["tokens"] and summary["examples"] == 11
    assert summary["target_tokens"] == tokenized.n_target_tokens
    assert trained["provenance"]["steps"] == 3 and trained["adapter"] == "ids"
    # The same settings on the text lines give the same adapter, byte for byte: the ids
    # were trained as given (no BOS, template or end-of-turn token added to them).
    from_text, _ = run_job(TrainRequest("pairs", BASE, str(pairs), dict(SMALL),
                                        register=False))
    assert from_text["provenance"]["data"]["kinds"] == ["chat", "pair"]
    for kind in ("gguf", "peft"):
        assert from_text["files"][kind]["sha256"] == trained["files"][kind]["sha256"], kind


@pytest.mark.slow
def test_dpo_starts_at_log2_and_continuing_names_the_start(
        studio_home: Path, tmp_path: Path) -> None:
    prefs = tmp_path / "prefs.jsonl"
    prefs.write_text("".join(json.dumps({
        "messages": [{"role": "user", "content": f"Say yes or no ({i})."}],
        "chosen": "Yes.", "rejected": "No."}) + "\n" for i in range(6)))
    result, events = run_job(TrainRequest("pref", BASE, str(prefs),
                                          {**SMALL, "dpo": True, "dpo_beta": 0.5,
                                           "lr": 2e-2, "steps": 4}))
    progress = [e for e in events if e["event"] == "progress"]
    # The adapter starts at zero, so the policy equals the frozen reference.
    assert abs(progress[0]["loss"] - math.log(2)) < 1e-3
    assert progress[-1]["loss"] < progress[0]["loss"] - 0.01
    assert progress[-1]["reward_accuracy"] == 1.0
    assert result["provenance"]["method"] == "dpo"

    data = sft_data(tmp_path / "data.jsonl")
    with pytest.raises(UsageError, match="differs from the starting adapter"):
        run_job(TrainRequest("more", BASE, str(data), {"rank": 8, "steps": 1},
                             init_adapter="pref"))
    more, _ = run_job(TrainRequest("more", BASE, str(data),
                                   {"steps": 1, "batch": 2, "seq_len": 48},
                                   init_adapter="pref"))
    record = more["provenance"]
    pref_sha = Catalog().adapter("pref")["sha256"]
    assert record["init_adapter"] == {"name": "pref", "sha256": pref_sha,
                                      "source": Catalog().adapter("pref")["source"]}
    assert record["config"]["rank"] == 4 and record["config"]["alpha"] == 8.0
    assert more["files"]["gguf"]["sha256"] != pref_sha


def test_cli_refuses_bad_requests_before_starting(
        studio_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    data = sft_data(tmp_path / "data.jsonl")
    cases = [
        (["train", "x", "--base", "nope", "--data", str(data)], 4, "no model, adapter"),
        (["train", "x", "--base", BASE, "--data", str(tmp_path / "missing.jsonl")], 2,
         "does not exist"),
        (["train", BASE, "--base", BASE, "--data", str(data)], 2, "already used"),
        (["train", "x", "--base", BASE, "--data", str(data), "--rank", "0"], 2,
         "rank must be"),
        (["train", "x", "--base", BASE, "--data", str(data), "--targets", "q,zz"], 2,
         "unknown target"),
        (["train", "x", "--base", BASE, "--data", str(data), "--variant", "x"], 2,
         "name of its own"),
        (["train", "x", "--base", BASE, "--data", str(data), "--kl-text", str(data)], 2,
         "a KL text needs a KL weight"),
        (["train", "x", "--base", BASE, "--data", str(data), "--kl", "1", "--kl-text",
          str(tmp_path / "missing.txt")], 2, "KL text"),
        (["train", "x", "--base", BASE, "--data", str(data), "--kl", "1", "--kl-batch",
          "0"], 2, "kl-batch must be"),
    ]
    for argv, code, reason in cases:
        got, _, err = run_cli(capsys, *argv)
        assert got == code and reason in err and len(err.strip().splitlines()) == 1, err
    monkeypatch.setattr("engine.training.torch_available", lambda: False)
    got, _, err = run_cli(capsys, "train", "x", "--base", BASE, "--data", str(data))
    assert got == 3 and "pip install 'variant-studio[train]'" in err
    assert not (studio_home / "training").exists()


def test_malformed_data_fails_with_line_numbers_in_the_worker(
        studio_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"prompt": 1, "completion": "x"}\n')
    code, _, err = run_cli(capsys, "train", "x", "--base", BASE, "--data", str(bad))
    assert code == 3 and "line 2: prompt must be a string" in err
    assert "x" not in Catalog().data()["adapters"]


@pytest.mark.slow
def test_a_failed_checkpoint_write_keeps_the_previous_one(
        tmp_path: Path, embedded_path: Path, base_info, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.errors import RefusedError
    from engine.training import data as data_mod
    from engine.training import trainer as trainer_mod
    from engine.training.config import TrainConfig
    from engine.training.model import DecoderTorch
    from engine.training.tokenizer import Tokenizer

    config = TrainConfig.from_dict({**SMALL, "steps": 3})
    with Tokenizer(embedded_path, base_info) as tok:
        data = data_mod.load(sft_data(tmp_path / "d.jsonl"), tok, config.seq_len,
                             config.train_eot, False, config.steps, config.batch)
    model = DecoderTorch(embedded_path)
    trainer = trainer_mod.Trainer(model, config, data, "base-sha")
    trainer.train_step()
    path = tmp_path / "run" / "checkpoint.safetensors"
    trainer.save_checkpoint(path)
    before = path.read_bytes()
    trainer.train_step()

    def fail(*_args: object) -> None:
        raise OSError("disk full")

    with monkeypatch.context() as patch:
        patch.setattr(trainer_mod.os, "replace", fail)
        with pytest.raises(OSError, match="disk full"):
            trainer.save_checkpoint(path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["checkpoint.safetensors"]

    # The kept checkpoint resumes at step 1 with its loss history and parameters.
    resumed = trainer_mod.Trainer(model, config, data, "base-sha")
    resumed.load_checkpoint(path)
    assert resumed.step == 1 and resumed.losses == trainer.losses[:1]
    # ...and is refused for other settings, another base or other data.
    for other, reason in ((trainer_mod.Trainer(model, TrainConfig.from_dict(
            {**SMALL, "steps": 3, "lr": 1e-3}), data, "base-sha"), "different settings"),
                          (trainer_mod.Trainer(model, config, data, "other"), "base model")):
        with pytest.raises(RefusedError, match=reason):
            other.load_checkpoint(path)
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(before[: len(before) // 2])
    with pytest.raises(RefusedError):
        resumed.load_checkpoint(broken)


@pytest.mark.slow
def test_training_attaches_the_openvino_file_when_the_base_has_a_counterpart(
        studio_home: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    from engine.catalog.resolve import resolve
    from engine.curated import openvino_default
    from tests.openvino_helpers import register_default

    register_default(Catalog(), tmp_path_factory)
    result, _ = run_job(TrainRequest("ov", BASE, str(sft_data(tmp_path / "d.jsonl")),
                                     {**SMALL, "steps": 1}, variant="ov-v"))
    attached = result["openvino"]
    assert attached["attached"] and attached["base"] == openvino_default.NAME
    assert attached["same_tensors_as_export"] is True
    peft_sha = result["files"]["peft"]["sha256"]
    assert Catalog().adapter_file("ov", "openvino")["sha256"] == peft_sha
    spec = resolve(Catalog(), "ov-v", backend="openvino")
    assert spec.backend == "openvino" and spec.adapters[0].sha256 == peft_sha


@pytest.mark.slow
def test_every_run_is_checked_as_served(studio_home: Path, tmp_path: Path) -> None:
    """After the adapter is written the worker measures it through llama.cpp: parity with
    the trainer (the adapter on both) and drift on unrelated prose; the figures arrive as
    a `checks` event before the run ends and are in the result and the record."""
    from engine.training import served_check

    result, events = run_job(TrainRequest("chk", BASE, str(sft_data(tmp_path / "d.jsonl")),
                                          {**SMALL, "steps": 2, "lr": 3e-2}))
    kinds = [e["event"] for e in events]
    assert kinds.index("checks") > max(i for i, k in enumerate(kinds) if k == "progress")
    assert kinds.index("checks") < kinds.index("finished")
    checks = result["checks"]
    event = events[kinds.index("checks")]
    assert {k: event[k] for k in ("parity", "drift")} == checks
    assert result["provenance"]["served_checks"] == checks
    parity = checks["parity"]
    assert parity["adapter"] == "adapter.gguf" and parity["positions"] > 150
    assert parity["top1_agreement"] >= served_check.TOP1_LIMIT
    assert parity["mean_abs_logprob_diff"] < 0.1
    drift = checks["drift"]
    # The base's NLL on these six paragraphs is the figure docs/training.md gives.
    assert drift["texts"] == 6 and abs(drift["base"] - 3.31) < 0.01
    assert drift["variant"] != drift["base"]  # the adapter is applied when it is scored
    # The catalog's adapter record carries the verdict (docs/training.md).
    assert Catalog().adapter("chk")["served_check"] == served_check.verdict(checks) \
        == result["served_check"]


def test_served_check_lines_flag_what_is_past_the_limits() -> None:
    from engine.training.served_check import summary_lines

    good = {"parity": {"top1_agreement": 0.975, "mean_abs_logprob_diff": 0.051},
            "drift": {"base": 3.306, "variant": 3.33, "delta": 0.024}}
    lines = summary_lines(good)
    assert lines == ["parity with llama.cpp: the next token agrees 97.5%, mean |Δ log p| "
                     "0.051 nats",
                     "drift on unrelated text: 3.306 → 3.330 nats/token (+0.024)"]
    bad = {"parity": {"top1_agreement": 0.9, "mean_abs_logprob_diff": 0.2},
           "drift": {"base": 3.306, "variant": 3.504, "delta": 0.198}}
    assert [line.endswith("]") for line in summary_lines(bad)] == [True, True]
    assert "over +0.05" in summary_lines(bad)[1]
    missing = summary_lines({"drift": {"error": "llama.cpp could not load the adapter"}})
    assert missing == ["parity with llama.cpp: not measured",
                       "drift on unrelated text: not measured (llama.cpp could not load "
                       "the adapter)"]


@pytest.mark.slow
def test_the_kl_penalty_starts_at_zero_and_keeps_the_prompts_text_near_the_base(
        tmp_path: Path, embedded_path: Path, base_info) -> None:
    """`kl` adds KL(base || adapted) at the prompt's positions, the base scored in the
    same batch: zero before the first update, and a run with it leaves the prompts'
    next-token distributions closer to the base than the same run without it."""
    from engine.training import data as data_mod
    from engine.training import trainer as trainer_mod
    from engine.training.config import TrainConfig
    from engine.training.model import DecoderTorch
    from engine.training.tokenizer import Tokenizer

    # lr 1e-2: at 3e-2 the penalised run diverged on an AVX-512 machine (loss 68 at step
    # 3, prompt KL 3.4 against 4.5 without), though it held on an AVX2 one; at 1e-2 it
    # measured 0.029 against 0.95.
    settings = {**SMALL, "steps": 4, "lr": 1e-2}
    with Tokenizer(embedded_path, base_info) as tok:
        data = data_mod.load(sft_data(tmp_path / "d.jsonl"), tok, SMALL["seq_len"], True,
                             False, 4, SMALL["batch"])
    sequences = [e.sequences[0] for e in data.examples]
    model = DecoderTorch(embedded_path)

    def prompt_kl(trainer: trainer_mod.Trainer) -> float:
        with trainer.scoring():
            reference = trainer._forward(sequences, anchors=True)[1]
        with trainer.scoring(adapter=True):
            adapted = trainer._forward(sequences, anchors=True)[1]
        assert reference is not None and adapted is not None
        return float((reference.exp() * (reference - adapted)).sum(-1).mean())

    penalised = trainer_mod.Trainer(model, TrainConfig.from_dict({**settings, "kl": 20.0}),
                                    data, "base-sha")
    steps = [penalised.train_step() for _ in range(4)]
    assert steps[0]["kl"] == 0.0 and steps[0]["kl_positions"] > 10
    assert steps[-1]["kl"] > 0.0
    with_penalty = prompt_kl(penalised)
    free = trainer_mod.Trainer(model, TrainConfig.from_dict(settings), data, "base-sha")
    free_steps = [free.train_step() for _ in range(4)]
    assert "kl" not in free_steps[0]
    without = prompt_kl(free)
    assert with_penalty < 0.5 * without, (with_penalty, without)


@pytest.mark.slow
def test_a_kl_text_moves_the_penalty_onto_its_passages(
        tmp_path: Path, embedded_path: Path, base_info) -> None:
    """With a KL text the penalty is measured on `kl_batch` of its passages per step
    (every position of each), not on the prompts: zero before the first update, and the
    run leaves the passages closer to the base than the same run without it, while the
    examples' batches stay as they were; its checkpoint resumes only with that text."""
    from engine.training import data as data_mod
    from engine.training import trainer as trainer_mod
    from engine.training.config import TrainConfig
    from engine.training.model import DecoderTorch
    from engine.training.tokenizer import Tokenizer

    settings = {**SMALL, "steps": 4, "lr": 3e-2}
    text = tmp_path / "unrelated.txt"
    text.write_text("The river rose slowly through the night.\n\n"
                    "Bread is one of the oldest prepared foods.\n"
                    "A comet is a small icy body that warms near the Sun.\n")
    with Tokenizer(embedded_path, base_info) as tok:
        data = data_mod.load(sft_data(tmp_path / "d.jsonl"), tok, SMALL["seq_len"], True,
                             False, 4, SMALL["batch"])
        kl_text = data_mod.load_kl_text(text, tok, SMALL["seq_len"])
    assert len(kl_text.passages) == 3 and kl_text.truncated == 0
    model = DecoderTorch(embedded_path)

    def text_kl(trainer: trainer_mod.Trainer) -> float:
        passages = list(kl_text.passages)
        with trainer.scoring():
            reference = trainer._distributions(passages)
        with trainer.scoring(adapter=True):
            adapted = trainer._distributions(passages)
        return float((reference.exp() * (reference - adapted)).sum(-1).mean())

    config = TrainConfig.from_dict({**settings, "kl": 20.0, "kl_batch": 2})
    penalised = trainer_mod.Trainer(model, config, data, "base-sha", kl_text=kl_text)
    drawn = penalised.kl_passages(0)
    steps = [penalised.train_step() for _ in range(4)]
    checkpoint = tmp_path / "checkpoint.safetensors"
    penalised.save_checkpoint(checkpoint)
    assert steps[0]["kl"] == 0.0
    assert steps[0]["kl_positions"] == sum(len(p) - 1 for p in drawn)
    with_penalty = text_kl(penalised)
    free = trainer_mod.Trainer(model, TrainConfig.from_dict(settings), data, "base-sha")
    assert [free.batch_indices(s) for s in range(4)] == \
        [penalised.batch_indices(s) for s in range(4)]
    for _ in range(4):
        free.train_step()
    without = text_kl(free)
    assert with_penalty < 0.5 * without, (with_penalty, without)
    # A checkpoint resumes only with the KL text it was trained with.
    from dataclasses import replace

    from engine.errors import RefusedError

    other = replace(kl_text, sha256="0" * 64)
    with pytest.raises(RefusedError, match="different KL text"):
        trainer_mod.Trainer(model, config, data, "base-sha", kl_text=other
                            ).load_checkpoint(checkpoint)
    resumed = trainer_mod.Trainer(model, config, data, "base-sha", kl_text=kl_text)
    resumed.load_checkpoint(checkpoint)
    assert resumed.step == 4
