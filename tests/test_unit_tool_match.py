"""Tool calls read back from any answer and compared (engine/formats/tool_match.py), the
tools a user gives the chat, and score sets whose answers are tool calls: read from
chat JSONL with assistant `tool_calls`, refused by training (not yet trainable), and the
`score` table's tool-call column."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from engine.catalog import evaluation
from engine.cli import score_cmds
from engine.errors import RefusedError
from engine.formats import tool_match as tm
from engine.formats.templates import ToolCall
from engine.runtime.results import ScoreResult
from engine.training import data, score_sets

pytestmark = pytest.mark.unit

WEATHER = ToolCall("c1", "get_weather", '{"city": "Paris", "unit": "c"}')


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}'
    "\n</tool_call>",
    '{"name": "get_weather", "parameters": {"unit": "c", "city": "Paris"}}',
    '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}]',
    '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}]}',
    '{"tool": "get_weather", "args": {"city": "Paris", "unit": "c"}}',
    '  {"type": "function", "function": {"name": "get_weather", '
    '"arguments": "{\\"city\\": \\"Paris\\", \\"unit\\": \\"c\\"}"}}',
])
def test_every_format_parses_to_the_same_call(text: str) -> None:
    calls = tm.parse_any(text)
    assert calls is not None and tm.same_calls(calls, (WEATHER,))


@pytest.mark.parametrize("text", [
    "It is sunny in Paris.", "", '{"city": "Paris"}', "[1, 2]", '{"tool": "f"}',
    '{"tool": "f", "args": {}, "note": "extra keys: not a call"}', "{" * 5000,
])
def test_plain_answers_make_no_calls(text: str) -> None:
    assert tm.parse_any(text) is None


def test_arguments_are_equal_as_json_values() -> None:
    assert tm.same_arguments('{"a": 1, "b": {"x": [1, 2]}}', '{"b":{"x":[1.0,2]},"a":1}')
    assert not tm.same_arguments('{"a": 1}', '{"a": true}')  # JSON tells them apart
    assert not tm.same_arguments('{"a": [1, 2]}', '{"a": [2, 1]}')
    assert not tm.same_arguments('{"a": 1}', '{"a": 1, "b": null}')
    assert tm.same_arguments("not json", "not json")
    assert not tm.same_calls((WEATHER,), (WEATHER, WEATHER))
    assert not tm.same_calls((WEATHER,), (ToolCall("c1", "get_time", WEATHER.arguments),))


def test_the_difference_is_said_in_plain_words() -> None:
    paris = (WEATHER,)
    rome = (ToolCall("z", "get_weather", '{"unit": "c", "city": "Rome"}'),)
    time = (ToolCall("z", "get_time", '{"city": "Paris"}'),)
    assert tm.difference(None, None) is None
    assert tm.difference(paris, (ToolCall("other id", "get_weather",
                                          '{"unit": "c", "city": "Paris"}'),)) == "same call"
    assert tm.difference(paris, time) == "different tool: get_weather vs get_time"
    assert tm.difference(paris, rome) == "same tool, different arguments: city"
    assert tm.difference(paris, (ToolCall("z", "get_weather", '{"city": "Paris"}'),)) == \
        "same tool, different arguments: unit"
    assert tm.difference(None, time) == "only the variant calls a tool: get_time"
    assert tm.difference(paris, None) == "only the base calls a tool: get_weather"


def test_tools_are_read_from_openai_json_and_refused_with_the_entry() -> None:
    tools = tm.tools_from_openai(json.loads(
        '[{"type": "function", "function": {"name": "get_weather", "description": "Now.",'
        ' "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},'
        ' {"name": "get_time"}]'))
    assert [t.name for t in tools] == ["get_weather", "get_time"]
    assert tools[0].parameters == {"type": "object",
                                   "properties": {"city": {"type": "string"}}}
    assert tools[1].parameters is None and tools[0].description == "Now."
    assert tm.tools_from_openai({"tools": [{"name": "f"}]})[0].name == "f"
    for value, reason in (("nope", "JSON list"), ([{"function": {}}], "tool 1"),
                          ([{"name": "f"}, {"name": "f"}], "same name"),
                          ([{"name": "bad name!"}], "letters, digits"),
                          ([{"name": "f", "parameters": [1]}], "tool 1: parameters")):
        with pytest.raises(RefusedError, match=reason):
            tm.tools_from_openai(value)


def _jsonl(path: Path, *lines: dict) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


CALL_LINE = {"messages": [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}]}]}


def test_a_chat_item_with_tool_calls_is_a_tool_call_score_item(tmp_path: Path) -> None:
    plain = {"messages": [{"role": "user", "content": "Hi"},
                          {"role": "assistant", "content": "Hello."}]}
    loaded = score_sets.read_set(_jsonl(tmp_path / "calls.jsonl", CALL_LINE, plain))
    called, said = loaded.items
    assert called.tool_calls is not None and tm.same_calls(called.tool_calls, (WEATHER,))
    assert json.loads(called.target) == {"tool_calls": [
        {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}]}
    assert [m.role for m in called.prompt.messages] == ["user"]
    assert said.tool_calls is None and said.target == "Hello."


def test_tool_calls_in_data_are_checked_and_trained_only_with_tools(tmp_path: Path) -> None:
    bad = {"messages": [{"role": "user", "content": "x", "tool_calls": []},
                        {"role": "assistant", "content": "y"}]}
    nameless = {"messages": [{"role": "user", "content": "x"}, {
        "role": "assistant", "content": "", "tool_calls": [{"function": {}}]}]}
    with pytest.raises(data.DataError) as refused:
        data.read_records(_jsonl(tmp_path / "bad.jsonl", bad, nameless), dpo=False)
    assert "line 1: message 0: only an assistant message has tool_calls" in \
        refused.value.message
    assert "line 2: message 1: tool call 1: needs a function with a name" in \
        refused.value.message
    records, _sha = data.read_records(_jsonl(tmp_path / "ok.jsonl", CALL_LINE), dpo=False)
    # Scoreable as it is; trained only beside the tools a served request would offer
    # (tests/test_training_tools.py trains lines with tools).
    with pytest.raises(data.DataError, match="line 1: assistant tool_calls need the "
                                             "line's tools"):
        data.encode(records, object(), 64, False)


def _result(name: str, calls: float | None) -> ScoreResult:
    return ScoreResult(
        name=name, kind="variant", backend="llama", identity="i" * 64,
        identity_short="i" * 12, openvino_profile=None, adapters=(), items=4, tokens=40,
        nll=20.0, mean_nll=0.5, perplexity=1.65, exact_items=4, exact_matches=1,
        exact_match=0.25, seconds=1.0, rows=(), tool_call_items=4 if calls is not None
        else 0, tool_call_matches=round((calls or 0) * 4), tool_call_exact=calls)


def test_score_prints_the_tool_call_figure_beside_exact_match(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = _jsonl(tmp_path / "calls.jsonl", CALL_LINE)
    results = [_result("base", 0.0), _result("tool-calls", 0.75)]
    monkeypatch.setattr(score_sets, "score_models", lambda *_a, **_k: results)
    args = argparse.Namespace(data=path, names=["base", "tool-calls"], backend=None,
                              exact_match=True, json=False, profile=None)
    assert score_cmds.cmd_score(None, args) == 0  # type: ignore[arg-type]
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[-4:] == ["exact", "match", "tool-call", "exact"]
    assert lines[3].endswith("25.0% (1/4)  75.0% (3/4)")
    assert lines[2].endswith("25.0% (1/4)  0.0% (0/4)")
    # A set without tool-call items keeps the table it always had.
    monkeypatch.setattr(score_sets, "score_models",
                        lambda *_a, **_k: [_result("base", None)])
    score_cmds.cmd_score(None, args)  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert "tool-call" not in out and out.splitlines()[2].endswith("25.0% (1/4)")
    summary = evaluation.score_summary(_result("tool-calls", 0.75))
    assert (summary["tool_call_exact"], summary["tool_call_items"]) == (0.75, 4)
    assert "tool-call exact match 75.0% (3/4)" in evaluation.score_line(
        "tool-calls", "llama", summary)
    assert "tool_call_exact" not in evaluation.score_summary(_result("base", None))
