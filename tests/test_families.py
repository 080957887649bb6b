"""The family fixtures (tests/families.py) are what they claim to be, judged by llama.cpp.

Every variant and type loads and generates in llama.cpp; the quantized files hold the
types they are named for; the GGUF adapter loads and changes the output; the PEFT folder
is the same adapter; and attention is peaked enough that a RoPE, mode or window mistake
moves the next-token distribution visibly (otherwise every parity test built on these
files would pass whatever it computes). llama.cpp runs in a child process per variant
(`families.probe`): it aborts the process on a failed assertion.
"""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests import families as F
from tests import gguf_bytes as gb

# Mean |delta log p| over the reference's 20 likeliest next tokens that a changed RoPE,
# mode or window must exceed. Measured (F32, the 30-token PROMPT): 0.57 (gemma3 without
# its linear scaling) to 6.4 for the changes below; F16 rounding moves 0.001-0.004; with
# q/k (norm) weights at the usual scale, RoPE changes moved 0.03-0.08 (0.35 for qwen3,
# whose q/k norms alone sharpen attention a little).
NOT_FLAT = 0.3
# The adapter (on the Q4_K_M base) must move the distribution at least this much
# (measured 1.5 to 3.9).
ADAPTER_MOVES = 0.3
TOP = 20

# What each variant's "not flat" test changes (each a copy with the same weights):
# "mode": q/k rows in the other order, which is exactly the wrong RoPE mode (normal vs
# NEOX); "base": rope.freq_base x10; "swa_base": Gemma 3's sliding layers' own base x100
# (its global layer's RoPE is slowed x8, a base change there barely shows); "freqs": no
# rope_freqs (Llama 3 factors ignored); "scaling": no rope.scaling (linear factor
# ignored); "window": no sliding_window key (Gemma 2 then slides 4096, Gemma 3 not at all).
CHANGES: dict[str, tuple[str, ...]] = {
    "llama": ("mode", "base"), "llama3": ("mode", "freqs"),
    "llama-linear": ("mode", "scaling"), "qwen2": ("mode", "base"),
    "qwen3": ("mode", "base"), "gemma2": ("mode", "window"),
    "gemma3": ("mode", "swa_base", "scaling", "window"), "phi3": ("mode", "base"),
}
F32, STRING = 6, 8  # GGUFValueType


def _changed(ff: F.FamilyFiles, change: str, folder: Path) -> Path:
    """A copy of the F32 base with one `change` (the same weights otherwise)."""
    spec, arch, ref = ff.spec, ff.arch, ff.base("F32")
    target = folder / f"{ff.variant}-{change}.gguf"
    if change == "mode":
        other = replace(spec, qk_permuted=not spec.qk_permuted)
        flipped = {}
        for name in F.read_header(ref).tensors:
            role = name.split(".")[2] if name.startswith("blk.") else ""
            if role in ("attn_q", "attn_k", "attn_qkv"):  # weights and biases
                rows = F.from_gguf_rows(spec, role, F.read_tensor(ref, name))
                flipped[name] = F.to_gguf_rows(other, role, rows)
        return F.splice(ref, target, tensors=flipped)
    if change == "base":
        return F.splice(ref, target, {f"{arch}.rope.freq_base": (F32, spec.rope_base * 10)})
    if change == "swa_base":
        # llama.cpp's default base of Gemma 3's sliding layers is 10000.
        return F.splice(ref, target, {f"{arch}.rope.freq_base_swa": (F32, 1e6)})
    if change == "freqs":
        return F.splice(ref, target, tensors={"rope_freqs.weight": None})
    if change == "scaling":
        return F.splice(ref, target, {f"{arch}.rope.scaling.type": None,
                                      f"{arch}.rope.scaling.factor": None})
    if change == "window":
        return F.splice(ref, target, {f"{arch}.attention.sliding_window": None})
    raise ValueError(change)


Runs = dict[str, tuple[dict[str, Any], np.ndarray | None]]
# The types every variant's quick run loads; the others load in one slow test.
QUICK_TYPES = ("F32", "Q4_K_M")


def _probe(jobs: dict[str, F.Probe]) -> Runs:
    """The probes in one child: label -> (result, next-token log-probabilities)."""
    results = F.probe(list(jobs.values()))
    return {label: (result, np.load(job.save) if "error" not in result and job.save else None)
            for (label, job), result in zip(jobs.items(), results, strict=True)}


