"""Scoring in-process on the fake backend, through the engine host's scheduler: the
teacher-forced figures are the session's own numbers for the tokens a served request
sees, exact match follows the greedy answer to its end, the adapters and their scales
change the score, a bad item is refused with its line, and a score runs beside a
generation instead of in front of it."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.catalog.profiles import Sampling
from engine.catalog.resolve import resolve
from engine.catalog.store import Catalog
from engine.errors import ContextOverflowError, RefusedError
from engine.formats import artifacts
from engine.formats.templates import Message, ToolCall
from engine.formats.tool_calls import write_calls
from engine.runtime import messages as m
from engine.runtime import scoring
from engine.runtime.adapters import AdapterManager
from engine.runtime.results import ScoreResult
from engine.runtime.sampler import log_softmax
from tests import fake_backend as fb
from tests.inprocess_engine import InProcessEngine

pytestmark = pytest.mark.unit

QUESTION = "Q: say the letters.\nA:"
ITEMS = (
    m.ScoreItem("pair", fb.GREEDY_ANSWER, m.Prompt(QUESTION), line=1),
    m.ScoreItem("pair", "abd", m.Prompt(QUESTION), line=2),
    m.ScoreItem("text", "The sea, the sea.", line=3),
)


@pytest.fixture
def engine(fake: fb.FakeBackend, fake_catalog: Catalog) -> Iterator[InProcessEngine]:
    with InProcessEngine() as running:
        yield running


def score(engine: InProcessEngine, catalog: Catalog, name: str,
          items: tuple[m.ScoreItem, ...] = ITEMS, exact: bool = True) -> ScoreResult:
    result = engine.call(m.Score(resolve(catalog, name), items, exact_match=exact))
    assert isinstance(result, ScoreResult)
    return result


def test_the_figures_are_the_sessions_numbers_for_the_served_tokens(
        fake: fb.FakeBackend, fake_catalog: Catalog, engine: InProcessEngine) -> None:
    result = score(engine, fake_catalog, "va", exact=False)
    # The same tokens scored by a fresh context of the same adapters: add_bos is off, a
    # pair's answer is tokenized without special tokens.
    spec = resolve(fake_catalog, "va")
    model = fake.models[0]
    info = artifacts.inspect_path(Path(model.path))
    assert isinstance(info, artifacts.BaseModelInfo)
    context = model.new_context(AdapterManager().verify(spec, info), 4096, 64)
    answer = fb.tokenize(fb.GREEDY_ANSWER, add_special=False, parse_special=False)
    rows = context.score(fb.tokenize(QUESTION, add_special=False), answer)
    expected = [float(log_softmax(row)[t]) for row, t in zip(rows, answer, strict=True)]
    first = result.rows[0]
    assert first.logprobs == tuple(expected)
    assert first.tokens == len(fb.GREEDY_ANSWER) and first.nll == pytest.approx(-sum(expected))
    assert result.rows[2].tokens == len("The sea, the sea.") - 1
    assert result.tokens == sum(r.tokens for r in result.rows)
    assert result.mean_nll == pytest.approx(result.nll / result.tokens)
    assert result.perplexity == pytest.approx(math.exp(result.mean_nll))
    assert result.exact_items == 0 and result.exact_match is None


def test_exact_match_follows_the_greedy_answer_to_its_end(
        fake_catalog: Catalog, engine: InProcessEngine) -> None:
    result = score(engine, fake_catalog, fb.BASE)
    whole, wrong, text = result.rows
    assert (whole.exact, whole.answer) == (True, fb.GREEDY_ANSWER)
    assert (wrong.exact, wrong.answer) == (False, "abc")  # stopped at the first mismatch
    assert text.exact is None  # a text item has no answer to match
    assert (result.exact_items, result.exact_matches, result.exact_match) == (2, 1, 0.5)
    generated = engine.call(m.Generate(resolve(fake_catalog, fb.BASE), m.Prompt(QUESTION),
                                       Sampling(temperature=0.0, repeat_penalty=1.0)))
    assert generated.text == whole.answer and generated.finish_reason == "eos"


def test_the_adapters_and_their_scales_change_the_score(
        fake_catalog: Catalog, engine: InProcessEngine) -> None:
    scores = {n: score(engine, fake_catalog, n, exact=False)
              for n in (fb.BASE, "va0", "va-half", "va")}
    assert scores["va0"].nll == scores[fb.BASE].nll  # scale 0 computes the base
    assert scores["va0"].identity != scores[fb.BASE].identity
    assert len({scores[n].nll for n in (fb.BASE, "va-half", "va")}) == 3
    # The base table favours the alphabet: the variants that move away score it worse.
    assert scores[fb.BASE].rows[0].nll < scores["va-half"].rows[0].nll
    assert [a.scale for a in scores["va-half"].adapters] == [0.5]


@pytest.mark.parametrize(("item", "error", "message"), [
    (m.ScoreItem("chat", "Teal.", line=7), RefusedError,
     "line 7: a chat item needs the messages before its answer"),
    (m.ScoreItem("pair", "x" * 5000, m.Prompt(QUESTION), line=9), ContextOverflowError,
     "line 9: "),
])
def test_an_item_that_cannot_be_scored_is_refused_with_its_line_before_any_scoring(
        fake: fb.FakeBackend, fake_catalog: Catalog, engine: InProcessEngine,
        item: m.ScoreItem, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        engine.call(m.Score(resolve(fake_catalog, "va"), (ITEMS[0], item)))
    assert fake.models[0].contexts_opened == 0  # refused while tokenizing: nothing ran


def test_a_score_runs_beside_a_generation(fake: fb.FakeBackend, fake_catalog: Catalog,
                                          engine: InProcessEngine) -> None:
    ended: list[str] = []
    fake.before_load = pause = fb.Pause()
    long = engine.submit(
        m.Generate(resolve(fake_catalog, fb.BASE), m.Prompt("Go on:"),
                   Sampling(temperature=0.0, max_tokens=60)),
        lambda e: ended.append("generate") if isinstance(e, m.TERMINAL) else None)
    scored = engine.submit(
        m.Score(resolve(fake_catalog, "va"), ITEMS[:1], exact_match=False),
        lambda e: ended.append("score") if isinstance(e, m.TERMINAL) else None)
    engine.handled()
    assert pause.reached.wait(30)
    pause.go.set()
    assert len(long.wait().token_ids) == len(fb.GREEDY_ANSWER)
    assert ended == ["score", "generate"]
    assert isinstance(scored.wait(), ScoreResult)


def test_tool_call_items_are_decoded_whole_and_judged_as_calls(
        fake_catalog: Catalog, engine: InProcessEngine,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The fake model only ever answers the alphabet: read here as a call of `letters`,
    # so both verdicts can be seen. Everything else is parsed for real.
    said = ToolCall("call_x", "letters", '{"a": 1, "b": [true]}')
    real = scoring.parse_any
    monkeypatch.setattr(scoring, "parse_any",
                        lambda text: (said,) if text == fb.GREEDY_ANSWER else real(text))
    asked = m.Prompt(messages=(Message("user", "Say the letters."),), chat=True)
    # Key order, spacing and 1 vs 1.0 do not matter; another value does.
    same = m.ScoreItem("chat", "letters(b, a)", asked, 1, (
        ToolCall("call_0", "letters", '{"b": [true],   "a": 1.0}'),))
    other = m.ScoreItem("chat", "letters(a=2)", asked, 2, (
        ToolCall("call_0", "letters", '{"a": 2, "b": [true]}'),))
    # A target that parses as a tool call (the demo's own shape) is a tool-call item too.
    parsed = m.ScoreItem("pair", '{"tool": "lookup", "args": {"q": "sea"}}',
                         m.Prompt(QUESTION), line=3)
    result = score(engine, fake_catalog, fb.BASE, (same, other, parsed, ITEMS[1]))
    rows = result.rows
    assert [r.tool_call_exact for r in rows] == [True, False, False, None]
    # Decoded to its end, not stopped at the first character unlike the target (as the
    # plain item is, at "abc").
    assert [r.answer for r in rows] == [fb.GREEDY_ANSWER] * 3 + ["abc"]
    assert [r.exact for r in rows] == [False, False, False, False]
    assert (result.tool_call_items, result.tool_call_matches) == (3, 1)
    assert result.tool_call_exact == pytest.approx(1 / 3)
    assert result.tool_call_text == "33.3% (1/3)"
    assert (result.exact_items, result.exact_matches) == (4, 0)
    # Kept with a result's JSON and read back.
    assert ScoreResult.from_dict(result.to_dict()).tool_call_exact == result.tool_call_exact


def test_a_tool_call_target_is_written_in_the_scored_models_format() -> None:
    """The set holds an answer's calls in the generic format; each model is scored on
    them as it writes them (its template's format, or its profile's), content first."""
    calls = (ToolCall("call_0", "add", '{"a": 1}'),)
    generic = write_calls(calls, "generic")
    asked = m.Prompt(messages=(Message("user", "Add."),), chat=True)
    item = m.ScoreItem("chat", generic, asked, 1, calls)
    assert scoring.served_target(item, "generic") == generic
    assert scoring.served_target(item, "hermes") == (
        '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>')
    assert scoring.served_target(item, "tool-args") == '{"tool": "add", "args": {"a": 1}}'
    said = m.ScoreItem("chat", f"Adding.\n{generic}", asked, 2, calls)
    assert scoring.served_target(said, "hermes").startswith("Adding.\n<tool_call>")


def test_a_set_without_tool_calls_has_no_tool_call_figure(
        fake_catalog: Catalog, engine: InProcessEngine) -> None:
    result = score(engine, fake_catalog, fb.BASE)
    assert result.tool_call_exact is None and result.tool_call_text == "n/a"
    assert "tool_call_exact" not in result.to_dict()
    assert all(r.tool_call_exact is None for r in result.rows)
