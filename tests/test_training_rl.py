"""`variant-studio train-rl`, the seeded reinforcement loop (engine.training.rl).

One small real run (four yes/no questions, rewarded for answers that begin with "no";
four samples each, three rounds of two steps, two sampled tokens, rank 4), run twice
with the same seed, is shared by the slow tests: the mean reward rises over the
rounds, every round reports and records how far the trainer's log-probabilities are
from llama.cpp's, the rollouts are token lines the trainer read back, and the two runs
wrote the same adapter bytes. The refusals are fast: they are caught before a worker
starts, except the Python reward that raises, which runs in the worker on one prompt
with two samples of two tokens.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from engine import cli
from engine.catalog.store import Catalog
from engine.curated.embedded import DEFAULT_MODEL_NAME as BASE
from engine.errors import RefusedError, UsageError
from engine.training import rewards
from engine.training.client import TrainingJob
from engine.training.rl import RLRequest, RLSettings, advantages, agreement, sample_seed

SYSTEM = "Answer with one word: yes or no."
QUESTIONS = ("Is water wet?", "Is the sky blue?", "Is fire hot?", "Do birds fly?")
# A trivially learnable task: begin the answer with the word "no". At temperature 1 the
# base does so about half the time (it also says yes, or argues), so most groups of four
# have some variance from round 1 on, and the reward has room to rise.
NO_REWARD = ('import re\n\n\n'
             'def reward(prompt, completion):\n'
             '    words = re.findall(r"[a-z]+", completion.lower())\n'
             '    return 1.0 if words[:1] == ["no"] else 0.0\n')
FLAGS = ["--rounds", "3", "--samples", "4", "--steps-per-round", "2", "--max-tokens", "2",
         "--rank", "4", "--lr", "2e-3", "--threads", "1", "--seed", "0"]


def write_prompts(path: Path, questions: tuple[str, ...] = QUESTIONS) -> Path:
    rows = [{"messages": [{"role": "system", "content": SYSTEM},
                          {"role": "user", "content": q}], "answer": "No"} for q in questions]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------------------- the shared run


@pytest.fixture(scope="module")
def runs(module_home: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same run twice: through the CLI (imported) and as a job (not imported)."""
    folder = tmp_path_factory.mktemp("rl")
    prompts = write_prompts(folder / "prompts.jsonl")
    reward = folder / "reward.py"
    reward.write_text(NO_REWARD)
    argv = ["train-rl", "no-rl", "--base", BASE, "--prompts", str(prompts), "--reward",
            f"python:{reward}", *FLAGS, "--json"]
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    assert code == 0, err.getvalue()[-3000:]
    first = json.loads(out.getvalue())
    events: list[dict[str, Any]] = []
    settings = {"rank": 4, "lr": 2e-3, "threads": 1, "seed": 0}
    rl = {"rounds": 3, "samples": 4, "steps_per_round": 2, "max_tokens": 2}
    job = TrainingJob(RLRequest("no-rl-again", BASE, str(prompts), f"python:{reward}",
                                settings, rl, register=False,
                                run_dir=str(folder / "again")), events.append)
    second = job.start().wait(900)
    return {"first": first, "second": second, "events": events, "stderr": err.getvalue()}


@pytest.mark.slow
def test_reward_rises_over_rounds(runs: dict[str, Any]) -> None:
    rounds = runs["first"]["provenance"]["rl"]["rounds"]
    means = [r["reward"]["mean"] for r in rounds]
    assert len(means) == 3
    # Measured with these settings: 0.56, 0.81, 0.88 (seed 0, this run) and 0.50, 0.81,
    # 0.69 (seed 1); at lr 5e-3 0.56, 0.62, 0.69 / 0.50, 0.62, 0.81 / 0.50, 0.50, 0.81.
    assert means[0] <= means[1] and means[2] >= means[0] + 0.1, means
    for r in rounds:
        assert r["reward"]["min"] <= r["reward"]["mean"] <= r["reward"]["max"]
        assert r["groups"] == 4 and r["tokens"] > 0
    assert sum(r["steps"] for r in rounds) == runs["first"]["provenance"]["steps"] > 0