@cache
def _runs(variant: str, folder: Path) -> Runs:
    """A variant's quick llama.cpp runs, in one child process: the F32 and Q4_K_M bases
    (4 greedy tokens), the adapter on Q4_K_M, each change (and, for a derived variant,
    its parent's F32)."""
    ff = F.family_files()[variant]
    folder.mkdir(parents=True, exist_ok=True)
    jobs = {kind: F.Probe(ff.base(kind), save=folder / f"{kind}.npy") for kind in QUICK_TYPES}
    # Right after its base: the child loads that model once for both.
    jobs["adapter"] = F.Probe(ff.base("Q4_K_M"), adapter=ff.gguf_adapter,
                              save=folder / "adapter.npy")
    for change in CHANGES[variant]:
        jobs[change] = F.Probe(_changed(ff, change, folder), n_predict=0,
                               save=folder / f"change-{change}.npy")
    if variant in F.DERIVED:
        jobs["parent"] = F.Probe(F.family_files()[F.DERIVED[variant]].base("F32"),
                                 n_predict=0, save=folder / "parent.npy")
    return _probe(jobs)


@pytest.fixture
def runs(request: pytest.FixtureRequest, family_files: dict[str, F.FamilyFiles],
         tmp_path_factory: pytest.TempPathFactory) -> Runs:
    variant = request.node.callspec.params["variant"]
    # One folder per variant and process: the cache above keys on it.
    return _runs(variant, tmp_path_factory.getbasetemp() / f"families-{variant}")


def _check_generated(label: str, result: dict[str, Any]) -> None:
    assert "error" not in result, (label, result)
    assert result["n_prompt"] == 30 and len(result["tokens"]) == 4, (label, result)
    assert result["finite"], label
    assert 0.5 < result["logit_std"] < 10, (label, result["logit_std"])


def _moved(ref: np.ndarray, other: np.ndarray) -> float:
    """Mean |delta log p| over the reference's TOP likeliest next tokens."""
    top = np.argsort(-ref)[:TOP]
    return float(np.abs(ref[top] - other[top]).mean())


# ------------------------------------------------------------------------------ the build


