"""Application entry point: creates the QApplication and the main window."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication

from gui import theme


def main(argv: Sequence[str]) -> int:
    if "VARIANT_STUDIO_HOME" not in os.environ:
        from gui.settings_dialog import user_settings

        chosen = user_settings().value("data_dir")
        if chosen:
            os.environ["VARIANT_STUDIO_HOME"] = str(chosen)
    app = QApplication.instance() or QApplication([sys.argv[0], *argv])
    app.setApplicationName("Variant Studio")
    app.setOrganizationName("VariantStudio")
    app.setDesktopFileName("variant-studio")
    icon = os.path.join(os.path.dirname(__file__), "..", "resources", "icon.svg")
    if os.path.exists(icon):
        app.setWindowIcon(QIcon(icon))

    from gui.main_window import MainWindow

    window = MainWindow()
    theme.apply(app, window.theme)
    window.show()
    return app.exec()
