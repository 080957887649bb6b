"""Light and dark palettes (Fusion style), or the platform's own, switched live.

A switch must leave nothing in the previous theme's colours. Two kinds of places keep
colours of their own: widgets with a style sheet (Qt works out their palette when they
are polished, and does not for a palette change alone) and rich text, whose links take
the palette's link colour when the HTML is parsed. `apply` sets the palette and then the
style, which polishes every widget again with the new palette, then parses rich-text
labels again and gives the links of every text document the new link colour. Views
whose HTML depends on the theme itself (code highlighting: the chat, Compare) draw it
again on the palette change they receive (`changeEvent`).
"""

from __future__ import annotations

# Qt from QtGui: `Qt.mightBeRichText` is a QtGui function.
from PySide6.QtGui import QColor, QPalette, Qt, QTextCharFormat, QTextCursor, QTextDocument
from PySide6.QtWidgets import QApplication, QLabel, QStyleFactory, QTextEdit, QWidget

_DEFAULT_PALETTE: list[QPalette] = []


def apply(app: QApplication, theme: str) -> None:
    if not _DEFAULT_PALETTE:
        _DEFAULT_PALETTE.append(app.palette())
    old_link = app.palette().color(QPalette.ColorRole.Link)
    style = QStyleFactory.create("Fusion")
    if theme == "dark":
        palette = dark_palette()
    elif theme == "light":
        palette = style.standardPalette()
    else:
        palette = _DEFAULT_PALETTE[0]
    # The palette first, then the style: setting the style polishes every widget again
    # with the palette as it is then. In the other order a widget with a style sheet
    # (the chat's header, the banner's buttons) kept the previous theme's colours.
    app.setPalette(palette)
    app.setStyle(style)
    new_link = palette.color(QPalette.ColorRole.Link)
    for widget in app.allWidgets():
        restyle_rich_text(widget, old_link, new_link)


def restyle_rich_text(widget: QWidget, old_link: QColor, new_link: QColor) -> None:
    """Rich text parsed under the previous palette, brought to the new one: a label's
    text is parsed again; in a text document, the links that have the previous link
    colour get the new one (a colour the HTML chose itself is left alone)."""
    if isinstance(widget, QLabel):
        text = widget.text()
        if widget.textFormat() != Qt.TextFormat.PlainText and Qt.mightBeRichText(text):
            widget.setText("")  # the same text again is not parsed again
            widget.setText(text)
    elif isinstance(widget, QTextEdit) and old_link != new_link:
        recolor_links(widget.document(), old_link, new_link)


def recolor_links(document: QTextDocument, old: QColor, new: QColor) -> None:
    spans = []  # found first, changed after: a change splits and merges fragments
    block = document.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            style = fragment.charFormat()
            if style.isAnchor() and style.anchorHref() and style.foreground().color() == old:
                spans.append((fragment.position(), fragment.position() + fragment.length()))
            it += 1
        block = block.next()
    change = QTextCharFormat()
    change.setForeground(new)
    cursor = QTextCursor(document)
    for start, end in spans:
        cursor.setPosition(start)
        cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
        cursor.mergeCharFormat(change)


def dark_palette() -> QPalette:
    p = QPalette()
    role = QPalette.ColorRole
    colors = {
        role.Window: "#232629", role.WindowText: "#e6e6e6", role.Base: "#1b1d1f",
        role.AlternateBase: "#2a2d31", role.ToolTipBase: "#2a2d31",
        role.ToolTipText: "#e6e6e6", role.Text: "#e6e6e6", role.Button: "#2f3236",
        role.ButtonText: "#e6e6e6", role.BrightText: "#ff6b6b", role.Highlight: "#2f6fdf",
        role.HighlightedText: "#ffffff", role.Link: "#7aa7ff", role.PlaceholderText: "#8a8f98",
    }
    for r, c in colors.items():
        p.setColor(r, QColor(c))
    for r in (role.Text, role.ButtonText, role.WindowText):
        p.setColor(QPalette.ColorGroup.Disabled, r, QColor("#6b6f75"))
    return p
