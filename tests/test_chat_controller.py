"""The chat's controller on its own, with no engine and no widget: requests built by
the one assembly function (the chat's own system prompt and sampling on top of the
profile), the answer streamed, recorded and saved, a request the user moved away from
not heard, regenerate with a new seed keeping the versions, edit and resend as a
branch, and an answer that cannot be asked for. That the controllers and the renderer
import no Qt is checked with the engine's modules (scripts/check_layering.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from engine.catalog.store import AdapterSpec, Catalog
from engine.curated import setup
from engine.curated.demo import ADAPTER_NAME, VARIANT_NAME
from engine.curated.embedded import DEFAULT_MODEL_NAME as BASE
from engine.formats.templates import Message, ToolCall
from engine.runtime.messages import Generate
from engine.state import conversations, paths
from gui.controllers.chat import ChatController
from gui.render import transcript_html
from tests.gui_helpers import FakeEngine, generation_result

pytestmark = pytest.mark.unit  # no engine process, no widget: the fake or no backend

WARM = {"temperature": 0.9, "max_tokens": 6, "repeat_penalty": 1.0, "seed": 5}
ROOT = Path(__file__).resolve().parents[1]


class Recorder:
    """A view that only writes down what it is told (`ChatListener`)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.streamed: list[str] = []
        self.statuses: list[str] = []

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def model_changed(self) -> None:
        self.calls.append(("model_changed", None))

    def conversation_opened(self) -> None:
        self.calls.append(("conversation_opened", None))

    def show_conversation(self) -> None:
        self.calls.append(("show_conversation", None))

    def show_list(self) -> None:
        self.calls.append(("show_list", None))

    def show_settings(self) -> None:
        self.calls.append(("show_settings", None))

    def show_status(self, text: str) -> None:
        self.statuses.append(text)

    def busy_changed(self, busy: bool) -> None:
        self.calls.append(("busy_changed", busy))

    def stream_started(self) -> None:
        self.calls.append(("stream_started", None))

    def stream_grew(self, text: str) -> None:
        self.streamed.append(text)

    def answer_finished(self) -> None:
        self.calls.append(("answer_finished", None))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def catalog(module_home: Path) -> Catalog:
    catalog = Catalog()
    setup.first_run(catalog, with_demo=True)
    catalog.add_variant("warm", BASE, [AdapterSpec(ADAPTER_NAME, 0.5)], WARM)
    return catalog


@pytest.fixture
def parts(catalog: Catalog) -> tuple[ChatController, FakeEngine, Recorder, Clock]:
    """A controller over the module's catalog, with no conversation kept from before."""
    shutil.rmtree(paths.conversations_dir(), ignore_errors=True)
    engine, listener, clock = FakeEngine(), Recorder(), Clock()
    seeds = iter(range(1000, 2000))
    controller = ChatController(engine, catalog, listener, clock=clock,
                                new_seed=lambda: next(seeds))
    return controller, engine, listener, clock


def test_an_answer_is_asked_streamed_recorded_and_saved(parts) -> None:  # noqa: ANN001
    controller, engine, listener, clock = parts
    controller.set_model(VARIANT_NAME)
    assert controller.conversation is not None and controller.conversation.messages == ()
    assert controller.header()[1] and "identity" in controller.header()[0]
    assert controller.send("  Weather in Paris?  ")
    request = engine.last.request
    assert isinstance(request, Generate)
    assert request.prompt.messages == (Message("user", "Weather in Paris?"),)
    assert request.prompt.system is None  # the profile's, in the spec
    assert request.sampling.seed == 0 and request.spec.identity == controller.spec().identity
    assert controller.reply is engine.last and ("busy_changed", True) in listener.calls
    # Drawn once it runs; saved once it was asked (the list shows the new title).
    assert listener.names()[-4:] == ["show_conversation", "stream_started", "busy_changed",
                                     "show_list"]
    assert not controller.send("again")  # one answer at a time

    clock.now += 0.25
    engine.last.sink.tokens("main", '{"tool": ', [[1, -0.1, '{"tool": ', []]])
    clock.now += 1.0
    engine.last.sink.tokens("main", '"get_weather"}', [])
    assert listener.streamed == ['{"tool": ', '"get_weather"}']
    assert controller.stream_text == '{"tool": "get_weather"}'
    assert controller.first_token_seconds == pytest.approx(0.25)
    assert listener.statuses[-1] == "generating… 23 chars, 1.2 s"

    text = '{"tool": "get_weather"}'
    engine.last.sink.finished(generation_result(text, VARIANT_NAME))
    user, answer = controller.conversation.messages
    assert (user.content, answer.content, answer.model) == \
        ("Weather in Paris?", text, VARIANT_NAME)
    assert (answer.identity, answer.backend, answer.seed, answer.error) == \
        ("f" * 64, "llama", 0, None)
    assert controller.reply is None and listener.names()[-1] == "answer_finished"
    assert ("busy_changed", False) in listener.calls
    assert "12.0 tok/s" in listener.statuses[-1] and "first token 0.25 s" in \
        listener.statuses[-1]
    assert conversations.load(controller.conversation.id) == controller.conversation
    assert controller.footer().startswith("last answer: " + VARIANT_NAME)
    assert controller.last_answer_text() == text
    assert [c.id for c in controller.listed] == [controller.conversation.id]
    assert controller.conversation.title == "Weather in Paris?"


