"""`variant-studio export`: a variant written for llama-server and for vLLM.

The llama-server export is checked file by file (adapters byte-identical to the store,
the preset, the command, the per-request ids) and its adapter is loaded by llama.cpp as
a LoRA for the base. The vLLM export is checked the way vLLM would read it: the base and
the PEFT adapter loaded with transformers and peft, their next-token distributions
compared, teacher-forced on the same token ids, with the variant served by llama.cpp
through the engine's own scoring (`LlamaContext.score`, aligned 64-token chunks).

Thresholds (measured on this project's 2-core machines, figures in docs/serving.md):
llama.cpp multiplies its Q4_1 weights with 8-bit activations, transformers with float32
ones, so the distributions are close, not equal. Measured over 4 held-out tool-call
chats (423 positions): base max KL 0.023, mean 0.0041, top-1 0.957; tool-calls max KL
0.118, mean 0.0073, top-1 0.962 (on the answer tokens: max KL 0.0018, top-1 0.989). The
limits hold about 2.5x margin on KL and a few positions on top-1; and the adapter must
be reproduced: the exported variant's mean KL must stay under 5% of the KL between
llama.cpp's variant and the plain base (measured 0.5%), which a q/k row-order or
alpha/rank mistake would break.
"""

from __future__ import annotations

import configparser
import hashlib
import json
import os
import shlex
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine import cli, export
from engine.catalog import imports
from engine.catalog.store import AdapterSpec, Catalog
from engine.curated import demo, setup
from engine.curated.embedded import DEFAULT_MODEL_NAME
from engine.errors import RefusedError
from engine.formats import hf_export, lora_io
from engine.formats.artifacts import BaseModelInfo
from tests import factories as f

BASE = DEFAULT_MODEL_NAME
VARIANT = demo.VARIANT_NAME
HELDOUT = demo.resources_dir() / "heldout.jsonl"

# (max KL, mean KL, top-1 agreement) limits; see the module docstring.
BASE_LIMITS = (0.06, 0.012, 0.92)
VARIANT_LIMITS = (0.30, 0.02, 0.92)
ANSWER_LIMITS = (0.01, 0.001, 0.96)  # the variant on the reference answers' tokens
EFFECT_SHARE = 0.05  # exported variant's mean KL / the adapter's own effect


def run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_manifest_matches(folder: Path) -> dict[str, Any]:
    """Every path in manifest.json exists with its sha256 and size, and nothing else is
    in the folder."""
    manifest = json.loads((folder / "manifest.json").read_text())
    listed = {entry["path"] for entry in manifest["files"]}
    assert listed == set(tree(folder)) - {"manifest.json"}
    for entry in manifest["files"]:
        path = folder / entry["path"]
        assert path.is_file(), entry["path"]
        assert sha256(path) == entry["sha256"], entry["path"]
        assert path.stat().st_size == entry["size"]
    assert export.check_files(folder) == []
    return manifest


# ---------------------------------------------------------------------- folding (fast)


def _weights(rng: np.random.Generator, rank: int, alpha: float, modules: dict[str, tuple]
             ) -> lora_io.LoraWeights:
    layers = {m: (rng.normal(size=(rank, n_in)).astype(np.float32),
                  rng.normal(size=(n_out, rank)).astype(np.float32))
              for m, (n_in, n_out) in modules.items()}
    return lora_io.LoraWeights(alpha, rank, layers)


