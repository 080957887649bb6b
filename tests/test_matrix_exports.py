"""Acceptance matrix, exports: every fixture family × {F16, Q8_0, Q4_K_M} variant exported
for llama-server and for vLLM, or refused up front with the table's reason; and the
OpenVINO Model Server export refused up front where the table says so.

The cells come from docs/models.md's table (tests/matrix_helpers.py). Per case, through
`variant-studio export VARIANT --target T --out DIR --json`:

- llama-server: the manifest lists every file with its sha256 (`export.check_files`
  finds nothing amiss), the adapter is the catalog's stored GGUF byte for byte, and the
  preset names the variant;
- vLLM: the base converted to a Hugging Face folder whose config.json names the
  family's class and model type, the variant as one PEFT adapter, the manifest;
- OpenVINO Model Server: where the table refuses it (no OpenVINO for the family), the
  command exits 3 with the reason, writes no folder and leaves no staging folder beside
  it. Where it is supported, the export (a merge and an OpenVINO build, about 20 s
  each) runs in tests/test_matrix_openvino.py, on one type per family.

A refused export must change nothing (no folder, no catalog change) and start nothing
(no writer, no merge). One catalog for the module and no engine process (exports read
files, they do not serve): about 40 s of CPU, most of it the vLLM exports' conversion.
"""

from __future__ import annotations

import configparser
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from engine import export
from engine.catalog.store import Catalog
from engine.export import llama_server, ovms, vllm
from engine.formats import architecture
from engine.formats import capabilities as cap
from engine.runtime.merge.work import MergeWorker
from tests import families
from tests.matrix_helpers import (
    CASES,
    IDS,
    add_gguf_variant,
    assert_refused,
    expected,
    run_cli,
)
from tests.world import Recipe, World

TARGETS = {"llama-server": cap.EXPORT_LLAMA_SERVER, "vllm": cap.EXPORT_VLLM,
           "ovms": cap.EXPORT_OVMS}
# What writes each export (and the merge the OVMS export starts with): a refused export
# must call none of them.
WRITERS = {"llama-server": llama_server, "vllm": vllm, "ovms": ovms}


WORLD = Recipe(demo=True)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_llama_server(folder: Path, manifest: dict[str, Any], catalog: Catalog,
                       var: str, adapter: str) -> None:
    assert manifest["target"] == "llama-server" and manifest["variant"]["name"] == var
    stored = catalog.adapter(adapter)
    (entry,) = manifest["adapters"]
    assert entry["name"] == adapter and entry["sha256"] == stored["sha256"]
    assert sha256(folder / entry["file"]) == stored["sha256"]
    preset = configparser.ConfigParser()
    preset.read_string("[top]\n" + (folder / "models.ini").read_text())  # keys before a section
    assert var in preset.sections()


def check_vllm(folder: Path, manifest: dict[str, Any], files: families.FamilyFiles,
               var: str) -> None:
    family = architecture.family(files.arch)
    config = json.loads((folder / "base" / "config.json").read_text())
    assert config["architectures"] == [family.hf_class]
    assert config["model_type"] == family.hf_model_type
    lora = folder / manifest["lora"]["path"]
    adapter_config = json.loads((lora / "adapter_config.json").read_text())
    assert adapter_config["r"] >= 8  # the fixture's rank (vLLM's smallest is 8)
    assert (lora / "adapter_model.safetensors").is_file()
    assert manifest["target"] == "vllm" and manifest["variant"]["name"] == var


@pytest.mark.slow
@pytest.mark.parametrize(("variant", "kind"), CASES, ids=IDS)
def test_exports_work_or_are_refused_up_front(
        variant: str, kind: str, world: World,
        family_files: dict[str, families.FamilyFiles],
        capsys: pytest.CaptureFixture) -> None:
    files = family_files[variant]
    cells = expected(files, kind)
    catalog: Catalog = world.catalog
    base, adapter, var = add_gguf_variant(catalog, files, kind)
    root: Path = world.out / f"{variant}-{kind}"
    root.mkdir()

    for target, feature in TARGETS.items():
        folder = root / target
        command = ["export", var, "--target", target, "--out", str(folder), "--json"]
        cell = cells[feature]
        if not cell.ok:
            if target == "ovms":
                command[-1:-1] = ["--eval-rows", "1", "--task-rows", "0"]
            assert_refused(capsys, command, cell.reason, [folder],
                           forbid=[(WRITERS[target], "write"), (MergeWorker, "__init__")])
            continue
        if target == "ovms":
            continue  # supported: tests/test_matrix_openvino.py (one type per family)
        code, out, err = run_cli(capsys, *command)
        assert code == 0, err[-3000:]
        manifest = json.loads(out)
        assert manifest["dir"] == str(folder)
        assert export.check_files(folder) == []
        if target == "llama-server":
            check_llama_server(folder, manifest, catalog, var, adapter)
        else:
            check_vllm(folder, manifest, files, var)
    # Nothing but the exports that ran: no staging folder left beside them.
    made = sorted(p.name for p in root.iterdir())
    want = sorted(t for t, f in TARGETS.items() if cells[f].ok and t != "ovms")
    assert made == want, made
