"""Application entry point: creates the QApplication and the main window."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from PySide6.QtWidgets import QApplication, QMainWindow, QTreeWidget, QTreeWidgetItem

from engine.catalog import Catalog


class MainWindow(QMainWindow):
    def __init__(self, catalog: Catalog) -> None:
        super().__init__()
        self.setWindowTitle("Variant Studio")
        self.tree = QTreeWidget()
        self.tree.setHeaderLabels(["Name", "Backend", "sha256"])
        data = catalog.data()
        for kind, title in (("models", "Base models"), ("adapters", "Adapters"),
                            ("variants", "Variants")):
            section = QTreeWidgetItem([title])
            for record in data[kind].values():
                section.addChild(QTreeWidgetItem(
                    [record["name"], record.get("backend", ""), record.get("sha256", "")[:12]]))
            self.tree.addTopLevelItem(section)
            section.setExpanded(True)
        self.setCentralWidget(self.tree)
        self.resize(900, 600)


def main(argv: Sequence[str]) -> int:
    app = QApplication.instance() or QApplication([sys.argv[0], *argv])
    catalog = Catalog()
    catalog.ensure_initialized()
    window = MainWindow(catalog)
    window.show()
    return app.exec()
