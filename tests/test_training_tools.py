"""Training data with tools (issue 27 part 4): a chat line's `tools`, assistant
`tool_calls` and `tool` results are checked with line-numbered reasons, and rendered
for training exactly as serving renders the same conversation with the same tools, in
the generic format and in a native (Hermes) one; a turn whose calls a template writes
otherwise than the server parses is refused, never trained."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from engine.catalog import imports, resolve
from engine.catalog.store import Catalog
from engine.formats import tool_calls as tc
from engine.formats.artifacts import BaseModelInfo
from engine.formats.templates import Message
from engine.runtime import messages, prompting
from engine.runtime.client import EngineClient
from engine.runtime.messages import Prompt
from engine.training import data as data_mod
from engine.training import score_sets
from engine.training.tokenizer import Tokenizer
from tests import families
from tests.engine_helpers import sampling
from tests.matrix_helpers import run_cli
from tests.test_tool_calls import HERMES_TEMPLATE

ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                    "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


def call(name: str, arguments: dict[str, Any], call_id: str = "call_1") -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


def tool_line(answer: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """A two-turn tool conversation: a call, its result, the final answer."""
    return {"tools": [ADD, WEATHER], "messages": [
        {"role": "user", "content": "What is 2 plus 3?"},
        answer or {"role": "assistant", "content": None,
                   "tool_calls": [call("add", {"a": 2, "b": 3})]},
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
        {"role": "assistant", "content": "2 plus 3 is 5."}], **extra}


def write_lines(path: Path, lines: list[object]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n"
                            for x in lines))
    return path


# The Hermes template of tests/test_tool_calls.py, writing each call's tags without the
# newline between calls the server's Hermes format has: a turn with two calls cannot be
# trained for it.
TIGHT_TEMPLATE = HERMES_TEMPLATE.replace("{% if not loop.first %}\n{% endif %}", "")


@pytest.fixture(scope="module")
def tokenizer(embedded_path: Path, base_info: BaseModelInfo):
    with Tokenizer(embedded_path, base_info) as tok:
        yield tok


@pytest.fixture
def hermes(tokenizer: Tokenizer):
    """The embedded tokenizer with a Hermes template (restored afterwards)."""
    original = tokenizer.info
    tokenizer.info = dataclasses.replace(original, chat_template=HERMES_TEMPLATE)
    yield tokenizer
    tokenizer.info = original


# ---------------------------------------------------------------------------- checking


def test_tool_lines_are_parsed_with_their_calls_and_results(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "t.jsonl", [tool_line()])
    [record], _sha = data_mod.read_records(path, dpo=False)
    assert record.kind == "chat"
    assert record.tools is not None and [t.name for t in record.tools] == ["add",
                                                                          "get_weather"]
    user, asked, result, final = record.messages
    assert asked.content == "" and asked.tool_calls is not None
    assert [(c.id, c.name, json.loads(c.arguments)) for c in asked.tool_calls] == [
        ("call_1", "add", {"a": 2, "b": 3})]
    # The result's tool name is filled in from the call it answers, as the server does.
    assert (result.role, result.content, result.tool_call_id, result.name) == (
        "tool", "5", "call_1", "add")
    assert final.content == "2 plus 3 is 5."


def test_malformed_tool_lines_are_refused_with_their_reasons(tmp_path: Path) -> None:
    lookaround = {"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"s": {"type": "string", "pattern": "(?=a)a"}}}}}
    lines: list[object] = [
        tool_line(),  # 1: fine
        {**tool_line(), "tools": {"type": "function"}},  # 2
        {**tool_line(), "tools": [{"name": "add"}]},  # 3: not OpenAI's tool shape
        {**tool_line(), "tools": [lookaround]},  # 4: no grammar for this schema
        tool_line({"role": "assistant", "content": None,
                   "tool_calls": [call("multiply", {"a": 2, "b": 3})]}),  # 5
        tool_line({"role": "assistant", "content": None,
                   "tool_calls": [call("add", {"a": 2, "b": 3}, "call_9")]}),  # 6
        tool_line({"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "add", "arguments": "{a: 2"}}]}),  # 7: bad JSON
        tool_line({"role": "assistant", "content": None,
                   "tool_calls": [call("add", {"a": "two", "b": 3})]}),  # 8
        {**tool_line(), "messages": [*tool_line()["messages"][:2],
                                     {"role": "tool", "tool_call_id": "call_1",
                                      "name": "get_weather", "content": "5"},
                                     tool_line()["messages"][3]]},  # 9
        {"prompt": "p", "completion": "c", "tools": [ADD]},  # 10
        {"messages": [{"role": "user", "content": "hi", "tool_call_id": "x"},
                      {"role": "assistant", "content": "yo"}]},  # 11
        {"tools": [ADD, ADD], "messages": tool_line()["messages"]},  # 12
    ]
    path = write_lines(tmp_path / "bad.jsonl", lines)
    with pytest.raises(data_mod.DataError) as caught:
        data_mod.read_records(path, dpo=False)
    expected = {
        2: "tools must be a non-empty list",
        3: 'tool 1: expected {"type": "function"',
        4: "tool pick: its parameters cannot be compiled to a grammar",
        5: "tool call 1 (multiply): calls a tool that is not in the line's tools (add, "
           "get_weather)",
        6: "message 2: tool_call_id 'call_1' answers no earlier tool call",
        7: "tool call 1 (add): arguments are not valid JSON",
        8: "tool call 1 (add): arguments do not match its parameters: a: 'two' is not of "
           "type 'integer'",
        9: "name 'get_weather' is not the tool that call 'call_1' called (add)",
        10: "tools go with messages only",
        11: "only a tool message has tool_call_id and name",
        12: "two tools have the same name",
    }
    details = {int(d.split(":")[0].removeprefix("line ")): d for d in caught.value.details}
    assert set(details) == set(expected), details
    for line, reason in expected.items():
        assert reason in details[line], details[line]


def test_calls_without_tools_are_scoreable_but_not_trainable(tmp_path: Path,
                                                             tokenizer: Tokenizer) -> None:
    line = tool_line()
    del line["tools"]
    path = write_lines(tmp_path / "t.jsonl", [line])
    records, _sha = data_mod.read_records(path, dpo=False)
    assert records[0].tools is None
    with pytest.raises(data_mod.DataError, match="line 1: assistant tool_calls need the "
                                                 "line's tools"):
        data_mod.encode(records, tokenizer, 512, False)
    # A score set's line keeps its tools, rendered into the scored prompt as served.
    tools = write_lines(tmp_path / "s.jsonl", [tool_line(), {
        "tools": [WEATHER], "messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": None,
             "tool_calls": [call("get_weather", {"city": "Oslo"}, "w1")]}]}])
    first, second = score_sets.read_set(tools).items
    assert [t.name for t in first.prompt.tools or ()] == ["add", "get_weather"]
    assert first.tool_calls is None and first.target == "2 plus 3 is 5."
    assert [c.name for c in second.tool_calls or ()] == ["get_weather"]


# ---------------------------------------------------------------------------- rendering


class Served:
    """The training tokenizer as the resident model `engine.runtime.prompting` tokenizes
    a served request with (the same llama.cpp vocabulary)."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        self.n_vocab = tok.n_vocab

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        return self.tok.tokenize(text, add_special=add_special, parse_special=parse_special)

    def token_text(self, token: int) -> bytes:
        return self.tok.special_text(token).encode()


