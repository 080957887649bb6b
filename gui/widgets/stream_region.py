"""The end of a text document where a streaming answer is drawn, frame by frame
(`gui.render.StreamFrame`): its label once, each finished block appended once, and the
unfinished tail replaced; nothing drawn before is touched again, so a frame costs the
same at the thousandth block as at the first.

Qt's HTML insertion merges the first block of what it inserts into the block the cursor
is in, and a removal that spans blocks leaves the last one's format (a list item's)
on the block that stays. So every piece goes into a fresh block with plain formats,
and the first inserted block gets back the format it has in its own document (a
heading's level); a list or table leaves that fresh block empty, and it is removed
where Qt allows. While streaming, a rule or a table may still show an empty line more
than the finished answer, which the view renders whole.
"""

from __future__ import annotations

from PySide6.QtGui import QTextBlockFormat, QTextCharFormat, QTextCursor, QTextDocument

from gui.render import StreamFrame


def _fresh_block(cursor: QTextCursor) -> None:
    # Plain formats: the current block's would carry its list or code style along.
    cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())


def _plain_block(cursor: QTextCursor) -> None:
    block = cursor.block()
    if block.textList() is not None:
        block.textList().remove(block)
    cursor.setBlockFormat(QTextBlockFormat())
    cursor.setBlockCharFormat(QTextCharFormat())
    cursor.setCharFormat(QTextCharFormat())


class StreamRegion:
    """Draws frames at the end of `document`, below what it holds (in a block of its
    own: appended to the last block, the label would be glued to its text)."""

    def __init__(self, document: QTextDocument, head_html: str = "") -> None:
        self.document = document
        cursor = QTextCursor(document)
        cursor.movePosition(QTextCursor.MoveOperation.End)
        if not document.isEmpty():
            _fresh_block(cursor)
        if head_html:
            # The label is a block of its own, never part of the body's first block.
            cursor.insertHtml(head_html)
            _fresh_block(cursor)
        self._tail = cursor.position()  # where the unfinished tail starts

    def show(self, frame: StreamFrame) -> None:
        cursor = QTextCursor(self.document)
        cursor.beginEditBlock()
        cursor.setPosition(self._tail)
        cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        _plain_block(cursor)
        if frame.finished:
            self._insert(cursor, frame.finished)
            _fresh_block(cursor)
            self._tail = cursor.position()
        if frame.tail:
            self._insert(cursor, frame.tail)
        cursor.endEditBlock()

    def _insert(self, cursor: QTextCursor, piece: str) -> None:
        start = cursor.position()
        own = QTextDocument()
        own.setHtml(piece)
        first = own.begin()
        cursor.insertHtml(piece)
        block = self.document.findBlock(start)
        edit = QTextCursor(self.document)
        edit.setPosition(start)
        if block.text() == "" and block.next().isValid() and first.text() != "":
            edit.deleteChar()  # a list first: Qt put it after the fresh block
        elif first.textList() is None:
            edit.setBlockFormat(first.blockFormat())
