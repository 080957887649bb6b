"""OpenVINO beyond the curated default: llama (with Llama 3's frequency factors or linear
RoPE scaling), qwen2 and qwen3 GGUFs become named IRs that compute what llama.cpp
computes on the same file, and PEFT adapters attach to them and act as the GGUF adapter
does on llama.cpp; families and RoPE variants OpenVINO cannot compute are refused at
`model add`, with the reason, and nothing is written.

The fixtures are tests/families.py's small random-weight models, whose attention is
peaked (so a wrong RoPE changes the output), with the same LoRA as a GGUF and a PEFT
file. Each variant's named F16 IR is built once per module, in this process (`exact`
profile: OpenVINO at f32 over the F16 copy); llama.cpp runs in a child process (it
aborts its process on a failed assertion). Measured here (30 tokens of text, KL of
llama.cpp's next-token distribution to OpenVINO's, nats; docs/formats.md): every
variant within 3e-5 at every position, base and with the LoRA, where the reader's own
IR missed by 2.1 (llama3, top-1 0.24) and 2.9 (llama-linear, top-1 0.07).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine import cli
from engine.catalog import resolve, validation
from engine.catalog.resolve import AdapterFile
from engine.catalog.store import AdapterSpec, Catalog
from engine.errors import RefusedError
from engine.formats import artifacts
from engine.formats.artifacts import AdapterInfo, BaseModelInfo
from engine.runtime import messages
from engine.runtime.client import EngineClient
from engine.runtime.openvino import build
from tests import families
from tests.engine_helpers import PROMPT, sampling
from tests.openvino_helpers import cache_dir

SUPPORTED = ("llama", "llama3", "llama-linear", "qwen2", "qwen3")
REFUSED = {"gemma2": "does not know the gemma2 architecture",
           "gemma3": "does not know the gemma3 architecture",
           "phi3": "does not know the phi3 architecture"}
MAX_KL = 1e-3  # same F16 weights on both sides (docs/formats.md, "Parity")
TIMEOUT = 900  # a hang bound only

# llama.cpp's logits for every position of a token sequence, with and without a LoRA,
# in a child (llama.cpp aborts its process on a failed assertion).
_LLAMA_CHILD = r"""
import json, sys
import numpy as np
import llama_cpp
jobs = json.loads(sys.stdin.read())
out = []
for job in jobs:
    kwargs = {"lora_path": job["adapter"], "lora_scale": 1.0} if job["adapter"] else {}
    model = llama_cpp.Llama(model_path=job["model"], n_ctx=256, n_batch=256, n_ubatch=256,
                            logits_all=True, n_threads=1, verbose=False, **kwargs)
    ids = model.tokenize(job["text"].encode(), add_bos=False, special=True)
    model.eval(ids)
    np.save(job["save"], np.asarray(model.scores[: len(ids)], dtype=np.float32))
    out.append(ids)
    model.close()
print(json.dumps(out))
"""


def _llama_cpp(jobs: list[dict[str, Any]]) -> list[list[int]]:
    child = subprocess.run([sys.executable, "-c", _LLAMA_CHILD], input=json.dumps(jobs),
                           capture_output=True, text=True, timeout=600, check=False)
    assert child.returncode == 0, child.stderr[-2000:]
    return json.loads(child.stdout.strip().splitlines()[-1])


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64) - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def kl(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """KL(first || second) of the next-token distributions, per position (nats)."""
    a, b = _log_softmax(first), _log_softmax(second)
    return (np.exp(a) * (a - b)).sum(-1)


def top1(first: np.ndarray, second: np.ndarray) -> float:
    return float(np.mean(first.argmax(-1) == second.argmax(-1)))


# ------------------------------------------------------------------------ refusals


@pytest.mark.parametrize("variant", sorted(REFUSED))
def test_a_family_openvino_cannot_compute_is_refused_at_model_add(
        variant: str, family_files, studio_home: Path, capsys: pytest.CaptureFixture) -> None:
    source = family_files[variant].base("F16")
    code = cli.main(["model", "add", "x", "--file", str(source), "--backend", "openvino"])
    err = capsys.readouterr().err
    assert code == 3, err  # RefusedError's exit code
    assert "OpenVINO cannot compute this file as llama.cpp does" in err
    assert REFUSED[variant] in err
    assert "x" not in Catalog().data()["models"]  # nothing written
    assert "building" not in err  # refused before any work


def test_a_rope_scaling_openvino_cannot_reproduce_is_refused_before_any_work(
        family_files, studio_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    yarn = family_files["llama"].rewrite(tmp_path / "yarn.gguf", rope_scaling="yarn",
                                  rope_factor=4.0)
    code = cli.main(["model", "add", "y", "--file", str(yarn), "--backend", "openvino"])
    err = capsys.readouterr().err
    assert code == 3 and "does not reproduce yarn RoPE scaling" in err
    assert "y" not in Catalog().data()["models"]
    # The same file on llama.cpp is fine: llama.cpp computes YaRN itself.
    assert cli.main(["model", "add", "y", "--file", str(yarn)]) == 0


# ----------------------------------------------------------------------- parity


@pytest.fixture(scope="module")
def built(family_files, tmp_path_factory: pytest.TempPathFactory
          ) -> dict[str, build.BuildResult]:
    """Each supported variant's named F16 IR (the exact profile), built once."""
    cache_dir(tmp_path_factory)
    return {v: build.build_from_gguf(family_files[v].base("F16"), profiles=False)
            for v in SUPPORTED}