def test_one_adapter_keeps_its_alpha_over_rank_and_takes_its_scale_into_b() -> None:
    rng = np.random.default_rng(0)
    q = "model.layers.0.self_attn.q_proj"
    weights = _weights(rng, 8, 16.0, {q: (12, 12)})
    a, b = weights.layers[q]
    same = hf_export.fold_adapters([(weights, 1.0)])
    assert (same.rank, same.alpha) == (8, 16.0)
    assert same.layers[q][1] is b  # scale 1: B's values untouched
    half = hf_export.fold_adapters([(weights, 0.5)])
    assert (half.rank, half.alpha) == (8, 16.0)
    np.testing.assert_array_equal(half.layers[q][0], a)
    # PEFT applies B·A·lora_alpha/r; llama.cpp applies scale·alpha/rank·B·A.
    np.testing.assert_allclose(hf_export.delta(half, q), 0.5 * 16 / 8 * (b.astype(float) @ a),
                               rtol=1e-6)
    # alpha 0 in a GGUF means "no alpha/rank factor" to llama.cpp: lora_alpha becomes r.
    bare = hf_export.fold_adapters([(lora_io.LoraWeights(0.0, 8, weights.layers), 2.0)])
    assert bare.alpha == 8.0
    np.testing.assert_allclose(hf_export.delta(bare, q), 2.0 * (b.astype(float) @ a),
                               rtol=1e-6)


def test_several_adapters_stack_along_the_rank_with_their_whole_multipliers() -> None:
    rng = np.random.default_rng(1)
    q, k = "model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.k_proj"
    first = _weights(rng, 8, 16.0, {q: (12, 12)})
    second = _weights(rng, 4, 0.0, {q: (12, 12), k: (12, 6)})
    folded = hf_export.fold_adapters([(first, 0.5), (second, 3.0)])
    assert (folded.rank, folded.alpha) == (12, 12.0)  # PEFT's factor is 1
    expected_q = (0.5 * 16 / 8 * (first.layers[q][1].astype(float) @ first.layers[q][0])
                  + 3.0 * (second.layers[q][1].astype(float) @ second.layers[q][0]))
    np.testing.assert_allclose(hf_export.delta(folded, q), expected_q, rtol=1e-5, atol=1e-6)
    # k only in the second adapter: the first's block is zeros.
    np.testing.assert_allclose(hf_export.delta(folded, k),
                               3.0 * (second.layers[k][1].astype(float) @ second.layers[k][0]),
                               rtol=1e-5, atol=1e-6)
    assert not folded.layers[k][0][:8].any() and not folded.layers[k][1][:, :8].any()


def test_vllm_rank_is_the_smallest_value_vllm_accepts() -> None:
    from engine.export import vllm

    assert [vllm.max_lora_rank(r) for r in (1, 2, 8, 9, 24, 300, 512)] == [
        1, 8, 8, 16, 32, 320, 512]
    with pytest.raises(RefusedError, match="513"):
        vllm.max_lora_rank(513)


