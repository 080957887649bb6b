"""The details a new user tripped on (the window issue's items 8 and 9), each held here.

Speed and status: the chat's status line is whole on a 1024 px window (the figures
first, on a line of its own), a stopped answer keeps its tok/s, the toolbar's Stop is
enabled only while something runs, Copy answer waits for the answer, and Delete and
Rename need a chat. Unfinished details: Help → Documentation renders README.md and
docs/*.md in the app (and a wheel ships them), no internal issue numbers in what users
read, plain identity wording, the wizard's summary names the base in the library's
words with one line of targets, Enter in its path field goes on, F1 lists each thing
once, the Evaluate page says what goes where before a run and shows whole names, and
quitting with the local server running asks first."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from PySide6.QtCore import QSize, Qt, QUrl
from PySide6.QtWidgets import QApplication, QMessageBox

from engine.catalog.store import Catalog
from engine.catalog.wizard import ImportWizard, Step
from engine.cli.parser import build_parser
from engine.curated import demo, setup
from engine.curated.demo import VARIANT_NAME
from engine.curated.embedded import DEFAULT_MODEL_NAME as BASE
from engine.formats import artifacts
from gui import help as help_menu
from gui import main_window as main_window_module
from gui.main_window import MainWindow
from gui.markdown import slug
from gui.wizard import summary_rows
from tests.gui_helpers import LONG, SHORT, FakeEngine, generation_result

ROOT = Path(__file__).resolve().parents[1]
DEMO_ADAPTER = demo.resources_dir() / "adapter.gguf"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def resize(window: MainWindow, qtbot, width: int, height: int) -> None:  # noqa: ANN001
    size = QSize(width, height)
    window.resize(size)
    qtbot.waitUntil(lambda: window.size() == size, timeout=SHORT)
    QApplication.processEvents()


# --------------------------------------------------------------------------- item 8


def test_the_chat_status_is_whole_at_1024_and_the_buttons_follow_what_runs(
        window: MainWindow, qtbot) -> None:
    resize(window, qtbot, 1024, 700)
    window.open_chat(VARIANT_NAME)
    chat = window.chat
    engine, clock = FakeEngine(), Clock()
    chat.controller.engine = engine
    chat.controller._clock = clock
    # A new chat is no chat yet: nothing to delete or rename. Nothing runs: no Stop.
    assert chat.conversation is not None and not chat.conversation.messages
    assert not chat.delete_button.isEnabled() and not chat.rename_button.isEnabled()
    assert not window.act_stop.isEnabled() and not chat.stop_button.isEnabled()

    chat.input.setPlainText("What is the weather in Paris?")
    chat.send()
    assert window.act_stop.isEnabled() and chat.stop_button.isEnabled()
    assert not chat.copy_button.isEnabled()  # nothing finished to copy
    assert not chat.delete_button.isEnabled() and not chat.rename_button.isEnabled()
    pieces = ['{"tool":'] + [" x"] * 63
    clock.now += 9.48
    engine.last.sink.tokens("main", pieces[0], [[0, -0.1, pieces[0], []]])
    engine.last.sink.tokens("main", "".join(pieces[1:]),
                            [[i, -0.1, p, []] for i, p in enumerate(pieces[1:], 1)])
    engine.last.sink.finished(generation_result(
        "".join(pieces), VARIANT_NAME, tokens=pieces, finish="length",
        tokens_per_second=4.7))
    QApplication.processEvents()
    assert not window.act_stop.isEnabled() and not chat.stop_button.isEnabled()
    assert chat.copy_button.isEnabled()
    assert chat.delete_button.isEnabled() and chat.rename_button.isEnabled()
    status = chat.status
    assert status.text().startswith("4.7 tok/s · 64 tokens · first token 9.48 s · "
                                    "cut at max tokens"), status.text()
    assert VARIANT_NAME in status.text()
    # Whole on a 1024 px window (it was cut at "first tok…", the rest in a tooltip).
    assert not status.is_elided(), (status.elided(), status.width())
    assert window.size() == QSize(1024, 700)

    # While the next answer runs, Copy answer waits (an older answer is no answer to
    # this question); the toolbar's Stop stops it, and the stopped answer keeps its speed.
    chat.input.setPlainText("And in Rome?")
    chat.send()
    assert not chat.copy_button.isEnabled() and window.act_stop.isEnabled()
    clock.now += 0.5
    engine.last.sink.tokens("main", "It", [[1, -0.1, "It", []]])
    clock.now += 2.0
    engine.last.sink.tokens("main", " is sunny", [[2, -0.1, " is", []], [3, -0.1, " sunny", []],
                                                  [4, -0.1, ".", []], [5, -0.1, "!", []]])
    window.act_stop.trigger()
    assert engine.last.stopped
    engine.last.sink.cancelled()
    answer = chat.conversation.messages[-1]
    assert answer.error == "stopped" and answer.tokens_per_second == pytest.approx(2.0)
    assert chat.status.text() == "stopped · 2.0 tok/s · 5 tokens · first token 0.50 s"
    assert "2.0 tok/s" in chat.transcript.toPlainText().split("And in Rome?")[-1]
    assert not window.act_stop.isEnabled() and chat.copy_button.isEnabled()

    # Deleted, the chat on show is a new one again: no Delete, no Rename.
    chat.delete_chat()
    assert chat.conversation is not None and not chat.conversation.messages
    assert not chat.delete_button.isEnabled() and not chat.rename_button.isEnabled()


# --------------------------------------------------------------------------- item 9: help


def test_help_documentation_is_shown_in_the_app_rendered(window: MainWindow, qtbot,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    opened: list[QUrl] = []
    monkeypatch.setattr(help_menu.QDesktopServices, "openUrl", opened.append)
    window.help_actions["docs"].trigger()
    dialog = window.findChild(help_menu.DocsDialog, "documentation")
    assert dialog is not None and dialog.isVisible() and not opened  # no launcher needed
    titles = [dialog.list.item(i).text() for i in range(dialog.list.count())]
    assert titles[0] == "Overview" and "Command line" in titles
    assert "Training adapters through the served file" in titles
    assert len(titles) == 1 + len(list((ROOT / "docs").glob("*.md")))
    page = dialog.browser.toPlainText()
    # Rendered, not the Markdown source.
    assert page.startswith("Variant Studio") and "## " not in page and "**" not in page
    assert "<h2" in dialog.browser.toHtml() or "font-size" in dialog.browser.toHtml()
    # A link to another document opens it here, a web link in the browser.
    dialog.browser.anchorClicked.emit(QUrl("docs/cli.md"))
    assert dialog.current() == ROOT / "docs" / "cli.md"
    assert dialog.browser.toPlainText().startswith("Command line")
    dialog.browser.anchorClicked.emit(QUrl("https://example.com/"))
    assert opened == [QUrl("https://example.com/")]
    # Headings are anchors, as on GitHub.
    assert dialog.open_document("training.md",
                                slug("Parity gate: the trainer against llama.cpp"))
    QApplication.processEvents()
    assert dialog.browser.verticalScrollBar().value() > 0
    # Asked again, the same dialog comes forward.
    window.help_actions["docs"].trigger()
    assert window.findChildren(help_menu.DocsDialog) == [dialog]
    dialog.close()


def test_the_documentation_is_found_where_an_installed_wheel_puts_it(tmp_path: Path,
                                                                     qtbot) -> None:
    checkout, shared = tmp_path / "no-checkout", tmp_path / "prefix" / help_menu.SHARED
    (shared / "docs").mkdir(parents=True)
    (shared / "README.md").write_text("# Variant Studio\n\nHello.\n", encoding="utf-8")
    (shared / "docs" / "cli.md").write_text("# Command line\n", encoding="utf-8")
    found = help_menu.documents([checkout, shared])
    assert found == [("Overview", shared / "README.md"),
                     ("Command line", shared / "docs" / "cli.md")]
    # The places looked in: the checkout, then the environment's shared data.
    assert help_menu.doc_roots()[0] == ROOT
    assert any(str(root).endswith(str(help_menu.SHARED)) for root in help_menu.doc_roots())
    # Nothing found: the dialog says where it looked instead of a blank page.
    empty = help_menu.DocsDialog(None, found=[])
    qtbot.addWidget(empty)
    assert "not found" in empty.browser.toPlainText()
    # pyproject.toml ships every document there.
    data_files = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "data-files"]
    assert data_files[str(help_menu.SHARED)] == ["README.md"]
    assert data_files[f"{help_menu.SHARED}/docs"] == ["docs/*.md"]


@pytest.mark.slow
def test_a_built_wheel_carries_the_documentation(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        (source / name).write_bytes((ROOT / name).read_bytes())
    for folder in ("engine", "gui", "docs"):
        subprocess.run(["cp", "-r", str(ROOT / folder), str(source / folder)], check=True)
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                          "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"),
                          str(source)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    data = f"variant_studio-0.1.0.data/data/{help_menu.SHARED}"
    assert f"{data}/README.md" in names
    assert {f"{data}/docs/{doc.name}" for doc in (ROOT / "docs").glob("*.md")} <= names


def test_f1_lists_each_thing_once(window: MainWindow) -> None:
    rows = help_menu.shortcuts(window)
    whats = [what for _keys, what in rows]
    assert len(whats) == len(set(whats)), sorted(w for w in whats if whats.count(w) > 1)
    (evaluate,) = [keys for keys, what in rows if what == "Evaluate"]
    assert evaluate == "Ctrl+E, Ctrl+5"


# This project's own issues; llama.cpp's (an upstream bug, with its link) are another
# project's and stay.
INTERNAL_ISSUE = re.compile(r"\bissues?[ -]#?\d+|\b(?:this|the) issue\b", re.IGNORECASE)


def test_what_users_read_speaks_of_no_internal_issue_numbers() -> None:
    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"),
             *(ROOT / "engine").rglob("*.py"), *(ROOT / "gui").rglob("*.py")]
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in files
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if INTERNAL_ISSUE.search(line) and "llama.cpp" not in line]
    assert not found, "\n".join(found)
    train = build_parser()._subparsers._group_actions[0].choices["train"]  # noqa: SLF001
    numerics = next(a for a in train._actions if "--numerics" in a.option_strings)
    assert not INTERNAL_ISSUE.search(numerics.help) and "December 2026" in numerics.help


def test_the_identity_is_explained_in_plain_words(window: MainWindow) -> None:
    window.select(VARIANT_NAME)
    text = window.detail.browser.toPlainText()
    assert "what makes this model this model" not in text
    assert "Identity" in text and "the base file, each adapter file with its scale" in text


# --------------------------------------------------------------------------- the wizard


def test_the_wizard_names_the_base_in_the_librarys_words_with_one_line_of_targets(
        studio_home: Path) -> None:
    catalog = Catalog()
    setup.first_run(catalog)
    wizard = ImportWizard(catalog)
    wizard.set_path(DEMO_ADAPTER)
    info = wizard.info
    assert info is not None and info.base_name == "Smollm2 135M 8k Lc100K Mix1 Ep2"
    assert wizard.made_for == [BASE]  # by its declared digest
    rows = dict(summary_rows(info, wizard.made_for))
    assert rows["Made for"] == f"{BASE} (the file declares this base's digest)"
    assert not any("Expected base" in k or "Target modules" in k for k in rows)
    assert rows["Targets"] == "attn_q, attn_v"
    shown = " ".join(f"{k} {v}" for k, v in summary_rows(info, wizard.made_for))
    assert info.base_name not in shown  # the file's own name for its base
    # No digest: the base is found by its model name, and it says so.
    by_name = dataclasses.replace(info, base_sha256=None)
    assert wizard._made_for(by_name) == (BASE,)
    assert dict(summary_rows(by_name, [BASE]))["Made for"].startswith(
        f"{BASE} (by the base's model name")
    other = dataclasses.replace(info, base_sha256=None, base_name="Llama 3 8B")
    assert wizard._made_for(other) == ()
    assert dict(summary_rows(other, []))["Made for"] == (
        "a base named “Llama 3 8B”; none in your library has that name (its digest is not "
        "declared)")
    unknown = dataclasses.replace(info, base_sha256="ab" * 32, base_name=None)
    assert dict(summary_rows(unknown, []))["Made for"].startswith(
        "a base that is not in your library (digest abababababab…")
    # A PEFT config's own module names stay on the targets' line.
    peft = dataclasses.replace(info, target_modules=("q_proj", "v_proj"))
    assert dict(summary_rows(peft, [BASE]))["Targets"] == \
        "attn_q, attn_v (adapter_config.json: q_proj, v_proj)"
    assert artifacts.inspect_path(DEMO_ADAPTER).summary()["target_modules"] == []


def test_enter_in_the_wizards_path_field_goes_to_next(window: MainWindow, qtbot) -> None:
    dialog = window.import_adapter()
    # Typed and Enter at once: read, then on to the summary.
    qtbot.keyClicks(dialog.path, str(DEMO_ADAPTER))
    with qtbot.waitSignal(dialog.stepReady, timeout=LONG):
        qtbot.keyClick(dialog.path, Qt.Key.Key_Return)
    assert dialog.state.step == Step.SUMMARY
    assert "Made for" in dialog.summary.toPlainText()
    dialog.back()
    # Already read: Enter is Next at once.
    dialog.path.setFocus()
    qtbot.keyClick(dialog.path, Qt.Key.Key_Return)
    assert dialog.state.step == Step.SUMMARY
    dialog.reject()


# --------------------------------------------------------------------------- evaluate, quit


def test_the_evaluate_page_says_what_goes_where_and_shows_whole_names(
        window: MainWindow, qtbot) -> None:
    resize(window, qtbot, 1024, 700)
    view = window.evaluate
    window.open_evaluate()
    QApplication.processEvents()
    assert view.placeholder.isVisible() and not view.table.isVisible()
    assert "Evaluate" in view.placeholder.text()
    metrics = view.models.fontMetrics()
    texts = []
    for row in range(view.models.count()):
        item = view.models.item(row)
        texts.append(item.text())
        room = view.models.visualItemRect(item).width() - 28  # the check box
        assert metrics.horizontalAdvance(item.text()) <= room, (item.text(), room)
    assert texts == ["Base models", BASE, "Variants", VARIANT_NAME]
    assert not any("(base m" in t for t in texts)
    window.select(VARIANT_NAME)
    assert view.checked() == [BASE, VARIANT_NAME] and view.run_button.isEnabled()


class FakeServer:
    url = "http://127.0.0.1:8123"

    def __init__(self) -> None:
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True


def test_quitting_with_the_server_running_asks_first(window: MainWindow,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []
    answer = [QMessageBox.StandardButton.No]

    def question(_parent, _title, text, *_args, **_kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        asked.append(text)
        return answer[0]

    monkeypatch.setattr(main_window_module.QMessageBox, "question", question)
    assert window.confirm_server_stop() and not asked  # nothing served: no question
    server = FakeServer()
    window.server_controller.server = server
    assert window.act_quit.shortcut().toString() == "Ctrl+Q"
    window.act_quit.trigger()
    assert len(asked) == 1 and "local server is running at http://127.0.0.1:8123" in asked[0]
    assert "stops it" in asked[0]
    assert window.isVisible() and not server.stopped  # No: it goes on serving
    answer[0] = QMessageBox.StandardButton.Yes
    window.act_quit.trigger()
    assert not window.isVisible() and server.stopped
