"""Scoring through the served numerics: the base and the demo variant on the demo's
held-out set (llama.cpp and OpenVINO), evaluation sets attached to adapters and their
kept scores, malformed data refused with line numbers, scoring interleaved with a
generation and cancelled, and the window's Evaluate view.

The held-out set has 60 rows; scoring all of them for two models takes about three
minutes on llama.cpp on a busy 2-core machine (longer on OpenVINO), so the tests score a
fixed subset: rows 1-5 (the five tools, in rotation) and the rows the variant gets
wrong (on OpenVINO, which decodes every prompt whole, rows 1, 2, 21 and 44). The
per-row expectations below were computed once over all 60 rows with
`variant-studio score smollm2-135m-instruct tool-calls --data resources/demo/heldout.jsonl
[--backend openvino]`: the variant's greedy answer equals the expected call on 58 of 60
rows on llama.cpp (every row but 4 and 21) and on 57 on OpenVINO at f32 (also not 44,
which the bf16 fast profile answers), the base's on none — the 96.7 %, 95.0 % and 0 %
docs/training.md reports.
"""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import Any

import pytest

from engine import cli
from engine.catalog import evaluation, resolve
from engine.catalog.store import Catalog
from engine.curated import demo, setup
from engine.curated.embedded import DEFAULT_MODEL_NAME as BASE
from engine.errors import Cancelled, ContextOverflowError, RefusedError
from engine.runtime import messages
from engine.runtime.client import EngineClient
from engine.training import data, score_sets

HELDOUT = demo.resources_dir() / demo.SHIPPED_HELDOUT
VARIANT, ADAPTER = demo.VARIANT_NAME, demo.ADAPTER_NAME
SUBSET = (1, 2, 3, 4, 5, 21, 44)
# Computed once over all 60 rows (see the module docstring). Row 44 is a near miss on
# OpenVINO: missed where the fast profile computes at f32, answered where it computes at
# the CPU's bf16 (an AVX-512 BF16 machine, which misses rows 29 and 49 instead, outside
# the subset), so it may go either way.
VARIANT_MISSES = {"llama": {4, 21}, "openvino": {4, 21}}
NEAR_MISSES = {"llama": set(), "openvino": {44}}
TIMEOUT = 900


def subset_file(folder: Path, lines: tuple[int, ...] = SUBSET) -> Path:
    rows = HELDOUT.read_bytes().split(b"\n")
    path = folder / "subset.jsonl"
    path.write_bytes(b"".join(rows[n - 1] + b"\n" for n in lines))
    return path


def demo_catalog() -> Catalog:
    catalog = Catalog()
    setup.first_run(catalog, with_demo=True)
    return catalog


# --------------------------------------------------------------------------- data


def test_the_heldout_set_is_checked_and_attached_to_the_demo_at_first_run(
        studio_home: Path) -> None:
    checked = score_sets.read_set(HELDOUT)
    assert (checked.rows, checked.kind, checked.format) == (60, "chat", "jsonl")
    assert 60 - len(VARIANT_MISSES["llama"]) == 58  # docs/training.md: 58 / 60 (96.7 %)
    assert "58 / 60 (96.7 %)" in (Path(__file__).parents[1] / "docs/training.md").read_text()
    # Each item: the messages before the last assistant turn, scoring that turn only.
    item = checked.items[0]
    row = json.loads(HELDOUT.read_text().splitlines()[0])
    assert item.kind == "chat" and item.line == 1
    assert item.target == row["messages"][-1]["content"]
    assert [m.content for m in item.prompt.messages] == [m["content"]
                                                         for m in row["messages"][:-1]]

    catalog = demo_catalog()
    entry = catalog.adapter(ADAPTER)["evaluation"]
    # What the seeding recorded is what the training data's parser finds.
    assert (entry["sha256"], entry["rows"], entry["kind"], entry["format"]) == (
        checked.sha256, 60, "chat", "jsonl")
    stored = evaluation.set_path(catalog, ADAPTER)
    assert stored is not None and stored.name == "evaluation.jsonl"
    assert stored.read_bytes() == HELDOUT.read_bytes()
    assert score_sets.stored_set(catalog, ADAPTER).sha256 == checked.sha256
    assert entry["scores"] == {}


