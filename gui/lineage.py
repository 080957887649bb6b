"""The lineage view: what a model, adapter or variant was made from, as a tree.

Opened from the detail pane ("Lineage…"), non-modal. The tree is
`engine.catalog.lineage.lineage` (records matched by digest, never by name); a digest
the catalog no longer has is shown greyed as "no longer in the catalog", with the name
it was recorded under. Reading it touches only the catalog file, so it is built on the
GUI thread.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFont, QGuiApplication
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QLabel,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from engine.catalog import lineage
from engine.catalog.lineage import Node
from engine.catalog.store import Catalog
from engine.formats.safeio import printable

SHA_ROLE = Qt.ItemDataRole.UserRole + 1


def label(node: Node) -> str:
    """The first column: role, kind and name (or the recorded name of a gone digest)."""
    role = "" if node.role == node.kind else f"{node.role}: "
    if node.present or node.kind == "data":
        what = f"{node.kind} {node.name}"
    elif node.recorded_name:
        what = f"{node.kind} (recorded as {node.recorded_name})"
    else:
        what = node.kind
    scale = f" @ {node.scale:g}" if node.scale is not None else ""
    return printable(f"{role}{what}{scale}", 200)


class LineageDialog(QDialog):
    """A tree of one entry's lineage, with a digest column (copied on double-click)."""

    def __init__(self, catalog: Catalog, name: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle(f"Lineage of {printable(name, 64)}")
        self.resize(820, 420)
        self.root = lineage.lineage(catalog, name)
        self.tree = QTreeWidget()
        self.tree.setColumnCount(3)
        self.tree.setHeaderLabels(["Made from", "sha256", "Detail"])
        header = self.tree.header()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)
        self.tree.addTopLevelItem(self._item(self.root))
        self.tree.expandAll()
        self.tree.itemDoubleClicked.connect(self._copy)
        hint = QLabel("Ancestors are matched by digest. Double-click a row to copy its "
                      "sha256.")
        hint.setWordWrap(True)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.close)
        layout = QVBoxLayout(self)
        layout.addWidget(hint)
        layout.addWidget(self.tree)
        layout.addWidget(buttons)

    def _item(self, node: Node) -> QTreeWidgetItem:
        sha = node.sha256 or ""
        item = QTreeWidgetItem([label(node), f"{sha[:16]}…" if sha else "—",
                                printable(node.detail, 300)])
        item.setData(0, SHA_ROLE, sha)
        item.setToolTip(1, sha)
        if not node.present and node.kind != "data":
            font = QFont()
            font.setItalic(True)
            for column in range(3):
                item.setForeground(column, QColor("#8a8f98"))
                item.setFont(column, font)
        for child in node.children:
            item.addChild(self._item(child))
        return item

    def _copy(self, item: QTreeWidgetItem, _column: int) -> None:
        sha = item.data(0, SHA_ROLE)
        if sha:
            QGuiApplication.clipboard().setText(sha)

    def rows(self) -> list[tuple[int, str, str, str]]:
        """(depth, label, sha256, detail) of every row, top to bottom (for tests)."""
        out: list[tuple[int, str, str, str]] = []

        def visit(item: QTreeWidgetItem, depth: int) -> None:
            out.append((depth, item.text(0), item.data(0, SHA_ROLE) or "", item.text(2)))
            for i in range(item.childCount()):
                visit(item.child(i), depth + 1)

        for i in range(self.tree.topLevelItemCount()):
            visit(self.tree.topLevelItem(i), 0)
        return out