@pytest.fixture(scope="module")
def llama_side(family_files, built, tmp_path_factory: pytest.TempPathFactory
               ) -> dict[str, dict[str, Any]]:
    """llama.cpp on each variant's F16 GGUF, base and with the GGUF adapter: token ids
    of the fixture's text and the logits at every position."""
    folder = tmp_path_factory.mktemp("llama-logits")
    jobs = []
    for v in SUPPORTED:
        for adapter in (None, family_files[v].gguf_adapter):
            jobs.append({"model": str(family_files[v].base("F16")), "text": families.PROMPT,
                         "adapter": adapter and str(adapter),
                         "save": str(folder / f"{v}-{'lora' if adapter else 'base'}.npy")})
    ids = _llama_cpp(jobs)
    out: dict[str, dict[str, Any]] = {}
    for job, tokens in zip(jobs, ids, strict=True):
        variant = Path(job["save"]).stem.rsplit("-", 1)[0]
        entry = out.setdefault(variant, {"ids": tokens})
        assert entry["ids"] == tokens
        entry["lora" if job["adapter"] else "base"] = np.load(job["save"])
    return out


def _openvino_logits(result: build.BuildResult, ids: list[int],
                     adapter: tuple[AdapterFile, AdapterInfo] | None) -> np.ndarray:
    """OpenVINO's logits at every position but the last (teacher forcing), through the
    engine's own backend, with the adapter's LoRA branches when one is given."""
    from engine.runtime import backend

    model = backend.load_model("openvino", result.folder, "x" * 64, 1, None, lambda: False)
    try:
        context = model.new_context([adapter] if adapter else [], 256, 64)
        rows = context.score(ids[:1], ids[1:])
        context.close()
    finally:
        model.close()
    return np.stack(rows)


def _peft(family_files: dict[str, families.FamilyFiles], variant: str
          ) -> tuple[AdapterFile, AdapterInfo]:
    folder = family_files[variant].peft_adapter
    info = artifacts.inspect_path(folder)
    assert isinstance(info, AdapterInfo)
    return AdapterFile(variant, info.path, "y" * 64, 1.0), info


@pytest.mark.slow
@pytest.mark.parametrize("variant", SUPPORTED)
def test_the_named_ir_computes_what_llama_cpp_computes_on_the_same_file(
        variant: str, built, llama_side) -> None:
    """Same F16 weights, same token ids: the next-token distributions agree at every
    position. llama3 (rope_freqs) and llama-linear (linear scaling) failed this before
    the builder replaced the reader's rotary table (KL of several nats)."""
    side = llama_side[variant]
    ours = _openvino_logits(built[variant], side["ids"], None)
    theirs = side["base"][:-1]
    divergence = kl(theirs, ours)
    assert divergence.max() < MAX_KL, (variant, float(divergence.max()))
    assert top1(theirs, ours) >= 0.9
    report = built[variant].naming
    assert (report.layers, report.renamed, report.rope_tables) == (2, 14, 1)


