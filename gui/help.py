"""The Help menu: About (the versions that matter for a bug report: the app, llama.cpp's
binding, OpenVINO, Qt and PySide6), the keyboard shortcuts (read from the window's own
actions, so the list cannot drift from what the keys do; an action reached by two keys
is one row), and the documentation, shown in the app.

Versions come from the installed packages' metadata: the GUI never imports a native
runtime (the engine process owns them).

The documentation is README.md and docs/*.md, rendered by `gui.markdown.document_html`
in a dialog with the list of documents; links between them (and to their sections) open
in the dialog, web links in the browser. They are read from the checkout the app runs
from (run.sh's editable install) or, for an installed wheel, from
`<prefix>/share/variant-studio/`, where pyproject.toml's `data-files` puts them
(`doc_roots`).
"""

from __future__ import annotations

import html
import platform
import sysconfig
from importlib import metadata
from pathlib import Path

import PySide6
from PySide6.QtCore import Qt, QUrl, qVersion
from PySide6.QtGui import QAction, QDesktopServices, QKeySequence, QPalette
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QMessageBox,
    QSplitter,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from engine import __version__
from gui.markdown import document_html

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# Where an installed wheel's data-files go (pyproject.toml [tool.setuptools.data-files]).
SHARED = Path("share") / "variant-studio"
# The documents in the order a new user needs them (any other docs/*.md after these).
DOC_ORDER = ("cli", "training", "serving", "models", "formats", "merge", "trust",
             "security", "performance", "architecture", "notes")


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
    """(keys, what) for every action of the window that has a shortcut: one row per
    thing done ("Evaluate…" in the Model menu and the View menu's "Evaluate" tab are
    one row, "Ctrl+E, Ctrl+5")."""
    keys_of: dict[str, list[str]] = {}
    for action in window.findChildren(QAction):
        keys = action.shortcut()
        if keys.isEmpty():
            continue
        text = action.text().replace("&", "").rstrip("…").strip()
        key = keys.toString(QKeySequence.SequenceFormat.NativeText)
        if key not in keys_of.setdefault(text, []):
            keys_of[text].append(key)
    # The keys in the order the actions were made: a menu's own first, then the tab's.
    return sorted(((", ".join(keys), text) for text, keys in keys_of.items()),
                  key=lambda pair: pair[1].lower())


def shortcuts_html(window: QMainWindow) -> str:
    rows = "".join(f"<tr><td style='padding-right:16px'><b>{html.escape(k)}</b></td>"
                   f"<td>{html.escape(t)}</td></tr>" for k, t in shortcuts(window))
    extra = ("<p>In a chat: Enter sends, Shift+Enter adds a line, F2 renames the chat. "
             "In Compare: Ctrl+Enter runs. Alt with a menu's underlined letter opens it; "
             "Tab moves between controls.</p>")
    return f"<h3>Keyboard shortcuts</h3><table>{rows}</table>{extra}"


def doc_roots() -> list[Path]:
    """Where README.md and docs/ may be: the checkout the app runs from, then an
    installed wheel's shared data (the environment's, then the user's)."""
    roots = [ROOT]
    for scheme in (sysconfig.get_default_scheme(), sysconfig.get_preferred_scheme("user")):
        try:
            roots.append(Path(sysconfig.get_path("data", scheme)) / SHARED)
        except KeyError:  # a scheme this platform does not have
            continue
    return roots


def documents(roots: list[Path] | None = None) -> list[tuple[str, Path]]:
    """(title, file) of each document, README first: from the first root that has
    docs/ (the title is the file's first heading)."""
    for root in roots if roots is not None else doc_roots():
        docs = root / "docs"
        if not docs.is_dir():
            continue
        rank = {name: i for i, name in enumerate(DOC_ORDER)}
        files = sorted(docs.glob("*.md"), key=lambda f: (rank.get(f.stem, len(rank)), f.stem))
        readme = root / "README.md"
        found = [("Overview", readme)] if readme.is_file() else []
        return found + [(_title(f), f) for f in files]
    return []


