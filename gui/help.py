"""The Help menu: About (the versions that matter for a bug report: the app, llama.cpp's
binding, OpenVINO, Qt and PySide6), the keyboard shortcuts (read from the window's own
actions, so the list cannot drift from what the keys do), and the documentation.

Versions come from the installed packages' metadata: the GUI never imports a native
runtime (the engine process owns them).
"""

from __future__ import annotations

import html
import platform
from importlib import metadata
from pathlib import Path

import PySide6
from PySide6.QtCore import Qt, QUrl, qVersion
from PySide6.QtGui import QAction, QDesktopServices, QKeySequence
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QMainWindow,
    QMessageBox,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from engine import __version__

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def versions() -> dict[str, str]:
    return {
        "Variant Studio": __version__,
        "llama.cpp (llama-cpp-python)": _version("llama-cpp-python"),
        "OpenVINO": _version("openvino"),
        "OpenVINO GenAI": _version("openvino-genai"),
        "Qt": qVersion(),
        "PySide6": getattr(PySide6, "__version__", _version("PySide6")),
        "Python": platform.python_version(),
    }


def about_text() -> str:
    rows = "".join(f"<tr><td style='color:#888;padding-right:12px'>{html.escape(k)}</td>"
                   f"<td>{html.escape(v)}</td></tr>" for k, v in versions().items())
    return ("<h3>Variant Studio</h3><p>Local custom models: a base model, LoRA adapters "
            "with scales and a profile, with the provenance and checks that make each "
            f"one what it is.</p><table>{rows}</table>")


def shortcuts(window: QMainWindow) -> list[tuple[str, str]]:
    """(keys, what) for every action of the window that has a shortcut."""
    found = []
    for action in window.findChildren(QAction):
        keys = action.shortcut()
        if keys.isEmpty():
            continue
        text = action.text().replace("&", "").rstrip("…").strip()
        found.append((keys.toString(QKeySequence.SequenceFormat.NativeText), text))
    return sorted(set(found), key=lambda pair: pair[1].lower())


def shortcuts_html(window: QMainWindow) -> str:
    rows = "".join(f"<tr><td style='padding-right:16px'><b>{html.escape(k)}</b></td>"
                   f"<td>{html.escape(t)}</td></tr>" for k, t in shortcuts(window))
    extra = ("<p>In a chat: Enter sends, Shift+Enter adds a line, F2 renames the chat. "
             "In Compare: Ctrl+Enter runs. Alt with a menu's underlined letter opens it; "
             "Tab moves between controls.</p>")
    return f"<h3>Keyboard shortcuts</h3><table>{rows}</table>{extra}"


def documentation_url() -> QUrl:
    index = DOCS if DOCS.is_dir() else ROOT / "README.md"
    return QUrl.fromLocalFile(str(index))


def install(window: QMainWindow) -> dict[str, QAction]:
    """Add the Help menu to `window`; returns its actions by name."""
    menu = window.menuBar().addMenu("&Help")
    actions: dict[str, QAction] = {}

    def add(key: str, text: str, slot, shortcut: str | None = None) -> None:  # noqa: ANN001
        action = QAction(text, window)
        if shortcut:
            action.setShortcut(QKeySequence(shortcut))
        action.triggered.connect(slot)
        menu.addAction(action)
        actions[key] = action

    add("shortcuts", "&Keyboard shortcuts", lambda: show_shortcuts(window), "F1")
    add("docs", "&Documentation", lambda: QDesktopServices.openUrl(documentation_url()))
    menu.addSeparator()
    add("about", "&About Variant Studio", lambda: show_about(window))
    return actions


def show_about(parent: QWidget) -> QMessageBox:
    box = QMessageBox(QMessageBox.Icon.Information, "About Variant Studio", about_text(),
                      QMessageBox.StandardButton.Ok, parent)
    box.setTextFormat(Qt.TextFormat.RichText)
    box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    box.setObjectName("about")
    box.open()  # never a nested exec(): the window runs coroutines (gui.aio)
    return box


def show_shortcuts(window: QMainWindow) -> QDialog:
    dialog = QDialog(window)
    dialog.setObjectName("shortcuts")
    dialog.setWindowTitle("Keyboard shortcuts")
    dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    browser = QTextBrowser()
    browser.setHtml(shortcuts_html(window))
    buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
    buttons.rejected.connect(dialog.reject)
    layout = QVBoxLayout(dialog)
    layout.addWidget(browser)
    layout.addWidget(buttons)
    dialog.resize(460, 420)
    dialog.open()
    return dialog
