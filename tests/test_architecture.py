"""The architecture description: each family resolved as llama.cpp resolves it, names per
family, what each feature can do per file, and no family named outside the description."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest

from engine.errors import RefusedError
from engine.formats import architecture, capabilities, gguf_file, naming
from engine.formats.gguf_file import GgufArray, GgufHeader, TensorInfo
from engine.formats.safeio import FileStat

ROOT = Path(__file__).resolve().parent.parent


def header(arch: str, layers: int = 2, meta: dict[str, Any] | None = None,
           drop: tuple[str, ...] = (), extra: dict[str, tuple[int, ...]] | None = None,
           types: dict[str, str] | None = None, head_dim: int = 64) -> GgufHeader:
    """A header as the strict reader returns it: `arch`'s metadata and tensor directory
    (no data: describe() reads none), with numbers like the test fixtures'."""
    n_embd, n_head, n_kv, n_ff = 256, 4, 2, 512
    metadata: dict[str, Any] = {
        "general.architecture": arch, f"{arch}.block_count": layers,
        f"{arch}.embedding_length": n_embd, f"{arch}.attention.head_count": n_head,
        f"{arch}.attention.head_count_kv": n_kv, f"{arch}.feed_forward_length": n_ff,
        f"{arch}.attention.key_length": head_dim, f"{arch}.attention.value_length": head_dim,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-6, f"{arch}.context_length": 2048,
        **(meta or {})}
    value_types = {k: ("string" if isinstance(v, str) else "float32" if isinstance(v, float)
                       else "uint32") for k, v in metadata.items()}
    fam = architecture.FAMILIES[arch]
    q, kv = n_head * head_dim, n_kv * head_dim
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (n_embd, 1000),
                                          "output_norm.weight": (n_embd,),
                                          "output.weight": (n_embd, 1000)}
    dims = {"attn_q": (n_embd, q), "attn_k": (n_embd, kv), "attn_v": (n_embd, kv),
            "attn_qkv": (n_embd, q + 2 * kv), "attn_output": (q, n_embd),
            "ffn_gate": (n_embd, n_ff), "ffn_down": (n_ff, n_embd),
            "ffn_up": (n_embd, (2 if fam.fused_gate_up else 1) * n_ff)}
    for i in range(layers):
        for role in fam.projection_roles:
            shapes[f"blk.{i}.{role}.weight"] = dims[role]
        for role, _ in fam.norms:
            width = head_dim if role in ("attn_q_norm", "attn_k_norm") else n_embd
            shapes[f"blk.{i}.{role}.weight"] = (width,)
    shapes.update(extra or {})
    for name in drop:
        shapes.pop(name, None)
    tensors = {name: TensorInfo(name, shape, 0, (types or {}).get(name, "F32"), 0, 0)
               for name, shape in shapes.items()}
    return GgufHeader(path=Path(f"{arch}-test.gguf"), stat=FileStat(0, 0, 0, 0),
                      version=3, metadata=metadata, value_types=value_types,
                      tensors=tensors, alignment=32, data_offset=0)


def test_the_embedded_model_is_described_as_llama_cpp_reads_it(embedded_path: Path) -> None:
    model = architecture.describe(gguf_file.read_header(embedded_path))
    assert (model.name, model.n_layer, model.n_embd, model.n_head, model.n_head_kv,
            model.head_dim, model.n_ff, model.n_vocab) == ("llama", 30, 576, 9, 3, 64, 1536,
                                                           49152)
    assert model.rope == architecture.Rope(architecture.NORMAL, 64, 100000.0, "none", 1.0,
                                           8192, False)
    assert model.tied_output and not model.biases and not model.swa_window
    assert model.attention_scale == pytest.approx(1 / 8)
    assert model.heads_for("attn_q") == 9 and model.heads_for("attn_k") == 3
    assert model.heads_for("attn_v") is None