def test_one_build_shared_and_complete(family_files: dict[str, F.FamilyFiles]) -> None:
    assert tuple(family_files) == F.VARIANTS
    folder = family_files["llama"].base().parents[1]
    assert folder == F.CACHE_ROOT / F.cache_key()
    record = json.loads((folder / "build.json").read_text())
    print(f"\nfamilies built in {record['seconds']} s by pid {record['pid']}")
    assert F.family_files() is F.family_files()  # one lookup per process
    for ff in family_files.values():
        for kind in F.TYPES:
            assert ff.base(kind).is_file()
        assert ff.gguf_adapter.is_file()
        assert (ff.peft_adapter / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize("variant", F.VARIANTS)
def test_layout_is_the_familys(variant: str, family_files: dict[str, F.FamilyFiles]) -> None:
    """Tensor names from gguf-py's MODEL_TENSORS, widths multiple of 256, GQA, the
    metadata llama.cpp reads, and the embedded model's tokenizer byte for byte."""
    import gguf

    ff = family_files[variant]
    spec = ff.spec
    header = F.read_header(ff.base("F32"))
    arch = gguf.MODEL_ARCH_NAMES
    arch_id = next(a for a, name in arch.items() if name == spec.arch)
    allowed = set()
    for kind in gguf.MODEL_TENSORS[arch_id]:
        template = gguf.TENSOR_NAMES[kind]
        allowed |= {template.format(bid=i) + suffix for i in range(spec.n_layer)
                    for suffix in (".weight", ".bias")}
    assert set(header.tensors) <= allowed, set(header.tensors) - allowed
    for name, info in header.tensors.items():
        if len(info.dims) == 2:
            assert info.dims[0] % 256 == 0, (name, info.dims)
    assert spec.n_head_kv < spec.n_head
    dims = {n: i.dims for n, i in header.tensors.items()}
    if spec.fused:
        assert dims["blk.0.attn_qkv.weight"] == (256, (spec.n_head + 2 * spec.n_head_kv) * 64)
        assert dims["blk.0.ffn_up.weight"] == (256, 2 * spec.n_ff)
        assert "blk.0.ffn_gate.weight" not in dims and "blk.0.attn_q.weight" not in dims
    else:
        assert dims["blk.0.attn_q.weight"] == (256, spec.n_head * spec.head_dim)
        assert dims["blk.0.attn_k.weight"] == (256, spec.n_head_kv * spec.head_dim)
    assert ("output.weight" in dims) == (not spec.tied)
    assert ("blk.0.attn_q.bias" in dims) == spec.qkv_bias
    assert ("blk.1.attn_q_norm.weight" in dims) == spec.qk_norm
    assert ("blk.1.post_ffw_norm.weight" in dims) == spec.gemma_norms
    assert ("rope_freqs.weight" in dims) == spec.rope_freqs
    raw = header.raw_kv
    assert raw["general.architecture"] == gb.value(STRING, spec.arch)
    assert raw[f"{spec.arch}.attention.key_length"] == gb.value(4, spec.head_dim)
    name = raw["general.name"][12:].decode().lower()
    assert "phi3" not in name and "phi-3" not in name  # llama.cpp's vocab loader aborts
    tokenizer = {k: v for k, v in raw.items() if k.startswith("tokenizer.")}
    assert tokenizer == F.tokenizer_kv()
    assert {"tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.chat_template",
            "tokenizer.ggml.add_bos_token"} <= set(tokenizer)


@pytest.mark.parametrize("variant", F.VARIANTS)
def test_quantized_files_hold_their_types(variant: str,
                                          family_files: dict[str, F.FamilyFiles]) -> None:
    ff = family_files[variant]
    expected = {"F32": "F32", "F16": "F16", "Q8_0": "Q8_0", "Q6_K": "Q6_K",
                "Q4_K_M": "Q4_K", "Q4_1": "Q4_1"}
    for kind, tensor_type in expected.items():
        types = F.tensor_types(ff.base(kind))
        matrix = "blk.0.attn_qkv.weight" if ff.spec.fused else "blk.0.attn_q.weight"
        assert types[matrix] == tensor_type, (kind, types[matrix])
        assert types["output_norm.weight"] == "F32"


def test_llama3_factors_are_hugging_faces() -> None:
    """rope_freqs = theta / Hugging Face's llama3 inv_freq (transformers'
    _compute_llama3_parameters, written out here), most of them != 1."""
    scaling = F.llama3_rope_scaling()
    dim = F.SPECS["llama3"].head_dim
    inv_freq = 1.0 / (F.LLAMA3_ROPE_BASE ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    old = scaling["original_max_position_embeddings"]
    low_wavelen = old / scaling["low_freq_factor"]
    high_wavelen = old / scaling["high_freq_factor"]
    wavelen = 2 * np.pi / inv_freq
    hf = np.where(wavelen > low_wavelen, inv_freq / scaling["factor"], inv_freq)
    smooth = ((old / wavelen - scaling["low_freq_factor"])
              / (scaling["high_freq_factor"] - scaling["low_freq_factor"]))
    smoothed = (1 - smooth) * hf / scaling["factor"] + smooth * hf
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    hf = np.where(medium, smoothed, hf)
    factors = F.llama3_rope_freqs(dim)
    np.testing.assert_allclose(inv_freq / factors, hf, rtol=1e-6)
    assert (factors != 1).sum() >= dim // 2 * 3 // 4


def test_permutation_is_the_converters() -> None:
    rows = np.arange(8)  # one head of 8: halves (0..3), (4..7) interleaved
    assert F.permute_rows(rows, 1).tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    weights = np.random.default_rng(0).standard_normal((256, 3))
    for heads in (4, 2):
        assert np.array_equal(F.unpermute_rows(F.permute_rows(weights, heads), heads),
                              weights)


# --------------------------------------------------------------------------- in llama.cpp


@pytest.mark.parametrize("variant", F.VARIANTS)
def test_f32_and_q4_k_m_load_and_generate(variant: str, runs: Runs) -> None:
    for kind in QUICK_TYPES:
        _check_generated(f"{variant} {kind}", runs[kind][0])


@pytest.mark.slow
def test_every_other_type_loads_and_generates(family_files: dict[str, F.FamilyFiles],
                                               tmp_path: Path) -> None:
    """F16, Q8_0, Q6_K and Q4_1 of every variant (32 loads, ~10 s of CPU: slow)."""
    jobs = {f"{v} {kind}": F.Probe(ff.base(kind), save=tmp_path / f"{v}-{kind}.npy")
            for v, ff in family_files.items() for kind in F.TYPES if kind not in QUICK_TYPES}
    jobs.update({f"{v} F32": F.Probe(ff.base("F32"), n_predict=0,
                                     save=tmp_path / f"{v}-F32.npy")
                 for v, ff in family_files.items()})
    runs = _probe(jobs)
    for label, (result, _) in runs.items():
        if not label.endswith("F32"):
            _check_generated(label, result)
    for variant in family_files:
        # F16 is F32 rounded: the same distribution to rounding (greedy may differ where
        # two tokens are within rounding of each other: phi3's are).
        assert _moved(runs[f"{variant} F32"][1], runs[f"{variant} F16"][1]) < 0.02


@pytest.mark.parametrize("variant", F.VARIANTS)
def test_gguf_adapter_changes_the_output(variant: str, runs) -> None:
    result, adapted = runs["adapter"]
    assert "error" not in result, result
    base_result, base = runs["Q4_K_M"]
    assert adapted is not None and base is not None
    moved = _moved(base, adapted)
    print(f"\n{variant}: adapter moves {moved:.3f}")
    assert moved > ADAPTER_MOVES
    assert result["tokens"] != base_result["tokens"]


@pytest.mark.parametrize("variant", F.VARIANTS)
def test_attention_is_not_flat(variant: str, runs) -> None:
    _, ref = runs["F32"]
    assert ref is not None
    figures = {}
    for change in CHANGES[variant]:
        result, changed = runs[change]
        assert "error" not in result and changed is not None, (change, result)
        figures[change] = _moved(ref, changed)
    print(f"\n{variant}: " + ", ".join(f"{c} {v:.3f}" for c, v in figures.items()))
    assert all(v > NOT_FLAT for v in figures.values()), figures
    if variant in F.DERIVED:
        # llama3 without rope_freqs and llama-linear without scaling are llama exactly.
        undo = "freqs" if variant == "llama3" else "scaling"
        assert np.array_equal(runs[undo][1], runs["parent"][1])


# ------------------------------------------------------------------------------- PEFT


@pytest.mark.parametrize("variant", F.VARIANTS)
def test_peft_folder_is_the_gguf_adapter(variant: str,
                                         family_files: dict[str, F.FamilyFiles]) -> None:
    """A equal; B equal but for llama's q (n_head) and k (n_head_kv) rows, which the GGUF
    holds permuted."""
    import gguf
    from safetensors.numpy import load_file

    ff = family_files[variant]
    spec = ff.spec
    reader = gguf.GGUFReader(ff.gguf_adapter)
    assert reader.fields["general.type"].contents() == "adapter"
    assert reader.fields["general.architecture"].contents() == spec.arch
    assert reader.fields["adapter.type"].contents() == "lora"
    assert reader.fields["adapter.lora.alpha"].contents() == F.LORA_ALPHA
    tensors = {t.name: np.array(t.data) for t in reader.tensors}
    peft = load_file(str(ff.peft_adapter / "adapter_model.safetensors"))
    config = json.loads((ff.peft_adapter / "adapter_config.json").read_text())
    assert config["r"] == F.LORA_RANK and config["lora_alpha"] == F.LORA_ALPHA
    assert config["peft_type"] == "LORA" and config["task_type"] == "CAUSAL_LM"
    suffix = "qkv_proj" if spec.fused else "q_proj"
    assert suffix in config["target_modules"]
    assert len(peft) == len(tensors) == 2 * spec.n_layer * len(spec.targets)
    heads = {"attn_q": spec.n_head, "attn_k": spec.n_head_kv} if variant.startswith("llama") \
        else {}
    for layer in range(spec.n_layer):
        for role in spec.targets:
            a = tensors[f"blk.{layer}.{role}.weight.lora_a"]
            b = tensors[f"blk.{layer}.{role}.weight.lora_b"]
            module = f"base_model.model.model.layers.{layer}.{spec.hf_suffix(role)}"
            assert a.shape == (F.LORA_RANK, spec.n_embd)  # ggml {in, r}
            np.testing.assert_array_equal(peft[f"{module}.lora_A.weight"], a)
            if role in heads:
                b = F.unpermute_rows(b, heads[role])
                assert not np.array_equal(peft[f"{module}.lora_B.weight"],
                                          tensors[f"blk.{layer}.{role}.weight.lora_b"])
            np.testing.assert_array_equal(peft[f"{module}.lora_B.weight"], b)


@pytest.mark.slow
def test_tokenizer_is_the_embedded_models_by_gguf_reader(
        family_files: dict[str, F.FamilyFiles]) -> None:
    """gguf-py's own reader sees the same tokenizer entries in a fixture as in the
    embedded model (the fixtures copy them with this module's header walker; ~10 s)."""
    import gguf

    def entries(path: Path) -> dict[str, Any]:
        reader = gguf.GGUFReader(path)
        return {k: (f.types, f.contents()) for k, f in reader.fields.items()
                if k.startswith("tokenizer.")}

    embedded = entries(F.embedded_path())
    assert len(embedded["tokenizer.ggml.tokens"][1]) == 49152
    assert entries(family_files["gemma3"].base("Q4_K_M")) == embedded
