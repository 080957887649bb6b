"""Chat formats with tools (engine/formats/tool_calls.py): detection, rendering into a
prompt (native templates and the generic format), the streaming parser of every format,
the grammars, and the sampler's mask (engine/runtime/sampler.py,
engine/runtime/constraint.py). All in-process and quick."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.catalog.profiles import Sampling
from engine.errors import RefusedError
from engine.formats import tool_calls as tc
from engine.formats.templates import Message, ToolCall, render
from engine.runtime import constraint
from engine.runtime.sampler import Sampler
from tests import fake_backend

WEATHER = tc.Tool("get_weather", "Current weather for a city", {
    "type": "object", "properties": {"city": {"type": "string"},
                                     "unit": {"type": "string", "enum": ["c", "f"]}},
    "required": ["city", "unit"]})
ADD = tc.Tool("add", "Add two integers", {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"]})

# A Qwen-style template (the real ones are longer; the tool parts are these): calls as
# `<tool_call>` tags after any content, one per line, results as `<tool_response>` user
# turns. Shared with tests/test_training_tools.py.
HERMES_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n<tools>{% for tool in tools %}\n"
    "{{ tool | tojson }}{% endfor %}\n</tools>\nCall with <tool_call></tool_call>"
    "<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'assistant' and message.tool_calls is defined %}"
    "<|im_start|>assistant\n{% if message.content %}{{ message.content }}\n{% endif %}"
    "{% for call in message.tool_calls %}{% if not loop.first %}\n{% endif %}<tool_call>\n"
    '{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}'
    "\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n"
    "{{ message.content }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
          "{{ message['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_the_format_is_read_from_the_template() -> None:
    assert tc.detect(HERMES_TEMPLATE) == "hermes"
    assert tc.detect(CHATML) == "generic"
    assert tc.detect(None) == "generic"
    assert tc.detect("{% if tools %}[AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]") == "bracketed"
    assert tc.detect("{% if tools %}<|python_tag|>{% endif %}<|eot_id|>") == "llama3"
    # A template that takes tools in a syntax we do not know: the generic format.
    assert tc.detect("{% if tools %}{{ tools }}{% endif %}") == "generic"


def test_a_native_template_renders_tools_calls_and_results() -> None:
    history = [Message("user", "Weather in Oslo?"),
               Message("assistant", "", tool_calls=(ToolCall("call_1", "get_weather",
                                                             '{"city": "Oslo", "unit": "c"}'),)),
               Message("tool", "-3 C, snow", tool_call_id="call_1", name="get_weather")]
    messages, tools = tc.prepare(history, [WEATHER], "hermes")
    text = render(HERMES_TEMPLATE, messages, tools=tools)
    assert '"name": "get_weather"' in text and '"description": "Current weather' in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}' \
        in text
    assert "<tool_response>\n-3 C, snow\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_the_generic_format_for_a_template_without_tools() -> None:
    history = [Message("system", "Be brief."), Message("user", "Weather in Oslo?"),
               Message("assistant", "", tool_calls=(ToolCall("call_1", "get_weather",
                                                             '{"city": "Oslo", "unit": "c"}'),)),
               Message("tool", "-3 C", tool_call_id="call_1", name="get_weather")]
    messages, tools = tc.prepare(history, [WEATHER, ADD], "generic")
    assert tools is None
    assert [m.role for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[0].content.startswith("Be brief.\n\nYou can call these tools")
    assert '"name": "add"' in messages[0].content
    assert json.loads(messages[2].content) == {"tool_calls": [
        {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}]}
    assert json.loads(messages[3].content) == {"tool_response": {
        "name": "get_weather", "tool_call_id": "call_1", "content": "-3 C"}}
    text = render(CHATML, messages)  # the plain template renders it as any chat
    assert "<|im_start|>user\n{\"tool_response\"" in text
    # Without a system message, the section is one.
    messages, _ = tc.prepare([Message("user", "hi")], [ADD], "generic")
    assert messages[0].role == "system" and "add" in messages[0].content


ANSWERS = {
    "hermes": ('Let me check.<tool_call>\n{"name": "get_weather", "arguments": '
               '{"city": "Oslo", "unit": "c"}}\n</tool_call>\n<tool_call>\n{"name": "add", '
               '"arguments": {"a": 2, "b": 3}}\n</tool_call>'),
    "llama3": ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo", '
               '"unit": "c"}}; {"name": "add", "parameters": {"a": 2, "b": 3}}'),
    "bracketed": ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo", '
                '"unit": "c"}}, {"name": "add", "arguments": {"a": 2, "b": 3}}]'),
    "generic": ('{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo", '
                '"unit": "c"}}, {"name": "add", "arguments": {"a": 2, "b": 3}}]}'),
    "tool-args": ('{"tool": "get_weather", "args": {"city": "Oslo", "unit": "c"}}\n'
                  '{"tool": "add", "args": {"a": 2, "b": 3}}'),
}


def test_a_declared_format_replaces_the_templates_and_renders_no_tools() -> None:
    """A profile's `tool-args`: the variant's own system prompt describes its tools (its
    adapter was trained on that prompt), so the tools are not rendered; its calls in a
    history are written as it writes them, results as the generic format's."""
    history = [Message("system", "Reply with one JSON tool call."),
               Message("user", "Weather in Oslo?"),
               Message("assistant", "", tool_calls=(ToolCall("call_1", "get_weather",
                                                             '{"city": "Oslo", "unit": "c"}'),)),
               Message("tool", "-3 C", tool_call_id="call_1", name="get_weather")]
    assert tc.chat_format(HERMES_TEMPLATE, history, [WEATHER], "tool-args") == "tool-args"
    assert tc.chat_format(HERMES_TEMPLATE, history[:2], None, "tool-args") is None
    messages, tools = tc.prepare(history, [WEATHER, ADD], "tool-args")
    assert tools is None
    assert messages[0] == history[0]  # no tools section
    assert json.loads(messages[2].content) == {"tool": "get_weather",
                                               "args": {"city": "Oslo", "unit": "c"}}
    assert json.loads(messages[3].content)["tool_response"]["content"] == "-3 C"
    text = tc.render_chat(CHATML, history, [WEATHER], declared="tool-args")
    assert "get_weather" not in text.split("<|im_start|>user")[0]
    # The lazy grammar starts at the format's own trigger, and the call parses.
    grammar = tc.grammar(tc.Constraint(tool_choice="auto"), [WEATHER], "tool-args")
    assert grammar is not None and '"{\\"tool\\""' in grammar
    assert tc.split('{"tool_calls": []}', "tool-args", "s")[1] == []


