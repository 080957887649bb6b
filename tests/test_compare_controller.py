"""The comparison's controller on its own, with no engine and no widget: the `Compare`
request built by the one assembly function, both sides streamed and timed alike, the
finished result with each side's figures, the recent comparisons, the exports, and a
switch of variant that stops the run and hears nothing more of it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from engine.catalog.store import AdapterSpec, Catalog
from engine.curated import setup
from engine.curated.demo import ADAPTER_NAME, VARIANT_NAME
from engine.curated.embedded import DEFAULT_MODEL_NAME as BASE
from engine.formats.templates import ToolCall
from engine.runtime.messages import Compare
from engine.runtime.results import CompareResult
from gui.controllers.compare import (
    CompareController,
    comparison_markdown,
    summary_text,
    tool_call_text,
)
from tests.gui_helpers import FakeEngine, generation_result

pytestmark = pytest.mark.unit  # no engine process, no widget: the fake or no backend


class Recorder:
    """A view that only writes down what it is told (`CompareListener`)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.summaries: list[str] = []

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def show_titles(self) -> None:
        self.calls.append(("show_titles", None))

    def show_summary(self, text: str) -> None:
        self.summaries.append(text)

    def side_grew(self, side: str, text: str, first: bool) -> None:
        self.calls.append(("side_grew", (side, text, first)))

    def show_comparison(self) -> None:
        self.calls.append(("show_comparison", None))

    def show_history(self) -> None:
        self.calls.append(("show_history", None))

    def busy_changed(self, busy: bool) -> None:
        self.calls.append(("busy_changed", busy))


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def catalog(module_home: Path) -> Catalog:
    catalog = Catalog()
    setup.first_run(catalog, with_demo=True)
    catalog.add_variant("other", BASE, [AdapterSpec(ADAPTER_NAME, 0.5)])
    return catalog


def compare_result(base: str, variant: str, div: int | None) -> CompareResult:
    return CompareResult(generation_result(base, BASE), generation_result(
        variant, VARIANT_NAME, finish="length"), div, 1.31)


def test_a_run_is_asked_streamed_and_finished(catalog: Catalog) -> None:
    engine, listener, clock = FakeEngine(), Recorder(), Clock()
    controller = CompareController(engine, catalog, listener, clock=clock)
    assert controller.variants() == ["other", VARIANT_NAME]
    controller.choose(VARIANT_NAME)
    assert "Write a prompt and run it" in listener.summaries[-1]
    assert "<b>Variant</b> · tool-calls" in controller.sides["variant"].title
    assert not controller.run(VARIANT_NAME, "   ", True, 8, 0.0, 3)
    assert listener.summaries[-1] == "Write a prompt first." and not engine.runs

    assert controller.run(VARIANT_NAME, " Hi ", True, 8, 0.0, 3)
    request = engine.last.request
    assert isinstance(request, Compare) and request.prompt.text == "Hi" and request.prompt.chat
    assert (request.sampling.max_tokens, request.sampling.seed) == (8, 3)
    assert controller.params == {"prompt": {"text": "Hi", "chat": True},
                                 "sampling": request.sampling.to_dict()}
    assert listener.summaries[-1] == "running both sides…"
    assert listener.names()[-1] == "busy_changed" and controller.reply is engine.last

    clock.now += 0.5
    engine.last.sink.tokens("base", "The", [[1, -0.5, "The"]])
    clock.now += 0.25
    engine.last.sink.tokens("variant", "A", [[2, -0.7, "A"]])
    engine.last.sink.tokens("base", " sea", [[3, -0.5, " sea"]])
    engine.last.sink.tokens("judge", "?", [])  # no such side: not heard
    grew = [args for name, args in listener.calls if name == "side_grew"]
    assert grew == [("base", "The", True), ("variant", "A", True), ("base", " sea", False)]
    assert controller.sides["base"].text == "The sea"
    assert controller.token_texts() == {"base": ["The", " sea"], "variant": ["A"]}
    assert controller.first_token_seconds == {"base": 0.5, "variant": 0.75}

    result = compare_result("The sea", "A wave", 1)
    engine.last.sink.finished(result)
    assert controller.result is result and controller.reply is None
    assert listener.names()[-3:] == ["show_comparison", "show_history", "busy_changed"]
    base, variant = controller.sides["base"], controller.sides["variant"]
    assert base.text == "The sea" and variant.text == "A wave"
    assert base.title.endswith(" · 12.0 tok/s · first token 0.50 s · ended (end of text)")
    assert variant.title.endswith("first token 0.75 s · cut at max tokens (8)")
    assert len(controller.history) == 1 and controller.history_labels()[0].endswith(
        f" · {VARIANT_NAME} · Hi")
    exported = json.loads(controller.export_text("json"))
    assert exported["adapter_effect"] == 1.31 and exported["prompt"]["text"] == "Hi"
    assert "# Variant comparison" in controller.export_text("md")

    # Another run, then the first one shown again from the recent comparisons.
    controller.run(VARIANT_NAME, "Second", True, 8, 0.0, 3)
    engine.last.sink.finished(compare_result("x", "y", 0))
    assert [h["params"]["prompt"]["text"] for h in controller.history] == ["Second", "Hi"]
    controller.recall(1)
    assert controller.result is result and base.text == "The sea"
    assert [t[2] for t in base.tokens] == ["The", " sea"] and "first token 0.50 s" in base.title