@pytest.mark.slow
def test_agreement_reported_every_round_and_recorded(runs: dict[str, Any]) -> None:
    events = [e for e in runs["events"] if e["event"] == "round"]
    assert [e["round"] for e in events] == [1, 2, 3]
    recorded = runs["second"]["provenance"]["rl"]["rounds"]
    for event, record in zip(events, recorded, strict=True):
        agree = record["agreement"]
        assert event["agreement"] == agree and event["reward"] == record["reward"]
        assert agree["tokens"] == record["tokens"]
        assert 0 <= agree["mean_abs"] <= agree["max_abs"]
        assert 0 <= agree["exact"] <= agree["within"] <= 1 and agree["tolerance"] == 0.05
        # The trainer computes the served file's arithmetic: close, if not bit for bit.
        assert agree["mean_abs"] < 0.3 and agree["within"] > 0.2, agree
    record = runs["first"]["provenance"]
    assert record["method"] == "grpo" and record["rl"]["reward"]["kind"] == "python"
    assert record["rl"]["sampling"]["temperature"] == 1.0
    assert record["rl"]["settings"]["samples"] == 4


@pytest.mark.slow
def test_same_seed_same_bytes_and_imported(runs: dict[str, Any]) -> None:
    first, second = runs["first"], runs["second"]
    for kind in ("gguf", "peft"):
        assert first["files"][kind]["sha256"] == second["files"][kind]["sha256"], kind
    assert ([r["rollouts"]["sha256"] for r in first["provenance"]["rl"]["rounds"]]
            == [r["rollouts"]["sha256"] for r in second["provenance"]["rl"]["rounds"]])
    catalog = Catalog()
    assert first["adapter"] == "no-rl" and catalog.adapter("no-rl")["sha256"] == \
        first["files"]["gguf"]["sha256"]
    assert "no-rl-again" not in catalog.data()["adapters"]  # register=False
    run_dir = Path(first["run_dir"])
    assert (run_dir / "adapter.gguf").is_file() and (run_dir / "peft").is_dir()
    assert json.loads((run_dir / "provenance.json").read_text()) == first["provenance"]


@pytest.mark.slow
def test_rollouts_are_token_lines_of_the_sampled_ids(runs: dict[str, Any]) -> None:
    run_dir = Path(runs["first"]["run_dir"])
    for number, record in enumerate(runs["first"]["provenance"]["rl"]["rounds"], start=1):
        lines = [json.loads(x) for x in
                 (run_dir / record["rollouts"]["file"]).read_text().splitlines()]
        assert len(lines) == 16
        for line in lines:
            meta = line["meta"]
            assert meta["round"] == number
            assert meta["seed"] == sample_seed(0, number, (meta["prompt_line"] - 1),
                                               meta["sample"])
            completion = sum(line["mask"])
            assert 1 <= completion <= 2 and completion == len(meta["sampler_logprobs"])
            assert line["mask"] == [0] * (len(line["tokens"]) - completion) + [1] * completion
        # Advantages: each group's weights sum to zero, zero for a group of equal rewards.
        for start in range(0, 16, 4):
            group = lines[start:start + 4]
            assert abs(sum(g["weight"] for g in group)) < 1e-9
        if number > 1:
            assert (run_dir / "rounds" / f"adapter-round-{number}.gguf").is_file()
            assert record["adapter_sha256"]
        else:
            assert record["adapter_sha256"] is None  # round 1 samples the bare base


# ---------------------------------------------------------------------------- units


def test_advantages_and_agreement() -> None:
    assert advantages([1.0, 1.0, 1.0, 1.0]) == [0.0] * 4
    values = advantages([1.0, 0.0, 0.0, 0.0])
    assert values[0] > 0 > values[1] and abs(sum(values)) < 1e-12
    assert math.isclose(values[0], 0.75 / (math.sqrt(3) / 4 + 1e-4))
    figures = agreement([[-1.0, -2.0]], [(-1.0, -2.1)])
    assert figures["tokens"] == 2 and figures["exact"] == 0.5 and figures["within"] == 0.5
    assert math.isclose(figures["max_abs"], 0.1, rel_tol=1e-6)
    assert sample_seed(0, 1, 0, 0) != sample_seed(0, 1, 0, 1) != sample_seed(0, 2, 0, 1)
    assert sample_seed(5, 2, 3, 1) == sample_seed(5, 2, 3, 1)