def served_tokens(tok: Tokenizer, messages: list[Message], tools: Any) -> list[int]:
    """The prompt tokens of a served chat request with these messages and tools, through
    serving's own prompt path (no profile system prompt, as the data gives it)."""
    spec = SimpleNamespace(system_prompt=None, tool_format=None,
                           identity=SimpleNamespace(context=SimpleNamespace(n_ctx=4096)))
    prompt = Prompt(messages=tuple(messages), chat=True, system="", tools=tools)
    return prompting.prompt_tokens(Served(tok), tok.info, spec, prompt)  # type: ignore[arg-type]


def assert_trained_as_served(tok: Tokenizer, tmp_path: Path, line: dict[str, Any],
                             fmt: str) -> data_mod.Sequence:
    path = write_lines(tmp_path / f"{fmt}.jsonl", [line])
    records, _sha = data_mod.read_records(path, dpo=False)
    [example] = data_mod.encode(records, tok, 1024, True)
    [seq] = example.sequences
    messages, tools = list(records[0].messages), records[0].tools
    assert tok.tool_format(messages, tools) == fmt
    # The tokens before each trained answer are the served request's prompt for that
    # turn, tools and all, through serving's own prompt path...
    first = seq.targets.index(True)
    assert list(seq.tokens[:first]) == served_tokens(tok, messages[:1], tools)
    second = seq.targets.index(True, seq.targets.index(False, first))
    assert list(seq.tokens[:second]) == served_tokens(tok, messages[:3], tools)
    # ...and the whole line is the conversation with its answers, rendered the same way.
    whole = tc.render_chat(tok.info.chat_template, messages, tools, bos_token=tok.bos_text,
                           eos_token=tok.eos_text, add_generation_prompt=False)
    assert list(seq.tokens) == tok.prompt_tokens(whole)
    # The first trained answer is what the server's parser reads back as the call.
    end = seq.targets.index(False, first)
    answer = tok.detokenize(list(seq.tokens[first:end]))
    assert answer.startswith(tc.write_calls(messages[1].tool_calls or (), fmt))
    content, calls = tc.split(answer.removesuffix(tok.eos_text), fmt, "x")
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("add", {"a": 2, "b": 3})]
    assert not content.strip()
    return seq


