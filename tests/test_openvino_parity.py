"""One adapter, both backends: GGUF <-> PEFT conversion with the q/k row permutation,
per-backend files in the catalog, and the same behaviour on llama.cpp and OpenVINO.

Tolerances (docs/formats.md, "Parity"): on the same F16 weights, KL(llama.cpp ||
OpenVINO) of the next-token distribution is at most 1e-3 nats at every position and
the first greedy tokens agree on every prompt. Between the two curated defaults
(llama.cpp on Q4_1, OpenVINO on the F16 copy) at most 0.05 nats per position and 0.01
on average. A conversion that forgets the permutation misses by 50x or more.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine import cli
from engine.catalog import imports, resolve
from engine.catalog.store import AdapterSpec, Catalog
from engine.cli import run_cmds
from engine.curated import openvino_default
from engine.curated.embedded import DEFAULT_MODEL_NAME
from engine.formats import gguf_file, lora_io
from engine.runtime import messages
from engine.runtime.client import EngineClient
from engine.runtime.results import CrossCheckResult
from tests import factories as f
from tests.openvino_helpers import first_build, register_default

OV = openvino_default.NAME
ROLES = ("attn_q", "attn_k", "attn_v", "attn_output")
PROMPTS = tuple(messages.Prompt(text, chat=True) for text in run_cmds.PARITY_PROMPTS)


def test_gguf_to_peft_and_back_keeps_every_value(tmp_path: Path, base_info,
                                                 capsys: pytest.CaptureFixture,
                                                 studio_home: Path) -> None:
    source = f.write_gguf_lora(tmp_path / "all.gguf", base_info, roles=f.LLAMA_ROLES,
                               seed=4, layers=range(3))
    assert cli.main(["adapter", "convert-file", str(source), str(tmp_path / "peft")]) == 0
    assert cli.main(["adapter", "convert-file", str(tmp_path / "peft"),
                     str(tmp_path / "back.gguf")]) == 0
    capsys.readouterr()
    original, peft = lora_io.read_gguf(source), lora_io.read_peft(tmp_path / "peft")
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (8, 16.0)
    for module, (a, b) in original.layers.items():
        pa, pb = peft.layers[module]
        assert np.array_equal(pa, a)
        heads = {"attn_q": 9, "attn_k": 3}.get(f.naming.role_of(module))
        if heads:  # llama.cpp's per-head row order undone on B
            assert not np.array_equal(pb, b)
            assert np.array_equal(pb, lora_io.unpermute_rows(b, heads))
            assert np.array_equal(lora_io.permute_rows(pb, heads), b)
        else:
            assert np.array_equal(pb, b)
    before, after = gguf_file.read_header(source), gguf_file.read_header(tmp_path / "back.gguf")
    assert set(before.tensors) == set(after.tensors) and len(before.tensors) == 42
    for name in before.tensors:
        assert np.array_equal(gguf_file.read_tensor(before, name),
                              gguf_file.read_tensor(after, name)), name
    for key in ("general.type", "general.architecture", "adapter.type", "adapter.lora.alpha"):
        assert after.get(key) == before.get(key), key


@pytest.mark.slow
def test_an_adapter_carries_a_file_per_backend_and_its_variant_runs_on_both(
        studio_home: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
        base_info, capsys: pytest.CaptureFixture) -> None:
    catalog = Catalog()
    register_default(catalog, tmp_path_factory)
    weights = f.lora_weights(base_info, roles=ROLES, seed=3)
    weights.base_sha256 = catalog.model(DEFAULT_MODEL_NAME)["sha256"]
    lora_io.write_gguf(tmp_path / "style.gguf", weights)
    assert cli.main(["adapter", "add", "style", "--base", DEFAULT_MODEL_NAME, "--file",
                     str(tmp_path / "style.gguf"), "--strict"]) == 0
    assert cli.main(["variant", "add", "vs", "--base", DEFAULT_MODEL_NAME, "--adapter",
                     "style:0.5"]) == 0
    capsys.readouterr()
    assert cli.main(["show", "vs", "--json"]) == 0
    backends = json.loads(capsys.readouterr().out)["backends"]
    assert backends["llama"]["available"] is True
    assert backends["openvino"] == {"available": False, "reason": (
        "adapter style has no openvino file (add one with `variant-studio adapter convert "
        "style`)")}
    assert cli.main(["adapter", "convert", "style"]) == 0
    assert "added a openvino file (peft" in capsys.readouterr().out
    assert cli.main(["show", "style", "--json"]) == 0
    files = json.loads(capsys.readouterr().out)["files"]
    assert set(files) == {"llama", "openvino"}
    assert (files["llama"]["format"], files["openvino"]["format"]) == ("gguf", "peft")
    assert files["llama"]["sha256"] != files["openvino"]["sha256"]
    assert files["openvino"]["base"] == OV and files["llama"]["primary"] is True
    # The declared base digest follows the conversion: strict checks pass on both sides.
    assert files["llama"]["status"] == files["openvino"]["status"] == "pass"
    assert cli.main(["show", "vs", "--json"]) == 0
    backends = json.loads(capsys.readouterr().out)["backends"]
    assert backends["openvino"]["available"] is True and backends["openvino"]["base"] == OV
    assert backends["llama"]["identity"] != backends["openvino"]["identity"]
    assert [a["sha256"] for a in backends["openvino"]["adapters"]] == [
        files["openvino"]["sha256"]]
    assert backends["openvino"]["identity"] == (
        resolve.identity(catalog, "vs", backend="openvino").key)
    assert cli.main(["remove", OV]) == 3  # the adapter's OpenVINO file depends on it
    assert "used by style" in capsys.readouterr().err


@pytest.fixture(scope="module")
def parity_world(module_home: Path, tmp_path_factory: pytest.TempPathFactory, base_info
                 ) -> Iterator[tuple[Catalog, EngineClient]]:
    tmp = tmp_path_factory.mktemp("ov-parity")
    catalog = Catalog()
    register_default(catalog, tmp_path_factory)
    source = f.write_gguf_lora(tmp / "style.gguf", base_info, roles=ROLES, seed=3,
                               strength=0.05)
    imports.add_adapter(catalog, "style", DEFAULT_MODEL_NAME, source)
    imports.convert_adapter(catalog, "style", "openvino")
    catalog.add_variant("vs", DEFAULT_MODEL_NAME, [AdapterSpec("style", 1.0)])
    # llama.cpp on the very F16 weights the OpenVINO default was built from.
    f16 = Path(first_build(tmp_path_factory)["result"]["f16_gguf"])
    imports.add_model(catalog, "f16", f16, "llama")
    imports.add_adapter(catalog, "style16", "f16", source)
    catalog.add_variant("vs16", "f16", [AdapterSpec("style16", 1.0)])
    # The same GGUF moved to PEFT without undoing llama.cpp's q/k row order: wrong.
    imports.add_adapter(catalog, "raw", DEFAULT_MODEL_NAME, source)
    lora_io.write_peft(tmp / "raw", lora_io.read_gguf(source))
    imports.add_adapter_file(catalog, "raw", OV, tmp / "raw")
    catalog.add_variant("vraw", DEFAULT_MODEL_NAME, [AdapterSpec("raw", 1.0)])
    # An OpenVINO file with two tensors for a layer the model lacks (layer 99): our
    # coverage check warns and accepts it; OpenVINO GenAI prints its own warnings.
    imports.add_adapter(catalog, "extra", DEFAULT_MODEL_NAME, source)
    imports.add_adapter_file(catalog, "extra", OV,
                             with_unknown_layer(tmp / "extra", source, base_info))
    catalog.add_variant("vextra", DEFAULT_MODEL_NAME, [AdapterSpec("extra", 1.0)])
    client = EngineClient()
    yield catalog, client
    client.close()


UNKNOWN_LAYER = [f"base_model.model.model.layers.99.self_attn.{r}" for r in ("q_proj", "v_proj")]


def with_unknown_layer(folder: Path, source: Path, base_info) -> Path:
    """`source` converted to PEFT, plus q/v tensors for a layer 99 the model does not have."""
    from safetensors.numpy import load_file, save_file

    lora_io.write_peft(folder, lora_io.gguf_to_peft(lora_io.read_gguf(source),
                                                   base_info.head_count, base_info.head_count_kv))
    weights = folder / "adapter_model.safetensors"
    tensors = load_file(str(weights))
    rng = np.random.default_rng(9)
    shapes = base_info.module_shapes()
    for key in UNKNOWN_LAYER:
        # Shaped like layer 0's projection of the same role: only the layer is wrong.
        out_f, in_f = shapes[key.removeprefix("base_model.model.").replace(".99.", ".0.")]
        tensors[f"{key}.lora_A.weight"] = rng.normal(0, 0.05, (8, in_f)).astype(np.float32)
        tensors[f"{key}.lora_B.weight"] = rng.normal(0, 0.05, (out_f, 8)).astype(np.float32)
    save_file(tensors, str(weights), metadata={"format": "pt"})
    return folder


def cross(catalog: Catalog, client: EngineClient, first: str, second: str,
          first_backend: str = "llama") -> dict[str, Any]:
    return client.call(messages.CrossCheck(
        resolve.resolve(catalog, first, backend=first_backend),
        # Parity is the exact profile's job (F16 weights at f32); `fast` is measured in
        # test_openvino_profiles.py.
        resolve.resolve(catalog, second, backend="openvino", ov_profile="exact"), PROMPTS, 8),
        timeout=1200)


@pytest.mark.slow
def test_converted_adapter_behaves_on_openvino_as_the_original_on_llama_cpp(
        parity_world) -> None:
    catalog, client = parity_world
    same = cross(catalog, client, "vs16", "vs")
    assert same["first"]["backend"] == "llama" and same["second"]["backend"] == "openvino"
    assert all(row["same_token_ids"] for row in same["prompts"])
    assert same["max_kl"] <= 1e-3, same["max_kl"]
    assert same["top1_agreement"] == 1.0
    assert same["first_token_agreement"] == 1.0
    assert same["min_agreeing_tokens"] >= 4
    defaults = cross(catalog, client, "vs", "vs")
    assert defaults["max_kl"] <= 0.05 and defaults["mean_kl"] <= 0.01, defaults["max_kl"]
    assert defaults["first_token_agreement"] >= 0.75  # Q4_1 vs F16 may flip a near tie
    wrong = cross(catalog, client, "vs16", "vraw")
    assert wrong["max_kl"] >= 0.05 and wrong["max_kl"] >= 50 * max(same["max_kl"], 1e-6)
    # The adapter really acts: without it the distributions move far more than the noise.
    plain = client.call(messages.CrossCheck(resolve.resolve(catalog, "vs16"),
                                            resolve.resolve(catalog, "f16"), PROMPTS[:2], 4),
                        timeout=1200)
    assert plain["max_kl"] >= 0.05


PARITY_PROMPT = "What is the capital of France?"


def parity_json(capsys: pytest.CaptureFixture, *args: str) -> dict[str, Any]:
    """`variant-studio parity ... --json` (a fresh engine process, as for a user)."""
    capsys.readouterr()
    assert cli.main(["parity", *args, "--tokens", "4", "--prompt", PARITY_PROMPT,
                     "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def parity_text(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch,
                result: dict[str, Any], *args: str) -> str:
    """The text report for an engine result already measured (no second engine run)."""
    monkeypatch.setattr(run_cmds, "run_once", lambda request, on_event=None: (
        CrossCheckResult.from_dict({k: v for k, v in result.items() if k != "recorded_for"})))
    capsys.readouterr()
    assert cli.main(["parity", *args, "--tokens", "4", "--prompt", PARITY_PROMPT]) == 0
    monkeypatch.undo()
    return capsys.readouterr().out


@pytest.mark.slow
def test_parity_command_reports_kl_agreement_backends_and_no_openvino_warning(
        parity_world, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    catalog, _ = parity_world
    for genai in (False, True):
        result = parity_json(capsys, "vs", *(["--genai"] if genai else []))
        assert (result["first"]["backend"], result["second"]["backend"]) == ("llama",
                                                                             "openvino")
        assert result["first"]["name"] == result["second"]["name"] == "vs"
        # `parity` compares with the exact profile (F16 weights at f32) unless told.
        assert result["second"]["identity"] == (
            resolve.identity(catalog, "vs", backend="openvino", ov_profile="exact").key)
        (row,) = result["prompts"]
        assert row["same_token_ids"] and len(row["kl"]) == len(row["first"]) == 4
        # The curated defaults' tolerance (docs/formats.md, "Parity").
        assert result["max_kl"] <= 0.05 and result["mean_kl"] <= 0.01, result["max_kl"]
        assert result["first_token_agreement"] == 1.0 and row["agreeing_tokens"] >= 1
        # Captured, and empty: every tensor of this adapter attaches.
        assert result["openvino_warnings"] == [] and result["unused_lora_tensors"] == []
        assert result["recorded_for"] == ["style"]
        assert ("genai" in result) is genai
    genai_report = result["genai"]
    assert genai_report["mode"] == "MODE_DYNAMIC" and genai_report["unused_tensors"] == []
    assert genai_report["warnings"] == []
    assert genai_report["agreeing_tokens"][0] >= 3, genai_report  # GenAI's LoRA agrees
    text = parity_text(capsys, monkeypatch, result, "vs", "--genai")
    assert "vs: llama [" in text and "vs openvino [" in text
    assert "OpenVINO warnings on stderr: none; unused LoRA tensors: none" in text
    # The adapter's own report keeps the latest run.
    assert cli.main(["show", "style", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    found = shown["files"]["openvino"]["cross_check"]
    assert found["via"] == "vs" and found["genai"] is True
    assert found["openvino_warnings"] == [] and found["unused_lora_tensors"] == []
    assert found["max_kl"] == result["max_kl"]
    assert next(c for c in shown["checks"]
                if c["name"] == "cross-check (openvino)")["status"] == "pass"
    assert shown["files"]["llama"]["cross_check"] is None  # nothing checked it there


@pytest.mark.slow
def test_openvino_warnings_reach_the_parity_report_and_the_adapters_show(
        parity_world, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    result = parity_json(capsys, "vextra", "--genai")
    assert sorted(result["unused_lora_tensors"]) == UNKNOWN_LAYER
    assert any("There unused LoRA tensors" in line for line in result["openvino_warnings"])
    assert sum("Unused LoRA tensor:" in line for line in result["openvino_warnings"]) >= 2
    assert sorted(result["genai"]["unused_tensors"]) == UNKNOWN_LAYER
    assert result["max_kl"] <= 0.05  # the tensors that do attach are the same on both
    text = parity_text(capsys, monkeypatch, result, "vextra", "--genai")
    assert "unused LoRA tensors: 2" in text
    assert "stderr: " in text and "There unused LoRA tensors" in text
    assert cli.main(["show", "extra", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    # Our own coverage check had already warned about it, and accepted it.
    assert shown["files"]["openvino"]["status"] == "warn"
    check = next(c for c in shown["checks"] if c["name"] == "cross-check (openvino)")
    assert check["status"] == "warn" and "unused LoRA tensors: 2" in check["detail"]
    assert sorted(shown["files"]["openvino"]["cross_check"]["unused_lora_tensors"]) == (
        UNKNOWN_LAYER)
    assert cli.main(["show", "extra"]) == 0
    assert "parity --genai vextra" in capsys.readouterr().out