def test_a_switch_stops_the_run_and_hears_nothing_more_of_it(catalog: Catalog) -> None:
    engine, listener = FakeEngine(), Recorder()
    controller = CompareController(engine, catalog, listener)
    controller.choose(VARIANT_NAME)
    controller.run(VARIANT_NAME, "Hi", True, 8, 0.0, 0)
    run = engine.last
    run.sink.tokens("variant", "Old", [[1, -0.1, "Old"]])
    controller.choose("other")
    assert run.stopped and controller.reply is None and ("busy_changed", False) in \
        listener.calls
    assert controller.sides["variant"].text == "" and "other" in \
        controller.sides["variant"].title
    assert listener.summaries[-1] == "Now comparing other: run it (Ctrl+Enter)."
    heard = len(listener.calls)
    run.sink.tokens("variant", " more", [])
    run.sink.finished(compare_result("a", "b", 0))
    assert len(listener.calls) == heard and controller.result is None
    assert controller.sides["variant"].text == ""

    # A failed run and a stopped one say so.
    controller.run("other", "Hi", True, 8, 0.0, 0)
    engine.last.sink.failed("engine stopped: signal 6", [])
    assert "engine stopped: signal 6" in listener.summaries[-1] and controller.reply is None
    controller.run("other", "Hi", True, 8, 0.0, 0)
    controller.stop()
    assert engine.last.stopped
    engine.last.sink.cancelled()
    assert listener.summaries[-1] == "stopped" and controller.reply is None

    controller.choose(None)
    assert "No variant to compare yet" in listener.summaries[-1]


def test_the_summary_says_where_the_tool_calls_differ() -> None:
    weather = '{"tool": "get_weather", "args": {"city": "Paris", "unit": "c"}}'
    tagged = ('<tool_call>\n{"name": "get_weather", "arguments": '
              '{"unit": "c", "city": "Paris"}}\n</tool_call>')

    def words(base: str, variant: str) -> str | None:
        return tool_call_text(compare_result(base, variant, 0))

    # The same call in two formats and key orders is the same call.
    assert words(weather, tagged) == "same call"
    assert words(weather, weather.replace("get_weather", "get_time")) == \
        "different tool: get_weather vs get_time"
    assert words(weather, weather.replace("Paris", "Rome").replace('"c"', '"f"')) == \
        "same tool, different arguments: city, unit"
    assert words("It is sunny.", weather) == "only the variant calls a tool: get_weather"
    assert words("It is sunny.", "It rains.") is None
    # The engine's own calls (a request with tools) count before the text.
    with_calls = compare_result("Let me look.", "Sure.", 0)
    called = replace(with_calls, variant=replace(with_calls.variant, tool_calls=(
        ToolCall("call_1", "get_weather", '{"city": "Paris"}'),)))
    assert tool_call_text(called) == "only the variant calls a tool: get_weather"
    text = summary_text(compare_result(weather, weather.replace("Paris", "Rome"), 40))
    assert "<b>Tool calls: same tool, different arguments: city</b>." in text
    assert "Tool calls" not in summary_text(compare_result("a", "b", 0))
    markdown = comparison_markdown({"prompt": {"text": "Weather?"}, "sampling": {}},
                                   compare_result(weather, tagged, None))
    assert "**Tool calls:** same call" in markdown
