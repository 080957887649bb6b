"""Help: About with the versions, the keyboard shortcuts (from the window's own actions),
the documentation; every action reachable from the keyboard, no shortcut given twice,
accessible names on the main controls."""

from __future__ import annotations

from importlib import metadata

import pytest
from PySide6.QtCore import qVersion
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QDialog, QMessageBox, QTextBrowser

from engine import __version__
from gui import help as help_menu
from gui.main_window import MainWindow


def test_help_menu_about_shortcuts_and_documentation(window: MainWindow, qtbot,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    titles = [a.text() for a in window.menuBar().actions()]
    assert titles[-1] == "&Help" and all("&" in t for t in titles)
    window.help_actions["about"].trigger()
    about = window.findChild(QMessageBox, "about")
    assert about is not None and about.isVisible()
    text = about.text()
    for expected in (__version__, metadata.version("llama-cpp-python"),
                     metadata.version("openvino"), qVersion()):
        assert expected in text
    about.close()

    window.help_actions["shortcuts"].trigger()  # F1
    dialog = window.findChild(QDialog, "shortcuts")
    shown = dialog.findChild(QTextBrowser).toPlainText()
    for keys, what in (("Ctrl+N", "New chat"), ("Ctrl+Shift+B", "Add base model"),
                       ("Ctrl+K", "Compare with base"), ("F1", "Keyboard shortcuts")):
        assert keys in shown and what in shown
    dialog.close()

    # The documentation is shown in the app (no launcher, no folder of .md files).
    opened = []
    monkeypatch.setattr(help_menu.QDesktopServices, "openUrl", opened.append)
    window.help_actions["docs"].trigger()
    docs = window.findChild(help_menu.DocsDialog, "documentation")
    assert docs is not None and docs.isVisible() and not opened
    assert docs.browser.toPlainText().startswith("Variant Studio")
    docs.close()


def test_every_action_is_reachable_from_the_keyboard(window: MainWindow) -> None:
    menus = [a.menu() for a in window.menuBar().actions() if a.menu()]
    in_menus = [a for menu in menus for a in menu.actions() if not a.isSeparator()]
    assert in_menus and all("&" in a.text() for a in window.menuBar().actions())
    # The main actions have shortcuts of their own; none is given twice.
    for action in (window.act_import, window.act_model, window.act_variant,
                   window.act_new_chat, window.act_compare, window.act_stop,
                   window.act_settings, window.act_restart, window.act_server,
                   *window.tab_actions[:9]):
        assert not action.shortcut().isEmpty(), action.text()
    keys = [a.shortcut().toString() for a in window.findChildren(QAction)
            if not a.shortcut().isEmpty()]
    assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)
    window.tab_actions[2].trigger()
    assert window.tabs.currentIndex() == 2
    for widget in (window.chat.input, window.chat.transcript, window.compare.prompt,
                   window.compare.variant, window.library.search, window.library.tree,
                   window.server.key, window.server.port, window.tabs):
        assert widget.accessibleName(), widget


def test_a_first_run_welcomes_and_points_at_the_demo_and_the_comparison(
        window: MainWindow, qtbot) -> None:
    assert window.first_run and window.banner.isVisible()
    text = window.banner.label.text()
    assert "Welcome" in text and "tool-calls" in text and "Ctrl+K" in text
    # The same data directory: not a first run any more, and the welcome is still there
    # (until it is dismissed or a comparison was made: tests/test_gui_theme_state.py).
    again = MainWindow()
    qtbot.addWidget(again)
    again.show()
    assert not again.first_run and again.banner.isVisible()
    assert again.banner.label.text() == text
    again.close()
