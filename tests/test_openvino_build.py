"""The OpenVINO default: built once from the embedded GGUF with progress, cached, named
by structure, with llama.cpp's rotary table; a fresh catalog stays fast; a record that
holds a GGUF path on OpenVINO (made before `model add` built IRs) is served from the
named IR. Other families: tests/test_openvino_families.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine import cli
from engine.catalog import resolve
from engine.catalog.store import Catalog
from engine.curated import openvino_default, setup
from engine.curated.embedded import DEFAULT_MODEL_NAME
from engine.runtime import messages
from engine.runtime.client import EngineClient
from engine.runtime.openvino import build as openvino_build
from tests import factories as f
from tests.engine_helpers import PROMPT, request, sampling
from tests.openvino_helpers import cache_dir, first_build, progress_events, register_default

STAGES = ["verifying source", "dequantizing to F16", "converting with OpenVINO",
          "naming layers", "describing", "compressing to int4", "compressing to int8",
          "done"]  # the compressed profiles (compress.py) after the F16 IR


@pytest.mark.slow
def test_default_is_built_once_with_progress_then_cached(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    build = first_build(tmp_path_factory)
    result = build["result"]
    progress = progress_events(build)
    stages = [e.stage for e in progress]
    # The cache's first build (recorded by whichever worker made it: tests/
    # openvino_helpers.py) really built it; a cache of your own
    # (VARIANT_STUDIO_OPENVINO_CACHE) may already have held it.
    if not build["external"]:
        assert result["built"] is True
        seen = list(dict.fromkeys(stages))
        assert seen == STAGES, seen
        for stage in STAGES:
            fractions = [e.fraction for e in progress if e.stage == stage]
            assert fractions == sorted(fractions) and 0 <= fractions[0] <= fractions[-1] <= 1
    naming = result["naming"]
    assert (naming["layers"], naming["renamed"], naming["cross_checked"]) == (30, 210, 210)
    assert (naming["rope_tables"], naming["rope"]) == (1, "theta_i = 100000^(-2i/64) (f32)")
    # The compressed profiles, each in its own cache folder, int4 with the source's codes.
    assert set(result["profiles"]) == {"fast", "fast-int8"}
    assert result["profiles"]["fast"]["layers"] == {"int4": 210, "int8": 1,
                                                    "snapped_to_source": 210}
    # int8 with the source's codes too (x16, integer zero points).
    assert result["profiles"]["fast-int8"]["layers"] == {"int8": 211,
                                                         "snapped_to_source": 210}
    for built in result["profiles"].values():
        assert Path(built["folder"]).parent.parent == cache_dir(tmp_path_factory)
    assert (naming["hidden"], naming["ffn"], naming["q_out"], naming["kv_out"]) == (
        576, 1536, 576, 192)
    folder = Path(result["folder"])
    assert folder.parent.parent == cache_dir(tmp_path_factory)
    for name in openvino_build.IR_FILES + ("config.json", "tokenizer_config.json"):
        assert (folder / name).is_file(), name
    assert Path(result["f16_gguf"]).stat().st_size > 200 << 20
    # A second request is answered from the cache: nothing is rebuilt.
    client = EngineClient()
    try:
        again = client.call(openvino_default.build_request(), timeout=300)
    finally:
        client.close()
    assert again["built"] is False and again["folder"] == result["folder"]


@pytest.mark.slow
def test_first_use_adds_the_curated_default_with_its_recipe(
        studio_home: Path, tmp_path_factory: pytest.TempPathFactory,
        capsys: pytest.CaptureFixture) -> None:
    first_build(tmp_path_factory)
    assert cli.main(["list", "--json"]) == 0
    models = json.loads(capsys.readouterr().out)["models"]
    # Listed before anything asked for it, as available but not built (nothing is
    # registered: catalog.json holds only real records).
    assert [(m["name"], m["built"]) for m in models] == [
        (DEFAULT_MODEL_NAME, True), (openvino_default.NAME, False)]
    pending = models[1]
    assert (pending["sha256"], pending["path"], pending["status"]) == (None, None, "not built")
    assert pending["cached"] is True  # the session's build is in the cache: added instantly
    assert "model openvino-default" in pending["how"]
    assert not openvino_default.is_registered(Catalog())
    assert cli.main(["model", "openvino-default"]) == 0
    out = capsys.readouterr()
    assert "210 layers named by structure" in out.out
    assert cli.main(["list", "--json"]) == 0
    models = json.loads(capsys.readouterr().out)["models"]
    assert [(m["name"], m["built"]) for m in models] == [
        (DEFAULT_MODEL_NAME, True), (openvino_default.NAME, True)]
    assert models[1]["sha256"] == Catalog().model(openvino_default.NAME)["sha256"]
    assert cli.main(["show", openvino_default.NAME, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["backend"] == "openvino" and shown["format"] == "openvino"
    assert shown["curated"] is True
    assert shown["counterparts"] == {"llama": DEFAULT_MODEL_NAME}
    assert shown["built_from"]["sha256"] == Catalog().model(DEFAULT_MODEL_NAME)["sha256"]
    assert shown["built_from"]["recipe"] == openvino_build.RECIPE
    assert shown["metadata"]["chat_template_sha256"] == (
        Catalog().model(DEFAULT_MODEL_NAME)["metadata"]["chat_template_sha256"])
    assert [c["status"] for c in shown["checks"]] == ["pass"]


def test_listing_a_fresh_catalog_never_touches_openvino(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh catalog shows the OpenVINO default as not built, instantly: `list` and
    `show` import no OpenVINO module and build nothing."""
    env = dict(os.environ, VARIANT_STUDIO_HOME=str(tmp_path / "home"),
               VARIANT_STUDIO_OPENVINO_CACHE=str(tmp_path / "cache"))
    # The catalog as the first command that writes leaves it (with the demo): `list`
    # and `show` write nothing, so they no longer create it themselves.
    monkeypatch.setenv("VARIANT_STUDIO_HOME", env["VARIANT_STUDIO_HOME"])
    setup.first_run(Catalog(), with_demo=True)
    code = ("import json, sys; from engine import cli; "
            "codes = [cli.main(['list', '--json']), "
            f"cli.main(['show', '{openvino_default.NAME}', '--json']), "
            f"cli.main(['show', '{openvino_default.NAME}']), "
            "cli.main(['show', 'tool-calls', '--json'])]; "
            "print(json.dumps({'codes': codes, 'openvino': "
            "any(m.startswith('openvino') for m in sys.modules)}), file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True)
    report = json.loads(out.stderr.strip().splitlines()[-1])
    assert report == {"codes": [0, 0, 0, 0], "openvino": False}
    decoder = json.JSONDecoder()
    listed, end = decoder.raw_decode(out.stdout)
    rest = out.stdout[end:].lstrip()
    shown, end = decoder.raw_decode(rest)
    rest = rest[end:]
    text, brace = rest[:rest.index("\n{")], rest.index("\n{")
    variant = json.loads(rest[brace:])
    models = listed["models"]
    assert [(m["name"], m["built"]) for m in models] == [
        (DEFAULT_MODEL_NAME, True), (openvino_default.NAME, False)]
    pending = models[1]
    assert pending["backend"] == "openvino" and pending["curated"] is True
    assert (pending["sha256"], pending["path"], pending["cached"]) == (None, None, False)
    assert "built on first use (about 30 s" in pending["how"]
    assert pending["counterparts"] == {"llama": DEFAULT_MODEL_NAME}
    assert shown["built"] is False and shown["identity"] is None
    assert [(c["name"], c["status"]) for c in shown["checks"]] == [
        ("built", "warn"), ("source", "pass")]
    assert "not built yet: built on first use" in text and "None" not in text
    # The demo variant says why it is not on OpenVINO yet, and how that changes.
    reason = variant["backends"]["openvino"]["reason"]
    assert variant["backends"]["openvino"]["available"] is False
    assert reason.startswith(f"its OpenVINO base {openvino_default.NAME} is not built yet")
    assert "needs an OpenVINO file" not in reason  # the demo adapter gets one at the build
    assert not any((tmp_path / "cache").glob("*"))  # nothing was built
    catalog_json = json.loads((tmp_path / "home" / "catalog.json").read_text())
    assert openvino_default.NAME not in catalog_json["models"]  # no half-record


@pytest.mark.slow
def test_layer_names_come_from_structure_not_names_or_positions(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    import openvino as ov

    from engine.errors import RefusedError
    from engine.formats import architecture, gguf_file

    folder = Path(first_build(tmp_path_factory)["result"]["folder"])
    source = Path(first_build(tmp_path_factory)["result"]["source_path"])
    description = architecture.describe(gguf_file.read_header(source))
    core = ov.Core()
    model = core.read_model(str(folder / "openvino_model.xml"))
    named = [op for op in model.get_ordered_ops() if op.get_friendly_name().startswith(
        "__module.model.layers.")]
    original = [op.get_friendly_name() for op in named]
    assert len(original) == 210
    # Erase every clue but the graph: projection and weight names become meaningless.
    for index, op in enumerate(named):
        op.set_friendly_name(f"MatMul_scrambled_{index}")
        openvino_build.weight_constant(op.input_value(1).get_node()).set_friendly_name(
            f"Constant_scrambled_{index}")
    report = openvino_build.name_projections(model, description)
    assert (report.renamed, report.cross_checked) == (210, 0)
    assert [op.get_friendly_name() for op in named] == original
    # Weight names that contradict the structure stop the build.
    model = core.read_model(str(folder / "openvino_model.xml"))
    by_name = {op.get_friendly_name(): op for op in model.get_ordered_ops()}
    q = by_name["__module.model.layers.3.self_attn.q_proj/aten::linear/MatMul"]
    openvino_build.weight_constant(q.input_value(1).get_node()).set_friendly_name(
        "model.layers[3].self_attn.o_proj.weight")
    with pytest.raises(RefusedError, match="disagrees with the weights"):
        openvino_build.name_projections(model, description)


@pytest.mark.slow
def test_a_gguf_path_recorded_on_openvino_is_served_from_its_named_ir(
        studio_home: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
        base_info, capsys: pytest.CaptureFixture) -> None:
    """A record that holds a GGUF path on OpenVINO (as `model add --backend openvino`
    made them before it built a named IR, here made directly through the catalog) is
    served from the same named IR, built into the cache at first use; validation still
    refuses adapters for it, saying how to re-add the file."""
    from engine.catalog import imports

    catalog = Catalog()
    register_default(catalog, tmp_path_factory)
    f16 = Path(first_build(tmp_path_factory)["result"]["f16_gguf"])
    imports.add_model(catalog, "plain-ov", f16, "openvino")
    client = EngineClient()
    try:
        plain = client.call(request(catalog, "plain-ov", max_tokens=16), timeout=900)
        # The default's exact profile: the same F16 IR at f32 (its default is compressed).
        named = client.call(messages.Generate(
            resolve.resolve(catalog, openvino_default.NAME, ov_profile="exact"), PROMPT,
            sampling(max_tokens=16)), timeout=900)
    finally:
        client.close()
    assert plain["backend"] == "openvino" and len(plain["token_ids"]) == 16
    # Same F16 weights, same named IR.
    assert plain["token_ids"] == named["token_ids"]
    adapter = f.write_peft_lora(tmp_path / "peft", base_info)
    code = cli.main(["adapter", "add", "x", "--base", "plain-ov", "--file", str(adapter)])
    err = capsys.readouterr().err
    assert code == 3 and "0 of 120 tensors attach" in err and "add the file again" in err