def test_malformed_data_is_refused_with_line_numbers_and_attach_changes_nothing(
        studio_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n\n{"prompt": 1, "completion": "x"}\nnot json\n'
                   '{"prompt": "p", "chosen": "a", "rejected": "b"}\n'
                   '{"messages": [{"role": "user", "content": "hi"}]}\n')
    with pytest.raises(data.DataError) as caught:
        score_sets.read_set(bad)
    message = caught.value.message
    for line in ("line 3: prompt must be a string", "line 4: not valid JSON", "line 5:",
                 "line 6: messages have no assistant turn"):
        assert line in message
    assert "line 1" not in message and message.startswith("bad.jsonl: 4 malformed lines")

    text = tmp_path / "bad.txt"
    text.write_bytes(b"first line\n\xff\xfe broken\n\nthird\n")
    with pytest.raises(data.DataError, match="line 2: not valid UTF-8"):
        score_sets.read_set(text)
    good_text = tmp_path / "lines.txt"
    good_text.write_text("one line\r\n\n   \nanother line\n")
    lines = score_sets.read_set(good_text)
    assert [(i.kind, i.line, i.target) for i in lines.items] == [
        ("text", 1, "one line"), ("text", 4, "another line")]
    assert lines.kind == "lines"

    catalog = demo_catalog()
    before = catalog.adapter(ADAPTER)["evaluation"]
    folder = evaluation.store_folder(catalog.adapter(ADAPTER))
    files = sorted(p.name for p in folder.iterdir())
    for path in (bad, text):
        assert cli.main(["eval", "attach", ADAPTER, "--data", str(path)]) == 3
        err = capsys.readouterr().err
        # One line, naming the file given (not the store's copy) and the line.
        assert err.count("\n") == 1 and err.startswith(f"error: {path.name}: ") and "line " in err
        assert Catalog().adapter(ADAPTER)["evaluation"] == before
        assert sorted(p.name for p in folder.iterdir()) == files
    assert cli.main(["eval", "attach", "no-such-adapter", "--data", str(good_text)]) == 4
    capsys.readouterr()
    # A good text file replaces the set (under its fixed name); the JSONL copy goes.
    assert cli.main(["eval", "attach", ADAPTER, "--data", str(good_text), "--json"]) == 0
    entry = json.loads(capsys.readouterr().out)
    assert (entry["file"], entry["rows"], entry["kind"]) == ("evaluation.txt", 2, "lines")
    assert (folder / "evaluation.txt").read_bytes() == good_text.read_bytes()
    assert not (folder / "evaluation.jsonl").exists()


def test_score_requests_are_checked_before_anything_is_scored(studio_home: Path) -> None:
    catalog = demo_catalog()
    spec = resolve.resolve(catalog, BASE, n_ctx=256)
    with pytest.raises(RefusedError):
        messages.ScoreItem("poem", "x")
    with pytest.raises(RefusedError):
        messages.Score(spec, ())
    client = EngineClient()
    try:
        handle = client.submit_raw("score", {"spec": spec.to_dict(), "items": [
            {"kind": "text", "target": ""}]})
        with pytest.raises(RefusedError, match="malformed score request"):
            handle.wait(TIMEOUT)
        # An item that does not fit the context is refused with its line, before any
        # other item is scored.
        items = (messages.ScoreItem("text", "A short line.", line=1),
                 messages.ScoreItem("text", "word " * 400, line=7))
        with pytest.raises(ContextOverflowError, match="line 7: .* do not fit the context"):
            client.call(messages.Score(spec, items), TIMEOUT)
    finally:
        client.close()


# --------------------------------------------------------------------------- the demo


def check_demo_scores(results: list[dict[str, Any]], backend: str,
                      lines: tuple[int, ...] = SUBSET) -> None:
    base, variant = results
    assert (base["name"], variant["name"]) == (BASE, VARIANT)
    assert {base["backend"], variant["backend"]} == {backend}
    for result in results:
        # Rows are numbered by their line in the subset file, in order.
        assert result["items"] == len(lines)
        assert [r["line"] for r in result["rows"]] == list(range(1, len(lines) + 1))
        assert result["tokens"] == sum(r["tokens"] for r in result["rows"]) > 0
        # The figures agree with the per-token log-probabilities they come from.
        for row in result["rows"]:
            assert len(row["logprobs"]) == row["tokens"]
            assert row["nll"] == pytest.approx(-sum(row["logprobs"]))
            assert all(lp <= 0 for lp in row["logprobs"])
        assert result["mean_nll"] == pytest.approx(result["nll"] / result["tokens"])
        assert result["perplexity"] == pytest.approx(math.exp(result["mean_nll"]))
        assert result["exact_items"] == len(lines)
    # Both sides score the same tokens of the same completions.
    assert [r["tokens"] for r in base["rows"]] == [r["tokens"] for r in variant["rows"]]
    # The variant finds the expected calls far likelier, and answers them exactly on
    # every row but those it gets wrong over all 60; the base on none.
    assert variant["mean_nll"] < base["mean_nll"] / 10
    assert all(v["nll"] < b["nll"] for v, b in zip(variant["rows"], base["rows"], strict=True))
    misses = {lines[r["line"] - 1] for r in variant["rows"] if not r["exact"]}
    assert VARIANT_MISSES[backend] & set(lines) <= misses
    assert misses <= (VARIANT_MISSES[backend] | NEAR_MISSES[backend]) & set(lines)
    assert variant["exact_matches"] == len(lines) - len(misses)
    assert base["exact_matches"] == 0 and variant["exact_match"] > base["exact_match"]
    for row in variant["rows"]:
        expected = json.loads(HELDOUT.read_text().splitlines()[lines[row["line"] - 1] - 1])
        if row["exact"]:
            assert row["answer"] == expected["messages"][-1]["content"]


