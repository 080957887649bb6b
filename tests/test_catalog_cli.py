"""The foundation through the real CLI: first run, adapter import, refusals, variants."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine import cli
from engine.catalog.store import Catalog
from engine.curated import setup
from engine.curated.embedded import DEFAULT_MODEL_NAME
from engine.formats import lora_io
from engine.formats.artifacts import BaseModelInfo
from tests import factories as f
from tests import gguf_bytes as gb

BASE = DEFAULT_MODEL_NAME


def run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture, *argv: str) -> dict:
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_fresh_home_lists_the_embedded_base_through_the_console_script(
        studio_home: Path, embedded_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "engine.cli", "list", "--json"],
                         capture_output=True, text=True, check=True, env=os.environ.copy())
    listing = json.loads(out.stdout)
    assert set(listing) == {"models", "adapters", "variants"}
    (model,) = [m for m in listing["models"] if m["built"]]
    # The OpenVINO default is shown as available, not built (nothing was built).
    assert [m["name"] for m in listing["models"] if not m["built"]] == [
        "smollm2-135m-instruct-openvino"]
    import hashlib
    assert model["name"] == BASE and model["curated"] is True and model["backend"] == "llama"
    assert model["sha256"] == hashlib.sha256(embedded_path.read_bytes()).hexdigest()
    assert model["path"] == str(embedded_path)


def test_embedded_base_inspection(base_info: BaseModelInfo) -> None:
    assert base_info.architecture == "llama"
    assert (base_info.block_count, base_info.embedding_length) == (30, 576)
    assert (base_info.head_count, base_info.head_count_kv) == (9, 3)
    assert base_info.feed_forward_length == 1536 and base_info.vocab_size == 49152
    assert base_info.context_length == 8192 and base_info.tokenizer == "gpt2"
    assert base_info.chat_template and "im_start" in base_info.chat_template
    assert dict(base_info.tensor_types) == {"F32": 61, "Q4_1": 210, "Q8_0": 1}
    assert base_info.module_shapes()["model.layers.0.self_attn.k_proj"] == (192, 576)


def test_import_a_gguf_lora_and_show_it(studio_home: Path, tmp_path: Path,
                                        base_info: BaseModelInfo,
                                        capsys: pytest.CaptureFixture) -> None:
    source = f.write_gguf_lora(tmp_path / "style.gguf", base_info)
    code, out, err = run(capsys, "adapter", "add", "style", "--base", BASE, "--file",
                         str(source), "--source", "https://example.org/style")
    assert code == 0, err
    shown = run_json(capsys, "show", "style")
    import hashlib
    assert shown["kind"] == "adapter"
    assert shown["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    assert shown["rank"] == 8 and shown["alpha"] == 16.0
    assert shown["targets"] == ["attn_q", "attn_v"]
    assert shown["curated"] is False and shown["verified"] is False
    assert shown["source"] == "https://example.org/style"
    statuses = {c["name"]: c["status"] for c in shown["checks"]}
    assert all(statuses[n] == "pass" for n in
               ("digest", "format", "structure", "architecture", "coverage", "shapes",
                "rank", "alpha", "dtype", "values"))
    assert statuses["expected base"] == "warn"  # user-provided, unverified
    # The adapter is a copy in the store: editing the source changes nothing.
    stored = Path(shown["path"])
    assert stored.is_relative_to(studio_home) and stored.read_bytes() == source.read_bytes()
    source.write_bytes(b"changed")
    assert run_json(capsys, "show", "style")["status"] == "warn"


def test_strict_import_needs_a_declared_base_digest(studio_home: Path, tmp_path: Path,
                                                   base_info: BaseModelInfo,
                                                   capsys: pytest.CaptureFixture) -> None:
    source = f.write_gguf_lora(tmp_path / "a.gguf", base_info)
    code, _, err = run(capsys, "adapter", "add", "a", "--base", BASE, "--file", str(source),
                       "--strict")
    assert code == 3 and "must declare the sha256" in err
    sha = run_json(capsys, "show", BASE)["sha256"]
    weights = f.lora_weights(base_info)
    weights.base_sha256 = sha
    lora_io.write_gguf(tmp_path / "b.gguf", weights)
    code, _, err = run(capsys, "adapter", "add", "a", "--base", BASE, "--file",
                       str(tmp_path / "b.gguf"), "--strict")
    assert code == 0, err
    assert run_json(capsys, "show", "a")["verified"] is True


def _hostile_adapters(tmp: Path, base: BaseModelInfo, embedded: Path) -> dict[str, Path]:
    cases: dict[str, Path] = {}

    def put(name: str, data: bytes) -> None:
        cases[name] = tmp / f"{name}.gguf"
        cases[name].write_bytes(data)

    put("empty file", b"")
    put("random bytes", np.random.default_rng(1).bytes(4096))
    good = f.write_gguf_lora(tmp / "good.gguf", base).read_bytes()
    put("truncated gguf", good[: len(good) // 2])
    put("header-only gguf", gb.raw([gb.kv_str("general.architecture", "llama"),
                                      gb.kv_str("general.type", "adapter")]))
    put("absurd tensor count", gb.raw([], n_tensors=2**60))
    cases["a directory"] = tmp / "folder"
    cases["a directory"].mkdir()
    loop = tmp / "loop.gguf"
    os.symlink(loop, loop)
    cases["a symlink loop"] = loop
    cases["a base model"] = embedded
    other = f.lora_weights(base)
    other.architecture = "qwen2"
    lora_io.write_gguf(tmp / "other-arch.gguf", other)
    cases["another architecture"] = tmp / "other-arch.gguf"
    wrong = f.lora_weights(base)
    a, b = wrong.layers["model.layers.0.self_attn.q_proj"]
    wrong.layers["model.layers.0.self_attn.q_proj"] = (a[:, :512], b)
    lora_io.write_gguf(tmp / "wrong-shape.gguf", wrong)
    cases["wrong shapes"] = tmp / "wrong-shape.gguf"
    cases["missing lora_b"] = _without_tensor(tmp, base, "blk.3.attn_v.weight.lora_b")
    put("no lora tensors", _gguf_adapter_with_tensor("blk.0.attn_q.weight"))
    nan = f.lora_weights(base, alpha=math.nan)
    lora_io.write_gguf(tmp / "nan-alpha.gguf", nan)
    cases["NaN alpha"] = tmp / "nan-alpha.gguf"
    cases["other backend"] = f.write_peft_lora(tmp / "peft", base)
    return cases


def _without_tensor(tmp: Path, base: BaseModelInfo, drop: str) -> Path:
    import gguf

    weights = f.lora_weights(base)
    path = tmp / "missing-b.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", 16.0)
    from engine.formats import naming
    for module, (a, b) in weights.layers.items():
        name = naming.module_to_gguf(module)
        writer.add_tensor(f"{name}.lora_a", a)
        if f"{name}.lora_b" != drop:
            writer.add_tensor(f"{name}.lora_b", b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _gguf_adapter_with_tensor(name: str) -> bytes:
    data = np.zeros(576 * 576, dtype=np.float32).tobytes()
    return gb.raw(
        [gb.kv_str("general.architecture", "llama"),
         gb.kv_str("general.type", "adapter"),
         gb.kv_str("adapter.type", "lora"),
         gb.kv_f32("adapter.lora.alpha", 16.0)],
        [gb.tensor_info(name, (576, 576), 0, 0)], data)


EXPECTED_REASONS = {
    "empty file": "empty file",
    "random bytes": "not a GGUF or safetensors",
    "truncated gguf": "past the end",
    "header-only gguf": "no LoRA tensors",
    "absurd tensor count": "tensors, more than the file can hold",
    "a directory": "a directory",
    "a symlink loop": "symlink loop",
    "a base model": "is a base model",
    "another architecture": "adapter is for 'qwen2'",
    "wrong shapes": "wrong shapes",
    "missing lora_b": "has no lora_b",
    "no lora tensors": "no LoRA tensors",
    "NaN alpha": "alpha is NaN",
    "other backend": "PEFT safetensors",
}


def test_bad_adapters_are_refused_and_change_nothing(
        studio_home: Path, tmp_path: Path, base_info: BaseModelInfo, embedded_path: Path,
        capsys: pytest.CaptureFixture) -> None:
    setup.first_run(Catalog(), with_demo=True)  # what every command that writes does first
    catalog = studio_home / "catalog.json"
    before = catalog.read_bytes()
    cases = _hostile_adapters(tmp_path, base_info, embedded_path)
    assert set(cases) == set(EXPECTED_REASONS)
    for label, path in cases.items():
        code, out, err = run(capsys, "adapter", "add", "bad", "--base", BASE, "--file",
                             str(path))
        lines = err.strip().splitlines()
        assert code == 3, (label, err)
        assert len(lines) == 1 and lines[0].startswith("error: "), (label, err)
        assert EXPECTED_REASONS[label] in lines[0], (label, lines[0])
        assert "Traceback" not in err
        assert catalog.read_bytes() == before, label
    assert not (studio_home / "adapters" / "bad").exists()
    assert [p.name for p in (studio_home / "adapters").iterdir()] == []


def test_variants_refuse_bad_scales_and_show_identity(
        studio_home: Path, tmp_path: Path, base_info: BaseModelInfo,
        capsys: pytest.CaptureFixture) -> None:
    for name, seed in (("a", 1), ("b", 2)):
        path = f.write_gguf_lora(tmp_path / f"{name}.gguf", base_info, seed=seed)
        assert run(capsys, "adapter", "add", name, "--base", BASE, "--file", str(path))[0] == 0
    catalog = studio_home / "catalog.json"
    before = catalog.read_bytes()
    for scale, reason in (("nan", "NaN"), ("inf", "infinite"), ("-1", "negative"),
                          ("1e9", "absurd")):
        code, _, err = run(capsys, "variant", "add", "v", "--base", BASE, "--adapter",
                           f"a:{scale}")
        assert code == 3 and reason in err and len(err.strip().splitlines()) == 1
        assert catalog.read_bytes() == before
    assert run(capsys, "variant", "add", "ab", "--base", BASE, "--adapter", "a:0.5",
               "--adapter", "b")[0] == 0
    assert run(capsys, "variant", "add", "ba", "--base", BASE, "--adapter", "b",
               "--adapter", "a:0.5")[0] == 0
    listing = run_json(capsys, "list")
    variants = {v["name"]: v for v in listing["variants"]}
    assert variants["ab"]["adapters"][0] == {
        "name": "a", "scale": 0.5, "sha256": run_json(capsys, "show", "a")["sha256"]}
    assert variants["ab"]["identity"] != variants["ba"]["identity"]
    shown = run_json(capsys, "show", "ab")
    assert shown["kind"] == "variant" and shown["identity"] == variants["ab"]["identity"]
    assert all(c["status"] != "fail" for c in shown["checks"])
    # An adapter used by a variant cannot be removed; a variant can.
    code, _, err = run(capsys, "remove", "a")
    assert code == 3 and "used by" in err
    assert run(capsys, "remove", "ab")[0] == 0
    assert run(capsys, "remove", "ba")[0] == 0
    assert run(capsys, "remove", "a")[0] == 0
    assert not (studio_home / "adapters" / "a").exists()


def test_exit_codes_for_usage_and_unknown_names(studio_home: Path,
                                                capsys: pytest.CaptureFixture) -> None:
    code, _, err = run(capsys, "show", "nope")
    assert code == 4 and err.startswith("error: no model, adapter or variant named")
    code, _, err = run(capsys, "adapter", "add", "x")
    assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1
    code, _, err = run(capsys, "variant", "add", "../evil", "--base", BASE, "--adapter", "a")
    assert code == 2 and "invalid variant name" in err


def test_doctor_and_status(studio_home: Path, capsys: pytest.CaptureFixture) -> None:
    report = run_json(capsys, "doctor")
    names = {c["name"]: c for c in report["checks"]}
    assert names["llama-cpp-python"]["detail"] == "0.3.36"
    assert names[f"model {BASE}"]["status"] == "pass"
    status = run_json(capsys, "status")
    assert status["catalog"]["models"] == 1 and status["data_dir"] == str(studio_home)


def test_changed_base_is_reported_not_served(studio_home: Path, tmp_path: Path,
                                             embedded_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(embedded_path.read_bytes())
    assert run(capsys, "model", "add", "mine", "--file", str(copy))[0] == 0
    with copy.open("r+b") as handle:
        handle.seek(-1, 2)
        handle.write(b"\x01")
    (model,) = [m for m in run_json(capsys, "list")["models"] if m["name"] == "mine"]
    assert model["status"] == "changed" and "changed on disk" in model["problem"]
    code, _, err = run(capsys, "adapter", "add", "x", "--base", "mine", "--file", str(copy))
    assert code == 3 and "changed on disk" in err


def test_an_adapter_that_failed_its_served_check_is_marked_everywhere(
        studio_home: Path, tmp_path: Path, base_info: BaseModelInfo,
        capsys: pytest.CaptureFixture) -> None:
    """A training run whose served check fell short imports its adapter marked
    (`served_check` on the record: engine.training.job.import_run); list, show and the
    library's entry all say so, with the reason."""
    from engine.catalog import imports
    from gui.library import snapshot

    setup.first_run(Catalog())
    reason = "the trainer and llama.cpp agree on the next token 81.6% of the time, under 93%"
    for name, passed in (("weak", False), ("fine", True)):
        imports.add_adapter(Catalog(), name, BASE, f.write_gguf_lora(tmp_path / f"{name}.gguf",
                                                                     base_info),
                            extra={"served_check": {"passed": passed,
                                                    "reason": "" if passed else reason}})
    code, out, _ = run(capsys, "list")
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert code == 0 and "served check failed" in lines["weak"]
    assert "served check" not in lines["fine"]
    checks = {c["name"]: c for c in run_json(capsys, "show", "weak")["checks"]}
    assert checks["served check"]["status"] == "fail"
    assert checks["served check"]["detail"] == reason
    assert run_json(capsys, "show", "fine")["served_check"]["passed"] is True
    entries = {e.name: e for e in snapshot(Catalog())["adapters"]}
    assert "served check failed" in entries["weak"].badges and reason in entries["weak"].problem
    assert "served check failed" not in entries["fine"].badges and entries["fine"].problem is None


def test_show_suggests_the_demo_before_the_first_run_as_generate_does(
        studio_home: Path, capsys: pytest.CaptureFixture) -> None:
    """`show` reads a preview before the first run (nothing written): a near miss of the
    demo's name is suggested there too, and the demo's own name is explained."""
    code, _, err = run(capsys, "show", "tool-call")
    assert code == 4 and err.strip().endswith("did you mean 'tool-calls'?")
    code, _, err = run(capsys, "show", "tool-calls")
    assert code == 4 and "set up at the first run" in err
    assert not studio_home.exists()  # still nothing written
    code, _, err = run(capsys, "generate", "tool-call", "--prompt", "x")
    assert code == 4 and err.strip().endswith("did you mean 'tool-calls'?")
