"""Acceptance matrix, OpenVINO: every fixture family × {F16, Q8_0, Q4_K_M} as an OpenVINO
base with a PEFT adapter that changes its output, or refused up front with the table's
reason; and the OpenVINO Model Server export of a variant, where supported.

The cells come from docs/models.md's table (tests/matrix_helpers.py). What runs where:

- adapters on OpenVINO, refused (gemma2, gemma3, phi3: every type): `variant-studio
  model add NAME --file X.gguf --backend openvino` exits 3 with the reason before
  anything is hashed or built: no record, nothing in the build cache.
- adapters on OpenVINO, supported, on one type per family (`rotation()`: llama F16,
  llama3 Q8_0, llama-linear Q4_K_M, qwen2 F16, qwen3 Q8_0; every type with
  VARIANT_STUDIO_FULL_MATRIX=1): the base is built (the named IR and its profiles) and
  added, its record naming the GGUF it was built from; the fixture's PEFT adapter is
  imported for it (every tensor attaches) and a variant over it generates on OpenVINO
  through the engine process, its tokens or log-probabilities apart from the base's.
  The build runs through `openvino.models.add_gguf`, what `model add --backend openvino`
  runs, with this module's engine process as its builder (the command starts a fresh
  engine per build, which imports NNCF again: 3.8 s of CPU); the adapter through
  `imports.add_adapter`, what `adapter add` runs. On the other types the up-front
  decision `model add` takes is checked (the file is described for OpenVINO, not
  refused) without building.
- export for OpenVINO Model Server, supported: a merge and an OpenVINO build of the
  merged file, on one type per family (`rotation(1)`, another type than the build's):
  `export VARIANT --target ovms` with the smallest survival check (one probe prompt, no
  task rows); the folder holds the OVMS config naming the variant, the IR with its
  layers named, the LLM graph and the manifest, and the merge was accepted. Its
  refusals need no build and run in tests/test_matrix_exports.py.

Why not every type: measured here, a build costs about 11 s of CPU in this module's
engine (2.6 s of it the gguf package's reader parsing the fixtures' 49k-token vocabulary,
then OpenVINO GenAI's conversion and the int4 and int8 profiles; a fresh engine adds
NNCF's import, 3.8 s), an OVMS export about 17 s (a merge, and a build in a fresh engine
process, which also makes the int4 and int8 profiles the export does not use): every
type would add about 4 minutes of CPU to every CI run, for what depends on the type
alone (dequantizing the source's blocks to F16), which runs on each type here. The
build cache is the run's, shared by its workers (tests/openvino_helpers.py). One
catalog and one engine process for the module.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine import export
from engine.catalog import digest, imports, resolve
from engine.catalog.store import AdapterSpec, Catalog
from engine.formats import capabilities as cap
from engine.runtime import messages
from engine.runtime.openvino import build
from engine.runtime.openvino import models as openvino_models
from tests import families
from tests.engine_helpers import sampling
from tests.matrix_helpers import (
    CASES,
    IDS,
    add_gguf_variant,
    assert_refused,
    expected,
    name,
    rotation,
    run_cli,
)
from tests.openvino_helpers import cache_dir
from tests.world import Recipe, World

PROMPT = messages.Prompt("The old lighthouse keeper climbed the spiral stairs", chat=False)
BUILT = set(rotation())  # where the supported builds run (see the module docstring)
EXPORTED = set(rotation(1))  # where the supported OVMS exports run
TIMEOUT = 600  # a hang bound only


def _cache(world: World) -> None:
    # Set before any engine process starts: they find the build cache through the env.
    world.extra["cache"] = cache_dir()


WORLD = Recipe(demo=True, furnish=_cache)


def built_from(cache: Path, source: Path) -> list[str]:
    """The cache's builds of `source` (each key starts with the file's digest; the cache
    is shared with other workers, whose builds of other files may land meanwhile)."""
    prefix = digest.content_digest(source)[:16]
    return sorted(p.name for p in cache.iterdir() if p.name.startswith(prefix))


def generate(world: World, model: str) -> dict[str, Any]:
    spec = resolve.resolve(world.catalog, model, backend="openvino")
    return world.engine.call(messages.Generate(spec, PROMPT, sampling(max_tokens=6)),
                                timeout=TIMEOUT)


@pytest.mark.slow
@pytest.mark.parametrize(("variant", "kind"), CASES, ids=IDS)
def test_openvino_with_an_adapter_works_or_is_refused_up_front(
        variant: str, kind: str, world: World,
        family_files: dict[str, families.FamilyFiles],
        capsys: pytest.CaptureFixture) -> None:
    files = family_files[variant]
    cells = expected(files, kind)
    source = files.base(kind)
    add = ["model", "add", name("ov", variant, kind), "--file", str(source), "--backend",
           "openvino"]

    cell = cells[cap.SERVE_OPENVINO]
    if not cell.ok:
        line = assert_refused(capsys, add, cell.reason,
                              forbid=[(openvino_models, "engine_builder")])
        assert "OpenVINO cannot compute this file as llama.cpp does" in line
        assert built_from(world.extra["cache"], source) == []  # nothing built
    elif (variant, kind) in BUILT:
        check_openvino_base(world, files, kind)
    else:
        # Built on another type of the family; here the up-front decision `model add`
        # takes before building: described for OpenVINO, not refused.
        model = build.describe_for_openvino(source)
        assert model.family.name == files.arch

    if cells[cap.EXPORT_OVMS].ok and (variant, kind) in EXPORTED:
        check_ovms_export(world, files, kind, capsys)


def check_openvino_base(world: World, files: families.FamilyFiles,
                        kind: str) -> None:
    """Added for OpenVINO (built), a PEFT adapter imported for it, a variant that serves."""
    catalog: Catalog = world.catalog
    source = files.base(kind)
    base, adapter, var = (name(p, files.variant, kind) for p in ("ov", "ap", "ovv"))

    def builder(path: Path, progress: Any) -> dict[str, Any]:
        return world.engine.call(messages.BuildOpenVino(str(path)), timeout=TIMEOUT)

    record = openvino_models.add_gguf(catalog, base, source, builder=builder)
    assert record["backend"] == "openvino" and record["format"] == "openvino"
    assert Catalog().model(base)["built_from"]["sha256"] == digest.content_digest(source)
    assert record["default_profile"] in record["profiles"]
    assert record["built_from"]["layers_named"] == 14  # 2 layers x 7 projections

    # The fixture's PEFT adapter, imported for it: every tensor attaches.
    entry = imports.add_adapter(catalog, adapter, base, files.peft_adapter)
    assert entry["backend"] == "openvino" and entry["format"] == "peft"
    coverage = next(c for c in entry["checks"] if c["name"] == "coverage")
    pairs = files.n_layer * len(files.spec.targets)
    assert coverage["status"] == "pass", coverage
    assert f"{2 * pairs} of {2 * pairs} tensors attach" in coverage["detail"], coverage
    catalog.add_variant(var, base, [AdapterSpec(adapter, 1.0)])
    answers = {n: generate(world, n) for n in (base, var)}
    for n, answer in answers.items():
        assert answer["backend"] == "openvino" and answer["token_ids"], n
    assert answers[var]["adapters"][0]["sha256"] == entry["sha256"]
    assert (answers[var]["token_ids"], answers[var]["logprobs"]) != (
        answers[base]["token_ids"], answers[base]["logprobs"])


def check_ovms_export(world: World, files: families.FamilyFiles, kind: str,
                      capsys: pytest.CaptureFixture) -> None:
    """`export VARIANT --target ovms` of the GGUF variant: merged, built, laid out."""
    catalog: Catalog = world.catalog
    base, adapter, var = add_gguf_variant(catalog, files, kind)
    folder = world.out / var
    code, out, err = run_cli(capsys, "export", var, "--target", "ovms", "--out", str(folder),
                             "--eval-rows", "1", "--task-rows", "0", "--json")
    assert code == 0, err[-3000:]
    manifest = json.loads(out)
    assert export.check_files(folder) == []
    assert manifest["target"] == "ovms" and manifest["base"]["merged"] is True
    assert manifest["merge"]["accepted"] and manifest["base"]["layers_named"] == 14
    assert json.loads((folder / "config.json").read_text()) == {
        "mediapipe_config_list": [{"name": var, "base_path": var}],
        "model_config_list": []}
    graph = (folder / var / "graph.pbtxt").read_text()
    assert 'calculator: "HttpLLMCalculator"' in graph
    xml = (folder / var / "openvino_model.xml").read_text()
    assert "__module.model.layers.1.self_attn.v_proj/aten::linear/MatMul" in xml
    assert (folder / var / "openvino_tokenizer.xml").is_file()