def test_moving_away_stops_the_answer_and_keeps_what_came(parts) -> None:  # noqa: ANN001
    controller, engine, listener, _clock = parts
    controller.set_model(VARIANT_NAME)
    controller.send("Tell me a story.")
    asked = controller.conversation.id
    run = engine.last
    run.sink.tokens("main", "Once", [])
    controller.set_model(BASE)
    assert run.stopped and controller.reply is None and controller.model_name == BASE
    kept = conversations.load(asked)
    assert [m.content for m in kept.messages] == ["Tell me a story.", "Once"]
    assert kept.messages[-1].error == "stopped"
    # What the stopped request still delivers is not heard, here or in the other chat.
    heard = len(listener.calls), list(listener.streamed)
    run.sink.tokens("main", " upon", [])
    run.sink.cancelled()
    assert (len(listener.calls), listener.streamed) == heard
    assert conversations.load(asked) == kept and controller.conversation.messages == ()

    # A failure keeps what came, with the reason; the conversation can go on.
    controller.send("Hello?")
    engine.last.sink.tokens("main", "Hi", [])
    engine.last.sink.failed("engine stopped: signal 6", [])
    assert controller.conversation.messages[-1].content == "Hi"
    assert controller.conversation.messages[-1].error == "engine stopped: signal 6"
    assert listener.statuses[-1] == "failed"
    controller.send("And now?")
    # The failed answer is not part of what the next one is asked from.
    assert [m.content for m in engine.last.request.prompt.messages] == ["Hello?", "And now?"]
    controller.stop()
    assert engine.last.stopped and controller.reply is not None  # until it is confirmed
    engine.last.sink.cancelled()
    assert controller.conversation.messages[-1].error == "stopped"


def test_a_stopped_answer_keeps_its_speed_and_the_actions_follow_the_state(
        parts) -> None:  # noqa: ANN001
    controller, engine, listener, clock = parts
    controller.set_model(VARIANT_NAME)
    # A new chat is not a chat of the list yet: nothing to rename, delete or copy.
    can = controller.actions()
    assert can.send and can.compose and not can.stop
    assert not (can.rename or can.delete or can.copy or can.regenerate or can.export)
    controller.send("Tell me a story.")
    can = controller.actions()
    assert can.stop and not (can.send or can.copy or can.rename or can.delete)
    clock.now += 0.5
    engine.last.sink.tokens("main", "Once", [[1, -0.1, "Once", []]])
    clock.now += 2.0  # four more tokens in the 2 s after the first
    engine.last.sink.tokens("main", " upon a time", [[i, -0.1, "x", []] for i in range(2, 6)])
    controller.stop()
    engine.last.sink.cancelled()
    stopped = controller.conversation.messages[-1]
    assert stopped.error == "stopped" and stopped.tokens_per_second == pytest.approx(2.0)
    assert listener.statuses[-1] == "stopped · 2.0 tok/s · 5 tokens · first token 0.50 s"
    assert conversations.load(controller.conversation.id).messages[-1] == stopped
    can = controller.actions()
    assert can.copy and can.rename and can.delete and can.regenerate and not can.stop
    # While the next answer runs, the earlier one is not offered for copying.
    controller.send("Go on.")
    assert not controller.actions().copy
    engine.last.sink.finished(generation_result("The end.", VARIANT_NAME))
    assert controller.actions().copy
    # Moving away keeps the speed too; a single delivery is too little to tell.
    controller.send("Again?")
    clock.now += 1.0
    engine.last.sink.tokens("main", "Yes", [[1, -0.1, "Yes", []]])
    clock.now += 0.5
    engine.last.sink.tokens("main", " and no", [[2, -0.1, " and", []], [3, -0.1, " no", []]])
    asked = controller.conversation.id
    controller.set_model(BASE)
    kept = conversations.load(asked).messages[-1]
    assert kept.error == "stopped" and kept.tokens_per_second == pytest.approx(4.0)
    controller.send("Hi")
    engine.last.sink.tokens("main", "Hello", [[1, -0.1, "Hello", []]])
    controller.stop()
    engine.last.sink.cancelled()
    assert controller.conversation.messages[-1].tokens_per_second is None
    assert listener.statuses[-1] == "stopped · 1 token · first token 0.00 s"
    # Deleted: the chat on show is a new one, which cannot be deleted or renamed.
    controller.delete()
    can = controller.actions()
    assert not controller.has_chat() and not can.delete and not can.rename


