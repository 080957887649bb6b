"""The Train page's reinforcement loop and served check (offscreen).

Fast: the worker's `round` and `checks` events fed through the client's dispatch (as
the worker's JSON lines arrive) draw one point per round and the round's line, and
the served-check panel words parity and drift and flags them past the thresholds;
the reinforcement form builds the request the CLI would, and refuses a missing or
malformed prompts file and an unconfirmed Python reward without starting a job.
Slow: one real tiny run from the page (two rounds of two samples of two tokens).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.catalog.store import Catalog
from engine.curated.embedded import DEFAULT_MODEL_NAME as BASE
from engine.training.rl import RLRequest, RLSettings
from gui.train_page import TrainPage
from gui.widgets import served_check
from tests.gui_helpers import LONG, make_train_page

SYSTEM = "Answer with one word: yes or no."
NO_REWARD = ('import re\n\n\n'
             'def reward(prompt, completion):\n'
             '    words = re.findall(r"[a-z]+", completion.lower())\n'
             '    return 1.0 if words[:1] == ["no"] else 0.0\n')


def write_prompts(path: Path, questions: tuple[str, ...] = ("Is water wet?", "Is fire hot?")
                  ) -> Path:
    rows = [{"messages": [{"role": "system", "content": SYSTEM},
                          {"role": "user", "content": q}], "answer": "No"} for q in questions]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def round_event(number: int, rounds: int, mean: float, low: float, high: float,
                within: float, mean_abs: float = 0.04) -> dict[str, Any]:
    return {"event": "round", "round": number, "rounds": rounds,
            "reward": {"mean": mean, "min": low, "max": high},
            "agreement": {"tokens": 16, "mean_abs": mean_abs, "max_abs": 0.3, "exact": 0.0,
                          "within": within, "tolerance": 0.05},
            "steps": 2, "step": 2 * number, "loss": [0.1, 0.05], "seconds": 12.0}


PARITY = {"sequences": 6, "positions": 1200, "top1_agreement": 0.975,
          "max_abs_logprob_diff": 0.37, "mean_abs_logprob_diff": 0.051, "max_kl": 0.035,
          "mean_kl": 0.0033, "adapter": "rl-a"}
DRIFT = {"texts": 6, "tokens": 261, "base": 3.306, "variant": 3.354, "delta": 0.048}


@pytest.fixture
def page(qtbot, studio_home: Path):
    widget = make_train_page(qtbot)
    yield widget
    widget.controller.shutdown()  # never leave a worker behind


def choose_rl(page: TrainPage) -> None:
    page.method.setCurrentIndex(page.method.findData("reinforce"))


# ---------------------------------------------------------------------------- fed events


def test_rounds_plot_and_served_check_from_the_workers_events(qtbot, page: TrainPage) -> None:
    choose_rl(page)
    assert page.rounds_plot.isVisibleTo(page) and not page.plot.isVisibleTo(page)
    page.rounds_plot.reset(3)
    feed = page.client._on_event  # the worker's JSON lines, as the reader thread delivers
    with qtbot.waitSignal(page.client.round) as got:
        feed(round_event(1, 3, 0.5625, 0.0, 1.0, 0.47, 0.084))
    assert got.args[0]["round"] == 1
    feed(round_event(2, 3, 0.8125, 0.0, 1.0, 0.97, 0.040))
    plot = page.rounds_plot
    assert [(p.round, p.mean, p.within) for p in plot.points] == [(1, 0.5625, 0.47),
                                                                   (2, 0.8125, 0.97)]
    assert [(q.x(), q.y()) for q in plot.reward.points()] == [(1, 0.5625), (2, 0.8125)]
    assert [round(q.y(), 6) for q in plot.agreement.points()] == [47.0, 97.0]  # percent
    assert [q.y() for q in plot.band_upper.points()] == [1.0, 1.0]
    assert [q.y() for q in plot.band_lower.points()] == [0.0, 0.0]
    assert (plot.x_axis.min(), plot.x_axis.max()) == (1, 3)
    assert (plot.y_axis.min(), plot.y_axis.max()) == (0.0, 1.0)
    assert plot.chart_.title() == ""  # the empty-plot hint is gone
    assert page.round_summary.text() == ("round 2/3 · reward 0.81 (0.00–1.00) · agreement "
                                         "97 % within 0.05 nats (mean |Δ| 0.040) · 12 s")
    assert not page.round_summary.isHidden()
    assert (page.progress.maximum(), page.progress.value()) == (3, 2)
    # A reward outside 0..1 (a Python reward may return any number) widens its axis.
    feed(round_event(3, 3, 2.5, -1.0, 4.0, 0.9))
    low, high = plot.y_axis.min(), plot.y_axis.max()
    assert low < -1.0 and high > 4.0 and high - low < 6.0
    # A malformed round is not drawn (and does not break the plot).
    feed({"event": "round", "round": 4, "reward": {"mean": float("nan")}, "agreement": {}})
    assert len(plot.points) == 3 and plot.reward.count() == 3

    # The served check: in words, no flag within the thresholds.
    assert page.served.isHidden()
    with qtbot.waitSignal(page.client.checks) as got:
        feed({"event": "checks", "parity": PARITY, "drift": DRIFT})
    assert got.args[0] == {"parity": PARITY, "drift": DRIFT}
    assert not page.served.isHidden() and not page.served.flagged()
    assert page.served.parity.text() == (
        "Trainer and llama.cpp agree on the next token 97.5 % of the time over 1,200 "
        "positions (mean |Δ log p| 0.051 nats, max 0.37), the adapter on both.")
    assert page.served.drift.text() == ("Unrelated text: 3.306 → 3.354 nats/token (+0.048) "
                                        "over 261 tokens.")
    assert [m.text() for m in page.served.marks] == ["✓", "✓"]
    assert page.served.title() == "Served check"

    # Past the thresholds: both flagged, in red, and the title says so.
    feed({"event": "checks", "parity": {**PARITY, "top1_agreement": 0.91},
          "drift": {**DRIFT, "variant": 3.504, "delta": 0.198}})
    assert [line.state for line in page.served.lines] == ["flag", "flag"]
    assert "91.0 %" in page.served.parity.text() and "Below the 93 %" in \
        page.served.parity.text()
    assert "(+0.198)" in page.served.drift.text() and "More than +0.05" in \
        page.served.drift.text()
    assert served_check.FLAG_COLOR in page.served.drift.styleSheet()
    assert page.served.title() == "Served check: needs a look"
    # Just over one threshold, just under the other.
    feed({"event": "checks", "parity": {**PARITY, "top1_agreement": 0.93},
          "drift": {**DRIFT, "delta": 0.0501}})
    assert [line.state for line in page.served.lines] == ["ok", "flag"]

    # A part that could not be measured, one missing: said plainly, never a pass.
    feed({"event": "checks", "parity": {"error": "llama.cpp refused the adapter"}})
    assert page.served.parity.text() == ("Parity (trainer vs llama.cpp) could not be "
                                         "measured: llama.cpp refused the adapter")
    assert page.served.drift.text() == "Drift on unrelated text: not measured for this run."
    assert [line.state for line in page.served.lines] == ["missing", "missing"]
    assert not page.served.flagged()


def test_the_finished_result_carries_the_check(qtbot, page: TrainPage) -> None:
    """On finish the result's `checks` is shown (it is the final word); a run that
    reported none says so instead of showing nothing."""
    choose_rl(page)
    rounds = [{"reward": {"mean": m, "min": 0.0, "max": 1.0}} for m in (0.5, 0.75)]
    result = {"adapter": "rl-x", "variant": None, "files": {"gguf": {"sha256": "ab" * 32}},
              "provenance": {"loss": {"first": 0.0, "last": 0.0}, "rl": {"rounds": rounds}},
              "checks": {"parity": PARITY, "drift": {"error": "out of memory"}}}
    with qtbot.waitSignal(page.controller.trained):
        page.client.finished.emit(result)
    assert page.status.text() == ("Done: adapter rl-x (sha256 abababababababab…), mean "
                                  "reward 0.500 → 0.750 over 2 rounds.")
    assert not page.served.isHidden()
    assert [line.state for line in page.served.lines] == ["ok", "missing"]
    assert page.served.drift.text() == ("Drift on unrelated text could not be measured: "
                                        "out of memory")
    page.served.clear()
    page._checks_seen = False
    page.client.finished.emit({**result, "checks": None})
    assert [line.state for line in page.served.lines] == ["missing", "missing"]


# ---------------------------------------------------------------------------- the form


def test_rl_form_builds_the_request_and_refuses_before_any_job(
        qtbot, page: TrainPage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[Any] = []
    monkeypatch.setattr(page.client, "start", started.append)  # no worker in this test

    # Supervised fields only for supervised runs, the loop's only for the loop.
    assert page.prompts.isHidden() and page.rounds.isHidden() and not page.data.isHidden()
    choose_rl(page)
    for hidden in (page.data, page.steps, page.variant, page.train_eot, page.batch,
                   page.dpo, page.save_every):
        assert hidden.isHidden(), hidden
    for shown in (page.prompts, page.reward_kind, page.rounds, page.samples, page.lr,
                  page.rank, page.seed, page.numerics, page.steps_per_round, page.kl_beta):
        assert not shown.isHidden(), shown
    assert page.reward_file.isHidden() and page.trust.isHidden()  # exact: no file
    defaults = RLSettings()
    assert (page.rounds.value(), page.samples.value(), page.max_tokens.value()) == (
        defaults.rounds, defaults.samples, defaults.max_tokens)
    assert page.start_button.text() == "Start the loop"

    prompts = write_prompts(tmp_path / "prompts.jsonl")
    page.base.setCurrentText(BASE)
    page.name.setText("rl-form")
    page.rounds.setValue(3)
    page.samples.setValue(2)
    page.max_tokens.setValue(4)
    page.lr.setValue(0.002)
    page.rank.setValue(4)
    page.seed.setValue(5)
    page.threads.setValue(1)

    # A missing prompts file: named, nothing started.
    page.start_button.click()
    assert page.status.text() == "choose a prompts file" and started == []
    page.prompts.setText(str(tmp_path / "missing.jsonl"))
    page.start_button.click()
    assert "missing.jsonl does not exist" in page.status.text() and started == []
    assert page.status.styleSheet() == "color:#c0392b"
    # A malformed line: its number and reason.
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "Say no.", "anwser": "no"}\n')
    page.prompts.setText(str(bad))
    page.start_button.click()
    assert "line 1: unknown key anwser" in page.status.text() and started == []

    # exact: the request the CLI would build from the same flags.
    page.prompts.setText(str(prompts))
    assert page.rl_request() == RLRequest(
        name="rl-form", base=BASE, prompts=str(prompts), reward="exact",
        settings={"lr": 0.002, "rank": 4, "alpha": page.alpha.value(),
                  "targets": page.targets.text(), "seq_len": page.seq_len.value(),
                  "seed": 5, "threads": 1, "numerics": "served"},
        rl={"rounds": 3, "samples": 2, "steps_per_round": defaults.steps_per_round,
            "max_tokens": 4, "clip": defaults.clip, "kl_beta": defaults.kl_beta})
    page.start_button.click()
    assert len(started) == 1 and isinstance(started[0], RLRequest)
    assert started[0].reward == "exact" and started[0].rl["rounds"] == 3
    assert page.progress.maximum() == 3 and page.rounds_plot.rounds == 3
    page._set_running(False)  # the stand-in start ran no job
    started.clear()

    # A Python reward: its file, then the explicit trust, bound to that file.
    code = tmp_path / "no_reward.py"
    code.write_text(NO_REWARD)
    page.reward_kind.setCurrentIndex(page.reward_kind.findData("python"))
    assert not page.reward_file.isHidden() and not page.trust.isHidden()
    page.start_button.click()
    assert page.status.text() == "choose the reward's Python file (your own code)"
    page.reward_file.setText(str(code))
    assert "I trust no_reward.py and want it run" in page.trust.text()
    assert not page.trust.isChecked()
    page.start_button.click()
    assert "confirm that you trust the file" in page.status.text()
    assert "no_reward.py" in page.status.text() and started == []
    page.trust.setChecked(True)
    assert page.status.text() == "Ready."  # the refusal is stale once acted on
    page.reward_file.setText(str(tmp_path / "other.py"))  # another file: ask again
    assert not page.trust.isChecked() and "other.py" in page.trust.text()
    page.reward_file.setText(str(code))
    page.trust.setChecked(True)
    page.start_button.click()
    assert len(started) == 1
    assert started[0].reward == f"python:{code}" and started[0].reward_sha256
    page._set_running(False)
    # The controller holds the gate too: no caller starts a Python reward unconfirmed.
    from engine.errors import StudioError

    with pytest.raises(StudioError, match="confirm that you trust"):
        page.controller.start_rl(page.rl_request())
    assert len(started) == 1

    # A JSON schema that is no schema is refused with the reason.
    schema = tmp_path / "schema.json"
    schema.write_text('{"type": 12}')
    page.reward_kind.setCurrentIndex(page.reward_kind.findData("json-schema"))
    assert page.trust.isHidden()
    page.reward_file.setText(str(schema))
    page.start_button.click()
    assert "not a valid JSON Schema" in page.status.text() and len(started) == 1

    # Back to supervised: the loop's fields go, the form's come back.
    page.method.setCurrentIndex(page.method.findData("supervised"))
    assert page.prompts.isHidden() and page.reward_file.isHidden() and page.trust.isHidden()
    assert not page.data.isHidden() and not page.steps.isHidden()
    assert page.plot.isVisibleTo(page) and not page.rounds_plot.isVisibleTo(page)


# ---------------------------------------------------------------------------- a real run


@pytest.mark.slow
def test_a_real_rl_run_plots_each_round_and_imports(qtbot, page: TrainPage,
                                                    tmp_path: Path) -> None:
    choose_rl(page)
    code = tmp_path / "no_reward.py"
    code.write_text(NO_REWARD)
    page.base.setCurrentText(BASE)
    page.name.setText("gui-rl")
    page.prompts.setText(str(write_prompts(tmp_path / "prompts.jsonl")))
    page.reward_kind.setCurrentIndex(page.reward_kind.findData("python"))
    page.reward_file.setText(str(code))
    page.trust.setChecked(True)
    page.rounds.setValue(2)
    page.samples.setValue(2)
    page.steps_per_round.setValue(1)
    page.max_tokens.setValue(2)
    page.rank.setValue(4)
    page.lr.setValue(0.002)
    page.threads.setValue(1)
    page.seed.setValue(0)
    rounds: list[dict] = []
    page.client.round.connect(rounds.append)
    with qtbot.waitSignal(page.controller.trained, timeout=LONG) as trained:
        page.start_button.click()
        assert page.busy() and page.cancel_button.isEnabled()
        assert not page.method.isEnabled() and not page.trust.isEnabled()
    result = trained.args[0]
    assert [e["round"] for e in rounds] == [1, 2]
    assert [p.round for p in page.rounds_plot.points] == [1, 2]
    assert page.rounds_plot.reward.count() == 2 and page.rounds_plot.agreement.count() == 2
    for event, point in zip(rounds, page.rounds_plot.points, strict=True):
        assert point.mean == event["reward"]["mean"]
        assert point.within == event["agreement"]["within"]
    assert page.round_summary.text().startswith("round 2/2 · reward ")
    assert (page.progress.maximum(), page.progress.value()) == (2, 2)
    assert page.status.text().startswith("Done: adapter gui-rl") and "over 2 rounds" in \
        page.status.text()
    assert not page.busy() and page.start_button.isEnabled()
    record = Catalog().adapter("gui-rl")
    assert record["sha256"] == result["files"]["gguf"]["sha256"]
    assert record["provenance"]["method"] == "grpo"
    assert len(record["provenance"]["rl"]["rounds"]) == 2
    assert page.init_adapter.findText("gui-rl") >= 0  # the page refreshed its choices
    # The served check is shown whatever the worker reported: figures, or plainly none.
    assert not page.served.isHidden() and len(page.served.lines) == 2
    checks = result.get("checks") or {}
    for line, part in zip(page.served.lines, (checks.get("parity"), checks.get("drift")),
                          strict=True):
        measured = isinstance(part, dict) and "error" not in part
        assert (line.state != "missing") == measured, (line, part)
