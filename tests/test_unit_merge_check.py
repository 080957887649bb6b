"""The merge's survival check in-process on the fake backend: its figures are the
engine's scoring (an item's tokens as a score tokenizes them, the teacher-forced
distributions of a fresh context, exact match's greedy loop run to the whole answer), a
merge that kept the variant loses nothing, and the merge worker's requests go through
the one wire checker."""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

import pytest

from engine.catalog.resolve import resolve
from engine.catalog.store import Catalog
from engine.errors import RefusedError
from engine.formats import artifacts, merge
from engine.runtime.adapters import AdapterManager
from engine.runtime.merge.check import CheckRequest, run_check
from engine.runtime.merge.work import MergeAdapter, MergeRequest
from engine.runtime.messages import Prompt, ScoreItem
from tests import fake_backend as fb

pytestmark = pytest.mark.unit

QUESTION = "Q: say the letters.\nA:"
ITEMS = (
    ScoreItem("pair", fb.GREEDY_ANSWER, Prompt(QUESTION), line=1),
    ScoreItem("pair", "abd", Prompt(QUESTION), line=2),
    ScoreItem("text", "The sea, the sea.", line=3),
)


def request(catalog: Catalog, **fields: Any) -> CheckRequest:
    """The check of variant "va" against its base, the variant itself as the "merged"
    side (a merge that kept everything)."""
    variant = resolve(catalog, "va")
    return CheckRequest(variant, variant.base_spec(), variant, **fields)


def run(check: CheckRequest) -> dict[str, Any]:
    return run_check(check, lambda stage, fraction: None, lambda: False, 1)


def test_the_figures_are_scorings_distributions_on_scorings_tokens(
        fake: fb.FakeBackend, fake_catalog: Catalog) -> None:
    result = run(request(fake_catalog, items=ITEMS))
    # Fresh contexts, the tokens a score sees: the raw prompt (add_bos is off), the answer
    # without special tokens; a text item's first token is not scored.
    model = fake.models[0]
    info = artifacts.inspect_path(Path(model.path))
    assert isinstance(info, artifacts.BaseModelInfo)
    contexts = {name: model.new_context(AdapterManager().verify(resolve(fake_catalog, name),
                                                                 info), 4096, 64)
                for name in ("va", fb.BASE)}
    prompt = fb.tokenize(QUESTION, add_special=False)
    for row, item in zip(result["per_item"], ITEMS[:2], strict=False):
        answer = fb.tokenize(item.target, add_special=False, parse_special=False)
        v, b = (contexts[n].score(prompt, answer) for n in ("va", fb.BASE))
        assert row["positions"] == len(answer)
        assert row["kl_variant_base"] == sum(merge.kl_rows(x, y) for x, y in zip(v, b, strict=True))
    assert [r["kind"] for r in result["per_item"]] == ["pair", "pair", "text"]
    assert result["per_item"][2]["positions"] == len("The sea, the sea.") - 1
    assert result["positions"] == sum(r["positions"] for r in result["per_item"])
    # The merged side is the variant: nothing lost, survival 1.
    assert result["kl_variant_merged"] == 0.0 and result["top1_merged"] == 1.0
    assert result["kl_variant_base"] > 0
    assert merge.survival(result["kl_variant_merged"], result["kl_variant_base"]) == 1.0
    assert result["answers"] is None


def test_greedy_answers_are_whole_answers_of_the_expected_length_and_a_few_more(
        fake: fb.FakeBackend, fake_catalog: Catalog) -> None:
    result = run(request(fake_catalog, items=ITEMS, greedy=2))
    answers = result["answers"]
    # The base walks the alphabet. Exact match's loop stops "abd" at "abc"; the check
    # decodes on (the lenient figure reads the whole answer), 3 + 16 tokens at most.
    assert answers["base"] == [fb.GREEDY_ANSWER, string.ascii_lowercase[:19]]
    assert answers["merged"] == answers["variant"]
    with pytest.raises(RefusedError, match="greedy items need a prompt and an answer"):
        run(request(fake_catalog, items=ITEMS[2:], greedy=1))


def test_a_probe_is_scored_on_the_variants_greedy_continuation(
        fake: fb.FakeBackend, fake_catalog: Catalog) -> None:
    probe = Prompt("Say the letters.", chat=True, system="")
    result = run(request(fake_catalog, probes=(probe,), probe_tokens=5))
    assert [(r["kind"], r["positions"]) for r in result["per_item"]] == [("probe", 5)]
    assert result["kl_variant_merged"] == 0.0 and result["answers"] is None
    assert run(request(fake_catalog, probes=(probe,), probe_tokens=0))["items"] == 0


def test_the_workers_requests_go_through_the_wire_checker(
        fake: fb.FakeBackend, fake_catalog: Catalog) -> None:
    check = request(fake_catalog, items=ITEMS, greedy=2)
    assert CheckRequest.from_params(check.to_params()) == check
    for bad, words in (({"greedy": 4}, "more greedy items than items"),
                       ({"items": []}, "needs 1 to 256 evaluation items"),
                       ({"probe_tokens": -1}, "probe_tokens"),
                       ({"items": [{"kind": "probe", "target": "x"}]}, "items.0.kind")):
        with pytest.raises(RefusedError, match=words):
            CheckRequest.from_params({**check.to_params(), **bad})
    adapter = MergeAdapter("a", "/x/a.gguf", "0" * 64, 1.0)
    merge_request = MergeRequest("/x/base.gguf", "1" * 64, (adapter,), "/x/out.gguf", "q8_0",
                                 {"variant": "va"})
    assert MergeRequest.from_params(merge_request.to_params()) == merge_request
    with pytest.raises(RefusedError, match="the scale must be a finite number"):
        MergeAdapter("a", "/x/a.gguf", "0" * 64, float("inf"))
    with pytest.raises(RefusedError, match="at least one adapter"):
        MergeRequest("/x/base.gguf", "1" * 64, (), "/x/out.gguf", "q8_0")
