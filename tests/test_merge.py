"""`variant-studio merge`: a variant folded into a standalone GGUF, with what survived.

Fast: the format work (codes, plans, the base-grid writer, the survival figure) and bad
input refused in one line with nothing changed. Slow (the real model, llama.cpp's
quantizer in the merge worker): the demo merged into Q8_0 keeps its held-out answers and
is accepted, loads in plain llama-cpp-python and answers as the variant; merged into
the base's own Q4_1 grid it is erased, refused with its figures and kept only with
--allow-erased, labelled erased; a cancel leaves nothing behind.

Held-out figures are measured on a few rows (the whole set is benchmarks/bench_merge.py):
three greedy models per row are slow on a 2-core machine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

from engine import cli
from engine.catalog.store import Catalog
from engine.curated import demo, setup
from engine.curated.embedded import DEFAULT_MODEL_NAME
from engine.errors import Cancelled, RefusedError, UsageError
from engine.formats import gguf_file, lora_io, merge, naming
from engine.runtime.merge import records
from engine.state import paths

BASE = DEFAULT_MODEL_NAME
VARIANT = demo.VARIANT_NAME
ADAPTER = demo.resources_dir() / "adapter.gguf"
EVAL_ROWS, TASK_ROWS = "10", "5"


def run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def store_state() -> tuple[bytes, list[str]]:
    """The catalog's bytes and what the merged store holds (nothing may change)."""
    root = paths.data_dir() / "models"
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) if root.exists() \
        else []
    return paths.catalog_file().read_bytes(), files


# ------------------------------------------------------------------- format (fast)


@pytest.mark.parametrize("kind", [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0])
def test_codes_are_the_stored_integers(kind: Q) -> None:
    rng = np.random.default_rng(3)
    rows = rng.normal(size=(4, 64)).astype(np.float32)
    raw = quantize(rows, kind)
    codes = merge.codes(raw, kind)
    assert codes is not None and codes.size == rows.size
    # Moving one weight changes codes in its own block of 32 only (row 1, block 0).
    moved = rows.copy()
    moved[1, 5] += 5.0
    changed = (merge.codes(quantize(moved, kind), kind) != codes).reshape(-1, 32)
    assert changed.any(axis=1).tolist() == [False, False, True, False, False, False,
                                            False, False]
    assert np.array_equal(merge.dequantize(raw, kind), dequantize(raw, kind))


def test_survival_is_one_minus_the_kl_ratio() -> None:
    assert merge.survival(0.0, 1.3) == 1.0
    assert merge.survival(1.3, 1.3) == 0.0
    assert merge.survival(0.65, 1.3) == pytest.approx(0.5)
    assert merge.survival(0.1, 0.0) is None  # an adapter that changes nothing
    logits = np.array([2.0, 1.0, 0.0])
    assert merge.kl_rows(logits, logits) == pytest.approx(0.0, abs=1e-12)
    assert merge.kl_rows(logits, logits[::-1].copy()) > 0.5


def test_unknown_types_are_refused_in_one_line() -> None:
    assert merge.check_type("Q8_0") == "q8_0"
    with pytest.raises(UsageError, match="unknown merge type 'q9_9'"):
        merge.check_type("q9_9")


def test_a_mismatched_adapter_is_refused_before_anything_is_written(
        tmp_path: Path, embedded_path: Path) -> None:
    header = gguf_file.read_header(embedded_path)
    weights = lora_io.read_gguf(ADAPTER)
    a, b = weights.layers["model.layers.0.self_attn.q_proj"]
    weights.layers["model.layers.0.self_attn.q_proj"] = (a[:, :100], b)
    with pytest.raises(RefusedError, match="blk.0.attn_q.weight is \\[576, 576\\]"):
        merge.plan(header, [merge.MergePart("bad", weights, 1.0)])
    target = tmp_path / "never.gguf"
    with pytest.raises(RefusedError):
        merge.write_merged(embedded_path, [merge.MergePart("bad", weights, 1.0)], target,
                           "base")
    assert not target.exists()


@pytest.mark.slow
def test_the_base_grid_merge_copies_unadapted_tensors_byte_for_byte(
        tmp_path: Path, embedded_path: Path) -> None:
    """`--type base` with the gguf package's quantizer: unadapted tensors are the base's
    bytes, adapted ones keep their type, and the weight figures see the base's grid."""
    parts = [merge.MergePart("demo", lora_io.read_gguf(ADAPTER), 1.0)]
    target = tmp_path / "merged.gguf"
    fractions: list[float] = []
    written = merge.write_merged(embedded_path, parts, target, "base",
                                 provenance={"variant": "x"}, progress=fractions.append)
    assert fractions[-1] == 1.0 and fractions == sorted(fractions)
    base, out = gguf_file.read_header(embedded_path), gguf_file.read_header(target)
    assert list(out.tensors) == list(base.tensors)
    assert len(written.adapted) == 60
    for name, info in base.tensors.items():
        assert out.tensors[name].type_id == info.type_id
        same = merge.read_raw(out, name) == merge.read_raw(base, name)
        assert same != (name in written.adapted), name
    assert json.loads(out.get(merge.METADATA_KEY)) == {"variant": "x"}
    report = merge.measure_weights(embedded_path, target, parts, "base")
    assert report.tensors == 60 and report.method == "codes"
    assert report.types == {"Q4_1": 60}
    # The seed's finding on this model: almost every 4-bit code rounds back, and the
    # stored change carries a small part of the delta.
    assert report.rounded_back > 0.98 and report.delta_retained < 0.3