def test_generic_format_is_trained_as_served(tmp_path: Path, tokenizer: Tokenizer) -> None:
    # The embedded SmolLM2 template takes no tools: the generic format.
    assert tc.detect(tokenizer.info.chat_template) == "generic"
    seq = assert_trained_as_served(tokenizer, tmp_path, tool_line(), "generic")
    text = tokenizer.detokenize(list(seq.tokens))
    assert "You can call these tools" in text  # the generic system section
    assert '{"tool_response": {"name": "add", "tool_call_id": "call_1", "content": "5"}}' \
        in text
    trained = tokenizer.detokenize([t for t, m in zip(seq.tokens, seq.targets, strict=True)
                                    if m])
    assert trained == ('{"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]}'
                       '<|im_end|>2 plus 3 is 5.<|im_end|>')


def test_native_format_is_trained_as_served(tmp_path: Path, hermes: Tokenizer) -> None:
    assert tc.detect(hermes.info.chat_template) == "hermes"
    seq = assert_trained_as_served(hermes, tmp_path, tool_line(), "hermes")
    text = hermes.detokenize(list(seq.tokens))
    assert '<tools>{"function": {"description": "Add two integers"' in text
    assert "<tool_response>\n5\n</tool_response>" in text
    # Content before the calls is trained too, on a line of its own before them.
    line = tool_line({"role": "assistant", "content": "Let me add.",
                      "tool_calls": [call("add", {"a": 2, "b": 3})]})
    path = write_lines(tmp_path / "content.jsonl", [line])
    [example] = data_mod.encode(data_mod.read_records(path, dpo=False)[0], hermes, 1024,
                                False)
    [seq] = example.sequences
    first = seq.targets.index(True)
    answer = hermes.detokenize(list(seq.tokens[first:seq.targets.index(False, first)]))
    assert answer == 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, ' \
                     '"b": 3}}\n</tool_call>'