def test_regenerate_and_edit_keep_versions(parts) -> None:  # noqa: ANN001
    controller, engine, _listener, _clock = parts
    controller.set_model("warm")
    controller.send("Name a colour.")
    engine.last.sink.finished(generation_result("Red.", "warm"))
    assert controller.regenerate()
    assert engine.last.request.sampling.seed == 1000  # a new seed: the sampling is warm
    assert [m.content for m in engine.last.request.prompt.messages] == ["Name a colour."]
    engine.last.sink.finished(generation_result("Blue.", "warm"))
    answer = controller.conversation.messages[1]
    assert (answer.content, answer.seed, answer.version, answer.versions()) == \
        ("Blue.", 1000, 1, 2)
    controller.switch_version(1, -1)
    assert controller.conversation.messages[1].content == "Red."
    assert conversations.load(controller.conversation.id).messages[1].content == "Red."

    # Edit the question and send it again: a branch; the old path is another version.
    assert not controller.start_editing(1)  # an answer is not edited
    assert controller.start_editing(0) and controller.editing == 0
    controller.send("Name a fruit.")
    assert controller.editing is None
    assert [m.content for m in engine.last.request.prompt.messages] == ["Name a fruit."]
    engine.last.sink.finished(generation_result("Apple.", "warm"))
    first = controller.conversation.messages[0]
    assert [m.content for m in controller.conversation.messages] == ["Name a fruit.", "Apple."]
    assert (first.version, first.versions()) == (1, 2)
    controller.switch_version(0, -1)
    assert [m.content for m in controller.conversation.messages] == ["Name a colour.", "Red."]

    # Greedy: a new seed would change nothing, so the profile's stays.
    controller.set_model(VARIANT_NAME)
    controller.send("Weather?")
    engine.last.sink.finished(generation_result("{}", VARIANT_NAME))
    controller.regenerate()
    assert engine.last.request.sampling.seed == 0


def test_the_chats_own_settings_go_with_its_requests(parts) -> None:  # noqa: ANN001
    controller, engine, listener, _clock = parts
    controller.set_model(VARIANT_NAME)
    shown = controller.settings()
    assert shown is not None and not shown.custom
    assert shown.system == shown.profile_system and "JSON tool call" in shown.system
    assert (shown.temperature, shown.max_tokens, shown.seed) == (0.0, 64, 0)
    controller.edit_settings("Answer in French.", 0.0, 0.95, 3, 0)
    assert controller.conversation.sampling == {"max_tokens": 3}  # only what differs
    assert controller.custom_settings() and controller.settings().system == \
        "Answer in French."
    controller.send("Hello")
    request = engine.last.request
    assert request.prompt.system == "Answer in French." and request.sampling.max_tokens == 3
    engine.last.sink.finished(generation_result("Bonjour", VARIANT_NAME))
    saved = conversations.load(controller.conversation.id)
    assert saved.system_prompt == "Answer in French." and saved.sampling == {"max_tokens": 3}
    controller.reset_settings()
    assert not controller.custom_settings() and listener.names()[-1] == "show_settings"

    # A setting no request can take: the answer says why, nothing is started.
    started = len(engine.runs)
    controller.edit_settings("Answer in French.", 0.0, 0.95, 3, 0)
    controller.conversation = controller.conversation.with_settings(None, {"top_p": 7.0})
    controller.send("Again")
    assert len(engine.runs) == started and controller.reply is None
    failed = controller.conversation.messages[-1]
    assert failed.role == "assistant" and failed.content == "" and failed.error


def test_conversations_are_listed_renamed_exported_and_deleted(
        parts, tmp_path: Path) -> None:  # noqa: ANN001
    controller, engine, _listener, _clock = parts
    controller.set_model(VARIANT_NAME)
    controller.send("First chat")
    engine.last.sink.finished(generation_result("ok", VARIANT_NAME))
    first = controller.conversation.id
    controller.new_chat()
    controller.send("Second chat about the sea")
    engine.last.sink.finished(generation_result("waves", VARIANT_NAME))
    assert [c.title for c in controller.listed] == ["Second chat about the sea", "First chat"]
    assert [c.id for c in controller.matching("sea")] == [controller.conversation.id]
    controller.rename(first, "  Renamed   one ")
    assert conversations.load(first).title == "Renamed one"
    controller.pick(first)
    assert controller.conversation.id == first
    path = controller.export(str(tmp_path / "chat.md"))
    assert Path(path).read_text(encoding="utf-8").startswith("# Renamed one\n")
    controller.delete()
    assert conversations.load(first) is None
    assert controller.conversation is not None and controller.conversation.id != first
    assert [c.title for c in controller.listed] == ["Second chat about the sea"]
    # A replay record gets back the messages it was asked from.
    assert controller.replay_record(1) is None  # none was recorded by the fake engine


