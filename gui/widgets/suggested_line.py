"""A line edit that can hold a suggestion: text the app filled in for the user, selected
whole when the user comes to the field, so what they type replaces it instead of being
appended to it (the Train page's variant name, suggested from the adapter's name)."""

from __future__ import annotations

from PySide6.QtCore import QTimer
from PySide6.QtGui import QFocusEvent
from PySide6.QtWidgets import QLineEdit


class SuggestedLineEdit(QLineEdit):
    def __init__(self) -> None:
        super().__init__()
        self._suggested = False
        self.textEdited.connect(self._typed)

    def suggest(self, text: str) -> None:
        """Fill in `text`, unless the user has typed their own."""
        if self.isModified() and not self._suggested:
            return
        self.setText(text)
        self._suggested = bool(text)

    def is_suggestion(self) -> bool:
        return self._suggested

    def _typed(self, _text: str) -> None:
        self._suggested = False

    def focusInEvent(self, event: QFocusEvent) -> None:  # noqa: N802 (Qt's name)
        super().focusInEvent(event)
        if self._suggested:
            # After the click that brought the focus has placed the cursor.
            QTimer.singleShot(0, self.selectAll)