def test_calls_a_template_writes_otherwise_are_refused(tmp_path: Path,
                                                       tokenizer: Tokenizer) -> None:
    two_calls = tool_line({"role": "assistant", "content": None, "tool_calls": [
        call("add", {"a": 2, "b": 3}), call("get_weather", {"city": "Oslo"}, "call_2")]})
    content_first = tool_line({"role": "assistant", "content": "Adding.",
                               "tool_calls": [call("add", {"a": 2, "b": 3})]})
    path = write_lines(tmp_path / "refused.jsonl", [two_calls, content_first])
    records, _sha = data_mod.read_records(path, dpo=False)
    original = tokenizer.info
    try:
        tokenizer.info = dataclasses.replace(original, chat_template=TIGHT_TEMPLATE)
        with pytest.raises(data_mod.DataError) as caught:
            data_mod.encode(records[:1], tokenizer, 1024, False)
        assert "line 1: the chat template writes this turn's tool calls differently from " \
               "what the server parses in its hermes format" in caught.value.message
    finally:
        tokenizer.info = original
    # The generic format reads calls only as the whole answer: content first is refused.
    with pytest.raises(data_mod.DataError) as caught:
        data_mod.encode(records, tokenizer, 1024, False)
    assert caught.value.details == (
        "line 2: the server would not read this turn's answer as its tool calls (generic "
        "format): the generic format reads calls only when they are the whole answer: "
        "leave the content empty",)


# ---------------------------------------------------------------------------- a real run

FLAGS = ["--steps", "2", "--batch", "1", "--seq-len", "384", "--rank", "4", "--threads",
         "1"]


@pytest.mark.slow
def test_a_tools_file_trains_and_its_variant_is_served_with_tools(
        studio_home: Path, tmp_path: Path, family_files: dict[str, families.FamilyFiles],
        capsys: pytest.CaptureFixture) -> None:
    """Two steps on a four-line tools file (the tiny llama family model, the generic
    format): the run completes, and its variant, asked with the same tools and
    tool_choice "auto", answers through a real engine process with the answer parsed
    for calls (its content split out) and the adapter applied."""
    lines = [tool_line(), tool_line({"role": "assistant", "content": None, "tool_calls": [
        call("add", {"a": 4, "b": 1})]}),
        {"tools": [WEATHER], "messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": None,
             "tool_calls": [call("get_weather", {"city": "Oslo"}, "w1")]}]},
        {"tools": [ADD], "messages": [{"role": "user", "content": "Hello"},
                                      {"role": "assistant", "content": "Hi!"}]}]
    path = write_lines(tmp_path / "tools.jsonl", lines)
    catalog = Catalog()
    imports.add_model(catalog, "fixture-llama", family_files["llama"].base("Q8_0"))
    code, out, err = run_cli(capsys, "train", "calls", "--base", "fixture-llama", "--data",
                             str(path), *FLAGS, "--variant", "caller", "--json")
    assert code == 0, err[-3000:]
    record = json.loads(out)["provenance"]
    assert record["steps"] == 2 and record["data"]["examples"] == 4
    assert math.isfinite(record["loss"]["last"])

    tools = tc.Tool("add", "Add two integers", ADD["function"]["parameters"])
    prompt = Prompt(messages=(Message("user", "What is 7 plus 8?"),), chat=True,
                    tools=(tools,))
    client = EngineClient()
    try:
        answer = client.call(messages.Generate(
            resolve.resolve(Catalog(), "caller"), prompt, sampling(max_tokens=24),
            constraint=tc.Constraint(tool_choice="auto")), timeout=120)
    finally:
        client.close()
    assert [a["name"] for a in answer["adapters"]] == ["calls"]
    # The answer went through the tool-call parser: its content is split out (and any
    # calls it makes are whole calls to the offered tool).
    assert isinstance(answer["content"], str)
    assert all(c["name"] == "add" for c in answer.get("tool_calls") or ())
    # The same file scores, tools and all: its one call turn is judged as a call.
    code, out, err = run_cli(capsys, "score", "fixture-llama", "caller", "--data",
                             str(path), "--json")
    assert code == 0, err[-3000:]
    for scored in json.loads(out)["results"]:
        assert scored["tool_call_items"] == 1 and scored["exact_items"] == 4, scored