def test_rewards(tmp_path: Path) -> None:
    line = rewards.PromptLine(3, prompt="Say yes.", answer="yes")
    exact = rewards.load_reward(rewards.parse_reward("exact"))
    assert exact(line, " yes\n") == 1.0 and exact(line, "Yes") == 0.0
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "required": ["tool"],
                                  "properties": {"tool": {"type": "string"}}}))
    check = rewards.load_reward(rewards.parse_reward(f"json-schema:{schema}"))
    assert check(line, 'Sure: {"tool": "x"} done') == 1.0
    assert check(line, '{"tool": 3}') == 0.0 and check(line, "no json") == 0.0
    code = tmp_path / "reward.py"
    code.write_text("def reward(prompt, completion):\n    return len(completion) / 10\n")
    assert rewards.load_reward(rewards.parse_reward(f"python:{code}"))(line, "abc") == 0.3
    code.write_text("def reward(prompt, completion):\n    return float('nan')\n")
    with pytest.raises(RefusedError, match="not finite.*prompt line 3"):
        rewards.load_reward(rewards.parse_reward(f"python:{code}"))(line, "abc")
    code.write_text("def reward(prompt, completion):\n    return 'good'\n")
    with pytest.raises(RefusedError, match="not a number"):
        rewards.load_reward(rewards.parse_reward(f"python:{code}"))(line, "abc")
    code.write_text("def reward(prompt, completion)\n    return 1\n")
    with pytest.raises(RefusedError, match="reward.py line 1: syntax error"):
        rewards.load_reward(rewards.parse_reward(f"python:{code}"))
    spec = rewards.parse_reward(f"python:{code}")
    code.write_text("def reward(prompt, completion):\n    return 1.0\n")
    with pytest.raises(RefusedError, match="changed since"):
        rewards.load_reward(spec)
    with pytest.raises(UsageError, match="unknown reward"):
        rewards.parse_reward("exact:x")
    with pytest.raises(UsageError):
        RLSettings(samples=1)


def test_refusals_before_the_worker(studio_home: Path, tmp_path: Path,
                                    capsys: pytest.CaptureFixture) -> None:
    prompts = write_prompts(tmp_path / "prompts.jsonl")
    base = ["--base", BASE, "--prompts", str(prompts)]

    # A malformed prompt file: every bad line, with its number, in one error (exit 3).
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "Say yes.", "answer": "yes"}\n'
                   '{"prompt": "Say yes.", "anwser": "yes"}\n'
                   '\n'
                   '{"messages": [{"role": "user", "content": "Hi"}, '
                   '{"role": "assistant", "content": "Hello"}], "answer": "x"}\n'
                   'not json\n'
                   '{"prompt": "Say no."}\n')
    code, _, err = run_cli(capsys, "train-rl", "r1", "--base", BASE, "--prompts", str(bad),
                           "--reward", "exact")
    assert code == 3
    assert "4 malformed lines" in err
    assert "line 2: unknown key anwser" in err
    assert "line 4: messages must end before the answer" in err
    assert "line 5: not valid JSON" in err
    assert "line 6: the exact reward needs an answer" in err

    # An unknown reward kind (exit 2), a missing reward file (exit 2).
    code, _, err = run_cli(capsys, "train-rl", "r2", *base, "--reward", "bleu")
    assert code == 2 and "unknown reward 'bleu'" in err and "json-schema:FILE" in err
    code, _, err = run_cli(capsys, "train-rl", "r2", *base, "--reward",
                           f"python:{tmp_path / 'none.py'}")
    assert code == 2 and "none.py does not exist" in err

    # A schema file that is not JSON (exit 3), and one that is no schema.
    schema = tmp_path / "schema.json"
    schema.write_text("{'type': 'object'}")
    code, _, err = run_cli(capsys, "train-rl", "r3", *base, "--reward",
                           f"json-schema:{schema}")
    assert code == 3 and "schema schema.json is not JSON" in err and "line 1" in err
    schema.write_text('{"type": 12}')
    code, _, err = run_cli(capsys, "train-rl", "r3", *base, "--reward",
                           f"json-schema:{schema}")
    assert code == 3 and "not a valid JSON Schema" in err

    # Bad settings (exit 2), an unknown base or starting adapter (exit 4), a taken name.
    code, _, err = run_cli(capsys, "train-rl", "r4", *base, "--reward", "exact",
                           "--samples", "1")
    assert code == 2 and "samples must be a whole number from 2" in err
    code, _, err = run_cli(capsys, "train-rl", "r4", "--base", "nope", "--prompts",
                           str(prompts), "--reward", "exact")
    assert code == 4
    code, _, err = run_cli(capsys, "train-rl", "r4", *base, "--reward", "exact",
                           "--init-adapter", "nope")
    assert code == 4
    code, _, err = run_cli(capsys, "train-rl", "bad name!", *base, "--reward", "exact")
    assert code == 2
    code, _, err = run_cli(capsys, "train-rl", "r4", "--base", BASE, "--prompts",
                           str(tmp_path / "missing.jsonl"), "--reward", "exact")
    assert code == 2 and "prompts file" in err and "missing.jsonl does not exist" in err
    adapters = Catalog().data()["adapters"]
    assert not {"r1", "r2", "r3", "r4"} & set(adapters)


