"""Adapters converted, merged and exported right for every model family.

Two independent sources judge. tests/families.py's tiny GGUF bases of every family
(llama, llama with Llama 3 `rope_freqs`, llama with linear RoPE, qwen2, qwen3, gemma2,
gemma3, phi3), each with the same LoRA written independently as a GGUF (llama.cpp's
order) and as a PEFT folder (Hugging Face's order), use none of our readers or writers,
so they judge:

- the GGUF <-> PEFT conversion (`lora_io`): the PEFT we make from the GGUF is the
  fixture's PEFT tensor for tensor (q/k rows permuted for llama only; the other
  families' rows are Hugging Face's already, and Phi-3's fused qkv_proj stays fused),
  and GGUF -> PEFT -> GGUF gives the same file's values back;
- the merge (`merge`): every family's adapted tensor is W + scale·alpha/r·B·A, and the
  merged file computes on llama.cpp what base + adapter computes;
- the vLLM export (`hf_export`, `export/vllm`): each family's F32 base loads in
  transformers as its own class and gives llama.cpp's next-token log-probabilities on
  the same token ids, and the exported PEFT adapter (loaded with peft) changes them as
  the GGUF adapter does on llama.cpp; the Llama 3 export's RoPE reproduces rope_freqs;
  the exported tokenizers split text as llama.cpp does, per pre-tokenizer.

And tests/reference_models.py's Hugging Face models and PEFT adapters, converted by
llama.cpp's own convert_hf_to_gguf.py and convert_lora_to_gguf.py: our conversion of
llama.cpp's LoRA is the original PEFT, and our export of llama.cpp's GGUF is the original
model (same config fields, the same log-probabilities in transformers to the bit).

Measured bounds (next-token log-probabilities over the 26-token prompt, every position,
llama.cpp with an F32 KV cache, F32 weights, one thread): llama, llama3, llama-linear,
qwen2, qwen3, phi3: max |Δ log p| over the likeliest 20 tokens ~1e-5 and KL ~1e-11,
which is float summation order; gemma2 and gemma3: ~2e-3 and KL ~3e-7, because
llama.cpp's CPU GELU reads a table indexed by the f16-rounded input (ggml-cpu vec.h,
GGML_GELU_FP16) where transformers computes tanh-GELU in float32. The asserted limits
are those figures with a margin (`LIMITS`); a wrong q/k row order, norm shift, RoPE or
window moves them by orders of magnitude (the llama3 check below shows how much a
missing rope_freqs alone moves them).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine import cli
from engine.errors import RefusedError
from engine.formats import architecture, gguf_file, hf_export, lora_io, merge
from tests import families
from tests import reference_models as reference

VARIANTS = families.VARIANTS
# Families whose GGUF q/k rows are permuted (llama.cpp's "normal" RoPE).
PERMUTED = {"llama", "llama3", "llama-linear"}
# (max |Δ log p| over each position's 20 likeliest tokens, max KL) per variant, base and
# variant alike; see the module docstring for the measured figures.
EXACT_LIMITS = (2e-4, 1e-8)
GELU_TABLE_LIMITS = (2e-2, 2e-5)
LIMITS = {v: GELU_TABLE_LIMITS if v.startswith("gemma") else EXACT_LIMITS for v in VARIANTS}


def model_of(path: Path) -> architecture.Model:
    return architecture.describe(gguf_file.read_header(path))


def same_layers(first: lora_io.LoraWeights, second: lora_io.LoraWeights) -> bool:
    """The same modules with bit-identical A and B."""
    return set(first.layers) == set(second.layers) and all(
        np.array_equal(first.layers[m][i], second.layers[m][i])
        for m in first.layers for i in (0, 1))


# ------------------------------------------------------------------------- conversion


def test_a_layout_from_the_catalog_answers_as_the_description(
        family_files: dict[str, families.FamilyFiles]) -> None:
    roles = architecture.PROJECTION_ROLES
    for variant, files in family_files.items():
        model = model_of(files.base())
        layout = lora_io.Layout.of(model.family.name, model.n_head, model.n_head_kv)
        assert [layout.heads_for(r) for r in roles] == [model.heads_for(r) for r in roles]
        assert (model.heads_for("attn_q") is not None) == (variant in PERMUTED), variant


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_gguf_adapter_converts_to_the_independently_made_peft(
        variant: str, family_files: dict[str, families.FamilyFiles], tmp_path: Path,
        studio_home: Path) -> None:
    """Through the command line, as a user converts: the base's family decides (on the
    code before families, qwen2/qwen3/gemma2/gemma3 q rows came out permuted as llama's
    and Phi-3's qkv was refused)."""
    files = family_files[variant]
    assert cli.main(["model", "add", "base", "--file", str(files.base("Q4_K_M"))]) == 0
    out = tmp_path / "peft"
    assert cli.main(["adapter", "convert-file", str(files.gguf_adapter), str(out),
                     "--base", "base"]) == 0
    ours, theirs = lora_io.read_peft(out), lora_io.read_peft(files.peft_adapter)
    assert same_layers(ours, theirs)
    assert ours.architecture == files.arch and theirs.architecture is None
    assert ours.alpha == theirs.alpha == families.LORA_ALPHA
    config = json.loads((out / "adapter_config.json").read_text())
    fixture = json.loads((files.peft_adapter / "adapter_config.json").read_text())
    assert config["target_modules"] == fixture["target_modules"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_gguf_to_peft_and_back_is_exact(
        variant: str, family_files: dict[str, families.FamilyFiles], tmp_path: Path) -> None:
    files = family_files[variant]
    model = model_of(files.base())
    lora_io.convert_file(files.gguf_adapter, tmp_path / "peft", model)
    lora_io.convert_file(tmp_path / "peft", tmp_path / "back.gguf", model)
    original, back = lora_io.read_gguf(files.gguf_adapter), lora_io.read_gguf(
        tmp_path / "back.gguf")
    assert same_layers(original, back)
    assert (back.alpha, back.rank, back.architecture) == (original.alpha, original.rank,
                                                          files.arch)
    # The fixture's own PEFT (no architecture recorded: the base decides) gives the
    # fixture's GGUF.
    lora_io.convert_file(files.peft_adapter, tmp_path / "theirs.gguf", model)
    assert same_layers(lora_io.read_gguf(tmp_path / "theirs.gguf"), original)


def test_an_adapter_is_converted_only_for_its_own_family(
        family_files: dict[str, families.FamilyFiles], tmp_path: Path,
        studio_home: Path) -> None:
    qwen3, llama = family_files["qwen3"], model_of(family_files["llama"].base())
    # Without --base the default base (the embedded llama model) is taken: refused.
    assert cli.main(["adapter", "convert-file", str(qwen3.gguf_adapter),
                     str(tmp_path / "peft")]) == 3
    with pytest.raises(RefusedError, match="is for qwen3, the base is llama"):
        lora_io.convert_file(qwen3.gguf_adapter, tmp_path / "peft", llama)
    assert not (tmp_path / "peft").exists()
    # Our PEFT folders carry their architecture; converting one for another family is
    # refused too.
    lora_io.convert_file(qwen3.gguf_adapter, tmp_path / "q3", model_of(qwen3.base()))
    with pytest.raises(RefusedError, match="is for qwen3"):
        lora_io.convert_file(tmp_path / "q3", tmp_path / "x.gguf", llama)
    assert not (tmp_path / "x.gguf").exists()


def test_a_fused_projection_crosses_only_into_a_layout_that_has_it(
        family_files: dict[str, families.FamilyFiles], tmp_path: Path) -> None:
    """Phi-3's fused qkv_proj has no counterpart in a family with separate q/k/v (and a
    separate up_proj none in Phi-3's gate_up_proj layout): refused, nothing written."""
    phi3, qwen2 = family_files["phi3"], family_files["qwen2"]
    fused = lora_io.read_gguf(phi3.gguf_adapter)
    fused.architecture = "qwen2"  # a qwen2 file may hold a fused attn_qkv for llama.cpp
    with pytest.raises(RefusedError, match=r"qkv_proj \(a fused q/k/v projection\) has no "
                                           r"counterpart in Qwen2ForCausalLM"):
        lora_io.gguf_to_peft(fused, model_of(qwen2.base()))
    lora_io.write_gguf(tmp_path / "fused.gguf", fused)
    with pytest.raises(RefusedError, match="no counterpart"):
        lora_io.convert_file(tmp_path / "fused.gguf", tmp_path / "peft",
                             model_of(qwen2.base()))
    assert not (tmp_path / "peft").exists()
    separate = lora_io.read_peft(qwen2.peft_adapter)
    up = {m.replace("self_attn.q_proj", "mlp.up_proj"): ab for m, ab in
          separate.layers.items() if m.endswith("q_proj")}
    with pytest.raises(RefusedError, match="up_proj has no counterpart in Phi3ForCausalLM"):
        lora_io.peft_to_gguf(lora_io.LoraWeights(16.0, 8, up), model_of(phi3.base()))


def test_the_older_call_with_head_counts_takes_the_family_from_the_adapter(
        family_files: dict[str, families.FamilyFiles]) -> None:
    """Callers that still pass (n_head, n_head_kv) get the adapter's own family."""
    files = family_files["qwen2"]
    weights = lora_io.read_gguf(files.gguf_adapter)
    model = model_of(files.base())
    assert same_layers(lora_io.gguf_to_peft(weights, model.n_head, model.n_head_kv),
                       lora_io.read_peft(files.peft_adapter))
    weights.architecture = None
    with pytest.raises(RefusedError, match="does not say its architecture"):
        lora_io.gguf_to_peft(weights, model.n_head, model.n_head_kv)


# ------------------------------------------------------------------------------ merge


# The vocabulary arrays: the merge copies them as they are, and the gguf package's reader,
# which the merge writes with, takes seconds over them; a merge test does without.
VOCABULARY = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges")


@pytest.mark.parametrize("variant", VARIANTS)
def test_merge_adds_the_delta_to_every_familys_own_tensors(
        variant: str, family_files: dict[str, families.FamilyFiles], tmp_path: Path) -> None:
    """Each adapted tensor of the merged file is W + scale·alpha/r·B·A in the GGUF's own
    row order (Phi-3's fused attn_qkv included) on the base's own F16 grid, every other
    tensor byte for byte the base's."""
    files = family_files[variant]
    source = families.splice(files.base("F16"), tmp_path / "base.gguf",
                             dict.fromkeys(VOCABULARY))
    weights = lora_io.read_gguf(files.gguf_adapter)
    part = merge.MergePart("lora", weights, 0.5)
    written = merge.write_merged(source, [part], tmp_path / "merged.gguf", "base")
    base = gguf_file.read_header(source)
    merged = gguf_file.read_header(tmp_path / "merged.gguf")
    targets = {f"blk.{layer}.{role}.weight" for layer, role in families.lora_weights(
        files.spec)}
    assert set(written.adapted) == targets
    factor = np.float32(0.5 * families.LORA_ALPHA / families.LORA_RANK)
    for tensor in base.tensors:
        if tensor in targets:
            a, b = weights.layers[lora_io.naming.gguf_to_module(tensor, files.arch)]
            want = (gguf_file.read_tensor(base, tensor) + (b * factor) @ a).astype(np.float16)
            assert np.array_equal(gguf_file.read_tensor(merged, tensor),
                                  want.astype(np.float32)), tensor
        else:
            assert np.array_equal(gguf_file.read_tensor_bytes(merged, tensor),
                                  gguf_file.read_tensor_bytes(base, tensor)), tensor


@pytest.mark.slow
def test_the_merged_phi3_file_computes_what_base_and_adapter_compute_on_llama_cpp(
        family_files: dict[str, families.FamilyFiles], tmp_path: Path) -> None:
    files = family_files["phi3"]
    weights = lora_io.read_gguf(files.gguf_adapter)
    merge.write_merged(files.base(), [merge.MergePart("lora", weights, 1.0)],
                       tmp_path / "merged.gguf", "base")
    ids, (with_adapter, merged, plain) = llama_cpp_logprobs([
        (files.base(), files.gguf_adapter), (tmp_path / "merged.gguf", None),
        (files.base(), None)])
    assert len(ids) > 20
    figures = distance(with_adapter, merged)
    effect = distance(with_adapter, plain)
    print("phi3 merged", figures, "adapter effect", effect)
    assert figures["max_dlogp"] < 1e-3 and figures["max_kl"] < 1e-7, figures
    assert effect["max_kl"] > 1e-2, effect  # the adapter matters: the check is not vacuous


# ----------------------------------------------------------------------------- export


# llama.cpp in a child process (it aborts the process on a failed assertion): every
# position's log-probabilities of the prompt, F32 KV cache, one thread.
_LLAMA_CHILD = r"""
import json, sys
import numpy as np
import llama_cpp
request = json.loads(sys.stdin.read())
answer = {"ids": None, "files": []}
for index, (model, adapter) in enumerate(request["jobs"]):
    extra = {"lora_path": adapter, "lora_scale": 1.0} if adapter else {}
    llm = llama_cpp.Llama(model, n_ctx=256, n_batch=256, n_ubatch=256, n_threads=1,
                          logits_all=True, verbose=False, flash_attn=False, type_k=0,
                          type_v=0, **extra)
    ids = llm.tokenize(request["prompt"].encode(), add_bos=False, special=True)
    answer["ids"] = ids
    llm.eval(ids)
    logits = np.array(llm.scores[:len(ids)], dtype=np.float64)
    logits -= logits.max(axis=-1, keepdims=True)
    logits -= np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    path = request["out"] + f"/{index}.npy"
    np.save(path, logits)
    answer["files"].append(path)
    del llm
print(json.dumps(answer))
"""


def llama_cpp_logprobs(jobs: list[tuple[Path, Path | None]], prompt: str = families.PROMPT
                       ) -> tuple[list[int], list[np.ndarray]]:
    """llama.cpp's token ids for `prompt` and, per (model, adapter) job, the
    log-probabilities at every position (n, vocab)."""
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        request = {"jobs": [[str(m), str(a) if a else None] for m, a in jobs],
                   "prompt": prompt, "out": out}
        done = subprocess.run([sys.executable, "-c", _LLAMA_CHILD], input=json.dumps(request),
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        answer = json.loads(done.stdout.strip().splitlines()[-1])
        return answer["ids"], [np.load(p) for p in answer["files"]]


def hf_logprobs(model: Any, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    return torch.log_softmax(logits, dim=-1).numpy()


def distance(reference: np.ndarray, got: np.ndarray) -> dict[str, float]:
    """Max KL(reference || got) over positions and max |Δ log p| over each position's 20
    likeliest tokens (by the reference)."""
    kl = (np.exp(reference) * (reference - got)).sum(-1)
    top = np.argsort(-reference, axis=-1)[:, :20]
    delta = np.abs(np.take_along_axis(reference - got, top, axis=-1))
    return {"max_kl": float(kl.max()), "max_dlogp": float(delta.max()),
            "top1": float((reference.argmax(-1) == got.argmax(-1)).mean())}


@pytest.fixture(scope="module")
def exported(module_home: Path, family_files: dict[str, families.FamilyFiles],
             tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each family's F32 base with its adapter as a catalog variant, exported for vLLM
    the way `variant-studio export VARIANT --target vllm` does."""
    from engine import export
    from engine.catalog import imports
    from engine.catalog.store import AdapterSpec, Catalog

    catalog = Catalog()
    out = tmp_path_factory.mktemp("vllm")
    folders = {}
    for variant, files in family_files.items():
        imports.add_model(catalog, f"{variant}-base", files.base())
        imports.add_adapter(catalog, f"{variant}-lora", f"{variant}-base", files.gguf_adapter)
        catalog.add_variant(f"{variant}-var", f"{variant}-base",
                            [AdapterSpec(f"{variant}-lora", 1.0)])
        export.export_variant(catalog, f"{variant}-var", "vllm", out / variant)
        folders[variant] = out / variant
    return folders


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_the_vllm_export_computes_what_llama_cpp_computes(
        variant: str, exported: dict[str, Path], family_files: dict[str, families.FamilyFiles],
        record_property: Any) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    files, folder = family_files[variant], exported[variant]
    family = architecture.family(files.arch)
    manifest = json.loads((folder / "manifest.json").read_text())
    config = json.loads((folder / "base" / "config.json").read_text())
    assert config["architectures"] == [family.hf_class]
    assert config["model_type"] == family.hf_model_type
    ids, (llama_base, llama_variant) = llama_cpp_logprobs(
        [(files.base(), None), (files.base(), files.gguf_adapter)])
    tokenizer = AutoTokenizer.from_pretrained(str(folder / "base"))
    assert tokenizer.encode(families.PROMPT, add_special_tokens=False) == ids

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(str(folder / "base"), dtype=torch.float32)
    assert type(model).__name__ == family.hf_class
    lora = folder / manifest["lora"]["path"]
    model = PeftModel.from_pretrained(model, str(lora)).eval()
    hf_variant = hf_logprobs(model, ids)
    with model.disable_adapter():
        hf_base = hf_logprobs(model, ids)
    base, adapted = distance(llama_base, hf_base), distance(llama_variant, hf_variant)
    effect = distance(llama_variant, llama_base)
    for name, figures in (("base", base), ("variant", adapted), ("effect", effect)):
        record_property(name, json.dumps(figures))
    print(variant, "base", base, "variant", adapted, "adapter effect", effect)
    max_dlogp, max_kl = LIMITS[variant]
    for figures in (base, adapted):
        assert figures["max_dlogp"] <= max_dlogp and figures["max_kl"] <= max_kl, figures
        assert figures["top1"] == 1.0, figures
    assert effect["max_kl"] > 1e3 * max(adapted["max_kl"], 1e-9), (effect, adapted)


def test_each_familys_config_says_what_llama_cpp_computes(
        family_files: dict[str, families.FamilyFiles]) -> None:
    def config(variant: str) -> dict[str, Any]:
        header = gguf_file.read_header(family_files[variant].base())
        return hf_export.config_dict(hf_export.describe(header), header)

    gemma2, gemma3 = config("gemma2"), config("gemma3")
    assert gemma2["query_pre_attn_scalar"] == 64 and gemma2["sliding_window"] == 8
    assert gemma2["attn_logit_softcapping"] == 50.0
    assert gemma2["final_logit_softcapping"] == 30.0
    assert gemma2["hidden_activation"] == "gelu_pytorch_tanh"
    assert gemma2["layer_types"] == ["sliding_attention", "full_attention"]
    assert gemma3["rope_scaling"] == {"rope_type": "linear", "factor": 8.0}
    assert gemma3["rope_local_base_freq"] == 10000.0 and gemma3["rope_theta"] == 1e6
    assert gemma3["rope_parameters"]["sliding_attention"] == {"rope_type": "default",
                                                              "rope_theta": 10000.0}
    assert config("llama-linear")["rope_scaling"] == {"rope_type": "linear", "factor": 4.0}
    assert config("qwen2")["use_sliding_window"] is False
    assert config("qwen3")["head_dim"] == 64 and config("qwen3")["num_attention_heads"] == 8
    phi3 = config("phi3")
    assert phi3["rope_scaling"] is None and phi3["sliding_window"] is None
    for variant, files in family_files.items():
        tied = "output.weight" not in gguf_file.read_header(files.base()).tensors
        assert config(variant)["tie_word_embeddings"] == tied, variant


@pytest.mark.slow
def test_the_llama3_export_reproduces_rope_freqs(
        exported: dict[str, Path], family_files: dict[str, families.FamilyFiles]) -> None:
    """transformers' inverse frequencies from the exported config are llama.cpp's
    base^(-2i/d) / rope_freqs[i]; without them the model computes something else."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    files = family_files["llama3"]
    header = gguf_file.read_header(files.base())
    factors = gguf_file.read_tensor(header, "rope_freqs.weight").astype(np.float64)
    dims = files.spec.head_dim
    want = files.spec.rope_base ** (-np.arange(0, dims, 2) / dims) / factors
    config = AutoConfig.from_pretrained(str(exported["llama3"] / "base"))
    assert config.rope_parameters["rope_type"] == "llama3"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    got = model.model.rotary_emb.inv_freq.double().numpy()
    assert np.max(np.abs(got - want) / want) < 1e-6
    assert not np.allclose(factors, 1.0)  # the factors change the frequencies
    # Ignoring them changes llama.cpp's output far beyond the export's bound.
    _, (llama3, plain) = llama_cpp_logprobs([
        (files.base(), None), (family_files["llama"].base(), None)])
    assert distance(llama3, plain)["max_kl"] > 1e4 * EXACT_LIMITS[1]


@pytest.mark.parametrize("params", [
    (500000.0, 128, 8.0, 1.0, 4.0, 8192),  # Llama 3.1 / 3.2 as Meta configures them
    (families.LLAMA3_ROPE_BASE, 64, families.LLAMA3_FACTOR, families.LLAMA3_LOW_FREQ_FACTOR,
     families.LLAMA3_HIGH_FREQ_FACTOR, families.LLAMA3_ORIGINAL_CONTEXT),
    (10000.0, 16, 4.0, 1.0, 4.0, 512),  # one smoothed frequency: only bounded
    (10000.0, 16, 4.0, 1.0, 1.5, 1000),  # none smoothed
])
def test_llama3_parameters_are_derived_from_rope_freqs_and_checked(
        params: tuple[float, int, float, float, float, int]) -> None:
    base, dims, factor, low, high, context = params
    inv = base ** (-np.arange(0, dims, 2, dtype=np.float64) / dims)
    factors = []
    for freq in inv:  # convert_hf_to_gguf's generate_extra_tensors (conversion/llama.py)
        wavelen = 2 * math.pi / freq
        if wavelen < context / high:
            factors.append(1.0)
        elif wavelen > context / low:
            factors.append(factor)
        else:
            smooth = (context / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    rope_freqs = np.asarray(factors, dtype=np.float32)
    derived = hf_export.llama3_rope(base, dims, rope_freqs)
    assert derived is not None and derived["rope_type"] == "llama3"
    got = hf_export.hf_llama3_inv_freq(base, dims, derived)
    assert np.max(np.abs(got - inv / rope_freqs) / (inv / rope_freqs)) <= 1e-5
    if base == 500000.0:  # enough smoothed frequencies: Meta's own numbers come back
        assert derived == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def test_rope_freqs_that_no_llama3_parameters_give_are_refused() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(RefusedError, match="not Llama 3's shape"):
        hf_export.llama3_rope(10000.0, 64, rng.uniform(1, 8, 32).astype(np.float32))
    assert hf_export.llama3_rope(10000.0, 64, np.ones(32, np.float32)) is None
    assert hf_export.llama3_rope(10000.0, 64, np.full(32, 2.0, np.float32)) == {
        "rope_type": "linear", "factor": 2.0}


# ----------------------------------------------- from llama.cpp's own converters and back

# config.json fields that must say what the original Hugging Face model said (RoPE is
# checked by the log-probabilities: equivalent Llama 3 parameters may be spelled apart).
CONFIG_FIELDS = ("architectures", "model_type", "hidden_size", "intermediate_size",
                 "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                 "head_dim", "vocab_size", "tie_word_embeddings", "rms_norm_eps",
                 "sliding_window", "query_pre_attn_scalar", "attn_logit_softcapping",
                 "final_logit_softcapping", "hidden_activation", "attention_bias")


@pytest.mark.parametrize("key", reference.FAMILY_KEYS)
def test_llama_cpps_lora_conversion_converts_back_to_the_original_peft(
        key: str, reference_models: dict[str, reference.ReferenceModel]) -> None:
    """tests/reference_models.py: a PEFT adapter made by peft, converted to GGUF by
    llama.cpp's convert_lora_to_gguf.py; ours gives the original back, and the original
    converts to llama.cpp's file."""
    ref = reference_models[key]
    model = model_of(ref.base_gguf)
    theirs = lora_io.read_gguf(ref.lora_gguf)
    assert same_layers(lora_io.gguf_to_peft(theirs, model), lora_io.read_peft(ref.peft))
    assert same_layers(lora_io.peft_to_gguf(lora_io.read_peft(ref.peft), model), theirs)


@pytest.mark.slow
@pytest.mark.parametrize("key", reference.FAMILY_KEYS)
def test_the_export_of_llama_cpps_conversion_is_the_original_model(
        key: str, reference_models: dict[str, reference.ReferenceModel],
        tmp_path: Path, record_property: Any) -> None:
    """The Hugging Face model llama.cpp's convert_hf_to_gguf.py made a GGUF of, exported
    back: the same config and, in transformers, the same log-probabilities as the
    original, with and without its LoRA (measured: equal to the bit, every family)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ref = reference_models[key]
    hf_export.write_base(ref.base_gguf, tmp_path / "base")
    lora_io.write_peft(tmp_path / "peft", lora_io.gguf_to_peft(
        lora_io.read_gguf(ref.lora_gguf), model_of(ref.base_gguf)))
    original = json.loads((ref.hf / "config.json").read_text())
    ours = json.loads((tmp_path / "base" / "config.json").read_text())
    for field in CONFIG_FIELDS:
        if field in original:
            assert ours.get(field) == original[field], field
    ids = ref.tokenizer().encode(families.PROMPT, add_special_tokens=False)
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "base"), dtype=torch.float32,
                                                 attn_implementation="eager")
    model = PeftModel.from_pretrained(model, str(tmp_path / "peft")).eval()
    with torch.no_grad():
        variant = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1).numpy()
        with model.disable_adapter():
            base = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1).numpy()
    figures = {"base": float(np.abs(base - ref.logprobs(ids, adapter=False)).max()),
               "variant": float(np.abs(variant - ref.logprobs(ids, adapter=True)).max())}
    record_property("max_dlogp", json.dumps(figures))
    print(key, figures)
    assert figures["base"] <= 1e-5 and figures["variant"] <= 1e-5, figures


# ------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(("variant", "metadata", "tensors", "reason"), [
    ("llama", {"llama.rope.scaling.type": (8, "yarn"), "llama.rope.scaling.factor": (6, 4.0)},
     {}, "yarn RoPE scaling is not reproduced"),
    ("phi3", {"phi3.rope.scaling.type": (8, "linear"), "phi3.rope.scaling.factor": (6, 2.0)},
     {}, "Phi3ForCausalLM's config accepts RoPE types default, not linear"),
    ("llama", {"tokenizer.ggml.model": (8, "llama")}, {}, "SentencePiece"),
    ("llama", {"tokenizer.ggml.pre": (8, "tekken")}, {}, "tokenizer gpt2/tekken"),
    ("qwen3", {}, {"blk.0.attn_q.bias": np.zeros(512, np.float32)},
     "blk.0.attn_q.bias has no counterpart in Qwen3ForCausalLM"),
    ("llama3", {}, {"rope_freqs.weight": np.linspace(3, 1, 32, dtype=np.float32)},
     "not Llama 3's shape"),
])
def test_what_the_export_cannot_express_is_refused_before_anything_is_written(
        variant: str, metadata: dict[str, Any], tensors: dict[str, np.ndarray], reason: str,
        family_files: dict[str, families.FamilyFiles], tmp_path: Path) -> None:
    source = families.splice(family_files[variant].base("Q4_K_M"), tmp_path / "x.gguf",
                             metadata, tensors)
    with pytest.raises(RefusedError, match=reason):
        hf_export.write_base(source, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------ tokenizers

TEXTS = (
    families.PROMPT,
    "Hello world! I'm sure they'LL say \"it's 12345678 or 3.14159\"...\n\n\tIndented\ttabs"
    "   and   spaces  \n  Ünïcödé naïve café, 日本語のテキスト, emoji 🙂👍🏽, Ελληνικά, "
    "русский текст.\r\nCode: def f(x): return x**2 + 1_000_000 # done\n\n\n   trailing   ",
    "DON'T we've you'd  I'M\u00a0nbsp 2024-12-03 12:30:45.123 $9.99 (a+b)*[c] {x:y} <tag/> "
    "a\u3000b",
    "   ", "\n", "x", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
)
_TOKENIZE_CHILD = r"""
import json, sys
import llama_cpp
request = json.loads(sys.stdin.read())
llm = llama_cpp.Llama(request["path"], vocab_only=True, verbose=False)
print(json.dumps([llm.tokenize(t.encode(), add_bos=bos, special=True)
                  for t in request["texts"] for bos in (False, True)]))
"""


@pytest.mark.slow
@pytest.mark.parametrize(("pre", "add_bos"), [
    ("smollm", None), ("gpt-2", None), ("llama-bpe", None), ("qwen2", None),
    ("llama-bpe", "default"), ("qwen2", "default")])
def test_the_exported_tokenizer_splits_text_as_llama_cpp_does(
        pre: str, add_bos: str | None, family_files: dict[str, families.FamilyFiles],
        tmp_path: Path) -> None:
    """The shared vocabulary under each pre-tokenizer llama.cpp names; "default": the file
    has no add_bos_token key, so the pre-tokenizer's own default applies (llama-bpe: BOS)."""
    from tokenizers import Tokenizer

    changes: dict[str, Any] = {"tokenizer.ggml.pre": (8, pre)}
    if add_bos == "default":
        changes["tokenizer.ggml.add_bos_token"] = None
    path = families.splice(family_files["llama"].base("Q4_K_M"), tmp_path / "t.gguf", changes)
    done = subprocess.run([sys.executable, "-c", _TOKENIZE_CHILD], capture_output=True,
                          text=True, timeout=300,
                          input=json.dumps({"path": str(path), "texts": list(TEXTS)}))
    assert done.returncode == 0, done.stderr[-3000:]
    want = json.loads(done.stdout.strip().splitlines()[-1])
    vocab = hf_export.read_vocabulary(path, gguf_file.read_header(path))
    tokenizer = Tokenizer.from_str(json.dumps(hf_export.tokenizer_json(vocab)))
    got = [tokenizer.encode(t, add_special_tokens=bos).ids for t in TEXTS for bos in
           (False, True)]
    assert got == want
    assert vocab.add_bos == (add_bos == "default" and pre == "llama-bpe")


@pytest.mark.slow
@pytest.mark.parametrize("variant", ("qwen3", "gemma2", "gemma3"))
def test_an_adapter_trained_here_works_in_stock_llama_cpp_and_in_transformers_peft(
        variant: str, family_files: dict[str, families.FamilyFiles], tmp_path: Path) -> None:
    """A few training steps on the fixture (float numerics, the family's default
    targets) give a GGUF adapter that stock llama.cpp loads and a PEFT export (our
    conversion, on our Hugging Face export of the base) that transformers + peft load, and
    both change the model the same way: the same shift in log-probabilities at every
    position, to the export's own precision."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from engine.training import data as data_mod
    from engine.training import support
    from engine.training import trainer as trainer_mod
    from engine.training.config import TrainConfig
    from engine.training.model import DecoderTorch
    from engine.training.tokenizer import Tokenizer
    from tests.factories import sft_data

    files = family_files[variant]
    base = files.base("F32")
    described = support.describe_path(base)
    config = TrainConfig.from_dict({"steps": 4, "batch": 2, "seq_len": 48, "rank": 4,
                                    "alpha": 8.0, "lr": 5e-2, "numerics": "float",
                                    "targets": list(support.default_targets(described))})
    with Tokenizer(base, artifacts_info(base)) as tokenizer:
        data = data_mod.load(sft_data(tmp_path / "data.jsonl"), tokenizer, 48, False, False,
                             2, 2)
    trainer = trainer_mod.Trainer(DecoderTorch(base, numerics="float"), config, data, "sha")
    for _ in range(config.steps):
        trainer.train_step()
    gguf_adapter = tmp_path / "trained.gguf"
    lora_io.write_gguf(gguf_adapter, trainer.weights("fixture"))
    peft_folder = tmp_path / "peft"
    lora_io.write_peft(peft_folder, lora_io.gguf_to_peft(lora_io.read_gguf(gguf_adapter),
                                                         described))
    hf_folder = tmp_path / "hf"
    hf_export.write_base(base, hf_folder)

    ids, (llama_base, llama_variant) = llama_cpp_logprobs([(base, None), (base, gguf_adapter)])
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(str(hf_folder), dtype=torch.float32)
    model = PeftModel.from_pretrained(model, str(peft_folder)).eval()
    hf_variant = hf_logprobs(model, ids)
    with model.disable_adapter():
        hf_base = hf_logprobs(model, ids)
    effect = distance(llama_variant, llama_base)
    assert effect["max_dlogp"] > 0.05, effect  # the trained adapter changes the model
    shift_llama, shift_hf = llama_variant - llama_base, hf_variant - hf_base
    top = np.argsort(-llama_variant, axis=-1)[:, :20]
    gap = np.abs(np.take_along_axis(shift_llama - shift_hf, top, axis=-1)).max()
    max_dlogp, _ = LIMITS[variant]
    print(variant, "effect", effect, "shift gap", gap)
    assert gap <= 2 * max_dlogp, (gap, effect)


def artifacts_info(path: Path) -> Any:
    from engine.formats import artifacts

    return artifacts.inspect_path(path)
