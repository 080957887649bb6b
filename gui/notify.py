"""Messages that do not block: a warning box opened window-modal with `open()`.

Used where a modal `exec()` must not run: inside a coroutine on the qasync loop (a
nested event loop would run other coroutine steps inside this one's) and in slots of
background work, where the user should not have to dismiss a box before the window
goes on.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox, QWidget


def warn(parent: QWidget, title: str, text: str) -> QMessageBox:
    box = QMessageBox(QMessageBox.Icon.Warning, title, text, QMessageBox.StandardButton.Ok,
                      parent)
    box.setTextFormat(Qt.TextFormat.PlainText)  # messages quote paths and names
    box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    box.open()
    return box