def tiny_base(path: Path, layers: int = 3, width: int = 64) -> Path:
    """A llama-shaped GGUF with Q4_1 q/v projections and F32 norms (not loadable by
    llama.cpp: only what the format work reads)."""
    import gguf

    rng = np.random.default_rng(5)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("llama.block_count", layers)
    for layer in range(layers):
        for role in ("attn_q", "attn_v"):
            values = (rng.normal(size=(width, width)) * 0.05).astype(np.float32)
            writer.add_tensor(f"blk.{layer}.{role}.weight", quantize(values, Q.Q4_1),
                              raw_dtype=Q.Q4_1)
        writer.add_tensor(f"blk.{layer}.attn_norm.weight", np.ones(width, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def tiny_adapter(layers: int, width: int, size: float) -> lora_io.LoraWeights:
    rng = np.random.default_rng(6)
    return lora_io.LoraWeights(8.0, 4, {
        f"model.layers.{n}.self_attn.{m}": (
            rng.normal(size=(4, width)).astype(np.float32),
            (rng.normal(size=(width, 4)) * size).astype(np.float32))
        for n in range(layers) for m in ("q_proj", "v_proj")})


def test_on_the_base_grid_a_small_delta_rounds_back_and_a_large_one_survives(
        tmp_path: Path) -> None:
    base = tiny_base(tmp_path / "base.gguf")
    figures = {}
    for size in (1e-4, 3e-2):
        parts = [merge.MergePart("a", tiny_adapter(3, 64, size), 1.0)]
        target = tmp_path / f"m{size}.gguf"
        written = merge.write_merged(base, parts, target, "base")
        head_b, head_m = gguf_file.read_header(base), gguf_file.read_header(target)
        assert merge.read_raw(head_m, "blk.0.attn_norm.weight") == merge.read_raw(
            head_b, "blk.0.attn_norm.weight")
        assert len(written.adapted) == 6
        figures[size] = merge.measure_weights(base, target, parts, "base")
    small, large = figures[1e-4], figures[3e-2]
    assert small.types == {"Q4_1": 6} and small.method == "codes"
    assert small.rounded_back > 0.99 and small.delta_retained < 0.1
    assert large.rounded_back < 0.5 and large.delta_retained > 0.8


def test_a_cancel_between_tensors_stops_the_merge(tmp_path: Path) -> None:
    base = tiny_base(tmp_path / "base.gguf")
    parts = [merge.MergePart("a", tiny_adapter(3, 64, 1e-2), 1.0)]
    calls = {"n": 0}

    def cancelled() -> bool:
        calls["n"] += 1
        return calls["n"] > 3

    with pytest.raises(Cancelled):
        merge.write_merged(base, parts, tmp_path / "x.gguf", "f16", cancelled=cancelled)
    assert calls["n"] == 4


# ---------------------------------------------------------------- bad input (fast)


@pytest.fixture(scope="module")
def home(module_home: Path) -> Path:
    assert setup.first_run(Catalog(), with_demo=True)
    assert VARIANT in Catalog().data()["variants"]
    return module_home


def test_bad_input_is_refused_in_one_line_and_changes_nothing(
        home: Path, capsys: pytest.CaptureFixture) -> None:
    (home / "models" / "someones").mkdir(parents=True)  # a store folder with no record
    before = store_state()
    cases = [
        (["merge", VARIANT, "--out", "someones", "--type", "q8_0"], 3,
         "already exists without a catalog record"),
        (["merge", "nope", "--out", "m1", "--type", "q8_0"], 4, "no model, adapter"),
        (["merge", BASE, "--out", "m1", "--type", "q8_0"], 2, "is a base model"),
        (["merge", demo.ADAPTER_NAME, "--out", "m1", "--type", "q8_0"], 2, "is an adapter"),
        (["merge", VARIANT, "--out", "m1", "--type", "q9_0"], 2, "invalid choice"),
        (["merge", VARIANT, "--out", BASE, "--type", "q8_0"], 2, "already used"),
        (["merge", VARIANT, "--out", VARIANT, "--type", "q8_0"], 2, "already used"),
        (["merge", VARIANT, "--out", "../x", "--type", "q8_0"], 2, "invalid model name"),
        (["merge", VARIANT, "--type", "q8_0"], 2, "--out"),
        (["merge", VARIANT, "--out", "m1", "--type", "q8_0", "--eval-rows", "0"], 2,
         "--eval-rows"),
    ]
    for argv, expected, words in cases:
        code, out, err = run(capsys, *argv)
        assert code == expected, (argv, err)
        assert out == "" and err.startswith("error: ") and err.count("\n") == 1, (argv, err)
        assert words in err, (argv, err)
        assert store_state() == before, argv
    assert (home / "models" / "someones").is_dir()  # named, never removed
    (home / "models" / "someones").rmdir()


def test_every_merge_option_has_help_and_docs() -> None:
    from engine.cli.parser import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    actions = sub.choices["merge"]._actions
    assert {o for a in actions for o in a.option_strings} >= {
        "--out", "--type", "--allow-erased", "--json", "--eval-rows", "--task-rows"}
    assert all(a.help for a in actions)
    docs = Path(__file__).parents[1] / "docs"
    assert "variant-studio merge VARIANT --out NAME --type" in (docs / "cli.md").read_text()
    assert str(merge.SURVIVAL_THRESHOLD) in (docs / "merge.md").read_text()


# ------------------------------------------------------------------- native (slow)


def merge_json(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, dict[str, Any], str]:
    code, out, err = run(capsys, "merge", *argv, "--eval-rows", EVAL_ROWS, "--task-rows",
                         TASK_ROWS, "--json")
    return code, json.loads(out), err


@pytest.fixture(scope="module")
def q8(home: Path) -> dict[str, Any]:
    """The demo merged into Q8_0 through the command line (once per module; capsys is
    per test, so the output is captured here)."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["merge", VARIANT, "--out", "tool-calls-q8", "--type", "q8_0",
                         "--eval-rows", EVAL_ROWS, "--task-rows", TASK_ROWS, "--json"])
    assert code == 0, err.getvalue()
    return json.loads(out.getvalue())


@pytest.mark.slow
def test_merging_the_demo_into_q8_0_keeps_it_and_is_accepted(
        q8: dict[str, Any], capsys: pytest.CaptureFixture) -> None:
    report = q8
    assert report["refused"] is False and report["accepted"] and not report["erased"]
    assert report["survival"] >= 0.95
    weights = report["weights"]
    assert weights["tensors"] == 60 and weights["types"] == {"Q8_0": 60}
    assert weights["delta_retained"] > 0.95
    task = report["task"]
    assert task["rows"] == int(TASK_ROWS) and report["eval_set"]["kind"] == "eval"
    assert task["base"]["strict"] == 0.0
    assert task["merged"]["strict"] == task["variant"]["strict"] >= 0.8

    catalog = Catalog()
    record = catalog.model("tool-calls-q8")
    found = record["merged_from"]
    adapter = catalog.adapter(demo.ADAPTER_NAME)
    assert found["variant"] == VARIANT and found["base"] == BASE
    assert found["base_sha256"] == catalog.model(BASE)["sha256"]
    assert found["adapters"] == [{"name": demo.ADAPTER_NAME, "sha256": adapter["sha256"],
                                  "scale": 1.0, "rank": 8, "alpha": 16.0}]
    assert found["type"] == "q8_0" and found["erased"] is False
    assert found["profile"]["system_prompt"] == demo.SYSTEM_PROMPT
    assert Path(record["path"]) == paths.model_store("tool-calls-q8") / "tool-calls-q8.gguf"
    assert record["metadata"]["file_type"] == "Q8_0"
    assert not list(records.store_root().glob(".merge-*"))  # no staging left

    code, out, _ = run(capsys, "show", "tool-calls-q8", "--json")
    shown = json.loads(out)
    assert code == 0 and shown["merge"].startswith("a merge, not a dynamic variant")
    assert shown["merged_from"]["erased"] is False
    check = next(c for c in shown["checks"] if c["name"] == "merge")
    assert check["status"] == "pass" and "survival" in check["detail"]
    code, out, _ = run(capsys, "show", "tool-calls-q8")
    assert "merge: a merge, not a dynamic variant: variant tool-calls" in out
    code, out, _ = run(capsys, "list", "--json")
    badge = next(m for m in json.loads(out)["models"] if m["name"] == "tool-calls-q8")
    assert badge["merged_from"] == {"variant": VARIANT, "type": "q8_0",
                                    "survival": report["survival"], "erased": False}
    code, out, _ = run(capsys, "doctor")
    line = next(x for x in out.splitlines() if "model tool-calls-q8" in x)
    assert "a merge, not a dynamic variant" in line and line.lstrip().startswith("✓")


@pytest.mark.slow
def test_the_merged_q8_0_answers_as_the_variant_in_plain_llama_cpp_python(
        q8: dict[str, Any]) -> None:
    import llama_cpp

    path = Catalog().model("tool-calls-q8")["path"]
    rows = [json.loads(line) for line in (demo.resources_dir() / "heldout.jsonl")
            .read_text().splitlines()[:3]]
    llm = llama_cpp.Llama(path, n_ctx=512, n_threads=1, verbose=False, seed=0)
    try:
        for row in rows:
            messages = [{"role": m["role"], "content": m["content"]}
                        for m in row["messages"][:2]]
            answer = llm.create_chat_completion(messages, temperature=0.0, max_tokens=48,
                                                repeat_penalty=1.0)
            text = answer["choices"][0]["message"]["content"]
            assert json.loads(text) == demo_expected(row), text
    finally:
        llm.close()


def demo_expected(row: dict[str, Any]) -> Any:
    return json.loads(row["messages"][-1]["content"])


@pytest.mark.slow
def test_a_merge_that_erases_the_fine_tune_is_refused_then_kept_labelled_erased(
        home: Path, capsys: pytest.CaptureFixture) -> None:
    before = store_state()
    code, out, err = run(capsys, "merge", VARIANT, "--out", "tool-calls-q41", "--type",
                         "base", "--eval-rows", EVAL_ROWS, "--task-rows", "3")
    assert code == 3 and err.count("\n") == 1 and "merge refused" in err, err
    assert f"below {merge.SURVIVAL_THRESHOLD:g}" in err and "--allow-erased" in err
    # The figures are shown: the base's own 4-bit grid rounds almost every weight back.
    assert "round back to the base's code" in out and "survival" in out
    assert "exact match base 0.00, variant 1.00, merged 0.00" in out
    assert store_state() == before

    code, report, err = merge_json(capsys, VARIANT, "--out", "tool-calls-q41", "--type",
                                   "base", "--allow-erased")
    assert code == 0, err
    assert report["accepted"] is False and report["erased"] is True
    assert report["survival"] < merge.SURVIVAL_THRESHOLD
    assert report["weights"]["rounded_back"] > 0.98
    assert report["weights"]["delta_retained"] < 0.3
    assert report["task"]["merged"]["strict"] == report["task"]["base"]["strict"] == 0.0
    record = Catalog().model("tool-calls-q41")
    assert record["merged_from"]["erased"] is True and record["merged_from"]["type"] == "base"
    assert record["metadata"]["file_type"] == Catalog().model(BASE)["metadata"]["file_type"]
    code, out, _ = run(capsys, "show", "tool-calls-q41", "--json")
    shown = json.loads(out)
    check = next(c for c in shown["checks"] if c["name"] == "merge")
    assert check["status"] == "warn" and "ERASED" in check["detail"]
    code, out, _ = run(capsys, "doctor")
    line = next(x for x in out.splitlines() if "model tool-calls-q41" in x)
    assert line.lstrip().startswith("!") and "ERASED" in line
    # A merged model lives in the model store: removing it removes its file.
    assert run(capsys, "remove", "tool-calls-q41")[0] == 0
    assert not paths.model_store("tool-calls-q41").exists()
    assert store_state() == before


@pytest.mark.slow
def test_a_cancelled_merge_leaves_nothing_behind(home: Path) -> None:
    from engine.runtime.merge import job as merge_job
    from engine.training import merge_eval

    catalog = Catalog()
    before = store_state()
    stages: list[str] = []

    def progress(stage: str, fraction: float) -> None:
        stages.append(stage)

    def cancelled() -> bool:
        return "quantizing" in stages  # while llama.cpp's quantizer runs

    with pytest.raises(Cancelled):
        merge_job.merge_variant(catalog, VARIANT, "never-added", "q4_k_m",
                                merge_eval.eval_set_for(catalog, VARIANT, limit=2),
                                task_rows=0, progress=progress, cancelled=cancelled)
    assert stages[0] == "verifying files" and "merging" in stages
    assert store_state() == before
    with pytest.raises(Exception, match="never-added"):
        catalog.find("never-added")


def test_gguf_order_is_kept_for_q_and_k(embedded_path: Path) -> None:
    """B·A is added in the GGUF's own row order: the adapter's B is already permuted."""
    header = gguf_file.read_header(embedded_path)
    weights = lora_io.read_gguf(ADAPTER)
    terms = merge.plan(header, [merge.MergePart("d", weights, 2.0)])
    a, b = weights.layers["model.layers.4.self_attn.q_proj"]
    expected = 2.0 * weights.alpha / weights.rank * (b.astype(np.float64) @ a)
    got = merge.delta_of(terms[naming.module_to_gguf("model.layers.4.self_attn.q_proj")])
    assert np.allclose(got, expected, atol=1e-6)
