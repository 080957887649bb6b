"""A theme switched live leaves nothing in the previous theme's colours (the chat's
header, the banner's buttons, links and code in every text), and what the window holds
is still there after a restart (a new window over the same data directory) or a switch:
recent comparisons and the Compare panes, the Server panel's request log, the welcome
banner until it is dismissed (or a comparison was made), and a new variant's offer of
the system prompt its adapter was trained with."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from PySide6.QtGui import QColor, QPalette, QTextDocument
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication

from engine.catalog.store import AdapterSpec
from engine.curated import demo
from engine.curated.demo import ADAPTER_NAME, VARIANT_NAME
from engine.curated.embedded import DEFAULT_MODEL_NAME as BASE
from engine.runtime import assembly
from engine.runtime.results import CompareResult
from engine.serve.app import LogEntry
from engine.state import conversations, recent
from engine.state.conversations import ChatMessage
from gui import theme
from gui.main_window import MainWindow
from tests.gui_helpers import SHORT
from tests.test_gui_compare import fragments, show, side


def anchor_colors(document: QTextDocument) -> set[str]:
    """The colours of the document's links."""
    found = set()
    block = document.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            style = it.fragment().charFormat()
            if style.isAnchor() and style.anchorHref():
                found.add(style.foreground().color().name())
            it += 1
        block = block.next()
    return found


def color_of(document: QTextDocument, text: str) -> str:
    return document.find(text).charFormat().foreground().color().name()


def switch(app: QApplication, name: str) -> None:
    """Settings → Theme: applied, and the palette change delivered (Qt posts it)."""
    theme.apply(app, name)
    QTest.qWait(50)


@pytest.fixture
def themed() -> Iterator[QApplication]:
    app = QApplication.instance()
    yield app
    theme.apply(app, "system")


def test_a_live_theme_switch_leaves_no_colour_of_the_previous_theme(
        window: MainWindow, themed: QApplication) -> None:
    app = themed
    switch(app, "dark")
    window.open_chat(VARIANT_NAME)
    answer = "Code:\n\n```python\nprint('a')\n```\n\nDone."
    conversation = conversations.new(VARIANT_NAME).with_messages((
        ChatMessage("user", "code?"),
        ChatMessage("assistant", answer, model=VARIANT_NAME, identity="f" * 64)))
    conversations.save(conversation)
    window.chat.open_conversation(conversation)
    window.banner.show_message("<b>Welcome</b>", kind="info")
    window.select(VARIANT_NAME)
    transcript = window.chat.transcript.document()
    details = window.detail.browser.document()
    dark_link = theme.dark_palette().color(QPalette.ColorRole.Link).name()
    assert anchor_colors(transcript) == {dark_link} and anchor_colors(details) == {dark_link}
    dark_code = color_of(transcript, "print")
    code = ["Code:\n\n", "```python\n", "print('a')\n", "```\n"]
    show(window.compare, code, ["Code:\n\n", "```python\n", "print('b')\n", "```\n"], 2)
    marked = fragments(window.compare.base_side.browser)
    assert color_of(window.compare.base_side.browser.document(), "print") == dark_code

    switch(app, "light")
    light = app.palette()
    header = window.chat.header
    # The header (a label with a style sheet) is drawn in the light theme's text colour.
    assert header.palette().color(header.foregroundRole()) == \
        light.color(QPalette.ColorRole.WindowText)
    assert QColor(header.palette().color(header.foregroundRole())).lightness() < 100
    # The banner's buttons follow the theme (its own strip keeps its colours).
    for button in (window.banner.dismiss, window.banner.retry):
        assert button.palette().color(QPalette.ColorRole.Button) == \
            light.color(QPalette.ColorRole.Button)
        assert button.palette().color(QPalette.ColorRole.ButtonText) == \
            light.color(QPalette.ColorRole.ButtonText)
    # Links in the light theme's colour, in the chat and in the details alike.
    light_link = light.color(QPalette.ColorRole.Link).name()
    assert light_link != dark_link
    assert anchor_colors(transcript) == {light_link}
    assert anchor_colors(details) == {light_link}
    # The chat's code is highlighted for the light theme.
    assert color_of(window.chat.transcript.document(), "print") != dark_code
    # So are both sides of the comparison, their marks kept.
    compared = window.compare.base_side.browser.document()
    assert color_of(compared, "print") == color_of(window.chat.transcript.document(), "print")
    assert fragments(window.compare.base_side.browser) == marked

    # And back: the dark theme's colours again.
    switch(app, "dark")
    assert header.palette().color(header.foregroundRole()) == \
        theme.dark_palette().color(QPalette.ColorRole.WindowText)
    assert window.banner.dismiss.palette().color(QPalette.ColorRole.Button) == \
        theme.dark_palette().color(QPalette.ColorRole.Button)
    assert anchor_colors(window.chat.transcript.document()) == {dark_link}
    assert color_of(window.chat.transcript.document(), "print") == dark_code


def restart(window: MainWindow, qtbot) -> MainWindow:  # noqa: ANN001
    """Quit (as the user does: the window closes) and start again on the same data."""
    window.close()
    again = MainWindow()
    qtbot.addWidget(again)
    again.show()
    return again


