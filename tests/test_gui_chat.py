"""The chat a person would keep open, offscreen, on the real engine: the streaming
answer in a block of its own, regenerate with a new seed (unless greedy) keeping the
versions, edit and resend as a branch, a per-chat system prompt and sampling saved with
the conversation, rename / search / export, a Copy link per code block, fresh footers,
and an empty chat that says what the variant is for; and, with a fake engine, the label
of an answer streaming a numbered list, and a JSON answer shown as code; a tool call (the
base model made to call one) shown as a card, its result written back, both kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PySide6.QtCore import QUrl
from PySide6.QtGui import QGuiApplication

from engine.catalog.store import AdapterSpec, Catalog
from engine.curated import setup
from engine.curated.demo import ADAPTER_NAME, VARIANT_NAME
from engine.curated.embedded import DEFAULT_MODEL_NAME as BASE
from engine.runtime.messages import Generate
from engine.state import conversations
from engine.state.conversations import ChatMessage
from gui.main_window import MainWindow
from tests.gui_helpers import LONG, SHORT, FakeEngine, generation_result

WARM = {"temperature": 0.9, "max_tokens": 6, "repeat_penalty": 1.0, "seed": 5}
GREEDY = {"temperature": 0.0, "max_tokens": 6, "repeat_penalty": 1.0, "seed": 5}


@pytest.fixture
def win(studio_home: Path, qtbot):
    catalog = Catalog()
    setup.first_run(catalog, with_demo=True)
    catalog.add_variant("warm", BASE, [AdapterSpec(ADAPTER_NAME, 0.5)], WARM)
    catalog.add_variant("cold", BASE, [AdapterSpec(ADAPTER_NAME, 0.5)], GREEDY)
    window = MainWindow()
    qtbot.addWidget(window)
    window.show()
    sent: list[Generate] = []
    submit = window.client.submit

    def recording(request):  # noqa: ANN001, ANN202
        if isinstance(request, Generate):
            sent.append(request)
        return submit(request)

    window.client.submit = recording
    window.sent = sent
    yield window
    window.close()


def answer(win: MainWindow, qtbot, action) -> ChatMessage:  # noqa: ANN001
    with qtbot.waitSignal(win.chat.answered, timeout=LONG):
        action()
    return win.chat.conversation.messages[-1]


def ask(win: MainWindow, qtbot, text: str) -> ChatMessage:
    win.chat.input.setPlainText(text)
    return answer(win, qtbot, win.chat.send)


def blocks(browser) -> list[str]:  # noqa: ANN001
    out, block = [], browser.document().begin()
    while block.isValid():
        out.append(block.text())
        block = block.next()
    return out


@pytest.mark.slow
def test_regenerate_streams_apart_gets_a_new_seed_and_keeps_versions(win: MainWindow,
                                                                     qtbot) -> None:
    chat = win.chat
    win.open_chat("warm")
    question = "Name a colour."
    seen: list[list[str]] = []

    def on_tokens(*_args) -> None:  # noqa: ANN002
        if not seen:
            seen.append(blocks(chat.transcript))

    chat.input.setPlainText(question)
    with qtbot.waitSignal(chat.answered, timeout=LONG):
        chat.send()
        chat.reply.tokens.connect(on_tokens)
    # While it streamed, the user's text was a block of its own, not glued to the
    # answer's header.
    assert seen and question in seen[0]
    assert any(b.startswith("warm") for b in seen[0])
    first = chat.conversation.messages[-1]
    assert first.seed == 5 and win.sent[-1].sampling.seed == 5

    second = answer(win, qtbot, chat.regenerate)
    third = answer(win, qtbot, chat.regenerate)
    seeds = [r.sampling.seed for r in win.sent]
    assert len(set(seeds)) == 3 and (second.seed, third.seed) == tuple(seeds[1:])
    assert [m.role for m in chat.conversation.messages] == ["user", "assistant"]
    assert (third.version, third.versions()) == (2, 3)
    assert "‹ 3/3 ›" in chat.transcript.toPlainText()
    chat.transcript.anchorClicked.emit(QUrl("prev:1"))
    chat.transcript.anchorClicked.emit(QUrl("prev:1"))
    shown = chat.conversation.messages[1]
    assert (shown.content, shown.seed) == (first.content, 5)
    assert "‹ 1/3 ›" in chat.transcript.toPlainText()
    # Kept with the conversation.
    assert conversations.load(chat.conversation.id).messages[1].versions() == 3

    # Greedy: the seed would change nothing, so it is the profile's.
    win.open_chat("cold")
    ask(win, qtbot, question)
    answer(win, qtbot, chat.regenerate)
    assert [r.sampling.seed for r in win.sent[-2:]] == [5, 5]
    # Another model's figures never stay in the footer.
    assert "cold" in chat.status.text()
    win.select(BASE)
    assert chat.model_name == BASE and chat.status.text() == ""


@pytest.mark.slow
def test_edit_branches_and_the_chat_keeps_its_own_settings(win: MainWindow, qtbot,
                                                           tmp_path: Path) -> None:
    chat = win.chat
    win.open_chat("cold")
    ask(win, qtbot, "Say hello.")
    ask(win, qtbot, "Say goodbye.")
    chat.transcript.anchorClicked.emit(QUrl("edit:0"))
    assert chat.input.toPlainText() == "Say hello." and chat.editing_label.isVisible()
    chat.input.setPlainText("Say hi.")
    answer(win, qtbot, chat.send)
    messages = chat.conversation.messages
    assert [m.content for m in messages if m.role == "user"] == ["Say hi."]
    assert (messages[0].version, messages[0].versions()) == (1, 2)
    assert [m.content for m in win.sent[-1].prompt.messages] == ["Say hi."]
    chat.switch_version(0, -1)
    assert [m.content for m in chat.conversation.messages if m.role == "user"] == \
        ["Say hello.", "Say goodbye."]

    # This chat's own settings: sent with the next answer, saved with the chat.
    chat.settings_toggle.click()
    chat.system_prompt.setPlainText("Answer in French.")
    chat.chat_max_tokens.setValue(3)
    conversation_id = chat.conversation.id
    ask(win, qtbot, "Say thanks.")
    request = win.sent[-1]
    assert request.prompt.system == "Answer in French." and request.sampling.max_tokens == 3
    assert len(chat.conversation.messages[-1].content) > 0
    saved = conversations.load(conversation_id)
    assert saved.system_prompt == "Answer in French." and saved.sampling == {"max_tokens": 3}
    assert chat.settings_toggle.text() == "Chat settings (custom)"

    # Rename, search, export.
    chat.rename_chat("Greetings")
    assert chat.list_model.item(0).text() == "Greetings"
    # The list view itself shows it (a reload must not hide rows from the view).
    assert chat.list.indexAt(chat.list.visualRect(chat.list_model.index(0, 0)).center()
                             ).data() == "Greetings"
    chat.search.setText("goodbye")
    assert [chat.list_model.item(r).text() for r in range(chat.list_model.rowCount())] == \
        ["Greetings"]
    chat.search.setText("no-such-words")
    assert chat.list_model.item(0).text() == "no matches"
    chat.search.setText("")
    md = Path(chat.export_chat(str(tmp_path / "chat.md"))).read_text(encoding="utf-8")
    assert md.startswith("# Greetings\n") and "## You\n\nSay thanks." in md
    data = json.loads(Path(chat.export_chat(str(tmp_path / "chat.json"))).read_text())
    assert data["id"] == conversation_id and data["system_prompt"] == "Answer in French."

    # After a restart: the same conversation, its settings shown again.
    win.close()
    again = MainWindow()
    qtbot.addWidget(again)
    again.show()
    again.open_chat("cold")
    qtbot.waitUntil(lambda: again.chat.conversation is not None, timeout=SHORT)
    again.chat.open_conversation(conversations.load(conversation_id))
    assert again.chat.system_prompt.toPlainText() == "Answer in French."
    assert again.chat.chat_max_tokens.value() == 3
    again.close()


def test_code_blocks_have_copy_links_and_an_empty_chat_says_what_it_is_for(
        window: MainWindow, qtbot) -> None:
    chat = window.chat
    window.open_chat(VARIANT_NAME)
    chat.new_chat()
    text = chat.transcript.toPlainText()
    assert "Its system prompt" in text and "Reply with one JSON tool call" in text
    assert "trained on train.jsonl" in text and "loss" in text

    reply = ("Two blocks:\n\n```python\nprint('a')\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
             "```\nplain text\n```")
    conversation = conversations.new(VARIANT_NAME).with_messages((
        ChatMessage("user", "code?"),
        ChatMessage("assistant", reply, model=VARIANT_NAME, identity="f" * 64)))
    conversations.save(conversation)
    chat.open_conversation(conversation)
    assert chat._code == ["print('a')", "plain text"]
    page = chat.transcript.toHtml()
    assert 'href="copy:0"' in page and 'href="copy:1"' in page and "<table" in page
    chat.transcript.anchorClicked.emit(QUrl("copy:1"))
    assert QGuiApplication.clipboard().text() == "plain text"
    # Highlighted: the keyword has a colour of its own.
    cursor = chat.transcript.document().find("print")
    assert cursor.charFormat().foreground().color().name() != \
        chat.transcript.document().find("Two").charFormat().foreground().color().name()


def test_a_streaming_list_keeps_the_label_and_a_json_answer_is_code(
        window: MainWindow) -> None:
    """With no engine (a fake one delivers the events): the speaker's label stays a label
    while an answer that starts a numbered list streams, each finished block is drawn
    once, and an answer that is one JSON value is shown as a formatted code block."""
    chat = window.chat
    window.open_chat(VARIANT_NAME)
    engine = FakeEngine()
    chat.controller.engine = engine
    chat.input.setPlainText("List two things.")
    chat.send()
    assert chat.reply is engine.last and chat.input.toPlainText() == ""
    document = chat.transcript.document()

    def label_block():  # noqa: ANN202
        block = document.begin()
        while block.isValid() and not block.text().startswith(VARIANT_NAME):
            block = block.next()
        return block

    for piece in ("1", ".", " First", "\n2. Sec", "ond\n", "\nDone", ".\n"):
        engine.last.sink.tokens("main", piece, [])
        label = label_block()
        assert label.isValid() and label.textList() is None, piece
    items = [(b.text(), b.textList().itemText(b)) for b in blocks_of(document)
             if b.textList() is not None]
    assert items == [("First", "1."), ("Second", "2.")]
    assert chat.transcript.toPlainText().count("Done.") == 1
    engine.last.sink.finished(generation_result("1. First\n2. Second\n\nDone.\n",
                                                VARIANT_NAME))
    assert chat.reply is None and label_block().textList() is None
    assert "12.0 tok/s" in label_block().text()

    call = '{"tool": "get_weather", "args": {"city": "Paris"}}'
    chat.input.setPlainText("Weather in Paris?")
    chat.send()
    engine.last.sink.tokens("main", call, [])
    engine.last.sink.finished(generation_result(call, VARIANT_NAME))
    pretty = json.dumps(json.loads(call), indent=2)
    assert chat._code[-1] == pretty
    cursor = document.find('"city": "Paris"')
    assert not cursor.isNull() and cursor.charFormat().fontFamilies() == ["monospace"]
    chat.transcript.anchorClicked.emit(QUrl(f"copy:{len(chat._code) - 1}"))
    assert QGuiApplication.clipboard().text() == pretty


def blocks_of(document):  # noqa: ANN001, ANN201
    block = document.begin()
    while block.isValid():
        yield block
        block = block.next()


CHAT_TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 40},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two integers",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"], "additionalProperties": False}}},
]


@pytest.mark.slow
def test_the_demo_variant_calls_the_demo_tools_in_the_chat(win: MainWindow, qtbot) -> None:
    """The Tools dialog offers the demo's tools; with them (tool choice auto), the demo
    variant's answer to a plain request is a card calling the right tool, and nothing of
    its JSON is left as text."""
    chat = win.chat
    win.open_chat(VARIANT_NAME)
    dialog = chat.open_tools()
    dialog.demo_button.click()
    assert dialog.apply() and chat.tools_button.text() == "Tools (5)…"
    called = ask(win, qtbot, "Do I need an umbrella in Zurich tomorrow?")
    assert win.sent[-1].constraint.tool_choice == "auto"
    assert called.error is None and called.content == ""
    [call] = called.tool_calls
    assert (call.name, json.loads(call.arguments)) == (
        "get_weather", {"city": "Zurich", "day": "tomorrow"})
    assert "Calls get_weather" in chat.transcript.toPlainText()


@pytest.mark.slow
def test_a_tool_call_is_a_card_and_its_result_continues_the_chat(win: MainWindow,
                                                                 qtbot) -> None:
    """The real base model, made to call a tool (tool choice "required", given in the
    Tools dialog): the call is a card with its arguments as highlighted JSON, the user's
    result goes back as a tool message, and both survive a restart."""
    chat = win.chat
    win.open_chat(BASE)
    chat.controller.edit_settings("", 0.0, 1.0, 80, 7)  # greedy, room for the call
    dialog = chat.open_tools()
    dialog.text.setPlainText("[not json")
    assert not dialog.apply() and "not JSON" in dialog.error.text()
    dialog.text.setPlainText(json.dumps(CHAT_TOOLS))
    dialog.choice.setCurrentText("required")
    assert dialog.apply() and chat.tools_button.text() == "Tools (2)…"

    called = ask(win, qtbot, "What is the weather in Paris right now?")
    assert win.sent[-1].constraint.tool_choice == "required"
    assert called.tool_calls and called.error is None
    call = called.tool_calls[0]
    arguments = json.loads(call.arguments)
    tool = {t["function"]["name"]: t["function"] for t in CHAT_TOOLS}[call.name]
    assert set(arguments) == set(tool["parameters"]["required"])
    # A card: the name, the arguments formatted as code (monospace), a reply link.
    text = chat.transcript.toPlainText()
    assert f"Calls {call.name}" in text and "Reply with result" in text
    pretty = json.dumps(arguments, indent=2, ensure_ascii=False)
    assert pretty in chat._code
    first_line = pretty.splitlines()[1].strip()
    cursor = chat.transcript.document().find(first_line)
    assert not cursor.isNull() and cursor.charFormat().fontFamilies() == ["monospace"]

    # The result, written in the composer after the card's link; the model goes on.
    for pending in called.tool_calls[1:]:  # parallel calls: the others answered first
        chat.controller.start_tool_reply(pending.id)
        assert chat.controller.send("{}") and chat.reply is None
    chat.transcript.anchorClicked.emit(QUrl(f"toolresult:{call.id}"))
    assert chat.editing_label.isVisible() and call.name in chat.editing_label.text()
    went_on = ask(win, qtbot, '{"temperature": 18, "sky": "sunny"}')
    result = win.sent[-1].prompt.messages[-1]
    assert (result.role, result.tool_call_id) == ("tool", call.id)
    assert (result.name, result.content) == (call.name, '{"temperature": 18, "sky": "sunny"}')
    assert went_on.role == "assistant" and went_on.error is None
    assert not chat.editing_label.isVisible()
    assert "Result of " + call.name in chat.transcript.toPlainText()

    # Kept: a restart reads the tools, the call and its result back.
    kept = conversations.load(chat.conversation.id)
    assert kept is not None and kept.tool_choice == "required" and len(kept.tools) == 2
    assert kept.messages[1].tool_calls == called.tool_calls
    assert any(m.role == "tool" and m.tool_call_id == call.id for m in kept.messages)