TOOLS_JSON = json.dumps([
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city now.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}},
    {"name": "get_time"}])  # a bare function object is read too


def test_tools_go_with_the_requests_and_tool_results_continue_the_chat(
        parts) -> None:  # noqa: ANN001
    controller, engine, listener, clock = parts
    controller.set_model(BASE)
    # Refused with the reason, changing nothing.
    assert controller.set_tools("[not json").startswith("the tools are not JSON")
    assert "tool 1: needs a function with a name" in controller.set_tools('[{"x": 1}]')
    assert "not one of the tools" in controller.set_tools(TOOLS_JSON, "get_date")
    assert "cannot be compiled" in controller.set_tools(json.dumps([{"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=x)a"}}}}]))
    assert controller.conversation.tools is None
    assert controller.set_tools(TOOLS_JSON, "required") is None
    assert json.loads(controller.tools_text())[1] == {
        "type": "function", "function": {"name": "get_time", "description": "",
                                         "parameters": {"type": "object", "properties": {}}}}

    assert controller.send("Weather in Paris, and the time?")
    asked = engine.last.request
    assert [t.name for t in asked.prompt.tools] == ["get_weather", "get_time"]
    assert asked.constraint.tool_choice == "required"
    # While the calls stream, the engine sends their names (their JSON is no content):
    # the status says which tools it is calling.
    clock.now += 1.0
    engine.last.sink.tokens("main", "", [[1, -0.1, "<tool_call>", []],
                                         [2, -0.1, '{"name": "get_weather"', ["get_weather"]]])
    assert controller.stream_text == ""
    assert listener.statuses[-1] == "generating… calling get_weather… 0 chars, 1.0 s"
    engine.last.sink.finished(generation_result(
        "<tool_call>…</tool_call>", BASE, content="", tool_calls=[
            {"id": "call_a", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"id": "call_b", "name": "get_time", "arguments": "{}"}]))
    answer = controller.conversation.messages[-1]
    assert answer.content == "" and [c.name for c in answer.tool_calls] == [
        "get_weather", "get_time"]
    assert [c.id for c in controller.pending_calls()] == ["call_a", "call_b"]
    page = transcript_html(controller.conversation.messages, busy=False)
    assert page.html.count("toolresult:") == 2 and "get_weather" in page.html
    assert '{\n  "city": "Paris"\n}' in page.code  # formatted, highlighted, copyable
    assert '"call_a"' in controller.message_text(1)  # Copy gives the calls

    # One result: saved, and the model waits for the other call's.
    assert controller.start_tool_reply("call_x") is None
    assert controller.start_tool_reply("call_a").name == "get_weather"
    assert controller.send("18 °C, sunny")
    assert len(engine.runs) == 1 and [c.id for c in controller.pending_calls()] == ["call_b"]
    page = transcript_html(controller.conversation.messages, busy=False)
    assert page.html.count("toolresult:") == 1 and "Result of <code>get_weather" in page.html
    controller.start_tool_reply("call_b")
    assert controller.send('{"time": "12:00"}')
    # Both answered: the model goes on from the calls and their results.
    went_on = engine.last.request
    assert len(engine.runs) == 2 and controller.reply is not None
    user, called, weather, time_result = went_on.prompt.messages
    assert called.tool_calls == (ToolCall("call_a", "get_weather", '{"city": "Paris"}'),
                                 ToolCall("call_b", "get_time", "{}"))
    assert (weather.role, weather.tool_call_id, weather.name, weather.content) == (
        "tool", "call_a", "get_weather", "18 °C, sunny")
    assert (time_result.tool_call_id, time_result.name) == ("call_b", "get_time")
    engine.last.sink.finished(generation_result("Sunny, 18 °C; it is noon.", BASE))
    assert controller.pending_calls() == []

    # Kept across a restart: the tools, the choice, the calls and the results.
    kept = conversations.load(controller.conversation.id)
    assert kept == controller.conversation
    assert kept.tool_choice == "required" and len(kept.tools) == 2
    assert [m.role for m in kept.messages] == ["user", "assistant", "tool", "tool",
                                               "assistant"]
    assert "Calls `get_weather` (`call_a`)" in kept.to_markdown()
    # The tools removed: the next answer is asked without them, and without constraint.
    assert controller.set_tools("") is None and controller.conversation.tools is None
    controller.send("Thanks")
    assert engine.last.request.prompt.tools is None and engine.last.request.constraint is None