def test_each_family_reads_its_own_conventions() -> None:
    qwen3 = architecture.describe(header("qwen3", head_dim=128))
    assert qwen3.rope.mode == architecture.NEOX and qwen3.heads_for("attn_q") is None
    assert qwen3.q_width == 512 and qwen3.head_dim == 128  # not n_embd / n_head
    assert qwen3.attention_scale == pytest.approx(128 ** -0.5)
    assert "attn_q_norm" in qwen3.layer_norms() and qwen3.tied_output is False

    # Gemma 2: a window of 4096 and every other layer sliding when the file says nothing;
    # soft-caps 50 and 30; the output is the embedding even if the file has output.weight.
    gemma2 = architecture.describe(header("gemma2", layers=4))
    assert gemma2.swa_window == 4096 and gemma2.swa_layers == (True, False, True, False)
    assert (gemma2.attn_softcap, gemma2.final_softcap) == (50.0, 30.0)
    assert gemma2.tied_output and "output.weight" not in gemma2.required_tensors()
    # ... and at the 27B shape q is scaled by the width per head, not head_dim.
    wide = architecture.describe(header("gemma2", layers=46, head_dim=128))
    assert wide.attention_scale == pytest.approx((256 / 4) ** -0.5)

    # Gemma 3: sliding only when the file declares a window; every 6th layer global; the
    # sliding layers rotate with base 10000 and no scaling, the global ones with the file's.
    plain = architecture.describe(header("gemma3", layers=6))
    assert plain.swa_window == 0 and not any(plain.swa_layers)
    gemma3 = architecture.describe(header("gemma3", layers=12, meta={
        "gemma3.attention.sliding_window": 512, "gemma3.rope.freq_base": 1e6,
        "gemma3.rope.scaling.type": "linear", "gemma3.rope.scaling.factor": 8.0}))
    assert [i for i, s in enumerate(gemma3.swa_layers) if not s] == [5, 11]
    assert (gemma3.rope_base_for(0), gemma3.rope_factor_for(0)) == (10000.0, 1.0)
    assert (gemma3.rope_base_for(5), gemma3.rope_factor_for(5)) == (1e6, 8.0)
    assert gemma3.final_softcap == 0.0
    two = architecture.describe(header("gemma3", meta={
        "gemma3.attention.sliding_window": 8, "gemma3.attention.sliding_window_pattern": 2}))
    assert two.swa_layers == (True, False)
    # The per-layer form (what llama.cpp's converter writes for newer Gemmas) wins.
    flags = architecture.describe(header("gemma3", layers=3, meta={
        "gemma3.attention.sliding_window": 8,
        "gemma3.attention.sliding_window_pattern": GgufArray("bool", 3, (False, True, True))}))
    assert flags.swa_layers == (False, True, True)

    phi3 = architecture.describe(header("phi3"))
    assert phi3.layer_roles() == ("attn_qkv", "attn_output", "ffn_up", "ffn_down")
    assert phi3.projection_shape("ffn_up") == (1024, 256)
    assert phi3.module(0, "ffn_up") == "model.layers.0.mlp.gate_up_proj"


def test_rope_scaling_is_read_as_llama_cpp_reads_it() -> None:
    # A factor without a type is linear (llama.cpp's default type).
    linear = architecture.describe(header("llama", meta={"llama.rope.scaling.factor": 4.0}))
    assert (linear.rope.scaling, linear.rope.factor) == ("linear", 4.0)
    # An explicit "none" never scales, whatever factor the file also gives.
    unscaled = architecture.describe(header("llama", meta={
        "llama.rope.scaling.type": "none", "llama.rope.scaling.factor": 4.0}))
    assert (unscaled.rope.scaling, unscaled.rope.factor) == ("none", 1.0)
    yarn = architecture.describe(header("qwen2", meta={
        "qwen2.rope.scaling.type": "yarn", "qwen2.rope.scaling.factor": 4.0,
        "qwen2.rope.scaling.original_context_length": 32768}))
    assert (yarn.rope.scaling, yarn.rope.original_context) == ("yarn", 32768)
    llama3 = architecture.describe(header("llama", extra={"rope_freqs.weight": (32,)}))
    assert llama3.rope.freq_factors and "rope_freqs.weight" in llama3.required_tensors()


@pytest.mark.parametrize(("build", "reason"), [
    (lambda: header("llama", meta={"general.architecture": "mamba"}), "not one Variant"),
    (lambda: header("qwen2", drop=("blk.1.attn_v.weight",)), "without blk.1.attn_v.weight"),
    (lambda: header("qwen3", extra={"blk.0.attn_q_norm.weight": (32,)}), r"shape \[32\]"),
    (lambda: header("llama", meta={"llama.rope.dimension_count": 32}), "partial rotary"),
    (lambda: header("llama", meta={"llama.rope.scaling.type": "wild"}), "not described"),
    (lambda: header("llama", meta={"llama.block_count": "two"}), "expected a number"),
    (lambda: header("llama", meta={"llama.attention.head_count_kv": 3}), "implausible"),
])
def test_a_file_the_description_cannot_trust_is_refused_with_its_reason(build, reason) -> None:
    with pytest.raises(RefusedError, match=reason):
        architecture.describe(build())