@pytest.mark.slow
def test_base_and_demo_variant_on_llama(studio_home: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture) -> None:
    subset = subset_file(tmp_path)
    demo_catalog()
    # Attached as the demo adapter's evaluation set, the scores are kept and shown.
    assert cli.main(["eval", "attach", ADAPTER, "--data", str(subset)]) == 0
    capsys.readouterr()
    assert cli.main(["score", BASE, VARIANT, "--data", str(subset), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["data"]["rows"] == len(SUBSET) and out["data"]["kind"] == "chat"
    results = out["results"]
    check_demo_scores(results, "llama")
    assert all(r["recorded_on"] == [ADAPTER] for r in results)

    assert cli.main(["show", ADAPTER, "--json"]) == 0
    kept = json.loads(capsys.readouterr().out)["evaluation"]
    assert kept["sha256"] == out["data"]["sha256"] and kept["rows"] == len(SUBSET)
    for result in results:
        score = kept["scores"][result["name"]]["llama"]
        assert score["current"] is True and score["identity"] == result["identity"]
        assert (score["mean_nll"], score["exact_matches"]) == (result["mean_nll"],
                                                               result["exact_matches"])
    assert cli.main(["show", VARIANT]) == 0
    shown = capsys.readouterr().out
    assert f"evaluation set of {ADAPTER}" in shown
    assert f"{VARIANT} on llama: mean NLL {results[1]['mean_nll']:.4f}" in shown
    assert f"exact match {results[1]['exact_match']:.1%}" in shown

    # A text file: every line scored whole; the table on stdout; not the attached set,
    # so nothing is kept.
    lines = tmp_path / "prose.txt"
    lines.write_text("The river rose slowly through the night.\n\nBread is one of the "
                     "oldest prepared foods.\n")
    assert cli.main(["score", VARIANT, "--data", str(lines)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("data: prose.txt (2 items, lines")
    assert table[1].split() == ["model", "backend", "items", "tokens", "mean", "NLL",
                                "perplexity", "exact", "match"]
    assert table[2].split()[:3] == [VARIANT, "llama", "2"] and table[2].endswith("n/a")
    assert len(table) == 3  # no "kept" line
    assert Catalog().adapter(ADAPTER)["evaluation"]["scores"].keys() == {BASE, VARIANT}


@pytest.mark.slow
def test_base_and_demo_variant_on_openvino(studio_home: Path, tmp_path: Path,
                                           tmp_path_factory: pytest.TempPathFactory,
                                           capsys: pytest.CaptureFixture) -> None:
    from tests.openvino_helpers import register_default

    catalog = demo_catalog()
    register_default(catalog, tmp_path_factory)
    # Fewer rows than on llama.cpp: OpenVINO decodes every prompt whole (no prefix
    # cache), about 3 s a row for the variant here; two of the misses stay in.
    lines = (1, 2, 21, 44)
    subset = score_sets.read_set(subset_file(tmp_path, lines))
    results = score_sets.score_models(catalog, [BASE, VARIANT], subset, backend="openvino",
                                      per_token=True)
    check_demo_scores(results, "openvino", lines)
    # Served there by the OpenVINO default and the adapter's PEFT file.
    assert results[1]["adapters"][0]["sha256"] == catalog.adapter(ADAPTER)["files"][
        "openvino"]["sha256"]
    assert results[0]["recorded_on"] == results[1]["recorded_on"] == []  # not the set
    # The default profile: the one measured faster on this CPU (probe.preferred_profile).
    assert results[1]["openvino_profile"] == catalog.model(
        resolve.serving_base(catalog, VARIANT, "openvino"))["default_profile"]
    # Another profile on request, named in the table: the int8 profile answers too.
    two = subset_file(tmp_path, (1, 2))
    assert cli.main(["score", VARIANT, "--data", str(two), "--backend", "openvino",
                     "--profile", "fast-int8"]) == 0
    row = capsys.readouterr().out.splitlines()[2].split()
    assert row[:3] == [VARIANT, "openvino/fast-int8", "2"] and row[-2:] == ["100.0%", "(2/2)"]


@pytest.mark.slow
def test_scoring_interleaves_with_a_generation_and_cancels(studio_home: Path) -> None:
    catalog = demo_catalog()
    heldout = score_sets.read_set(HELDOUT)
    client = EngineClient()
    try:
        started: list[messages.Progress] = []
        under_way = threading.Event()

        def on_event(event: messages.Event) -> None:
            if isinstance(event, messages.Progress):
                started.append(event)
                under_way.set()

        score = client.submit(messages.Score(resolve.resolve(catalog, BASE), heldout.items,
                                             exact_match=True), on_event)
        assert under_way.wait(TIMEOUT)  # the first item is scored
        spec = resolve.resolve(catalog, VARIANT)
        generate = messages.Generate(spec, messages.Prompt("Set a timer for 5 minutes.",
                                                           chat=True),
                                     resolve.sampling(catalog, VARIANT, max_tokens=8))
        # Submitted while the evaluation runs, the answer comes before it ends.
        answer = client.call(generate, TIMEOUT)
        assert answer["token_ids"] and not score.done.is_set()
        assert started and started[-1].stage == f"scoring {BASE}"
        assert 0 < started[-1].fraction < 1
        client.cancel(score)
        with pytest.raises(Cancelled):
            score.wait(TIMEOUT)
        # The engine goes on serving after the cancel.
        assert client.call(generate, TIMEOUT)["token_ids"] == answer["token_ids"]
    finally:
        client.close()


# --------------------------------------------------------------------------- the window


@pytest.mark.slow
def test_the_evaluate_view_runs_shows_progress_keeps_scores_and_cancels(
        window: Any, qtbot: Any, tmp_path: Path) -> None:
    from tests.gui_helpers import LONG

    view = window.evaluate
    catalog = window.catalog
    subset = subset_file(tmp_path, (1, 2, 21))
    # Selecting the demo adapter: its base and variant checked, its set as the data.
    window.select(ADAPTER)
    assert view.checked() == [BASE, VARIANT]
    assert view.data.text() == str(evaluation.set_path(catalog, ADAPTER))
    score_sets.attach(catalog, ADAPTER, subset)
    view.data.setText(str(evaluation.set_path(catalog, ADAPTER)))
    window.open_evaluate()
    assert window.tabs.currentWidget() is view

    progress: list[int] = []
    announced: list[tuple[list, list]] = []
    view.progress.valueChanged.connect(progress.append)
    window.events.catalogChanged.connect(lambda k, n: announced.append((k, n)))
    with qtbot.waitSignal(view.runFinished, timeout=LONG) as finished:
        view.run()
        assert view.running() and view.cancel_button.isEnabled()
        assert not view.run_button.isEnabled()
    assert finished.args == ["finished"]
    assert not view.running() and view.run_button.isEnabled()
    assert progress and progress[-1] == 1000 and any(0 < p < 1000 for p in progress)
    assert view.table.rowCount() == 2
    cells = [[view.table.item(r, c).text() for c in range(8)] for r in range(2)]
    assert [c[:4] for c in cells] == [[BASE, "llama", "3", cells[0][3]],
                                      [VARIANT, "llama", "3", cells[0][3]]]
    assert cells[0][6] == "0.0% (0/3)" and cells[1][6] == "66.7% (2/3)"
    # The demo's answers are tool calls ({"tool", "args"}): judged as calls too, where
    # every exact answer is also the same call.
    assert cells[0][7] == "0.0% (0/3)" and cells[1][7] in ("66.7% (2/3)", "100.0% (3/3)")
    assert float(cells[1][4]) < float(cells[0][4])
    assert [c.series.count() for c in view.charts] == [3, 3]
    assert [c.misses.count() for c in view.charts] == [3, 1]  # every base row; line 21
    # Kept on the adapter's set and announced: the detail pane shows it.
    assert (["evaluation"], [ADAPTER, VARIANT]) in announced
    kept = Catalog().adapter(ADAPTER)["evaluation"]["scores"]
    assert kept[VARIANT]["llama"]["exact_matches"] == 2
    window.select(ADAPTER)
    assert f"Evaluation set of {ADAPTER}" in window.detail.browser.toPlainText()
    assert "exact match 66.7% (2/3)" in window.detail.browser.toPlainText()

    # Cancel: the whole held-out set, stopped once it is under way.
    view.set_data(HELDOUT)
    view.set_checked([BASE])
    scores_before = Catalog().adapter(ADAPTER)["evaluation"]["scores"]
    progress.clear()
    with qtbot.waitSignal(view.runFinished, timeout=LONG) as stopped:
        view.run()
        qtbot.waitUntil(lambda: bool(progress) and progress[-1] > 0, timeout=LONG)
        view.cancel()
    assert stopped.args == ["cancelled"]
    assert view.table.rowCount() == 0 and "cancelled" in view.status.text()
    assert Catalog().adapter(ADAPTER)["evaluation"]["scores"] == scores_before
    assert view.run_button.isEnabled() and not view.cancel_button.isEnabled()
