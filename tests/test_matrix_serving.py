"""Acceptance matrix, serving: every fixture family × {F16, Q8_0, Q4_K_M} added, with its
adapters imported and converted, run as a variant, compared, scored and served by the
local server, or refused up front with the table's reason.

The cells come from docs/models.md's table (tests/matrix_helpers.py: read back and held
to `capabilities.for_header` on each file); the last test holds the whole doc table to
`scripts/models_table.py`'s generated one. Features checked here, per case:

- serve on llama.cpp: `model add` of the base; a variant of its GGUF LoRA (`adapter
  add`, `variant add`); greedy generation through the engine process returns tokens and
  the variant's tokens or log-probabilities differ from the base's; `compare` returns
  both sides (the base side is the plain base's answer) with a non-zero adapter effect;
  `score` gives finite per-token log-probabilities, apart for base and variant; the local
  server (`ServerThread`, the official `openai` client) lists the variant and answers
  `chat.completions` for it by name with the engine's own answer;
- convert adapters GGUF <-> PEFT: `adapter convert-file` both ways against the base;
  GGUF -> PEFT gives the fixture's PEFT tensors, PEFT -> GGUF gives the fixture's GGUF
  tensors, and that file, imported as an adapter, serves exactly what the original does.

Set-up shared by the module: one catalog, one local server whose engine process also
answers the engine requests (generate, compare, score). Measured on this 2-core machine:
about 35 s of CPU for the 24 cases (the doc-table test, unmarked so the quick tier
catches a stale doc, about 6 s: it reads the 48 fixture headers).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from engine.catalog import resolve
from engine.catalog.store import Catalog
from engine.formats import capabilities as cap
from engine.formats import lora_io
from engine.runtime import messages
from tests import families
from tests.engine_helpers import sampling
from tests.matrix_helpers import (
    CASES,
    IDS,
    assert_refused,
    doc_table,
    doc_table_text,
    expected,
    models_table,
    name,
    run_cli,
)
from tests.world import Recipe, World

QUESTION = "Tell me about lighthouses."
PROMPT = messages.Prompt(messages=(messages.Message("user", QUESTION),), chat=True)
TOKENS = 8
TIMEOUT = 300  # a hang bound only


WORLD = Recipe(demo=True)


def same_layers(first: lora_io.LoraWeights, second: lora_io.LoraWeights) -> bool:
    import numpy as np

    return set(first.layers) == set(second.layers) and all(
        np.array_equal(first.layers[m][i], second.layers[m][i])
        for m in first.layers for i in (0, 1))


def call(world: World, request: messages.Request) -> dict[str, Any]:
    return world.server.client.call(request, timeout=TIMEOUT)


@pytest.mark.slow
@pytest.mark.parametrize(("variant", "kind"), CASES, ids=IDS)
def test_a_base_its_adapters_a_variant_and_the_server(
        variant: str, kind: str, world: World,
        family_files: dict[str, families.FamilyFiles],
        capsys: pytest.CaptureFixture) -> None:
    files = family_files[variant]
    cells = expected(files, kind)
    catalog: Catalog = world.catalog
    base, adapter, var = (name(p, variant, kind) for p in ("b", "a", "v"))
    source = files.base(kind)

    # ---- add the base: serve on llama.cpp
    add_base = ["model", "add", base, "--file", str(source)]
    if not cells[cap.SERVE_LLAMA].ok:
        assert_refused(capsys, add_base, cells[cap.SERVE_LLAMA].reason)
        return  # nothing else runs on llama.cpp without its base; the refusal is the check
    code, _, err = run_cli(capsys, *add_base)
    assert code == 0, err
    assert catalog.model(base)["backend"] == "llama"

    # ---- import the GGUF adapter, make a variant
    code, _, err = run_cli(capsys, "adapter", "add", adapter, "--base", base, "--file",
                           str(files.gguf_adapter))
    assert code == 0, err
    code, _, err = run_cli(capsys, "variant", "add", var, "--base", base, "--adapter",
                           f"{adapter}:1.0")
    assert code == 0, err

    # ---- convert GGUF <-> PEFT against this base
    out = world.out / f"{variant}-{kind}"
    out.mkdir()
    to_peft, to_gguf = out / "peft", out / "from-peft.gguf"
    convert = cells[cap.CONVERT]
    if not convert.ok:
        assert_refused(capsys, ["adapter", "convert-file", str(files.gguf_adapter),
                                str(to_peft), "--base", base], convert.reason, [to_peft])
        assert_refused(capsys, ["adapter", "convert-file", str(files.peft_adapter),
                                str(to_gguf), "--base", base], convert.reason, [to_gguf])
    else:
        for src, dst in ((files.gguf_adapter, to_peft), (files.peft_adapter, to_gguf)):
            code, _, err = run_cli(capsys, "adapter", "convert-file", str(src), str(dst),
                                   "--base", base)
            assert code == 0, err
        assert same_layers(lora_io.read_peft(to_peft), lora_io.read_peft(files.peft_adapter))
        assert same_layers(lora_io.read_gguf(to_gguf), lora_io.read_gguf(files.gguf_adapter))
        # The converted file, imported, serves exactly what the original serves.
        code, _, err = run_cli(capsys, "adapter", "add", f"{adapter}-c", "--base", base,
                               "--file", str(to_gguf))
        assert code == 0, err
        code, _, err = run_cli(capsys, "variant", "add", f"{var}-c", "--base", base,
                               "--adapter", f"{adapter}-c")
        assert code == 0, err

    # ---- generate: the adapter changes the output
    greedy = sampling(max_tokens=TOKENS)
    answers = {n: call(world, messages.Generate(resolve.resolve(catalog, n), PROMPT, greedy))
               for n in (base, var)}
    for n, answer in answers.items():
        assert answer["token_ids"] and len(answer["logprobs"]) == len(answer["token_ids"]), n
        assert answer["backend"] == "llama" and answer["name"] == n
    assert (answers[var]["token_ids"], answers[var]["logprobs"]) != (
        answers[base]["token_ids"], answers[base]["logprobs"])
    if convert.ok:
        converted = call(world, messages.Generate(resolve.resolve(catalog, f"{var}-c"),
                                                  PROMPT, greedy))
        assert (converted["token_ids"], converted["logprobs"]) == (
            answers[var]["token_ids"], answers[var]["logprobs"])

    # ---- compare: both sides, the base side being the base's own answer
    compared = call(world, messages.Compare(resolve.resolve(catalog, var), PROMPT, greedy))
    assert compared["base"]["token_ids"] == answers[base]["token_ids"]
    assert compared["variant"]["token_ids"] == answers[var]["token_ids"]
    assert compared["adapter_effect"] > 0

    # ---- score: finite, and the adapter moves it
    item = (messages.ScoreItem("text", families.PROMPT, line=1),)
    scores = {n: call(world, messages.Score(resolve.resolve(catalog, n), item))
              for n in (base, var)}
    for n, score in scores.items():
        row = score["rows"][0]
        assert score["tokens"] == row["tokens"] == len(row["logprobs"]) > 20, n
        assert all(math.isfinite(lp) and lp <= 0 for lp in row["logprobs"]), n
        assert math.isfinite(score["mean_nll"]) and math.isfinite(score["perplexity"]), n
    assert scores[var]["rows"][0]["logprobs"] != scores[base]["rows"][0]["logprobs"]

    # ---- the local server answers for the variant by name, with the engine's answer
    listed = {m.id: m.model_dump() for m in world.openai.models.list().data}
    assert listed[var]["base"] == base and listed[var]["identity"] == answers[var]["identity"]
    served = world.openai.chat.completions.create(
        model=var, messages=[{"role": "user", "content": QUESTION}], temperature=0,
        max_tokens=TOKENS, extra_body={"repeat_penalty": greedy.repeat_penalty})
    assert served.model == var
    assert served.choices[0].message.content == answers[var]["text"]
    assert served.usage.completion_tokens == len(answers[var]["token_ids"])


def test_docs_models_md_holds_the_generated_table() -> None:
    """The table in docs/models.md (between scripts/models_table.py's markers) is the one
    the code answers for the fixtures (`models_table.generated()`), and it has a row for
    every case the matrix runs."""
    assert doc_table_text() == models_table().generated(), (
        "docs/models.md's table is out of date: run scripts/models_table.py --write")
    assert set(CASES) <= set(doc_table())