@pytest.mark.slow
def test_python_reward_that_raises_stops_the_run(studio_home: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    """Run in the worker (never in this process): its error names the reward file's line
    and the prompt line, and nothing is imported."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", QUESTIONS[:1])
    reward = tmp_path / "reward.py"
    reward.write_text("def reward(prompt, completion):\n"
                      "    words = completion.split()\n"
                      "    return 1.0 / (len(words) - len(words))\n")
    code, _, err = run_cli(capsys, "train-rl", "raises", "--base", BASE, "--prompts",
                           str(prompts), "--reward", f"python:{reward}", "--samples", "2",
                           "--rounds", "1", "--max-tokens", "2", "--threads", "1")
    assert code == 3, err
    assert ("python reward reward.py raised ZeroDivisionError: float division by zero "
            "(reward.py line 3) on prompt line 1") in err
    assert "raises" not in Catalog().data()["adapters"]


def test_docs_describe_every_train_rl_flag() -> None:
    import re

    root = Path(__file__).resolve().parents[1]
    training = (root / "docs" / "training.md").read_text()
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    actions = sub.choices["train-rl"]._actions
    flags = [o for a in actions for o in a.option_strings if o not in ("-h", "--help")]
    assert len(flags) >= 18 and all(a.help for a in actions)
    missing = [f for f in flags if not re.search(rf"`{re.escape(f)}(?![\w-])", training)]
    assert not missing, f"docs/training.md does not document {missing}"
    assert "## Reinforcement loop" in training
    assert "variant-studio train-rl NAME --base MODEL --prompts FILE" in (
        root / "docs" / "cli.md").read_text()


def test_cli_prints_a_line_per_round_and_stops_on_ctrl_c(
        studio_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The command's own output, with a stand-in for the worker: one stderr line per
    round event, the summary on stdout; Ctrl-C asks the worker to stop and exits 130."""
    import threading

    seen: dict[str, Any] = {}
    agree = {"tokens": 32, "mean_abs": 0.0649, "max_abs": 0.501, "exact": 0.0,
             "within": 0.594, "tolerance": 0.05}
    rounds = [{"round": n, "reward": {"mean": m, "min": 0.0, "max": 1.0}, "agreement": agree,
               "steps": 2, "seconds": {"total": 46.0}} for n, m in ((1, 0.5), (2, 0.625))]
    result = {"adapter": "cli-rl", "run_dir": "/runs/r", "provenance": {
        "steps": 4, "time": {"train_seconds": 92.0}, "rl": {"rounds": rounds}},
        "files": {"gguf": {"sha256": "a" * 64}, "peft": {"sha256": "b" * 64}}}

    class FakeJob:
        def __init__(self, request: RLRequest, on_event: Any) -> None:
            seen["request"] = request
            self.on_event = on_event
            self.done = threading.Event()

        def start(self) -> FakeJob:
            return self

        def wait(self, timeout: float | None = None) -> dict[str, Any]:
            if seen.get("interrupt"):
                raise KeyboardInterrupt
            for r in rounds:
                self.on_event({"event": "round", "rounds": 2, "step": 2 * r["round"],
                               "loss": [0.0, 0.0], **r, "seconds": 46.0})
            return result

        def cancel(self) -> None:
            seen["cancelled"] = True
            self.done.set()

    monkeypatch.setattr("engine.training.client.TrainingJob", FakeJob)
    prompts = write_prompts(tmp_path / "prompts.jsonl")
    argv = ["train-rl", "cli-rl", "--base", BASE, "--prompts", str(prompts), "--reward",
            "exact", "--rounds", "2", "--lr", "2e-3"]
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    assert ("round 2/2: reward 0.625 (min 0.000, max 1.000); trainer vs sampler mean |Δ| "
            "0.0649, max 0.501, 59% within 0.05; 2 steps (46 s)") in err
    assert "trained adapter cli-rl in 2 rounds, 4 steps (92 s), mean reward 0.500 → 0.625" in out
    request = seen["request"]
    assert request.rl == {"rounds": 2} and request.settings == {"lr": 2e-3}
    assert request.reward == "exact" and request.reward_sha256 is None
    seen["interrupt"] = True
    code, _, _ = run_cli(capsys, *argv)
    assert code == 130 and seen["cancelled"] is True
