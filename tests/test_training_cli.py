"""`variant-studio train` driven through the real command line (a subprocess with its
own data directory): every flag reaches the run, its files and its record; the seed
decides the bytes; a checkpoint resumes to the uninterrupted bytes; an adapter is
continued and named; DPO records its method and beta; and a negative per-example
weight really pushes that example's likelihood down, measured through llama.cpp.

Real runs are few and tiny (a couple of steps of two 48-token sequences); the first
one is shared by several tests.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine import cli
from engine.catalog import imports
from engine.catalog.store import Catalog
from engine.curated import setup
from engine.curated.embedded import DEFAULT_MODEL_NAME as BASE
from engine.errors import UsageError
from engine.formats import lora_io
from engine.training.job import TrainRequest, prepare
from tests.factories import sft_data

ROOT = Path(__file__).resolve().parents[1]
# The flags of the shared first run, all explicit (none of them the default).
FLAGS = ["--steps", "2", "--batch", "2", "--seq-len", "48", "--lr", "5e-3",
         "--targets", "q,k", "--rank", "4", "--alpha", "8", "--seed", "3"]


def run_cli(home: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """`python -m engine.cli ARGV` with its own data directory."""
    env = {**os.environ, "VARIANT_STUDIO_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "engine.cli", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600, check=False)


def train(home: Path, name: str, *argv: str) -> tuple[dict[str, Any], str]:
    """A `train ... --json` run that must succeed: its JSON result and its stderr."""
    done = run_cli(home, "train", name, "--base", BASE, *argv, "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout), done.stderr


def show(home: Path, name: str) -> dict[str, Any]:
    done = run_cli(home, "show", name, "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def with_flag(flags: list[str], flag: str, value: str) -> list[str]:
    out = list(flags)
    out[out.index(flag) + 1] = value
    return out


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("studio-home")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sft_data(tmp_path_factory.mktemp("data") / "data.jsonl")


@pytest.fixture(scope="module")
def first(home: Path, data: Path) -> dict[str, Any]:
    """One run with every SFT flag set, a checkpoint every step and a variant."""
    result, err = train(home, "t1", "--data", str(data), *FLAGS, "--save-every", "1",
                        "--variant", "v1")
    return {"result": result, "stderr": err, "sha256": result["files"]["gguf"]["sha256"],
            "run_dir": Path(result["run_dir"])}


@pytest.mark.slow
def test_cli_flags_reach_the_record_the_files_a_checkpoint_and_the_variant(
        home: Path, first: dict[str, Any]) -> None:
    result, run_dir = first["result"], first["run_dir"]
    assert result["adapter"] == "t1" and result["variant"] == "v1"
    assert "step 1/2" not in first["stderr"]  # --json: no progress lines, one JSON result
    record = show(home, "t1")["provenance"]
    assert record == result["provenance"]
    config = record["config"]
    assert config["targets"] == ["attn_q", "attn_k"]
    assert (config["rank"], config["alpha"], config["seed"], record["seed"]) == (4, 8.0, 3, 3)
    assert (config["steps"], config["batch"], config["seq_len"], config["lr"]) == (
        2, 2, 48, 5e-3)
    assert config["save_every"] == 1 and config["dpo"] is False
    assert record["method"] == "sft" and record["steps"] == 2

    # The adapter really has those targets, rank and alpha.
    weights = lora_io.read_gguf(run_dir / "adapter.gguf")
    assert (weights.rank, weights.alpha) == (4, 8.0)
    assert {m.rsplit(".", 1)[1] for m in weights.layers} == {"q_proj", "k_proj"}
    assert len(weights.layers) == 60  # 30 layers x 2 targets
    assert all(a.shape[0] == 4 and b.shape[1] == 4 for a, b in weights.layers.values())

    # --save-every 1 over 2 steps: the checkpoint of step 1 (the last step is the
    # adapter itself), written atomically (no temporary file left behind).
    from safetensors import safe_open

    checkpoint = run_dir / "checkpoint.safetensors"
    with safe_open(str(checkpoint), framework="numpy") as handle:
        meta = handle.metadata()
    assert meta["step"] == "1" and len(json.loads(meta["losses"])) == 1
    assert json.loads(meta["config"])["targets"] == ["attn_q", "attn_k"]
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "adapter.gguf", "checkpoint.safetensors", "peft", "provenance.json"]

    # --variant: the base plus the new adapter at scale 1.
    variant = show(home, "v1")
    assert variant["base"] == BASE
    assert [(a["name"], a["scale"]) for a in variant["adapters"]] == [("t1", 1.0)]


@pytest.mark.slow
def test_cli_the_seed_decides_the_bytes(home: Path, data: Path,
                                        first: dict[str, Any]) -> None:
    # Same flags and seed (no --save-every, which must not change the bytes), the
    # human-readable output this time: the same sha256.
    done = run_cli(home, "train", "t2", "--base", BASE, "--data", str(data), *FLAGS)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"GGUF (llama.cpp): sha256 {first['sha256']}" in done.stdout
    peft = first["result"]["files"]["peft"]["sha256"]
    assert f"PEFT (OpenVINO):  sha256 {peft}" in done.stdout
    assert "step 2/2 loss" in done.stderr
    # Another seed: another adapter.
    other, _ = train(home, "t3", "--data", str(data), *with_flag(FLAGS, "--seed", "4"))
    assert other["provenance"]["seed"] == 4
    assert other["files"]["gguf"]["sha256"] != first["sha256"]
    assert other["files"]["peft"]["sha256"] != peft


@pytest.mark.slow
def test_cli_resume_ends_with_the_uninterrupted_bytes(
        home: Path, data: Path, first: dict[str, Any], tmp_path: Path) -> None:
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    checkpoint = stopped / "checkpoint.safetensors"
    shutil.copyfile(first["run_dir"] / "checkpoint.safetensors", checkpoint)
    result, _ = train(home, "t5", "--data", str(data), *FLAGS, "--save-every", "1",
                      "--resume", str(checkpoint))
    assert result["files"]["gguf"]["sha256"] == first["sha256"]
    assert Path(result["run_dir"]) == stopped  # the run continues in its directory
    record = result["provenance"]
    assert record["resumed_from"] == {"checkpoint": "checkpoint.safetensors", "step": 1}
    # The loss history came from the checkpoint: step 1 is the first run's step 1.
    assert record["loss"]["curve"][0] == first["result"]["provenance"]["loss"]["curve"][0]


@pytest.mark.slow
def test_cli_init_adapter_continues_the_adapter_and_names_it(
        home: Path, data: Path, first: dict[str, Any]) -> None:
    refused = run_cli(home, "train", "t6", "--base", BASE, "--data", str(data),
                      "--init-adapter", "t1", "--rank", "8")
    assert refused.returncode == 2 and "differs from the starting adapter" in refused.stderr
    result, _ = train(home, "t4", "--data", str(data), "--init-adapter", "t1",
                      "--steps", "1", "--batch", "2", "--seq-len", "48", "--lr", "1e-3")
    record = result["provenance"]
    start = show(home, "t1")
    assert record["init_adapter"] == {"name": "t1", "sha256": first["sha256"],
                                      "source": start["source"]}
    config = record["config"]
    assert (config["targets"], config["rank"], config["alpha"]) == (
        ["attn_q", "attn_k"], 4, 8.0)  # inherited from t1
    assert result["files"]["gguf"]["sha256"] != first["sha256"]
    # It started from t1's weights: one Adam step moves each element by at most lr,
    # while a fresh initialisation would differ from t1 everywhere by far more.
    before = lora_io.read_gguf(first["run_dir"] / "adapter.gguf").layers
    after = lora_io.read_gguf(Path(result["run_dir"]) / "adapter.gguf").layers
    assert set(after) == set(before)
    moved = max(float(np.abs(after[m][i] - before[m][i]).max())
                for m in before for i in (0, 1))
    assert 0 < moved <= 1e-3 * 1.001


@pytest.mark.slow
def test_cli_dpo_records_the_method_and_beta(home: Path, tmp_path: Path) -> None:
    prefs = tmp_path / "prefs.jsonl"
    prefs.write_text("".join(json.dumps({
        "messages": [{"role": "user", "content": f"Say yes or no ({i})."}],
        "chosen": "Yes.", "rejected": "No."}) + "\n" for i in range(4)))
    refused = run_cli(home, "train", "p0", "--base", BASE, "--data", str(prefs),
                      "--dpo-beta", "0.2")
    assert refused.returncode == 2 and "add --dpo" in refused.stderr
    result, _ = train(home, "pref", "--data", str(prefs), "--dpo", "--dpo-beta", "0.2",
                      "--steps", "1", "--batch", "2", "--seq-len", "48")
    record = show(home, "pref")["provenance"]
    assert record == result["provenance"]
    assert record["method"] == "dpo"
    assert record["config"]["dpo"] is True and record["config"]["dpo_beta"] == 0.2
    # The adapter starts at zero, so the policy equals the reference: loss log 2.
    assert abs(record["loss"]["first"] - math.log(2)) < 1e-3


@pytest.mark.slow
def test_a_negative_weight_lowers_its_example_likelihood_and_a_positive_raises_it(
        home: Path, tmp_path: Path, embedded_path: Path, base_info) -> None:
    from engine.training import data as data_mod
    from engine.training import parity
    from engine.training.tokenizer import Tokenizer

    path = tmp_path / "signed.jsonl"
    rows = [{"prompt": "The capital of France is", "completion": " Paris, on the Seine.",
             "weight": -1},
            {"prompt": "My favourite colour is", "completion": " green, like moss.",
             "weight": 1}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result, err = train(home, "signed", "--data", str(path), "--steps", "2", "--batch", "2",
                        "--seq-len", "48", "--lr", "1e-2")
    assert "1 example has a negative weight: its likelihood is pushed down" in err

    # Teacher-forced log-probability of each completion, through llama.cpp, without
    # and with the trained adapter (the same tokens the trainer trained on).
    with Tokenizer(embedded_path, base_info) as tok:
        examples = data_mod.load(path, tok, 48, False, False, 2, 2).examples
    sequences = [e.sequences[0] for e in examples]

    def completion_logp(adapter: Path | None) -> list[float]:
        rows_per_seq = parity.llama_logprobs(embedded_path, [list(s.tokens) for s in sequences],
                                             adapter, threads=1)
        return [float(sum(rows[t - 1, s.tokens[t]] for t in range(1, len(s.tokens))
                          if s.targets[t]))
                for s, rows in zip(sequences, rows_per_seq, strict=True)]

    before = completion_logp(None)
    after = completion_logp(Path(result["run_dir"]) / "adapter.gguf")
    (neg_before, pos_before), (neg_after, pos_after) = before, after
    assert [e.weight for e in examples] == [-1.0, 1.0]
    assert neg_after < neg_before - 1.0, (before, after)  # weight -1: pushed down
    assert pos_after > pos_before + 1.0, (before, after)  # weight +1: pulled up


# ------------------------------------------------------------ no training process


def _no_alpha_adapter(path: Path, n_layer: int, n_embd: int, rank: int) -> Path:
    """A GGUF LoRA on q without adapter.lora.alpha (llama.cpp then applies it at scale 1)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    rng = np.random.default_rng(0)
    for i in range(n_layer):
        writer.add_tensor(f"blk.{i}.attn_q.weight.lora_a",
                          rng.standard_normal((rank, n_embd)).astype(np.float32) * 0.01)
        writer.add_tensor(f"blk.{i}.attn_q.weight.lora_b",
                          np.zeros((n_embd, rank), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_continuing_an_adapter_without_alpha_keeps_its_scale(
        studio_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
        base_info) -> None:
    catalog = Catalog()
    setup.first_run(catalog)
    file = _no_alpha_adapter(tmp_path / "noalpha.gguf", base_info.block_count,
                             base_info.embedding_length, 4)
    imports.add_adapter(catalog, "noalpha", BASE, file)
    assert catalog.adapter("noalpha")["metadata"]["alpha"] is None
    data = sft_data(tmp_path / "data.jsonl")
    prepared = prepare(catalog, TrainRequest("more", BASE, str(data), {"steps": 1},
                                             init_adapter="noalpha"))
    # alpha = rank: the trainer applies it at alpha / rank = 1, as llama.cpp did.
    assert (prepared.config.rank, prepared.config.alpha, prepared.config.scale) == (
        4, 4.0, 1.0)
    assert prepared.config.targets == ("attn_q",)
    assert prepare(catalog, TrainRequest("more", BASE, str(data), {"alpha": 4.0},
                                         init_adapter="noalpha")).config.alpha == 4.0
    with pytest.raises(UsageError, match="differs from the starting adapter"):
        prepare(catalog, TrainRequest("more", BASE, str(data), {"alpha": 8.0},
                                      init_adapter="noalpha"))
    code = cli.main(["train", "more", "--base", BASE, "--data", str(data),
                     "--init-adapter", "noalpha", "--alpha", "16"])
    err = capsys.readouterr().err
    assert code == 2 and "differs from the starting adapter's 4.0" in err, err


def test_ctrl_c_names_the_checkpoint_even_with_json(
        studio_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C in `train`: the worker is asked to stop, and the checkpoint to resume from
    is printed (stderr) also with --json, whose result never comes."""
    seen: dict[str, Any] = {}

    class FakeJob:  # stands in for the worker process; emits what a stopped run emits
        def __init__(self, request: TrainRequest, on_event: Any) -> None:
            seen["request"] = request
            self.on_event = on_event
            self.done = threading.Event()

        def start(self) -> FakeJob:
            return self

        def wait(self, timeout: float | None = None) -> dict[str, Any]:
            raise KeyboardInterrupt

        def cancel(self) -> None:
            seen["cancelled"] = True
            self.on_event({"event": "stopped", "step": 2,
                           "checkpoint": "/runs/x/checkpoint.safetensors"})
            self.on_event({"event": "cancelled"})
            self.done.set()

    monkeypatch.setattr("engine.training.client.TrainingJob", FakeJob)
    data = sft_data(tmp_path / "data.jsonl")
    for extra in ([], ["--json"]):
        seen.clear()
        code = cli.main(["train", "x", "--base", BASE, "--data", str(data), "--steps", "5",
                         "--save-every", "2", *extra])
        out, err = capsys.readouterr()
        assert code == 130 and seen["cancelled"] is True, (extra, err)
        assert seen["request"].settings == {"steps": 5, "save_every": 2}
        assert ("stopped at step 2; resume with --resume /runs/x/checkpoint.safetensors"
                in err), (extra, err)
        assert out == ""


def test_docs_describe_every_train_flag_and_data_key() -> None:
    from engine.training import data as data_mod

    docs = (ROOT / "docs" / "training.md").read_text()
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    train_parser = sub.choices["train"]
    flags = [o for a in train_parser._actions for o in a.option_strings
             if o not in ("-h", "--help")]
    assert len(flags) >= 18
    # The whole flag, so `--dpo-beta` does not count as documenting `--dpo`.
    missing = [f for f in flags if not re.search(rf"`{re.escape(f)}(?![\w-])", docs)]
    assert not missing, f"docs/training.md does not document {missing}"
    keys = ["text", "prompt", "completion", "messages", "chosen", "rejected", "weight",
            *sorted(data_mod.EXTRA_KEYS)]
    assert not [k for k in keys if f'"{k}"' not in docs and f"`{k}`" not in docs]
