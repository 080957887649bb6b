"""A theme switched live leaves nothing in the previous theme's colours: the chat's
header (a label with a style sheet), the banner's buttons, the links of the chat and the
details, and the code highlighted in the chat and in both sides of a comparison."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from PySide6.QtGui import QColor, QPalette, QTextDocument
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication

from engine.curated.demo import VARIANT_NAME
from engine.state import conversations
from engine.state.conversations import ChatMessage
from gui import theme
from gui.main_window import MainWindow
from tests.test_gui_compare import fragments, show


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
