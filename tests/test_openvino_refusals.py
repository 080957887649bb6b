"""Adapters the OpenVINO default must refuse, with exit 3 and a reason that gives the
coverage, before OpenVINO ever reads them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from engine import cli
from engine.catalog.store import Catalog
from engine.curated import openvino_default
from tests import factories as f
from tests.openvino_helpers import register_default

pytestmark = pytest.mark.slow  # each needs the OpenVINO default built (25-40 s)
OV = openvino_default.NAME


@pytest.fixture
def ov_home(studio_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    register_default(Catalog(), tmp_path_factory)
    return studio_home


def add(capsys: pytest.CaptureFixture, name: str, file: Path) -> tuple[int, str]:
    code = cli.main(["adapter", "add", name, "--base", OV, "--file", str(file)])
    out = capsys.readouterr()
    return code, out.out + out.err


def peft(folder: Path, tensors: dict[str, np.ndarray]) -> Path:
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    return folder


def test_names_that_match_no_layer_are_refused_with_the_coverage(
        ov_home: Path, tmp_path: Path, base_info, capsys: pytest.CaptureFixture) -> None:
    rng = np.random.default_rng(0)
    wrong = {}
    for layer in range(30):
        key = f"base_model.model.model.blocks.{layer}.attn.q"
        wrong[f"{key}.lora_A.weight"] = rng.normal(0, 0.1, (8, 576)).astype(np.float32)
        wrong[f"{key}.lora_B.weight"] = rng.normal(0, 0.1, (576, 8)).astype(np.float32)
    code, text = add(capsys, "wrong", peft(tmp_path / "wrong", wrong))
    assert code == 3
    assert "coverage: matches no layer: 0 of 60 tensors attach" in text
    assert "silently do nothing" in text
    # Canonical module names without PEFT's prefix: OpenVINO skips them without a word.
    weights = f.lora_io.gguf_to_peft(f.lora_weights(base_info, layers=range(2)), 9, 3)
    bare = {}
    for module, (a, b) in weights.layers.items():
        bare[f"{module}.lora_A.weight"] = a
        bare[f"{module}.lora_B.weight"] = b
    code, text = add(capsys, "bare", peft(tmp_path / "bare", bare))
    assert code == 3 and "0 of 8 tensors attach" in text
    assert not {"wrong", "bare"} & _adapters(capsys)  # nothing was added


def _adapters(capsys: pytest.CaptureFixture) -> set[str]:
    assert cli.main(["list", "--json"]) == 0
    return {a["name"] for a in json.loads(capsys.readouterr().out)["adapters"]}


def test_wrong_shapes_and_wrong_formats_are_refused(
        ov_home: Path, tmp_path: Path, base_info, capsys: pytest.CaptureFixture) -> None:
    rng = np.random.default_rng(1)
    key = "base_model.model.model.layers.0.self_attn.q_proj"
    shapes = {f"{key}.lora_A.weight": rng.normal(0, 0.1, (8, 576)).astype(np.float32),
              f"{key}.lora_B.weight": rng.normal(0, 0.1, (192, 8)).astype(np.float32)}
    code, text = add(capsys, "shapes", peft(tmp_path / "shapes", shapes))
    assert code == 3 and "shapes: 1 layer(s) with wrong shapes" in text
    assert "is 576x576" in text
    gguf = f.write_gguf_lora(tmp_path / "a.gguf", base_info)
    code, text = add(capsys, "gguf", gguf)
    assert code == 3 and "a GGUF LoRA (llama.cpp), but the base runs on OpenVINO" in text


def malformed_cases(tmp: Path) -> dict[str, Path]:
    good_tensor = np.zeros((8, 576), np.float32).tobytes()
    header = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight":
              {"dtype": "F32", "shape": [8, 576], "data_offsets": [0, len(good_tensor)]}}
    cases = {
        "header longer than the file": f.raw_safetensors(header, good_tensor, length=10 ** 6),
        "header that is not JSON": f.raw_safetensors(b"{not json", good_tensor),
        "offsets past the end": f.raw_safetensors(
            {k: {**v, "data_offsets": [0, len(good_tensor) * 2]} for k, v in header.items()},
            good_tensor),
        "shape that does not match the bytes": f.raw_safetensors(
            {k: {**v, "shape": [8, 577]} for k, v in header.items()}, good_tensor),
        "trailing bytes": f.raw_safetensors(header, good_tensor + b"\0" * 16),
        "header over 100 MB": f.raw_safetensors(header, good_tensor, length=100_000_001),
    }
    out = {}
    for index, (name, data) in enumerate(cases.items()):
        folder = tmp / f"case{index}"
        folder.mkdir()
        (folder / "adapter_model.safetensors").write_bytes(data)
        out[name] = folder
    return out


def test_malformed_safetensors_are_refused_before_openvino_sees_them(
        ov_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    reasons = {
        "header longer than the file": "longer than the file",
        "header that is not JSON": "not valid UTF-8 JSON",
        "offsets past the end": "past the end of the file",
        "shape that does not match the bytes": "does not match",
        "trailing bytes": "trailing bytes",
        "header over 100 MB": "exceeds the 100 MB limit",
    }
    cases = malformed_cases(tmp_path)
    for name, folder in cases.items():
        code, text = add(capsys, "bad", folder)
        assert code == 3, name
        assert reasons[name] in text, (name, text)
    assert "bad" not in _adapters(capsys)
    # The refusal happens in Python: the CLI never loads OpenVINO to reach it.
    script = ("import sys; from engine import cli; code = cli.main(sys.argv[1:]); "
              "print(code, any(m.startswith('openvino') for m in sys.modules), file=sys.stderr)")
    run = subprocess.run([sys.executable, "-c", script, "adapter", "add", "bad", "--base", OV,
                          "--file", str(cases["trailing bytes"])], capture_output=True,
                         text=True, env=dict(os.environ))
    assert run.returncode == 0  # the script itself
    assert run.stderr.strip().splitlines()[-1] == "3 False"