def test_names_follow_the_family() -> None:
    assert naming.gguf_to_module("blk.2.ffn_up.weight", "phi3") == "model.layers.2.mlp.gate_up_proj"
    assert naming.gguf_to_module("blk.2.ffn_up.weight", "qwen2") == "model.layers.2.mlp.up_proj"
    assert naming.gguf_to_module("blk.2.attn_qkv.weight", "phi3") == \
        "model.layers.2.self_attn.qkv_proj"
    assert naming.gguf_to_module("blk.2.attn_q_norm.weight", "qwen3") is None  # not a target
    assert naming.module_to_gguf("model.layers.2.mlp.gate_up_proj") == "blk.2.ffn_up.weight"
    assert naming.parse_targets("qkv, o", "phi3") == ("attn_qkv", "attn_output")
    with pytest.raises(ValueError, match="use qkv, o, up, down"):
        naming.parse_targets("q,v", "phi3")


def test_capabilities_say_what_each_feature_does_with_a_file_and_why_not() -> None:
    def table(h: GgufHeader) -> dict[str, capabilities.Capability]:
        return {c.name: c for c in capabilities.for_header(h)}

    llama = table(header("llama", meta={"tokenizer.ggml.model": "gpt2",
                                        "tokenizer.ggml.pre": "smollm"}))
    assert all(c.ok for c in llama.values()), llama
    gemma = table(header("gemma2"))
    assert not gemma[capabilities.SERVE_OPENVINO].ok
    assert "does not know the gemma2 architecture" in gemma[capabilities.SERVE_OPENVINO].reason
    assert gemma[capabilities.TRAIN].ok and gemma[capabilities.SERVE_LLAMA].ok
    yarn = table(header("qwen2", meta={"qwen2.rope.scaling.type": "yarn",
                                       "qwen2.rope.scaling.factor": 4.0}))
    assert not yarn[capabilities.TRAIN].ok
    assert "yarn RoPE scaling" in yarn[capabilities.TRAIN].reason
    kquant = table(header("qwen3", types={"blk.0.attn_q.weight": "Q4_K",
                                          "output.weight": "Q6_K"}))
    assert kquant[capabilities.TRAIN].ok and kquant[capabilities.TRAIN_SERVED].ok
    bf16 = table(header("qwen3", types={"blk.0.attn_q.weight": "BF16"}))
    assert bf16[capabilities.TRAIN].ok and not bf16[capabilities.TRAIN_SERVED].ok
    assert "blk.0.attn_q.weight is BF16" in bf16[capabilities.TRAIN_SERVED].reason
    unknown = header("llama", meta={"general.architecture": "mamba"})
    found = table(unknown)
    assert [n for n, c in found.items() if c.ok] == [
        capabilities.SERVE_LLAMA, capabilities.MERGE, capabilities.EXPORT_LLAMA_SERVER]
    with pytest.raises(RefusedError, match="cannot train adapters: architecture 'mamba'"):
        capabilities.require(unknown, capabilities.TRAIN)


# Family names, llama's metadata prefix and llama-only class names may appear in engine
# code only inside the description. Docstrings and comments may name families (they
# explain); the backend id "llama" (llama.cpp) is not a family and stays.
FAMILY_WORDS = re.compile(r"\b(qwen\d?|gemma\d?|phi-?\d|mistral)\b|^llama\.(?!cpp)|"
                          r"Llama(Torch|Shape|ForCausalLM)|llama_shape", re.IGNORECASE)


def _code_words(tree: ast.AST) -> list[tuple[int, str]]:
    """Identifiers and string constants of a module, docstrings left out."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    words = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings:
                words.append((node.lineno, node.value))
        elif isinstance(node, ast.Name):
            words.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute):
            words.append((node.lineno, node.attr))
        elif isinstance(node, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef):
            words.append((node.lineno, node.name))
        elif isinstance(node, ast.Compare):
            # `arch != "llama"`: a family test written by hand.
            text = ast.unparse(node)
            if "arch" in text and re.search(r"[\"']llama[\"']", text):
                words.append((node.lineno, "llama." + text))
    return words


def test_no_family_is_named_outside_the_description() -> None:
    found = []
    for path in sorted((ROOT / "engine").rglob("*.py")):
        if path.name == "architecture.py":
            continue
        for line, word in _code_words(ast.parse(path.read_text())):
            if FAMILY_WORDS.search(word):
                found.append(f"{path.relative_to(ROOT)}:{line}: {word!r}")
    assert not found, "\n".join(found)
