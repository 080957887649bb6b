"""A combo box choosing which backend serves a model or variant.

A variant whose base has a counterpart on the other backend (and whose adapters have
files for it) can be served by either; a backend that cannot serve it is listed but
disabled, with the reason as its tooltip.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QStandardItem, QStandardItemModel
from PySide6.QtWidgets import QComboBox, QWidget

from engine.catalog import resolve
from engine.catalog.store import Catalog
from engine.errors import StudioError
from gui.render import BACKEND_LABELS

LABELS = BACKEND_LABELS  # (gui.render: the views' labels and status lines say the same)


class BackendPicker(QComboBox):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setToolTip("Which runtime serves this model")
        self._model = QStandardItemModel(self)
        self.setModel(self._model)

    def set_target(self, catalog: Catalog, name: str | None) -> None:
        self._model.clear()
        if name is None:
            return
        try:
            options = resolve.backends_for(catalog, name)
        except StudioError:
            return
        for backend, reason in options:
            item = QStandardItem(LABELS.get(backend, backend))
            item.setData(backend, Qt.ItemDataRole.UserRole)
            if reason:
                item.setEnabled(False)
                item.setToolTip(reason)
            self._model.appendRow(item)
        self.setCurrentIndex(0)
        self.setEnabled(sum(1 for _b, r in options if r is None) > 1)

    def choose(self, backend: str) -> bool:
        """Choose `backend` if it is listed and can serve; False if not."""
        for row in range(self._model.rowCount()):
            item = self._model.item(row)
            if item.data(Qt.ItemDataRole.UserRole) == backend and item.isEnabled():
                self.setCurrentIndex(row)
                return True
        return False

    def backend(self) -> str | None:
        """The chosen backend, or None when the model's own one is chosen (or none)."""
        if self.currentIndex() <= 0:
            return None
        return self.currentData(Qt.ItemDataRole.UserRole)