@pytest.mark.slow
@pytest.mark.parametrize("variant", SUPPORTED)
def test_a_peft_adapter_attaches_and_changes_the_output_as_on_llama_cpp(
        variant: str, family_files, built, llama_side) -> None:
    """The fixture's PEFT file attaches to every layer it names (validation's coverage,
    OpenVINO's own name rule) and moves OpenVINO's distribution as the same LoRA as a
    GGUF moves llama.cpp's."""
    result = built[variant]
    base_info = artifacts.inspect_path(Path(result.folder))
    assert isinstance(base_info, BaseModelInfo) and base_info.architecture == family_files[
        variant].arch
    adapter = _peft(family_files, variant)
    report = validation.check_adapter(adapter[1], base_info, "openvino", "z" * 64)
    coverage = next(c for c in report.checks if c.name == "coverage")
    pairs = len(adapter[1].pairs)
    assert (coverage.status, coverage.detail) == (
        "pass", f"{2 * pairs} of {2 * pairs} tensors attach to {pairs} OpenVINO layers")
    side = llama_side[variant]
    effect = kl(side["base"][:-1], side["lora"][:-1])
    assert effect.max() > 0.05, "the adapter must change llama.cpp's output to judge it"
    ours = _openvino_logits(result, side["ids"], adapter)
    divergence = kl(side["lora"][:-1], ours)
    assert divergence.max() < MAX_KL and divergence.max() < effect.max() / 50, (
        variant, float(divergence.max()), float(effect.max()))


# ------------------------------------------------------------- model add, end to end


@pytest.fixture(scope="module")
def added(family_files, module_home: Path, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[Catalog, EngineClient]]:
    """qwen3 from its Q4_1 file added both ways: on llama.cpp as it is, on OpenVINO
    through `model add --backend openvino` (the build with its profiles, in the engine)."""
    cache_dir(tmp_path_factory)
    source = family_files["qwen3"].base("Q4_1")
    assert cli.main(["model", "add", "q3", "--file", str(source)]) == 0
    assert cli.main(["model", "add", "q3-ov", "--file", str(source), "--backend",
                     "openvino"]) == 0
    client = EngineClient()
    yield Catalog(), client
    client.close()


@pytest.mark.slow
def test_model_add_builds_a_named_ir_with_profiles_and_adapters_attach(
        added, family_files, capsys: pytest.CaptureFixture) -> None:
    catalog, client = added
    record = catalog.model("q3-ov")
    assert record["format"] == "openvino" and Path(record["path"]).is_dir()
    assert record["built_from"]["sha256"] == catalog.model("q3")["sha256"]
    assert record["built_from"]["recipe"] == build.RECIPE
    assert set(record["profiles"]) == {"fast", "fast-int8", "exact"}
    assert record["default_profile"] in ("fast", "fast-int8")
    # Chosen by the probe's measurement on this CPU, kept for this model's size class.
    from engine.runtime.openvino import probe

    kept = json.loads((build.cache_root() / probe.PROBES).read_text())
    (measured,) = [v for k, v in kept.items() if k.endswith(
        probe.size_class(Path(record["profiles"]["fast"]["path"])))]
    assert measured["profile"] == record["default_profile"]
    # The source is Q4_1: both compressed profiles carry its own codes (family-neutral:
    # qwen3's q/k rows are not permuted).
    for name in ("fast", "fast-int8"):
        assert record["profiles"][name]["layers"]["snapped_to_source"] == 14
    # The same GGUF on llama.cpp is its counterpart: the adapter gets both files.
    assert resolve.counterpart(catalog, "q3", "openvino") == "q3-ov"
    spec = family_files["qwen3"]
    assert cli.main(["adapter", "add", "a3", "--base", "q3", "--file",
                     str(spec.gguf_adapter)]) == 0
    capsys.readouterr()
    from engine.catalog import imports

    entry = imports.add_adapter_file(catalog, "a3", "q3-ov", spec.peft_adapter)
    coverage = next(c for c in entry["checks"] if c["name"] == "coverage")
    assert coverage["status"] == "pass" and "8 of 8 tensors attach" in coverage["detail"]
    catalog.add_variant("v3", "q3", [AdapterSpec("a3", 1.0)])
    # The variant runs on OpenVINO (default profile), and differs from its base there.
    answers = {}
    for name in ("q3", "v3"):
        answers[name] = client.call(messages.Generate(
            resolve.resolve(catalog, name, backend="openvino"), PROMPT,
            sampling(max_tokens=8)), timeout=TIMEOUT)
        assert answers[name]["backend"] == "openvino"
    assert answers["q3"]["token_ids"] != answers["v3"]["token_ids"]