def compared(window: MainWindow, base: list[str], variant: list[str], div: int,
             prompt: str) -> CompareResult:
    """A finished comparison of the demo variant as the engine reports it (its identity
    the variant's own), shown by the window's Compare view."""
    view = window.compare
    identity = assembly.spec(window.catalog, VARIANT_NAME).identity.key
    variant_side = {**side(variant, VARIANT_NAME), "identity": identity,
                    "identity_short": identity[:12]}
    result = CompareResult.from_dict({"base": side(base, BASE), "variant": variant_side,
                                      "first_divergence": div, "adapter_effect": 1.1})
    view.params = {"prompt": {"text": prompt, "chat": True},
                   "sampling": {"max_tokens": 8, "temperature": 0.0, "stop": []}}
    view.base_side.tokens = [[i, -0.5, t] for i, t in enumerate(base)]
    view.variant_side.tokens = [[i, -0.5, t] for i, t in enumerate(variant)]
    view.show_result(result)
    return result


def test_comparisons_are_kept_across_a_switch_a_new_variant_and_a_restart(
        window: MainWindow, qtbot) -> None:
    window.open_compare(VARIANT_NAME)
    view = window.compare
    result = compared(window, ["The", " sea"], ["The", " wave"], 1, "Sea?")
    # Every tab and back: the panes still show it.
    for action in (*window.tab_actions[:6], window.tab_actions[2]):
        action.trigger()
        assert view.variant_side.text == "The wave" and view.result is result
    # A new variant is selected (as composing or importing one does): the view compares
    # it; the demo variant chosen again shows its comparison again, marked.
    window.catalog.add_variant("other", BASE, [AdapterSpec(ADAPTER_NAME, 0.5)])
    window.events.changed(["variant"], ["other"])
    window.select("other")
    assert view.variant.currentText() == "other" and view.result is None
    assert view.variant_side.text == ""
    window.select(VARIANT_NAME)
    assert view.result is result and view.variant_side.text == "The wave"
    assert fragments(view.variant_side.browser)["token"] == "wave"
    assert "<b>Adapter effect: large</b>" in view.summary.text()

    again = restart(window, qtbot)
    view = again.compare
    assert view.recent.count() == 1 and view.recent.itemText(0).endswith(
        f" · {VARIANT_NAME} · Sea?")
    # The demo variant is selected again: its comparison is on show, as it was.
    assert again.library.current() == ("variant", VARIANT_NAME)
    assert view.result is not None and view.result.to_dict() == result.to_dict()
    assert view.variant_side.text == "The wave" and view.base_side.text == "The sea"
    assert fragments(view.base_side.browser)["token"] == "sea"
    assert view.params["prompt"]["text"] == "Sea?"
    view.recent.activated.emit(0)
    assert view.result.to_dict() == result.to_dict()
    # A comparison was made: the welcome that leads to it is not shown any more.
    assert not again.banner.isVisible()
    # Bounded: the oldest go.
    kept = recent.comparisons()
    kept.extend([kept.load()[0]] * (recent.COMPARISONS + 5))
    assert len(kept.load()) == recent.COMPARISONS
    again.close()


def test_the_welcome_stays_until_it_is_dismissed(window: MainWindow, qtbot) -> None:
    assert window.first_run and window.banner.isVisible()
    again = restart(window, qtbot)  # not dismissed: shown at the next start too
    assert not again.first_run and again.banner.isVisible()
    assert "Welcome" in again.banner.label.text() and again.banner.topic == "welcome"
    again.banner.dismiss.click()
    assert not again.banner.isVisible()
    third = restart(again, qtbot)
    assert not third.banner.isVisible() and not third.welcome_due()
    third.close()


def test_the_request_log_is_kept_across_a_restart(window: MainWindow, qtbot) -> None:
    now = time.time()
    served = LogEntry(now, "/v1/chat/completions", VARIANT_NAME, "d0bae8f37620", 12, 5,
                      20.5, 200, 0.4)
    refused = LogEntry(now + 1, "/v1/chat/completions", "nope", "", 0, 0, 0.0, 404, 0.01,
                       reason="no model named 'nope'")
    window.server.add_log_row(served)
    window.server.add_log_row(refused)
    rows = window.server.log_rows()
    assert [r[1] for r in rows] == ["200 OK", "404 Not Found"]
    # Written a moment after they arrive, whether or not the window quits after.
    qtbot.waitUntil(lambda: len(recent.requests().load()) == 2, timeout=SHORT)

    again = restart(window, qtbot)
    assert again.server.log_rows() == rows
    item = again.server.log_model.item(1, 0)
    assert "no model named 'nope'" in item.toolTip()
    again.server.add_log_row(served)
    third = restart(again, qtbot)  # the row not written yet is written at quit
    assert third.server.log_rows() == [*rows, rows[0]]
    # Cleared: empty at the next start too.
    third.server.clear_log.click()
    fourth = restart(third, qtbot)
    assert fourth.server.log_rows() == []
    fourth.close()


def test_a_new_variant_is_offered_the_system_prompt_its_adapter_was_trained_with(
        window: MainWindow) -> None:
    dialog = window.compose(adapter=ADAPTER_NAME)
    try:
        assert dialog.system.toPlainText() == ""
        assert dialog.offer_row.isVisibleTo(dialog)
        assert dialog.offer.text().startswith(f"{ADAPTER_NAME} was trained with this "
                                              "system prompt: “Reply with one JSON")
        assert dialog.offer.toolTip() == demo.SYSTEM_PROMPT
        dialog.use_offer.click()
        assert dialog.system.toPlainText() == demo.SYSTEM_PROMPT
        assert not dialog.offer_row.isVisibleTo(dialog)  # taken: nothing left to offer
        dialog.system.setPlainText("Something else.")
        assert dialog.offer_row.isVisibleTo(dialog)
    finally:
        dialog.reject()