def test_the_export_imports_without_torch_or_transformers() -> None:
    code = ("import sys\n"
            "for name in ('torch', 'transformers', 'peft'):\n"
            "    sys.modules[name] = None  # importing them now raises ImportError\n"
            "import engine.export, engine.export.vllm, engine.cli.export_cmds\n"
            "import engine.formats.hf_export\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])


# ----------------------------------------------------------- llama-server export (fast)


@pytest.fixture(scope="module")
def home(module_home: Path) -> Path:
    assert setup.first_run(Catalog(), with_demo=True)
    assert VARIANT in Catalog().data()["variants"]
    return module_home


def test_llama_server_export_files(home: Path, tmp_path: Path,
                                   capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "ls"
    code, text, err = run(capsys, "export", VARIANT, "--target", "llama-server",
                          "--out", str(out), "--json")
    assert code == 0, err
    printed = json.loads(text)
    manifest = assert_manifest_matches(out)
    assert printed == {"dir": str(out), **manifest}
    catalog = Catalog()
    stored = catalog.adapter_file(demo.ADAPTER_NAME, "llama")
    base = catalog.model(BASE)
    assert manifest["target"] == "llama-server"
    assert manifest["variant"]["name"] == VARIANT
    assert manifest["variant"]["identity"] == manifest["variant"]["identity_detail"]["key"]
    assert manifest["base"] == {"name": BASE, "sha256": base["sha256"],
                                "source": base["source"], "copied": False, "file": None,
                                "path": base["path"]}
    (adapter,) = manifest["adapters"]
    assert adapter["sha256"] == stored["sha256"] and adapter["scale"] == 1.0
    assert (adapter["rank"], adapter["alpha"], adapter["id"]) == (8, 16.0, 0)
    assert sha256(out / adapter["file"]) == stored["sha256"]

    # The preset: INI keys are llama-server flags; paths relative to this folder.
    preset = configparser.ConfigParser()
    preset.read_string("[top]\n" + (out / "models.ini").read_text())
    assert preset["top"]["version"] == "1"
    section = preset[VARIANT]
    assert section["model"] == base["path"]
    assert section["lora-scaled"] == f"{adapter['file']}:1"
    assert section["ctx-size"] == "4096" and section["temp"] == "0"
    files = {e["path"]: e["sha256"] for e in manifest["files"]}
    lora_file = section["lora-scaled"].rsplit(":", 1)[0]
    assert files[lora_file] == stored["sha256"]

    # The single command: the same base, adapter and scale.
    argv = shlex.split(manifest["serve"]["command"])
    assert argv[:3] == ["llama-server", "--model", base["path"]]
    assert argv[argv.index("--lora-scaled") + 1] == f"{lora_file}:1"
    script = (out / "serve.sh").read_text()
    assert os.access(out / "serve.sh", os.X_OK) and f"{lora_file}:1" in script
    subprocess.run(["sh", "-n", str(out / "serve.sh")], check=True)

    # Per-request LoRA: ids by position, the variant's own scale, no prompt cache.
    request = json.loads((out / "lora-request.json").read_text())
    assert request["request"]["lora"] == [{"id": 0, "scale": 1.0}]
    assert request["request"]["cache_prompt"] is False
    assert request["adapters"][0]["file"] == lora_file
    assert request["request"]["messages"][0] == {"role": "system",
                                                  "content": demo.SYSTEM_PROMPT}
    readme = (out / "README.md").read_text()
    assert "26207" in readme and '"cache_prompt": false' in readme
    assert base["sha256"] in readme and "--copy-base" in readme
    # The demo's declared tool-call format has no counterpart there: the README says so.
    assert "`tool-args`" in readme and "returns them as text" in readme


def test_copy_base_puts_the_verified_base_in_the_folder(home: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "ls"
    code, _, err = run(capsys, "export", VARIANT, "--target", "llama-server",
                       "--out", str(out), "--copy-base")
    assert code == 0, err
    manifest = assert_manifest_matches(out)
    base = Catalog().model(BASE)
    assert manifest["base"]["copied"] is True and manifest["base"]["path"] is None
    assert sha256(out / manifest["base"]["file"]) == base["sha256"]
    preset = configparser.ConfigParser()
    preset.read_string("[top]\n" + (out / "models.ini").read_text())
    assert preset[VARIANT]["model"] == manifest["base"]["file"]  # relative to the folder


def test_bad_input_changes_nothing(home: Path, tmp_path: Path,
                                   capsys: pytest.CaptureFixture) -> None:
    foreign = tmp_path / "work"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    before = tree(foreign)
    code, out, err = run(capsys, "export", VARIANT, "--target", "vllm", "--out", str(foreign))
    assert code == 3 and out == "" and err.count("\n") == 1 and "not empty" in err
    assert tree(foreign) == before
    siblings = sorted(p.name for p in tmp_path.iterdir())
    assert siblings == ["work"]  # no staging folder left behind

    cases = [
        (["export", "nope", "--target", "vllm", "--out", str(tmp_path / "a")], 4),
        (["export", BASE, "--target", "vllm", "--out", str(tmp_path / "a")], 2),
        (["export", demo.ADAPTER_NAME, "--target", "vllm", "--out", str(tmp_path / "a")], 2),
        (["export", VARIANT, "--target", "tgi", "--out", str(tmp_path / "a")], 2),
        (["export", VARIANT, "--target", "vllm", "--copy-base", "--out",
          str(tmp_path / "a")], 2),
        (["export", VARIANT, "--target", "vllm", "--out", str(tmp_path / "no" / "a")], 2),
        (["export", VARIANT, "--target", "vllm", "--out", str(foreign / "notes.txt")], 3),
    ]
    for argv, expected in cases:
        code, out, err = run(capsys, *argv)
        assert code == expected, (argv, err)
        assert out == "" and err.startswith("error: ") and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]
    assert tree(foreign) == before


def test_a_previous_export_of_the_same_variant_is_replaced_nothing_else(
        home: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "ls"
    out.mkdir()  # an empty folder is fine
    assert run(capsys, "export", VARIANT, "--target", "llama-server", "--out", str(out))[0] == 0
    (out / "README.md").write_text("edited")  # a file of the export: replaced
    assert run(capsys, "export", VARIANT, "--target", "llama-server", "--out", str(out),
               "--copy-base")[0] == 0
    manifest = assert_manifest_matches(out)
    assert manifest["base"]["copied"] is True
    assert (out / "README.md").read_text() != "edited"

    (out / "extra.txt").write_text("someone's")  # not part of the export: refused
    before = tree(out)
    code, _, err = run(capsys, "export", VARIANT, "--target", "llama-server", "--out", str(out))
    assert code == 3 and "extra.txt" in err
    assert tree(out) == before
    (out / "extra.txt").unlink()
    Catalog().add_variant("other", BASE, [AdapterSpec(demo.ADAPTER_NAME, 0.5)])
    code, _, err = run(capsys, "export", "other", "--target", "llama-server", "--out", str(out))
    assert code == 3 and "no export of other" in err
    assert tree(out) == {k: v for k, v in before.items() if k != "extra.txt"}


def test_every_export_option_has_help() -> None:
    from engine.cli.parser import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    actions = sub.choices["export"]._actions
    assert {o for a in actions for o in a.option_strings} >= {"--target", "--out",
                                                             "--copy-base", "--json"}
    assert all(a.help for a in actions)
    docs = (Path(__file__).parents[1] / "docs" / "cli.md").read_text()
    assert "variant-studio export VARIANT --target llama-server|vllm --out DIR" in docs


# ------------------------------------------------------------------- native (slow)


@pytest.mark.slow
def test_the_exported_adapter_loads_in_llama_cpp_as_a_lora_for_the_base(
        home: Path, tmp_path: Path, embedded_path: Path) -> None:
    import llama_cpp

    from engine.runtime.llama.backend import LlamaModel

    manifest = export.export_variant(Catalog(), VARIANT, "llama-server", tmp_path / "ls")
    adapter = tmp_path / "ls" / manifest["adapters"][0]["file"]
    model = LlamaModel(manifest["base"]["path"], manifest["base"]["sha256"])
    try:
        ptr = llama_cpp.llama_adapter_lora_init(model.ptr, str(adapter).encode())
        assert ptr, "llama.cpp rejected the exported adapter"
        llama_cpp.llama_adapter_lora_free(ptr)
    finally:
        model.close()


def chat_sequences(base_path: Path, info: BaseModelInfo, count: int
                   ) -> tuple[list[list[int]], list[int], list[list[dict[str, str]]]]:
    """Held-out tool-call chats as llama.cpp tokenizes them (the engine's template
    rendering), each followed by its reference answer: token ids, where each answer
    starts, and the messages before it."""
    from engine.formats import templates
    from engine.formats.templates import Message
    from engine.runtime.llama.backend import LlamaModel

    rows = [json.loads(line) for line in HELDOUT.read_text().splitlines()[:count]]
    model = LlamaModel(str(base_path), "tokenizer")
    try:
        special = {i: model.token_text(i).decode() for i in (info.bos_token_id,
                                                              info.eos_token_id)}
        sequences, starts, chats = [], [], []
        for row in rows:
            messages = [Message(m["role"], m["content"]) for m in row["messages"]]
            text = templates.render(info.chat_template, messages[:-1],
                                    bos_token=special[info.bos_token_id],
                                    eos_token=special[info.eos_token_id])
            prompt = model.tokenize(text, add_special=info.add_bos, parse_special=True)
            answer = model.tokenize(messages[-1].content + "<|im_end|>", add_special=False,
                                    parse_special=True)
            sequences.append(prompt + answer)
            starts.append(len(prompt))
            chats.append(row["messages"][:-1])
    finally:
        model.close()
    return sequences, starts, chats


def log_softmax(rows: np.ndarray) -> np.ndarray:
    shifted = rows - rows.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def llama_logprobs(base_path: Path, sequences: list[list[int]],
                   adapters: list[tuple[Path, float]]) -> list[np.ndarray]:
    """llama.cpp's next-token log-probabilities over each whole sequence, scored as the
    engine scores (LlamaContext.score, aligned chunks of 64)."""
    from engine.catalog.resolve import AdapterFile
    from engine.runtime.llama.backend import LlamaContext, LlamaModel

    model = LlamaModel(str(base_path), "base", n_threads=1)
    files = tuple(AdapterFile(f"a{i}", str(path), sha256(path), scale)
                  for i, (path, scale) in enumerate(adapters))
    context = LlamaContext(model, files, n_ctx=512, n_batch=64, n_threads=1)
    try:
        out = []
        for ids in sequences:
            context.reset()
            rows = np.stack(context.score(ids[:1], ids[1:])).astype(np.float64)
            out.append(log_softmax(rows))
        return out
    finally:
        context.close()
        model.close()


def hf_logprobs(model: Any, sequences: list[list[int]]) -> list[np.ndarray]:
    import torch

    out = []
    with torch.no_grad():
        for ids in sequences:
            logits = model(torch.tensor([ids])).logits[0, :-1].double()
            out.append(torch.log_softmax(logits, dim=-1).numpy())
    return out


def compare(reference: list[np.ndarray], got: list[np.ndarray], starts: list[int]
            ) -> dict[str, float]:
    """KL(llama.cpp || exported) and top-1 agreement, over every position and over the
    positions predicting the reference answers."""
    kls, agree, answer_kl, answer_agree = [], [], [], []
    for ref, mine, start in zip(reference, got, starts, strict=True):
        kl = (np.exp(ref) * (ref - mine)).sum(-1)
        same = ref.argmax(-1) == mine.argmax(-1)
        kls.append(kl)
        agree.append(same)
        answer_kl.append(kl[start - 1:])
        answer_agree.append(same[start - 1:])
    kl, same = np.concatenate(kls), np.concatenate(agree)
    akl, asame = np.concatenate(answer_kl), np.concatenate(answer_agree)
    return {"positions": int(kl.size), "max_kl": float(kl.max()), "mean_kl": float(kl.mean()),
            "top1": float(same.mean()), "answer_max_kl": float(akl.max()),
            "answer_mean_kl": float(akl.mean()), "answer_top1": float(asame.mean())}


def within(figures: dict[str, float], limits: tuple[float, float, float],
           prefix: str = "") -> bool:
    max_kl, mean_kl, top1 = limits
    return (figures[f"{prefix}max_kl"] <= max_kl and figures[f"{prefix}mean_kl"] <= mean_kl
            and figures[f"{prefix}top1"] >= top1)


@pytest.fixture(scope="module")
def vllm_export(home: Path, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[tuple[Path, dict[str, Any]]]:
    out = tmp_path_factory.mktemp("vllm") / "tool-calls"
    manifest = export.export_variant(Catalog(), VARIANT, "vllm", out)
    yield out, manifest


@pytest.mark.slow
def test_vllm_export_matches_the_variant_served_by_llama_cpp(
        vllm_export: tuple[Path, dict[str, Any]], base_info: BaseModelInfo,
        embedded_path: Path, record_property: Any) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, manifest = vllm_export
    assert_manifest_matches(out)
    assert manifest["lora"] == {
        "name": VARIANT, "path": f"lora/{VARIANT}", "r": 8, "lora_alpha": 16.0,
        "target_modules": ["q_proj", "v_proj"], "folded": manifest["lora"]["folded"]}
    argv = shlex.split(manifest["serve"]["command"])
    assert argv[:3] == ["vllm", "serve", "base"] and "--enable-lora" in argv
    assert argv[argv.index("--lora-modules") + 1] == f"{VARIANT}=lora/{VARIANT}"
    assert argv[argv.index("--max-lora-rank") + 1] == "8"
    assert argv[argv.index("--max-loras") + 1] == "1"

    sequences, starts, chats = chat_sequences(embedded_path, base_info, 4)
    stored = Catalog().adapter_file(demo.ADAPTER_NAME, "llama")["path"]
    llama_base = llama_logprobs(embedded_path, sequences, [])
    llama_variant = llama_logprobs(embedded_path, sequences, [(Path(stored), 1.0)])

    torch.set_num_threads(2)
    model = AutoModelForCausalLM.from_pretrained(str(out / "base"), dtype=torch.float32)
    model = PeftModel.from_pretrained(model, str(out / manifest["lora"]["path"])).eval()
    hf_variant = hf_logprobs(model, sequences)
    with model.disable_adapter():
        hf_base = hf_logprobs(model, sequences)

    base = compare(llama_base, hf_base, starts)
    variant = compare(llama_variant, hf_variant, starts)
    effect = compare(llama_variant, hf_base, starts)  # what the adapter changes
    for name, figures in (("base", base), ("variant", variant), ("effect", effect)):
        record_property(name, json.dumps(figures))
        print(name, json.dumps(figures))
    assert within(base, BASE_LIMITS), base
    assert within(variant, VARIANT_LIMITS), variant
    assert within(variant, ANSWER_LIMITS, "answer_"), variant
    assert variant["mean_kl"] < EFFECT_SHARE * effect["mean_kl"], (variant, effect)

    # What vLLM's chat endpoint would send: the exported tokenizer and chat template give
    # llama.cpp's token ids for the same conversation.
    tokenizer = AutoTokenizer.from_pretrained(str(out / "base"))
    for chat, ids, start in zip(chats, sequences, starts, strict=True):
        rendered = tokenizer.apply_chat_template(chat, add_generation_prompt=True,
                                                 tokenize=False)
        assert tokenizer.encode(rendered, add_special_tokens=True) == ids[:start]
    assert tokenizer.encode("In 1969 there were 12345 apples, 3.50 € each!") == (
        _llama_tokens(embedded_path, "In 1969 there were 12345 apples, 3.50 € each!"))


def _llama_tokens(path: Path, text: str) -> list[int]:
    from engine.runtime.llama.backend import LlamaModel

    model = LlamaModel(str(path), "tokenizer")
    try:
        return model.tokenize(text, add_special=False, parse_special=True)
    finally:
        model.close()


@pytest.mark.slow
def test_scales_and_several_adapters_are_folded_faithfully(
        vllm_export: tuple[Path, dict[str, Any]], base_info: BaseModelInfo,
        embedded_path: Path, tmp_path: Path, record_property: Any) -> None:
    """A variant of two adapters at scales other than 1, one of them on q and k (both
    permuted rows): exported for vLLM, it must still match llama.cpp."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    catalog = Catalog()
    probe = f.write_gguf_lora(tmp_path / "qk.gguf", base_info, roles=("attn_q", "attn_k"),
                              rank=4, alpha=8.0, seed=3, strength=0.08, layers=range(0, 30, 3))
    imports.add_adapter(catalog, "qk-probe", BASE, probe)
    catalog.add_variant("mixed", BASE, [AdapterSpec(demo.ADAPTER_NAME, 0.5),
                                        AdapterSpec("qk-probe", 1.5)])
    out = tmp_path / "mixed"
    manifest = export.export_variant(catalog, "mixed", "vllm", out)
    assert_manifest_matches(out)
    assert manifest["lora"]["r"] == 12 and manifest["lora"]["lora_alpha"] == 12.0
    # q and v in every layer (tool-calls), k in every third (the probe): exact paths.
    modules = manifest["lora"]["target_modules"]
    assert len(modules) == 30 * 2 + 10 and "model.layers.3.self_attn.k_proj" in modules
    assert "model.layers.1.self_attn.k_proj" not in modules
    assert "--max-lora-rank 16" in manifest["serve"]["command"]
    # The same GGUF base converts to the same bytes every time.
    first, _ = vllm_export
    assert sha256(out / "base" / "model.safetensors") == sha256(
        first / "base" / "model.safetensors")

    sequences, starts, _ = chat_sequences(embedded_path, base_info, 2)
    stored = catalog.adapter_file(demo.ADAPTER_NAME, "llama")["path"]
    probe_stored = catalog.adapter_file("qk-probe", "llama")["path"]
    llama_mixed = llama_logprobs(embedded_path, sequences,
                                 [(Path(stored), 0.5), (Path(probe_stored), 1.5)])
    torch.set_num_threads(2)
    model = AutoModelForCausalLM.from_pretrained(str(out / "base"), dtype=torch.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = PeftModel.from_pretrained(model, str(out / manifest["lora"]["path"])).eval()
    assert not [w for w in caught if "missing adapter keys" in str(w.message)]
    mixed = compare(llama_mixed, hf_logprobs(model, sequences), starts)
    with model.disable_adapter():
        effect = compare(llama_mixed, hf_logprobs(model, sequences), starts)
    record_property("mixed", json.dumps(mixed))
    print("mixed", json.dumps(mixed), "effect", json.dumps(effect))
    assert within(mixed, VARIANT_LIMITS), mixed
    assert mixed["mean_kl"] < EFFECT_SHARE * effect["mean_kl"], (mixed, effect)


# --------------------------------------------------------- OpenVINO Model Server (ovms)


def test_ovms_options_are_refused_where_they_do_not_apply(
        home: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    target = str(tmp_path / "a")
    cases = [
        (["export", VARIANT, "--target", "vllm", "--merge-type", "f16", "--out", target], 2),
        (["export", VARIANT, "--target", "llama-server", "--task-rows", "2", "--out",
          target], 2),
        (["export", VARIANT, "--target", "ovms", "--merge-type", "q4_k_m", "--out", target],
         2),  # below 8 bits: not offered
        (["export", VARIANT, "--target", "ovms", "--copy-base", "--out", target], 2),
        (["export", BASE, "--target", "ovms", "--out", target], 2),
        (["export", "nope", "--target", "ovms", "--out", target], 4),
    ]
    for argv, expected in cases:
        code, out, err = run(capsys, *argv)
        assert code == expected, (argv, err)
        assert out == "" and err.startswith("error: ") and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_ovms_export_is_the_merged_variant_and_answers_like_it_in_openvino_genai(
        home: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
        base_info: BaseModelInfo, capsys: pytest.CaptureFixture,
        record_property: Any) -> None:
    """The OVMS repository (config.json, graph.pbtxt, the IR) holds the variant merged
    into F16; OpenVINO GenAI (what the model server's LLM calculator runs) loads the IR
    with the graph's plugin_config and decodes held-out requests greedily to the same
    tokens as the dynamic variant on llama.cpp, with the expected tool calls."""
    import openvino_genai

    from engine.catalog.profiles import Sampling
    from engine.catalog.resolve import resolve
    from engine.export import ovms
    from engine.formats.templates import Message, render
    from engine.runtime import messages
    from engine.runtime.client import EngineClient
    from tests import openvino_helpers

    openvino_helpers.cache_dir(tmp_path_factory)  # the run's OpenVINO build cache
    out = tmp_path / "ovms"
    code, text, err = run(capsys, "export", VARIANT, "--target", "ovms", "--out", str(out),
                          "--eval-rows", "6", "--task-rows", "2", "--json")
    assert code == 0, err
    manifest = assert_manifest_matches(out)
    assert json.loads(text) == {"dir": str(out), **manifest}
    assert manifest["target"] == "ovms" and manifest["base"]["merged"] is True
    assert manifest["base"]["merge_type"] == "f16" and manifest["base"]["layers_named"] == 210
    assert manifest["merge"]["survival"] >= 0.95 and manifest["merge"]["accepted"]
    assert manifest["merge"]["task"]["merged"]["strict"] == 1.0
    (adapter,) = manifest["adapters"]
    assert adapter["folded"] is True and adapter["name"] == demo.ADAPTER_NAME
    assert json.loads((out / "config.json").read_text()) == {
        "mediapipe_config_list": [{"name": VARIANT, "base_path": VARIANT}],
        "model_config_list": []}
    model_dir = out / VARIANT
    graph = (model_dir / "graph.pbtxt").read_text()
    for line in ('calculator: "HttpLLMCalculator"', 'input_side_packet: "LLM_NODE_RESOURCES:llm"',
                 'models_path: "./"', "back_edge: true", 'device: "CPU"'):
        assert line in graph
    plugin = json.loads(graph.split("plugin_config: '", 1)[1].split("'", 1)[0])
    assert plugin == ovms.PLUGIN_CONFIG
    assert (model_dir / "chat_template.jinja").read_text() == base_info.chat_template
    assert "__module.model.layers.29.self_attn.v_proj/aten::linear/MatMul" in (
        model_dir / "openvino_model.xml").read_text()
    request = json.loads((out / "request.json").read_text())["request"]
    assert request["model"] == VARIANT and request["messages"][0]["content"] == \
        demo.SYSTEM_PROMPT
    assert "/v3/chat/completions" in (out / "README.md").read_text()

    rows = [json.loads(line) for line in HELDOUT.read_text().splitlines()[10:14]]
    catalog = Catalog()
    spec = resolve(catalog, VARIANT)
    greedy = Sampling.from_dict({"temperature": 0.0, "max_tokens": 48, "repeat_penalty": 1.0})
    client = EngineClient()
    try:
        served = [client.call(messages.Generate(spec, messages.Prompt(
            row["messages"][1]["content"], chat=True, system=demo.SYSTEM_PROMPT), greedy),
            timeout=300) for row in rows]
    finally:
        client.close()

    pipe = openvino_genai.LLMPipeline(str(model_dir), "CPU", **ovms.PLUGIN_CONFIG)
    tokenizer = pipe.get_tokenizer()
    config = pipe.get_generation_config()
    config.max_new_tokens, config.do_sample = 48, False
    agreeing = []
    for row, variant in zip(rows, served, strict=True):
        chat = [{"role": "system", "content": demo.SYSTEM_PROMPT},
                {"role": "user", "content": row["messages"][1]["content"]}]
        prompt = tokenizer.apply_chat_template(chat, add_generation_prompt=True)
        assert prompt == render(base_info.chat_template,
                                [Message(m["role"], m["content"]) for m in chat])
        result = pipe.generate(tokenizer.encode(prompt, add_special_tokens=False), config)
        tokens = [int(t) for t in result.tokens[0]]
        answer = tokenizer.decode(tokens, skip_special_tokens=True)
        expected = json.loads(row["messages"][-1]["content"])
        assert json.loads(answer) == expected == json.loads(variant["text"]), answer
        ids = variant["token_ids"]
        agreeing.append(next((i for i, (a, b) in enumerate(zip(ids, tokens, strict=False))
                              if a != b), min(len(ids), len(tokens))))
        assert tokens[:len(ids)] == ids, (tokens, ids)
    record_property("ovms_agreeing_tokens", json.dumps(agreeing))
