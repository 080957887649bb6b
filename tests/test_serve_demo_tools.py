"""The demo variant speaks the real protocol: served by name through the local server
and asked with the official `openai` client the way an agent framework asks (its five
tools as OpenAI `tools`, `tool_choice` left to its default, "auto"), it answers held-out
requests with real `tool_calls` (`finish_reason: "tool_calls"`, no content) naming the
expected function with the expected arguments, streamed and whole alike, on llama.cpp
(the GGUF adapter) and on OpenVINO (the OpenVINO default with the PEFT file).

Its profile declares the format its adapter was trained to write (`tool_format:
"tool-args"`: `{"tool": NAME, "args": {...}}`, the tools described by its system
prompt); the request's tools still decide which functions it may call. A catalog made
before profiles declared formats adopts the demo's at start-up.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.catalog.profiles import check_profile
from engine.catalog.store import AdapterSpec, Catalog
from engine.curated import demo, setup
from engine.errors import UsageError
from engine.training import demo as demo_data
from tests.world import Recipe, World

pytestmark = pytest.mark.slow  # a real engine behind a real server
OPENVINO_VARIANT = "tool-calls-openvino"
# Five rows: the tools rotate, so each tool is asked once (the second round: the
# shipped adapter misses one artist of the first, 58/60 overall).
ROWS = [json.loads(line) for line in
        (demo.resources_dir() / demo.SHIPPED_HELDOUT).read_text().splitlines()][5:10]


def on_openvino(world: World) -> None:
    world.catalog.add_variant(OPENVINO_VARIANT, world.base, [AdapterSpec(demo.ADAPTER_NAME,
                                                                         1.0)],
                              demo.DEMO_PROFILE)


WORLDS = [pytest.param(Recipe(demo=True, max_sessions=2), id="llama"),
          pytest.param(Recipe(demo=True, openvino=True, max_sessions=2,
                              furnish=on_openvino), id="openvino")]


def variant(world: World) -> str:
    return OPENVINO_VARIANT if world.backend == "openvino" else demo.VARIANT_NAME


def ask(world: World, request: str, **kw: Any) -> Any:
    return world.openai.chat.completions.create(
        model=variant(world), messages=[{"role": "user", "content": request}],
        tools=kw.pop("tools", demo.TOOLS), temperature=0, seed=7, max_tokens=64, **kw)


def streamed_calls(world: World, request: str) -> tuple[list[tuple[str, str, str]], str, Any]:
    """A streamed answer's calls (id, name, arguments), content and finish reason, as
    an agent framework accumulates the deltas."""
    calls: dict[int, list[str]] = {}
    content, finish = "", None
    for chunk in ask(world, request, stream=True):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for piece in choice.delta.tool_calls or ():
            call = calls.setdefault(piece.index, ["", "", ""])
            call[0] += piece.id or ""
            if piece.function:
                call[1] += piece.function.name or ""
                call[2] += piece.function.arguments or ""
        finish = choice.finish_reason or finish
    return [tuple(calls[i]) for i in sorted(calls)], content, finish


@pytest.mark.parametrize("row", ROWS, ids=[demo_data.expected_call(r)["tool"] for r in ROWS])
def test_a_held_out_request_gets_the_expected_tool_call(world: World, row: dict[str, Any]
                                                        ) -> None:
    request, expected = demo_data.request_of(row), demo_data.expected_call(row)
    choice = ask(world, request).choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert (call.function.name, json.loads(call.function.arguments)) == (
        expected["tool"], expected["args"])
    # Streamed: the same call, the same id, no content.
    calls, content, finish = streamed_calls(world, request)
    assert (calls, content, finish) == (
        [(call.id, call.function.name, call.function.arguments)], "", "tool_calls")


def test_the_request_decides_which_tools_may_be_called(world: World) -> None:
    """Asked about the weather with only `play_music` on offer, the variant starts its
    call as trained, and the grammar holds it to `play_music`; with `tool_choice: "none"`
    it answers as text (its JSON, unparsed)."""
    music = [t for t in demo.TOOLS if t["function"]["name"] == "play_music"]
    answer = ask(world, "What's the weather in Vienna today?", tools=music).choices[0]
    assert [c.function.name for c in answer.message.tool_calls or ()] == ["play_music"]
    none = ask(world, "What's the weather in Vienna today?", tool_choice="none").choices[0]
    assert none.message.tool_calls is None and none.finish_reason == "stop"
    assert json.loads(none.message.content)["tool"] == "get_weather"


def test_a_catalog_from_before_adopts_the_demos_format(studio_home: Path) -> None:
    catalog = Catalog()
    setup.first_run(catalog, with_demo=True)

    def forget(data: dict[str, Any]) -> dict[str, Any]:
        del data["variants"][demo.VARIANT_NAME]["profile"]["tool_format"]
        return data

    def profile() -> dict[str, Any]:
        return catalog.data()["variants"][demo.VARIANT_NAME]["profile"]

    catalog.state.update(forget)
    assert setup.first_run(catalog) is False  # the next start
    assert profile()["tool_format"] == demo.TOOL_FORMAT
    # A user's own system prompt is theirs: no format is declared for it.
    catalog.state.update(forget)

    def edit(data: dict[str, Any]) -> dict[str, Any]:
        data["variants"][demo.VARIANT_NAME]["profile"]["system_prompt"] = "Be brief."
        return data

    catalog.state.update(edit)
    assert demo.adopt_tool_format(catalog) is False
    assert "tool_format" not in profile()


def test_an_unknown_format_is_refused_in_a_profile() -> None:
    with pytest.raises(UsageError, match="tool_format must be one of"):
        check_profile({"tool_format": "xml"})
    assert check_profile({"tool_format": "hermes"}) == {"tool_format": "hermes"}