@pytest.mark.parametrize("fmt", tc.FORMATS)
def test_every_format_parses_whole_and_streamed_alike(fmt: str) -> None:
    answer = ANSWERS[fmt]
    content, calls = tc.split(answer, fmt, "seed")
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Oslo", "unit": "c"}), ("add", {"a": 2, "b": 3})]
    assert content.strip() == ("Let me check." if fmt == "hermes" else "")
    assert len({c.id for c in calls}) == 2
    assert all(len(c.id) == 9 for c in calls) if fmt == "bracketed" else all(
        c.id.startswith("call_") for c in calls)
    # Streamed a character at a time: the same content, the same calls, each call's id
    # and name in its first delta and its arguments' pieces adding up to the whole.
    parser = tc.CallParser(fmt, "seed")
    shown, deltas = [], []
    for char in answer:
        text, more = parser.feed(char)
        shown.append(text)
        deltas += more
    text, more = parser.finish()
    shown.append(text)
    deltas += more
    assert "".join(shown) == content
    assert parser.calls == calls
    for index, call in enumerate(calls):
        mine = [d for d in deltas if d.index == index]
        assert (mine[0].id, mine[0].name) == (call.id, call.name)
        assert "".join(d.arguments for d in mine) == call.arguments
        assert len(mine) > 2  # the arguments did stream, not only at the end


def test_plain_answers_and_near_misses_stay_text() -> None:
    for fmt in tc.FORMATS:
        assert tc.split("Hello there.", fmt, "s") == ("Hello there.", [])
    # A JSON answer that is no call stays content (a json_object answer with tools).
    assert tc.split('{"city": "Oslo"}', "llama3", "s") == ('{"city": "Oslo"}', [])
    assert tc.split("I like <tool_calls> and [TOOL", "hermes", "s")[1] == []
    # A call cut off by the length limit is left as text, not half a call.
    content, calls = tc.split('<tool_call>\n{"name": "add", "argu', "hermes", "s")
    assert calls == [] and '"name": "add"' in content
    # Arguments written as a JSON string are taken as their text.
    _, calls = tc.split('{"tool_calls": [{"name": "add", "arguments": "{\\"a\\": 1}"}]}',
                        "generic", "s")
    assert calls[0].arguments == '{"a": 1}'


