"""The OpenVINO profiles (docs/formats.md, "Profiles"): `fast` (int4 weights, the serving
default), `fast-int8` and `exact` (the F16 IR at f32, for parity).

Each profile is part of the identity (its weights' digest and precisions), so the three
have different keys and separate residents; dynamic LoRA applies on the compressed
weights as on the F16 ones (the adapter changes the output, scale 0 is the base bit for
bit); and the fast profile stays close to llama.cpp on the same Q4_1 source.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.catalog import resolve
from engine.catalog.identity import OPENVINO_PROFILES, ComputeProfile, ContextConfig, Identity
from engine.curated import openvino_default
from engine.curated.embedded import DEFAULT_MODEL_NAME
from engine.errors import RefusedError, UsageError
from engine.runtime import messages
from engine.runtime.openvino import compress
from tests.engine_helpers import PROMPT, sampling
from tests.world import Recipe, World

OV = openvino_default.NAME
TIMEOUT = 900  # a hang bound only
PROFILES = OPENVINO_PROFILES


def _record(**extra: Any) -> dict[str, Any]:
    profiles = {name: {"weights": w, "precision": "f32", "kv_cache": kv,
                       "sha256": name[0] * 64, "path": f"/x/{name}"}
                for name, w, kv in (("fast", "int4", "f16"), ("fast-int8", "int8", "f16"),
                                    ("exact", "f16", "f32"))}
    profiles["fast-int8"]["dynamic_quantization"] = 32
    return {"name": "ov", "backend": "openvino", "profiles": profiles, **extra}


def test_a_base_with_profiles_serves_fast_by_default_and_refuses_unknown_ones() -> None:
    record = _record()
    assert resolve.compute_profile(record) == ComputeProfile("fast", "int4", "f32", "f16",
                                                             "f" * 64)
    assert resolve.compute_profile(record, "exact").weights == "f16"
    int8 = resolve.compute_profile(record, "fast-int8")
    assert int8 is not None and (int8.weights, int8.dynamic_quantization) == ("int8", 32)
    assert int8.label() == "fast-int8 (int8 @ f32, int8 activations)"
    assert resolve.compute_profile(_record(default_profile="exact")).name == "exact"
    with pytest.raises(UsageError, match="unknown OpenVINO profile 'int2'"):
        resolve.compute_profile(record, "int2")
    # llama.cpp has no profiles; an OpenVINO IR a user added has only the exact one.
    assert resolve.compute_profile({"name": "l", "backend": "llama"}, "fast") is None
    plain = {"name": "user-ir", "backend": "openvino"}
    assert resolve.compute_profile(plain) is None
    assert resolve.compute_profile(plain, "exact") is None
    with pytest.raises(RefusedError, match="user-ir has no fast profile"):
        resolve.compute_profile(plain, "fast")
    # Every profile but the F16 build itself has a compression recipe.
    assert set(compress.COMPRESSED) | {"exact"} == set(PROFILES)


def test_profiles_are_part_of_the_identity_and_absent_keys_are_unchanged() -> None:
    def ident(compute: ComputeProfile | None) -> Identity:
        return Identity("openvino", "ov", "b" * 64, (), "t" * 64, "bos=1", "openvino-x",
                        ContextConfig(n_ctx=4096), compute)

    profiles = [resolve.compute_profile(_record(), name) for name in PROFILES]
    keys = {ident(p).key for p in profiles} | {ident(None).key}
    assert len(keys) == 4
    # The precision alone changes the key (the same weights computed at bf16).
    fast = profiles[0]
    assert fast is not None
    bf16 = ComputeProfile(fast.name, fast.weights, "bf16", fast.kv_cache, fast.weights_sha256)
    assert ident(bf16).key != ident(fast).key
    # So does quantizing the activations; float activations add nothing to the key.
    quantized = ComputeProfile(fast.name, fast.weights, fast.precision, fast.kv_cache,
                               fast.weights_sha256, dynamic_quantization=32)
    assert ident(quantized).key != ident(fast).key
    assert "dynamic_quantization" not in ident(fast).canonical()
    assert Identity.from_dict(ident(quantized).to_dict()) == ident(quantized)
    # No profile: the canonical form has no `compute` field (the keys made before stay).
    assert "compute" not in ident(None).canonical() and "compute" not in ident(None).to_dict()
    for item in (ident(fast), ident(None)):
        data = item.to_dict()
        data.pop("key")
        assert Identity.from_dict(data) == item
    assert ident(fast).served_sha256 == "f" * 64 and ident(None).served_sha256 == "b" * 64
    assert ident(fast).base_only().compute == fast


WORLD = Recipe(openvino=True, adapters=True)


def generate(world: World, name: str, profile: str) -> dict[str, Any]:
    catalog, client = world.catalog, world.engine
    spec = resolve.resolve(catalog, name, ov_profile=profile)
    return client.call(messages.Generate(spec, PROMPT, sampling(max_tokens=16)),
                       timeout=TIMEOUT)


@pytest.mark.slow
def test_the_built_default_has_three_profiles_with_their_own_keys_and_weights(world) -> None:
    catalog = world.catalog
    record = catalog.model(OV)
    assert set(record["profiles"]) == set(PROFILES)
    assert record["profiles"]["exact"]["sha256"] == record["sha256"]
    assert record["profiles"]["fast"]["weights"] == "int4"
    sizes = {name: entry["size"] for name, entry in record["profiles"].items()}
    assert sizes["fast"] < sizes["fast-int8"] < sizes["exact"]
    specs = {name: resolve.resolve(catalog, OV, ov_profile=name) for name in PROFILES}
    # The default: the profile measured faster on this CPU (probe.preferred_profile).
    assert record["default_profile"] in ("fast", "fast-int8")
    assert resolve.resolve(catalog, OV).identity == specs[record["default_profile"]].identity
    assert len({s.identity.key for s in specs.values()}) == 3
    assert len({s.base_path for s in specs.values()}) == 3
    for name, spec in specs.items():
        assert spec.identity.served_sha256 == record["profiles"][name]["sha256"]
        assert spec.base_path == record["profiles"][name]["path"]
    # Every variant over the default inherits the profile; llama.cpp keys have none.
    assert resolve.identity(catalog, "va", ov_profile="fast-int8").compute == specs[
        "fast-int8"].identity.compute
    assert resolve.identity(catalog, DEFAULT_MODEL_NAME).compute is None
    # The int4 and int8 layers carry the source's own Q4_1 codes (compress.py); int8's
    # integer zero points let its activations be quantized (fast's stay float).
    assert record["profiles"]["fast"]["layers"]["snapped_to_source"] == 210
    assert record["profiles"]["fast-int8"]["layers"]["snapped_to_source"] == 210
    assert [specs[p].identity.compute.dynamic_quantization for p in PROFILES] == [0, 32, 0]


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["fast", "fast-int8"])
def test_dynamic_lora_applies_on_the_compressed_weights(world, profile: str) -> None:
    base = generate(world, OV, profile)
    va, va0 = generate(world, "va", profile), generate(world, "va0", profile)
    assert va["token_ids"] != base["token_ids"], "the adapter must change the output"
    assert va0["token_ids"] == base["token_ids"], "scale 0 must equal the base"
    assert va0["logprobs"] == base["logprobs"]
    assert len({r["identity"] for r in (base, va, va0)}) == 3
    client = world.engine
    residents = client.call(messages.Describe(), timeout=60)["residents"]
    label = resolve.compute_profile(world.catalog.model(OV), profile).label()
    found = [r for r in residents if r.get("profile") == label]
    assert found, residents
    # What OpenVINO compiled is what the identity names (read back from the model).
    wanted = {"f32": "float32", "bf16": "bfloat16"}[world.catalog.model(OV)["profiles"][profile][
        "precision"]]
    assert wanted in found[0]["compiled"]["INFERENCE_PRECISION_HINT"], found[0]["compiled"]
    assert found[0]["compiled"]["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == str(
        resolve.compute_profile(world.catalog.model(OV), profile).dynamic_quantization)


@pytest.mark.slow
def test_the_fast_profile_stays_close_to_llama_cpp_on_the_same_q4_1_source(world) -> None:
    catalog, client = world.catalog, world.engine
    prompts = tuple(messages.Prompt(text, chat=True) for text in (
        "Write a short poem about the sea.", "What is the capital of France?"))
    result = client.call(messages.CrossCheck(
        resolve.resolve(catalog, DEFAULT_MODEL_NAME),
        resolve.resolve(catalog, OV, ov_profile="fast"), prompts, 8), timeout=TIMEOUT)
    # Measured on four prompts: max 0.030, mean 0.006 nats (docs/performance.md); the
    # exact profile is at 0.027 / 0.0055 against the same Q4_1 file.
    assert result["max_kl"] <= 0.06 and result["mean_kl"] <= 0.015, result["max_kl"]
    assert result["top1_agreement"] >= 0.8


def test_each_profile_compiles_with_the_settings_its_identity_names() -> None:
    from engine.runtime.openvino.backend import COMPILE_CONFIG, compile_config

    exact = compile_config(None, 1)
    assert exact == {**COMPILE_CONFIG, "INFERENCE_NUM_THREADS": "1"}
    assert compile_config(resolve.compute_profile(_record(), "exact"), 1) == exact
    fast = compile_config(resolve.compute_profile(_record(), "fast"), 1)
    assert (fast["INFERENCE_PRECISION_HINT"], fast["KV_CACHE_PRECISION"]) == ("f32", "f16")
    assert fast["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == "0"  # no activation quantization
    int8 = compile_config(resolve.compute_profile(_record(), "fast-int8"), 1)
    assert int8["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == "32"  # int8 activations, groups of 32
    # bf16 on one thread died with SIGFPE on one machine (docs/notes.md): two threads,
    # unless the probe found one thread safe here.
    bf16 = ComputeProfile("fast", "int4", "bf16", "f16", "f" * 64)
    assert compile_config(bf16, 1)["INFERENCE_NUM_THREADS"] == "2"
    assert compile_config(bf16, 1, bf16_one_thread=True)["INFERENCE_NUM_THREADS"] == "1"
    assert compile_config(bf16, 4)["INFERENCE_NUM_THREADS"] == "4"


def test_the_probe_takes_bf16_only_where_the_child_survived_it_and_it_was_faster() -> None:
    from engine.runtime.openvino.probe import BF16_MARGIN, Probe, _answer

    both = json.dumps({"f32": 100.0, "bf16": 100.0 * BF16_MARGIN})
    assert _answer(0, "warning: x\n" + both) == Probe(True, "bf16", json.loads(both))
    assert _answer(0, json.dumps({"f32": 100.0, "bf16": 104.0})).precision == "f32"
    # Killed by a signal (SIGFPE) after the f32 round: bf16 is not safe here.
    crashed = _answer(-8, json.dumps({"f32": 100.0}))
    assert crashed == Probe(False, "f32", {"f32": 100.0})
    assert _answer(1, "") == Probe(False, "f32", {})


@pytest.mark.slow
def test_the_precision_is_probed_once_in_a_child_and_registered_in_the_profiles(
        world, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    from dataclasses import asdict

    from engine.runtime.openvino import build, probe

    catalog = world.catalog
    folder = Path(resolve.resolve(catalog, OV, ov_profile="fast").base_path)
    record = catalog.model(OV)
    built = build.cached_build(record["built_from"]["sha256"])
    assert built is not None
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path))
    answer = probe.ask(folder)  # a real child, on the real IR (where the CPU has bf16)
    kept = json.loads((tmp_path / probe.PROBES).read_text())
    assert kept == {probe.machine_key(): asdict(answer)}
    if probe.native_bf16():
        assert answer.tokens_per_second["f32"] > 0
        assert answer.precision == ("bf16" if answer.tokens_per_second.get("bf16", 0)
                                    >= probe.BF16_MARGIN * answer.tokens_per_second["f32"]
                                    else "f32")
    else:
        assert answer == probe.Probe(False, "f32", {})

    def no_child(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("asked again")

    monkeypatch.setattr(subprocess, "run", no_child)
    assert probe.ask(folder) == answer  # kept: no second child
    # The catalog's compressed profiles compute at the chosen precision, the exact at f32.
    records = openvino_default.profile_records(built, {"path": record["path"],
                                                       "sha256": "e" * 64})
    assert {name: r["precision"] for name, r in records.items()} == {
        "fast": answer.precision, "fast-int8": answer.precision, "exact": "f32"}
    monkeypatch.undo()
    # A child that dies (here: no IR to compile) is a no, and kept as one.
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path / "other"))
    (tmp_path / "other").mkdir()
    assert probe.ask(tmp_path / "missing") == probe.Probe(False, "f32", {})
    assert json.loads((tmp_path / "other" / probe.PROBES).read_text()) == {
        probe.machine_key(): asdict(probe.Probe(False, "f32", {}))}


@pytest.mark.slow
@pytest.mark.parametrize("profile", PROFILES)
def test_the_one_token_graph_gives_the_dynamic_graphs_logits_bit_for_bit(world, profile: str
                                                                         ) -> None:
    """The token loop runs a static one-token copy of the graph (backend.py): after the
    prompt's KV state moves into it, every step's logits equal those of the dynamic
    graph fed the same tokens one at a time, with an adapter and without. Two variants
    whose adapters have the same ranks share one compiled one-token graph, each with its
    own adapter tensors bound."""
    import numpy as np

    from engine.formats.artifacts import inspect_path
    from engine.runtime.openvino.backend import load_base

    catalog = world.catalog
    model = None
    sets = []
    for name in ("va", "vb"):
        spec = resolve.resolve(catalog, name, ov_profile=profile)
        if model is None:
            model = load_base(spec.base_path, spec.identity.served_sha256, 1,
                              spec.identity.compute)
        sets.append([(a, inspect_path(Path(a.path))) for a in spec.adapters])
    assert model is not None
    prompt = model.tokenize("The lighthouse keeper opened the bottle and read", False)
    contexts = [model.new_context(adapter_set, 512, 64) for adapter_set in (*sets, [])]
    assert model.builds == 1
    if profile == "exact":  # steps on its prompt graph
        assert all(c.stepper is model.compiled for c in contexts) and not model.steppers
    else:  # va and vb (both rank-8 q/v) share one graph; the base's is another
        assert contexts[0].stepper is contexts[1].stepper is not contexts[2].stepper
        assert len(model.steppers) == 2
    last_logits = []
    for context in contexts:
        reference = model.compiled.create_infer_request()  # the dynamic graph
        for name, tensor in context.lora.items():
            reference.set_tensor(name, tensor)

        def dynamic(tokens: list[int], past: int, reference: Any = reference) -> np.ndarray:
            inputs = {"input_ids": np.asarray([tokens], np.int64),
                      "attention_mask": np.ones((1, past + len(tokens)), np.int64),
                      "position_ids": np.arange(past, past + len(tokens))[None],
                      "beam_idx": np.zeros(1, np.int32), "logits_from": np.asarray(
                          [len(tokens) - 1], np.int64)}
            reference.infer(inputs)
            return np.array(reference.get_tensor("logits").data[0, -1])

        logits = context.prefill(prompt)
        assert np.array_equal(logits, dynamic(prompt, 0))
        for position in range(len(prompt), len(prompt) + 8):
            token = int(np.argmax(logits))
            logits = context.step(token)
            assert np.array_equal(logits, dynamic([token], position)), (profile, position)
        last_logits.append(logits)
    # The shared graph ran each session's own adapter: va, vb and the base all differ.
    for i, j in ((0, 1), (0, 2), (1, 2)):
        assert not np.array_equal(last_logits[i], last_logits[j])
    for context in contexts:
        context.close()
    model.close()
