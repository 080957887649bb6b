"""Application entry point: creates the QApplication and the main window, and runs
them on qasync's event loop (`gui.aio`), so the window's coroutines (the OpenVINO
build awaits the engine's reply) run on the GUI thread as the Qt loop turns."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from PySide6.QtCore import QTimer
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication

from gui import aio, theme

ICON = Path(__file__).resolve().parents[1] / "resources" / "icons" / "variant-studio.svg"


def main(import_path: str | None = None, check: bool = False) -> int:
    """Open the window; with `import_path`, start the import wizard on that file.

    `check` opens the window, prints what it shows as one JSON line and quits: a
    smoke test for installers and CI that the app really starts.
    """
    if "VARIANT_STUDIO_HOME" not in os.environ:
        from gui.settings_dialog import user_settings

        chosen = user_settings().value("data_dir")
        if chosen:
            os.environ["VARIANT_STUDIO_HOME"] = str(chosen)
    app = QApplication.instance() or QApplication([sys.argv[0]])
    app.setApplicationName("Variant Studio")
    app.setOrganizationName("VariantStudio")
    app.setDesktopFileName("variant-studio")
    if ICON.exists():
        app.setWindowIcon(QIcon(str(ICON)))
    loop = aio.install(app)  # before the window: its coroutines are scheduled on it

    from gui.main_window import MainWindow

    window = MainWindow()
    theme.apply(app, window.theme)
    window.show()
    if import_path:
        QTimer.singleShot(0, lambda: window.import_adapter(import_path))
    if check:
        def report() -> None:
            from gui.wizard import ImportDialog

            model = window.library.model
            wizards = window.findChildren(ImportDialog)
            print(json.dumps({
                "title": window.windowTitle(), "visible": window.isVisible(),
                "icon": not app.windowIcon().isNull(), "desktop_file": app.desktopFileName(),
                "models": model.names("model"), "adapters": model.names("adapter"),
                "variants": model.names("variant"),
                "selected": (window.library.current() or ("", ""))[1],
                "importing": wizards[0].path.text() if wizards else None,
            }), flush=True)
            window.close()

        QTimer.singleShot(0, report)
    with loop:  # closed at the end, with whatever coroutine is still pending
        return int(loop.run_forever() or 0)