def test_ids_are_the_same_for_the_same_prompt() -> None:
    one = tc.split(ANSWERS["generic"], "generic", "prompt-a")[1]
    again = tc.split(ANSWERS["generic"], "generic", "prompt-a")[1]
    other = tc.split(ANSWERS["generic"], "generic", "prompt-b")[1]
    assert one == again and one[0].id != other[0].id


@pytest.mark.parametrize("fmt", tc.FORMATS)
@pytest.mark.parametrize("choice", ["auto", "required", "add"])
@pytest.mark.parametrize("parallel", [True, False])
def test_every_grammar_compiles(fmt: str, choice: str, parallel: bool) -> None:
    grammar = tc.grammar(tc.Constraint(tool_choice=choice, parallel_tool_calls=parallel),
                         [WEATHER, ADD], fmt)
    assert grammar is not None
    assert constraint._validation_error(grammar) is None, grammar
    assert ("get_weather" in grammar) == (choice != "add")


def test_response_formats_and_refusals() -> None:
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    grammar = tc.grammar(tc.Constraint(response_format="json_schema", schema=schema), [],
                         "generic")
    assert grammar is not None and constraint._validation_error(grammar) is None
    assert tc.grammar(tc.Constraint(response_format="json_object"), [], "generic")
    both = tc.grammar(tc.Constraint(tool_choice="auto", response_format="json_object"),
                      [ADD], "hermes")
    assert both is not None and constraint._validation_error(both) is None
    assert tc.grammar(tc.Constraint(), [ADD], "hermes") is None
    assert tc.grammar(tc.Constraint(tool_choice="none"), [ADD], "hermes") is None
    with pytest.raises(RefusedError, match="not one of the tools"):
        tc.grammar(tc.Constraint(tool_choice="multiply"), [ADD], "hermes")
    with pytest.raises(RefusedError, match="needs its schema"):
        tc.Constraint(response_format="json_schema")
    with pytest.raises(RefusedError, match="tool name"):
        tc.Tool("no spaces allowed")


def test_a_schema_the_engine_cannot_compile_is_named() -> None:
    assert constraint.schema_error({"type": "object"}) is None
    error = constraint.schema_error({"type": "string", "pattern": "(?<=a)b"})
    assert error is not None and "look-around" in error
    assert constraint.schema_error({"type": "object", "properties": {"x": {"$ref": "#/nope"}}})
    assert constraint.schema_error([1, 2]) == "a JSON schema must be an object"


class _OnlyEven:
    """A stand-in grammar: only even token ids, done after three tokens."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def mask(self, logits: np.ndarray) -> None:
        logits[1::2] = -np.inf

    def accept(self, token: int) -> None:
        self.seen.append(token)

    @property
    def done(self) -> bool:
        return len(self.seen) >= 3


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_the_sampler_chooses_only_what_the_mask_allows(temperature: float) -> None:
    rng = np.random.default_rng(0)
    mask = _OnlyEven()
    sampler = Sampler(Sampling(temperature=temperature, top_k=5, seed=3), mask)
    for _ in range(3):
        logits = rng.normal(size=50).astype(np.float32)
        logits[7] = 50.0  # the model's favourite is not allowed
        token = sampler.choose(logits, [])
        assert token % 2 == 0
    assert mask.seen and sampler.finished


def test_a_matcher_over_a_backends_vocabulary() -> None:
    """The grammar engine's tokenizer from a backend's vocabulary (the fake backend's
    characters): a mask that lets only the grammar's text through, and its end."""
    model = fake_backend.FakeModel.__new__(fake_backend.FakeModel)
    model.n_vocab = fake_backend.N_VOCAB
    matcher = constraint.Matcher(model, 'start: "ab" /[0-9]/\n')
    text = ""
    for _ in range(4):
        logits = np.zeros(fake_backend.N_VOCAB, dtype=np.float32)
        matcher.mask(logits)
        allowed = [fake_backend.VOCAB[t] for t in np.flatnonzero(np.isfinite(logits))]
        if matcher.done:
            break
        token = int(np.flatnonzero(np.isfinite(logits))[0])
        text += fake_backend.VOCAB[token]
        matcher.accept(token)
    assert text == "ab0" and matcher.done
    assert allowed  # only an end token is left
    with pytest.raises(RefusedError, match="cannot be compiled"):
        constraint.Matcher(model, "start: undefined_rule\n")