def _title(path: Path) -> str:
    try:
        with path.open(encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("# "):
                    return line[2:].strip()
    except OSError:
        pass
    return path.stem.replace("-", " ").capitalize()


class DocsDialog(QDialog):
    """Help → Documentation: the list of documents and the one chosen, rendered."""

    def __init__(self, parent: QWidget | None = None,
                 found: list[tuple[str, Path]] | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("documentation")
        self.setWindowTitle("Documentation")
        self.files = found if found is not None else documents()
        self.list = QListWidget()
        self.list.setObjectName("documents")
        self.list.setAccessibleName("Documents")
        # Long titles wrap ("Training adapters through the served file"), never cut.
        self.list.setWordWrap(True)
        self.list.setTextElideMode(Qt.TextElideMode.ElideNone)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setSpacing(2)
        for title, path in self.files:
            item = QListWidgetItem(title)
            item.setToolTip(path.name)
            self.list.addItem(item)
        self.browser = QTextBrowser()
        self.browser.setAccessibleName("Document")
        self.browser.setOpenLinks(False)
        self.browser.anchorClicked.connect(self._link)
        splitter = QSplitter()
        splitter.addWidget(self.list)
        splitter.addWidget(self.browser)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([220, 700])
        splitter.setChildrenCollapsible(False)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(splitter, 1)
        layout.addWidget(buttons)
        self.list.currentRowChanged.connect(self._show)
        if self.files:
            self.list.setCurrentRow(0)
        else:
            self.browser.setHtml(
                "<h3>The documentation was not found</h3><p>It is README.md and the docs "
                "folder of Variant Studio's source; an installed copy keeps them in "
                f"{html.escape(str(SHARED))} under its installation prefix. Looked in:</p>"
                "<ul>" + "".join(f"<li>{html.escape(str(r))}</li>" for r in doc_roots()) +
                "</ul>")
        screen = parent.screen().availableGeometry() if parent is not None else None
        width, height = 980, 700
        if screen is not None:
            width, height = min(width, screen.width() - 40), min(height, screen.height() - 60)
        self.resize(width, height)

    def current(self) -> Path | None:
        row = self.list.currentRow()
        return self.files[row][1] if 0 <= row < len(self.files) else None

    def _show(self, row: int) -> None:
        if not 0 <= row < len(self.files):
            return
        path = self.files[row][1]
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            self.browser.setHtml(f"<p>{html.escape(path.name)} could not be read: "
                                 f"{html.escape(str(exc))}</p>")
            return
        dark = self.palette().color(QPalette.ColorRole.Base).lightness() < 128
        self.browser.setHtml(document_html(text, dark))

    def open_document(self, name: str, anchor: str = "") -> bool:
        """Show the document whose file is `name` ("training.md"), at `anchor`."""
        for row, (_, path) in enumerate(self.files):
            if path.name == name:
                self.list.setCurrentRow(row)
                if anchor:
                    self.browser.scrollToAnchor(anchor)
                return True
        return False

    def _link(self, url: QUrl) -> None:
        if url.scheme() in ("http", "https", "mailto"):
            QDesktopServices.openUrl(url)
        elif not url.path() and url.fragment():
            self.browser.scrollToAnchor(url.fragment())
        elif url.path().endswith(".md"):
            self.open_document(Path(url.path()).name, url.fragment())


def show_documentation(window: QWidget) -> DocsDialog:
    dialog = window.findChild(DocsDialog, "documentation")
    if dialog is None:
        dialog = DocsDialog(window)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    dialog.show()  # non-modal: the window goes on meanwhile
    dialog.raise_()
    dialog.activateWindow()
    return dialog


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
    add("docs", "&Documentation", lambda: show_documentation(window))
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