@pytest.mark.slow
def test_parity_between_the_backends_on_a_q4_1_source(added) -> None:
    """`parity` on the same Q4_1 file: llama.cpp on its Q4_1 blocks, OpenVINO's exact
    profile on the F16 copy of them (the reference agreement of docs/formats.md)."""
    catalog, client = added
    first = resolve.resolve(catalog, "v3")
    second = resolve.resolve(catalog, "v3", backend="openvino", ov_profile="exact")
    prompts = [messages.Prompt("Tell me about lighthouses.", chat=True)]
    result = client.call(messages.CrossCheck(first, second, tuple(prompts), 8),
                         timeout=TIMEOUT)
    assert result["max_kl"] < 0.05, result
    assert result["first_token_agreement"] == 1.0
    assert result["unused_lora_tensors"] == []


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["llama3", "llama-linear"])
def test_rope_frequency_factors_and_linear_scaling_agree_with_llama_cpp_after_model_add(
        variant: str, added, family_files) -> None:
    """The two silent wrong results of OpenVINO's own GGUF reader, through the commands a
    user runs: `model add --backend openvino` of a Llama 3 file (rope_freqs) and of a
    linearly scaled one, then `parity` against the same file on llama.cpp. The reader's
    own IR ignored both and computed another model (KL of several nats, first tokens
    apart)."""
    catalog, client = added
    source = family_files[variant].base("F16")
    assert cli.main(["model", "add", f"{variant}-cpp", "--file", str(source)]) == 0
    assert cli.main(["model", "add", f"{variant}-ov", "--file", str(source), "--backend",
                     "openvino"]) == 0
    first = resolve.resolve(catalog, f"{variant}-cpp")
    second = resolve.resolve(catalog, f"{variant}-ov", ov_profile="exact")
    prompts = (messages.Prompt("The old lighthouse keeper climbed the spiral stairs", chat=False),
               messages.Prompt("Tell me about lighthouses.", chat=True))
    result = client.call(messages.CrossCheck(first, second, prompts, 8), timeout=TIMEOUT)
    assert all(row["same_token_ids"] for row in result["prompts"])
    assert result["max_kl"] < MAX_KL, (variant, result["max_kl"])
    assert result["first_token_agreement"] == 1.0


def test_build_refuses_before_building(family_files, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The builder itself refuses what `model add` refuses (an engine request made by
    another caller), before it hashes or writes anything."""
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path / "cache"))
    with pytest.raises(RefusedError, match="gemma3 architecture"):
        build.build_from_gguf(family_files["gemma3"].base("F16"))
    assert not (tmp_path / "cache").exists()


def test_the_serving_profile_rule_reads_the_median_ratio_and_ties_go_to_int8() -> None:
    """`probe.preferred_profile`'s rule (docs/formats.md, "Profiles"): `fast-int8` unless
    `fast` steps at least 10 % faster, judged on the median of back-to-back ratios; a
    failed child keeps `fast`."""
    from engine.runtime.openvino import probe

    def answer(ratio: float, returncode: int = 0) -> probe.ProfileProbe:
        line = json.dumps({"fast": 40.0, "fast-int8": 40.0 / ratio, probe.RATIO: ratio})
        return probe._profile_answer(returncode, "noise\n" + line)

    assert answer(1.0).profile == "fast-int8"
    assert answer(1.08).profile == "fast-int8"  # within the machine's spread: a tie
    assert answer(1.10).profile == "fast"
    assert answer(0.8).profile == "fast-int8"
    assert answer(1.5, returncode=-11).profile == "fast"  # crashed: keep the old default
    assert probe._profile_answer(0, "").profile == "fast"


def test_int4_is_a_default_candidate_only_where_it_carries_the_files_own_codes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """From a file that is not all Q4_1, NNCF re-quantizes to 4 bits (another model:
    KL 0.46-0.65 from llama.cpp on the fixtures): `fast-int8` serves without a measurement.
    Where int4 holds the file's own Q4_1 codes, the probe's measurement decides."""
    from engine.runtime.openvino import models, probe

    asked: list[Path] = []

    def measured(fast: Path, int8: Path, precision: str) -> probe.ProfileProbe:
        asked.append(fast)
        return probe.ProfileProbe("fast", {})

    monkeypatch.setattr(probe, "preferred_profile", measured)

    def profiles(layers: dict[str, int]) -> dict[str, dict[str, Any]]:
        return {"fast": {"path": "/f", "precision": "f32", "layers": layers},
                "fast-int8": {"path": "/i", "precision": "f32", "layers": {}}}

    assert models.default_profile(profiles({"int4": 14, "int8": 1,
                                            "snapped_to_source": 0})) == "fast-int8"
    assert models.default_profile(profiles({"int4": 14, "snapped_to_source": 13})) == \
        "fast-int8"
    assert asked == []
    assert models.default_profile(profiles({"int4": 14, "snapped_to_source": 14})) == "fast"
    assert asked == [Path("/f")]
