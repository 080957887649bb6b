"""Tool calling and structured output through the local server, driven by the official
`openai` client on a loopback port, on the plain embedded base model (llama.cpp; the
OpenVINO default for json_schema): `tool_choice` "required" and a named function
enforced, streamed and whole answers giving the same calls, `json_schema` answers that
validate, an uncompilable schema refused with a 400 naming it (and listed in the request
log), parallel calls, a tool-result round trip, and replay of a constrained answer.
Greedy, so every answer is reproducible."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

from engine.runtime import replay
from tests.engine_helpers import BASE
from tests.world import Recipe, World

pytestmark = pytest.mark.slow  # a real engine behind a real server
GREEDY = {"temperature": 0, "seed": 7, "extra_body": {"repeat_penalty": 1.0}}
WEATHER_SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 40},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
ADD_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"},
                                               "b": {"type": "integer"}},
              "required": ["a", "b"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_SCHEMA,
                                      "description": "The current weather in a city"}},
    {"type": "function", "function": {"name": "add", "parameters": ADD_SCHEMA,
                                      "description": "Add two integers"}},
]
SCHEMAS = {"get_weather": WEATHER_SCHEMA, "add": ADD_SCHEMA}
WEATHER_QUESTION = [{"role": "user", "content": "What is the weather in Paris right now?"}]


WORLD = Recipe(max_sessions=2)


def ask(world: World, model: str = BASE, **kw: Any) -> Any:
    args = {"model": model, "messages": WEATHER_QUESTION, "max_tokens": 60, **GREEDY, **kw}
    return world.openai.chat.completions.create(**args)


def valid_calls(calls: list[Any]) -> list[tuple[str, dict[str, Any]]]:
    """Each call's name and arguments, the arguments validated against its tool's schema."""
    out = []
    for call in calls:
        assert call.type == "function" and call.id
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, SCHEMAS[call.function.name])
        out.append((call.function.name, arguments))
    return out


def streamed(world: World, **kw: Any) -> tuple[list[dict[str, str]], str, str]:
    """A streamed answer's tool calls (by index: id, name and the arguments' pieces
    joined), content and finish reason, as an agent framework accumulates them."""
    calls: dict[int, dict[str, str]] = {}
    content, finish = "", None
    for chunk in ask(world, stream=True, **kw):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for piece in choice.delta.tool_calls or ():
            call = calls.setdefault(piece.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += piece.id or ""
            call["name"] += (piece.function.name or "") if piece.function else ""
            call["arguments"] += (piece.function.arguments or "") if piece.function else ""
        finish = choice.finish_reason or finish
    return [calls[i] for i in sorted(calls)], content, finish


def test_required_is_enforced_on_the_plain_base_and_streams_the_same(world: World
                                                                    ) -> None:
    whole = ask(world, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None
    [(name, arguments)] = valid_calls(choice.message.tool_calls)
    assert name == "get_weather" and arguments["city"] == "Paris"
    calls, content, finish = streamed(world, tools=TOOLS, tool_choice="required",
                                      parallel_tool_calls=False)
    assert finish == "tool_calls" and content == ""
    assert calls == [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                     for c in choice.message.tool_calls]
    # The same request again: the same call, the same id.
    again = ask(world, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    assert again.choices[0].message.tool_calls == choice.message.tool_calls


def test_a_named_function_is_enforced_even_against_the_question(world: World) -> None:
    answer = ask(world, tools=TOOLS,
                 tool_choice={"type": "function", "function": {"name": "add"}})
    calls = valid_calls(answer.choices[0].message.tool_calls)
    assert calls and {name for name, _ in calls} == {"add"}


def test_parallel_calls_several_or_at_most_one(world: World) -> None:
    question = [{"role": "system", "content": "Call a tool once for each part of a question."},
                {"role": "user", "content": "Add 2 and 3, then add 4 and 5."}]
    several = ask(world, messages=question, tools=TOOLS, tool_choice="required",
                  max_tokens=100).choices[0]
    assert len(valid_calls(several.message.tool_calls)) >= 2, several
    one = ask(world, messages=question, tools=TOOLS, tool_choice="required",
              parallel_tool_calls=False, max_tokens=100).choices[0]
    assert len(valid_calls(one.message.tool_calls)) == 1
    assert one.finish_reason == "tool_calls"


def test_auto_and_none(world: World) -> None:
    hello = [{"role": "user", "content": "Say hello to me."}]
    auto = ask(world, messages=hello, tools=TOOLS, max_tokens=30).choices[0]
    if auto.message.tool_calls:  # the lazy constraint held the call to its schema
        valid_calls(auto.message.tool_calls)
        assert auto.finish_reason == "tool_calls"
    else:
        assert auto.message.content and auto.finish_reason in ("stop", "length")
    none = ask(world, tools=TOOLS, tool_choice="none", max_tokens=30).choices[0]
    assert none.message.tool_calls is None and none.message.content


def test_a_tool_result_round_trip(world: World) -> None:
    first = ask(world, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    call = first.choices[0].message.tool_calls[0]
    history = [*WEATHER_QUESTION, first.choices[0].message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"}]
    second = ask(world, messages=history, tools=TOOLS, tool_choice="none", max_tokens=40)
    assert second.choices[0].message.content
    # The call and the result were rendered into the prompt (the generic format: the
    # call as JSON, the result as a tool_response) and the record keeps them.
    record = second.model_dump()["variant_studio"]["replay"]
    kept = record["prompt"]["messages"]
    assert kept[1]["tool_calls"][0]["id"] == call.id
    assert kept[2] == {"role": "tool", "content": "18 C and sunny", "tool_call_id": call.id,
                       "name": "get_weather"}
    without = ask(world, messages=history[:1], tools=TOOLS, tool_choice="none", max_tokens=1)
    assert second.usage.prompt_tokens > without.usage.prompt_tokens + 20


def test_json_schema_and_json_object_answers_validate(world: World) -> None:
    schema = {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 20},
                    "maxItems": 3}},
        "required": ["name", "age", "hobbies"], "additionalProperties": False}
    answer = ask(world, messages=[{"role": "user", "content": "Describe a person."}],
                 max_tokens=120, response_format={"type": "json_schema", "json_schema": {
                     "name": "person", "schema": schema, "strict": True}}).choices[0]
    assert answer.finish_reason == "stop", answer
    jsonschema.validate(json.loads(answer.message.content), schema)
    plain = ask(world, messages=[{"role": "user", "content": "List three fruits."}],
                max_tokens=80, response_format={"type": "json_object"}).choices[0]
    assert isinstance(json.loads(plain.message.content), dict)
    done = world.openai.completions.create(
        model=BASE, prompt="A city and its country as JSON:", max_tokens=60, temperature=0,
        extra_body={"response_format": {"type": "json_schema", "json_schema": {
            "name": "city", "schema": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 30}}, "required": ["city"],
                "additionalProperties": False}}}})
    assert isinstance(json.loads(done.choices[0].text)["city"], str)


@pytest.mark.parametrize(("extra", "param"), [
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "string", "pattern": "(?<=a)b"}}}},
     "response_format.json_schema.schema"),
    ({"tools": [TOOLS[1], {"type": "function", "function": {
        "name": "bad", "parameters": {"type": "object", "properties": {
            "x": {"$ref": "#/definitions/missing"}}}}}]}, "tools.1.function.parameters"),
])
def test_a_schema_that_cannot_be_compiled_is_a_400_naming_it(
        world: World, extra: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        ask(world, **extra)
    error = caught.value.body
    assert error["param"] == param and error["code"] == "invalid_schema"
    assert "cannot be compiled" in error["message"]
    # The Server panel's request log lists it, with the reason.
    last = world.server.state.log[-1]
    assert (last.status, last.model) == (400, BASE) and "cannot be compiled" in last.reason


def test_bad_tool_requests_are_400s(world: World) -> None:
    for extra, param in (
            ({"tool_choice": "required"}, "tool_choice"),
            ({"tools": TOOLS, "tool_choice": {"type": "function",
                                              "function": {"name": "multiply"}}},
             "tool_choice"),
            ({"tools": [TOOLS[0], TOOLS[0]]}, "tools")):
        with pytest.raises(openai.BadRequestError) as caught:
            ask(world, **extra)
        assert caught.value.body["param"] == param


def test_a_constrained_answer_replays_bit_for_bit(world: World) -> None:
    answer = ask(world, tools=TOOLS, tool_choice={"type": "function",
                                                  "function": {"name": "add"}})
    record = answer.model_dump()["variant_studio"]["replay"]
    assert record["constraint"] == {"tool_choice": "add", "parallel_tool_calls": True,
                                    "response_format": "text"}
    assert [t["name"] for t in record["prompt"]["tools"]] == ["get_weather", "add"]
    plan = replay.plan(world.catalog, replay.ReplayRecord.from_dict(record))
    assert plan.request is not None and plan.request.constraint is not None
    result = world.server.client.call(plan.request, 300)
    assert replay.verdict(plan, result)["verdict"] == "identical"
    assert [(c.id, c.name, c.arguments) for c in result.tool_calls] == [
        (c.id, c.function.name, c.function.arguments)
        for c in answer.choices[0].message.tool_calls]


def test_openvino_is_constrained_the_same_way(world: World,
                                              tmp_path_factory: pytest.TempPathFactory
                                              ) -> None:
    """The OpenVINO default (built once per test session) through the same server: its
    json_schema answers and tool calls validate; the mask comes from the same sampler,
    over the detokenizer's vocabulary."""
    from engine.curated import openvino_default
    from tests.openvino_helpers import register_default

    register_default(world.catalog, tmp_path_factory)
    name = openvino_default.NAME
    schema = {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 40},
        "year": {"type": "integer", "minimum": 1900, "maximum": 2100}},
        "required": ["title", "year"], "additionalProperties": False}
    answer = ask(world, model=name, max_tokens=60,
                 messages=[{"role": "user", "content": "Name a film and its year."}],
                 response_format={"type": "json_schema", "json_schema": {
                     "name": "film", "schema": schema, "strict": True}})
    assert answer.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(answer.choices[0].message.content), schema)
    assert answer.model_dump()["variant_studio"]["replay"]["backend"] == "openvino"
    called = ask(world, model=name, tools=TOOLS, tool_choice="required",
                 parallel_tool_calls=False).choices[0]
    assert called.finish_reason == "tool_calls"
    assert len(valid_calls(called.message.tool_calls)) == 1
