"""Window features that the user meets directly, offscreen, on the real engine.

Drag and drop, the status bar, restoring the window, Settings, the composer's delete,
profile and default model, chat copy / code blocks / speed, the comparison's marks,
speeds and quick switch, changed base files, corrupt state at start, hostile
adapter metadata, and the shipped demo's training provenance.

Generations are greedy and a few tokens long. Everything that may happen
asynchronously (library refreshes, engine answers, the import) is waited on through
the condition itself, never with a sleep.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from PySide6.QtCore import QMimeData, QPoint, QPointF, QSettings, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication, QMessageBox

from engine.catalog import imports, resolve
from engine.catalog.store import AdapterSpec, Catalog
from engine.curated.embedded import DEFAULT_MODEL_NAME
from engine.formats.lora_io import write_gguf
from engine.state import conversations, paths, settings
from engine.state.conversations import ChatMessage
from gui import render, theme
from gui.library import ProblemRole
from gui.main_window import MainWindow
from gui.settings_dialog import SettingsDialog
from gui.wizard import ImportDialog
from tests import factories as f
from tests.engine_helpers import BASE, populate
from tests.gui_helpers import LONG, SHORT, drive_modal

FAST = {"max_tokens": 8, "temperature": 0.0, "repeat_penalty": 1.0}
POEM = "Write a short poem about the sea."


# --------------------------------------------------------------------------- helpers


@pytest.fixture
def home(studio_home: Path, tmp_path: Path, base_info) -> Path:
    """Adapters a, b and variants over them (test_gui's), plus two greedy short ones."""
    catalog = Catalog()
    populate(catalog, tmp_path, base_info)
    catalog.add_variant("fast-a", BASE, [AdapterSpec("a", 1.0)], FAST)
    catalog.add_variant("fast-b", BASE, [AdapterSpec("b", 1.0)], FAST)
    return studio_home


@pytest.fixture
def open_window(qtbot):
    """Make windows on the current data directory; every one is closed at the end."""
    made: list[MainWindow] = []

    def make() -> MainWindow:
        win = MainWindow()
        qtbot.addWidget(win)
        made.append(win)
        win.show()
        assert win.library.model.names("model")  # the window opens on a loaded library
        return win

    yield make
    for win in made:
        win.close()


def ask(win: MainWindow, qtbot, text: str) -> ChatMessage:
    win.chat.input.setPlainText(text)
    with qtbot.waitSignal(win.chat.answered, timeout=LONG):
        win.chat.send()
    return win.chat.conversation.messages[-1]


def selected(win: MainWindow) -> str | None:
    current = win.library.current()
    return current[1] if current else None


def marked_text(browser) -> tuple[str, str]:
    """(unmarked, marked) text of a browser: marked = drawn with a background.

    Line breaks are left out: each line is a block of the document."""
    plain, marked = [], []
    block = browser.document().begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            if fragment.isValid():
                brush = fragment.charFormat().background()
                target = marked if brush.style() != Qt.BrushStyle.NoBrush and \
                    brush.color().alpha() > 0 else plain
                target.append(fragment.text())
            it += 1
        block = block.next()
    return "".join(plain), "".join(marked)


def wizard_next(qtbot, dialog: ImportDialog) -> None:
    """Next, once the step's own work (inspection, validation) lets the user go on."""
    qtbot.waitUntil(dialog.next_button.isEnabled, timeout=LONG)
    dialog.next()


# --------------------------------------------------------------------------- drag and drop


def drop_event(path_or_url: QUrl, window: MainWindow) -> tuple[QDragEnterEvent, QDropEvent]:
    mime = QMimeData()
    mime.setUrls([path_or_url])
    center = window.rect().center()
    enter = QDragEnterEvent(center, Qt.DropAction.CopyAction, mime,
                            Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    drop = QDropEvent(QPointF(center), Qt.DropAction.CopyAction, mime,
                      Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    drop._mime = mime  # keep the data alive as long as the event
    return enter, drop


def import_dialogs(win: MainWindow) -> list[ImportDialog]:
    return [d for d in win.findChildren(ImportDialog) if d.isVisible()]


def test_dropping_an_adapter_file_opens_the_import_wizard_on_it(
        home: Path, open_window, tmp_path: Path, base_info, qtbot) -> None:
    win = open_window()
    source = f.write_gguf_lora(tmp_path / "dropped.gguf", base_info, seed=5, strength=0.1)
    # A drag without files is not accepted; one with a file URL is.
    plain = QMimeData()
    plain.setText("just text")
    refused = QDragEnterEvent(QPoint(5, 5), Qt.DropAction.CopyAction, plain,
                              Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    refused.ignore()
    QApplication.sendEvent(win, refused)
    assert not refused.isAccepted()
    # A URL that is not a local file opens nothing.
    enter, drop = drop_event(QUrl("https://example.com/x.gguf"), win)
    QApplication.sendEvent(win, drop)
    assert import_dialogs(win) == []

    enter, drop = drop_event(QUrl.fromLocalFile(str(source)), win)
    enter.ignore()
    QApplication.sendEvent(win, enter)
    assert enter.isAccepted()
    QApplication.sendEvent(win, drop)
    (dialog,) = import_dialogs(win)  # the drop opens the wizard at once
    qtbot.waitUntil(lambda: dialog.state.info is not None, timeout=LONG)
    assert dialog.state.path == source and dialog.path.text() == str(source)
    assert dialog.state.error is None and dialog.state.name == "dropped"
    wizard_next(qtbot, dialog)  # it goes on to the summary of that file
    assert "dropped.gguf" in dialog.summary.toPlainText()
    dialog.reject()


# --------------------------------------------------------------------------- status bar


def test_status_bar_shows_engine_state_resident_model_and_memory(
        home: Path, open_window, qtbot) -> None:
    win = open_window()
    win.open_chat("fast-a")
    answer = ask(win, qtbot, POEM)
    assert answer.content and not answer.error
    # The window asks the engine to describe itself after an answer.
    qtbot.waitUntil(lambda: DEFAULT_MODEL_NAME in win.resident_label.text(), timeout=LONG)
    info = win.client.last_description
    assert [r.base for r in info.residents] == [DEFAULT_MODEL_NAME]
    sessions = len(info.sessions)
    assert sessions >= 1
    assert win.resident_label.text() == (f"resident: {DEFAULT_MODEL_NAME} · "
                                         f"{sessions} session(s)")
    rss = info.memory.rss_bytes
    assert rss > 50 * 2**20  # a loaded model: tens of MiB at least
    assert win.memory_label.text() == f"{rss / 2**20:.0f} MiB"
    assert win.engine_label.text() == "● engine running"
    for label in (win.engine_label, win.resident_label, win.memory_label):
        assert label.isVisible()
    # A fresh description after the engine stops says so.
    win.client.restart()
    qtbot.waitUntil(lambda: win.engine_label.text() != "● engine running", timeout=LONG)
    with qtbot.waitSignal(win.client.described, timeout=LONG):
        win.client.describe()
    qtbot.waitUntil(lambda: win.resident_label.text().startswith("resident: none"),
                    timeout=LONG)


# --------------------------------------------------------------------------- window state


def test_a_new_window_restores_geometry_splitters_tab_and_selection(
        home: Path, open_window, qtbot) -> None:
    first = open_window()
    # The offscreen screen is 800 x 800 and restoreGeometry fits a window into its
    # screen; this window is at least 806 wide, so only its height can be told apart
    # from the default (1280 x 800) after a restore.
    first.resize(first.minimumWidth(), 711)
    qtbot.waitUntil(lambda: first.height() == 711, timeout=SHORT)
    first.splitter.setSizes([211, first.splitter.width() - 211 - first.splitter.handleWidth()])
    first.tabs.setCurrentWidget(first.compare)
    first.select("vb")
    qtbot.waitUntil(lambda: selected(first) == "vb", timeout=SHORT)
    first.chat.splitter.setSizes([240, 600])
    splitter, chat_splitter = first.splitter.sizes(), first.chat.splitter.sizes()
    first.close()
    assert (home / "window.ini").is_file()

    again = open_window()
    qtbot.waitUntil(lambda: selected(again) == "vb", timeout=LONG)
    assert again.height() == 711
    # The library's width; the tabs take the rest of a width the offscreen screen
    # clamped, and grown to the new window's own minimum (which depends on the page
    # shown while it opens), so it need not be the first window's.
    assert again.splitter.sizes()[0] == splitter[0]
    assert again.chat.splitter.sizes()[0] == chat_splitter[0]
    assert again.tabs.currentWidget() is again.compare
    # The selection is not only highlighted: the panes are about it.
    assert again.detail.entry["name"] == "vb"
    assert again.compare.variant.currentText() == "vb"


# --------------------------------------------------------------------------- settings


@pytest.fixture
def user_ini(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> QSettings:
    """The user's own Qt settings (where the data directory is remembered), isolated."""
    ini = QSettings(str(tmp_path / "user.ini"), QSettings.Format.IniFormat)
    monkeypatch.setattr("gui.settings_dialog.user_settings", lambda: ini)
    return ini


def settings_dialog(win: MainWindow) -> SettingsDialog | None:
    return next((d for d in win.findChildren(SettingsDialog) if d.isVisible()), None)


def ok_button(dialog: SettingsDialog):
    from PySide6.QtWidgets import QDialogButtonBox

    return dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok)


def test_settings_save_context_backend_and_theme(home: Path, open_window, user_ini,
                                                 qtbot) -> None:
    app = QApplication.instance()
    win = open_window()
    before = settings.load()
    assert (before.context_size, before.default_backend) == (4096, "llama")
    seen: dict[str, object] = {}

    def change(dialog: SettingsDialog) -> None:
        dialog.context.setValue(2048)
        dialog.backend.setCurrentIndex(dialog.backend.findData("openvino"))
        dialog.theme.setCurrentText("dark")
        ok_button(dialog).click()
        seen["accepted"] = dialog.result() == SettingsDialog.DialogCode.Accepted

    try:
        drive_modal(lambda: settings_dialog(win), change)
        win.open_settings()
        assert seen == {"accepted": True}
        saved = settings.load()
        assert (saved.context_size, saved.default_backend) == (2048, "openvino")
        assert saved.threads == before.threads and saved.default_model == before.default_model
        # The theme is applied at once: the dark palette's window colour.
        assert app.palette().color(QPalette.ColorRole.Window).name() == "#232629"
        assert QSettings(str(home / "window.ini"), QSettings.Format.IniFormat).value(
            "theme") == "dark"
        assert user_ini.value("data_dir") is None  # the data directory was not touched

        # The chat serves a plain base with the context size from Settings, and says so
        # (as every front end does: the base's identity is that one everywhere).
        win.open_chat(BASE)
        expected = resolve.identity(Catalog(), BASE, n_ctx=2048)
        assert expected.short in win.chat.header.text()
        assert resolve.identity(Catalog(), BASE) == expected
        assert resolve.identity(Catalog(), BASE, n_ctx=4096).short not in win.chat.header.text()

        win.chat.input.setPlainText("Say hello.")
        with qtbot.waitSignal(win.chat.busyChanged, timeout=LONG,
                              check_params_cb=lambda busy: not busy):
            win.chat.send()
            reply = win.chat.reply  # stopped on its first tokens
            reply.tokens.connect(lambda *_args: reply.stop())
        assert reply.outcome == "cancelled"
        with qtbot.waitSignal(win.client.described, timeout=LONG) as described:
            win.client.describe()
        sessions = {s["identity"]: s for s in described.args[0]["sessions"]}
        assert expected.key in sessions and sessions[expected.key]["n_ctx"] == 2048

        # Reopened, the dialog shows what was saved; a new window keeps the theme.
        def check(dialog: SettingsDialog) -> None:
            seen["shown"] = (dialog.context.value(), dialog.backend.currentData(),
                             dialog.theme.currentText())
            dialog.reject()

        drive_modal(lambda: settings_dialog(win), check)
        win.open_settings()
        assert seen["shown"] == (2048, "openvino", "dark")
        win.close()
        assert open_window().theme == "dark"
    finally:
        theme.apply(app, "system")


def test_settings_refuse_a_bad_data_directory_with_a_message(
        home: Path, open_window, user_ini, tmp_path: Path, qtbot) -> None:
    win = open_window()
    a_file = tmp_path / "not-a-dir"
    a_file.write_text("x")
    settings_bytes = paths.settings_file().read_bytes() if paths.settings_file().exists() \
        else None
    outcomes: list[tuple[str, bool, str]] = []

    def try_bad_ones(dialog: SettingsDialog) -> None:
        dialog.context.setValue(1024)  # would be saved if the dialog went through
        for bad in (str(a_file), str(a_file / "below"), "relative/dir", ""):
            dialog.data_dir.setText(bad)
            ok_button(dialog).click()
            outcomes.append((bad, dialog.isVisible(), dialog.error.text()))
        dialog.reject()

    drive_modal(lambda: settings_dialog(win), try_bad_ones)
    win.open_settings()
    assert [visible for _bad, visible, _m in outcomes] == [True] * 4
    messages = [m for _bad, _v, m in outcomes]
    assert messages[0] == f"{a_file} is not a directory"
    assert messages[1] == f"{a_file / 'below'} cannot be created: {a_file} is not a directory"
    assert "absolute path" in messages[2] and messages[3] == "choose a data directory"
    # Refused: nothing was saved, not even the other fields.
    assert user_ini.value("data_dir") is None
    assert (paths.settings_file().read_bytes() if paths.settings_file().exists()
            else None) == settings_bytes
    assert settings.load().context_size == 4096

    # A good new directory is remembered for the next start.
    good = tmp_path / "elsewhere" / "studio"

    def choose_good(dialog: SettingsDialog) -> None:
        dialog.data_dir.setText(str(good))
        ok_button(dialog).click()
        outcomes.append((str(good), dialog.isVisible(), dialog.error.text()))

    drive_modal(lambda: settings_dialog(win), choose_good)
    win.open_settings()
    assert outcomes[-1] == (str(good), False, "")
    assert user_ini.value("data_dir") == str(good)


# --------------------------------------------------------------------------- composer


def test_removing_a_variant_asks_first_and_then_removes_it_everywhere(
        home: Path, open_window, qtbot, monkeypatch) -> None:
    win = open_window()
    win.select("vb")
    qtbot.waitUntil(lambda: (win.detail.entry or {}).get("name") == "vb", timeout=LONG)
    remove = win.detail.buttons["remove"]
    assert remove.isVisible()
    asked: list[str] = []
    answer = {"button": QMessageBox.StandardButton.No}

    def question(_parent, _title, text, *_args, **_kwargs):
        asked.append(text)
        return answer["button"]

    monkeypatch.setattr(QMessageBox, "question", question)
    remove.click()
    assert asked == ["Remove vb from the catalog?"]
    assert "vb" in Catalog().data()["variants"]  # No keeps it
    assert "vb" in win.library.model.names("variant")

    answer["button"] = QMessageBox.StandardButton.Yes
    remove.click()
    assert len(asked) == 2
    assert "vb" not in Catalog().data()["variants"]
    qtbot.waitUntil(lambda: "vb" not in win.library.model.names("variant"), timeout=LONG)
    assert win.compare.variant.findText("vb") < 0
    assert "b" in Catalog().data()["adapters"]  # its adapter stays installed

    # An adapter still used by a variant is not removed: the reason is shown.
    warnings: list[str] = []
    monkeypatch.setattr(QMessageBox, "warning",
                        lambda _p, _t, text, *_a, **_k: warnings.append(text))
    win.select("a")
    qtbot.waitUntil(lambda: (win.detail.entry or {}).get("name") == "a", timeout=LONG)
    win.detail.buttons["remove"].click()
    assert warnings and "a is used by" in warnings[0] and "va" in warnings[0]
    assert "a" in Catalog().data()["adapters"]


def test_after_a_removal_the_panes_no_longer_show_the_removed_variant(
        home: Path, open_window, qtbot, monkeypatch) -> None:
    win = open_window()
    win.open_chat("vb")
    qtbot.waitUntil(lambda: (win.detail.entry or {}).get("name") == "vb", timeout=LONG)
    monkeypatch.setattr(QMessageBox, "question",
                        lambda *_a, **_k: QMessageBox.StandardButton.Yes)
    win.detail.buttons["remove"].click()
    qtbot.waitUntil(lambda: "vb" not in win.library.model.names("variant"), timeout=LONG)
    qtbot.waitUntil(lambda: (win.detail.entry or {}).get("name") != "vb"
                    and win.chat.model_name != "vb", timeout=SHORT)
    assert win.compare.variant.findText("vb") < 0


PROFILE = {"system_prompt": "Answer in French, briefly.", "n_ctx": 2048,
           "temperature": 0.0, "top_p": 0.8, "top_k": 17, "repeat_penalty": 1.05,
           "max_tokens": 6, "seed": 4242}


def fill_profile(dialog, profile: dict) -> None:
    dialog.system.setPlainText(profile["system_prompt"])
    dialog.n_ctx.setValue(profile["n_ctx"])
    dialog.temperature.setValue(profile["temperature"])
    dialog.top_p.setValue(profile["top_p"])
    dialog.top_k.setValue(profile["top_k"])
    dialog.repeat.setValue(profile["repeat_penalty"])
    dialog.max_tokens.setValue(profile["max_tokens"])
    dialog.seed.setValue(profile["seed"])
    dialog.tool_format.setCurrentIndex(dialog.tool_format.findData(
        profile.get("tool_format")))


def shown_profile(dialog) -> dict:
    return {"system_prompt": dialog.system.toPlainText(), "n_ctx": dialog.n_ctx.value(),
            "temperature": dialog.temperature.value(), "top_p": dialog.top_p.value(),
            "top_k": dialog.top_k.value(), "repeat_penalty": dialog.repeat.value(),
            "max_tokens": dialog.max_tokens.value(), "seed": dialog.seed.value(),
            **({"tool_format": fmt} if (fmt := dialog.tool_format.currentData()) else {})}


def test_composer_profile_is_saved_shown_again_and_served(home: Path, open_window,
                                                          qtbot) -> None:
    win = open_window()
    dialog = win.compose(adapter="a")
    dialog.name.setText("french")
    default_key = dialog.identity.text()
    fill_profile(dialog, PROFILE)
    assert dialog.identity.text() != default_key  # the context size is identity
    dialog.save()
    assert Catalog().variant("french")["profile"] == PROFILE
    qtbot.waitUntil(lambda: selected(win) == "french", timeout=LONG)

    editing = win.compose(editing="french")
    assert editing.name.text() == "french" and editing.name.isReadOnly()
    assert shown_profile(editing) == PROFILE
    assert [(s.name, s.scale) for s in editing.specs()] == [("a", 1.0)]
    assert resolve.identity(Catalog(), "french").key in editing.identity.text()
    # The tool-call format its adapter writes (`tool_format`) is kept and shown too.
    changed = dict(PROFILE, top_k=23, system_prompt="Answer in German.",
                   tool_format="tool-args")
    fill_profile(editing, changed)
    editing.save()
    assert Catalog().variant("french")["profile"] == changed
    again = win.compose(editing="french")
    assert shown_profile(again) == changed
    again.reject()
    # Duplicating carries the profile too.
    duplicate = win.compose(duplicate_of="french")
    assert shown_profile(duplicate) == changed
    duplicate.reject()

    # The chat serves the profile: its context size and its max tokens.
    win.open_chat("french")
    answer = ask(win, qtbot, "Hello, who are you?")
    assert answer.identity == resolve.identity(Catalog(), "french").key
    tokens = re.search(r"· (\d+) tokens ·", win.chat.status.text())
    assert tokens and 1 <= int(tokens.group(1)) <= PROFILE["max_tokens"]
    with qtbot.waitSignal(win.client.described, timeout=LONG) as described:
        win.client.describe()
    session = next(s for s in described.args[0]["sessions"] if s["name"] == "french")
    assert session["n_ctx"] == 2048


def test_the_default_model_is_what_a_new_window_opens_on(home: Path, open_window,
                                                         qtbot) -> None:
    win = open_window()
    win.select("fast-b")
    qtbot.waitUntil(lambda: (win.detail.entry or {}).get("name") == "fast-b", timeout=LONG)
    button = win.detail.buttons["default"]
    assert button.isVisible() and button.isEnabled()
    button.click()
    assert settings.load().default_model == "fast-b"
    qtbot.waitUntil(lambda: not win.detail.buttons["default"].isEnabled(), timeout=LONG)
    assert win.detail.buttons["default"].text() == "Default model ✓"
    # The user moves on to another variant, which is later removed (say, by the CLI).
    win.select("va0")
    qtbot.waitUntil(lambda: selected(win) == "va0", timeout=LONG)
    win.close()
    Catalog().remove("va0")

    again = open_window()
    qtbot.waitUntil(lambda: selected(again) == "fast-b", timeout=LONG)
    assert again.chat.model_name == "fast-b"
    assert not again.detail.buttons["default"].isEnabled()
    again.tabs.setCurrentWidget(again.chat)
    answer = ask(again, qtbot, "Say hi.")
    assert answer.model == "fast-b" and answer.identity == resolve.identity(Catalog(), "fast-b").key


# --------------------------------------------------------------------------- chat


def test_chat_copy_puts_the_last_answer_on_the_clipboard(home: Path, open_window,
                                                         qtbot) -> None:
    win = open_window()
    win.open_chat("fast-a")
    clipboard = QGuiApplication.clipboard()
    clipboard.setText("something else")
    assert not win.chat.copy_button.isEnabled()  # nothing to copy yet
    first = ask(win, qtbot, POEM)
    second = ask(win, qtbot, "Now one about the mountains.")
    assert first.content and second.content and first.content != second.content
    assert win.chat.copy_button.isEnabled()
    win.chat.copy_button.click()
    assert clipboard.text() == second.content


HOSTILE_ANSWER = ("Here you go:\n```html\n<script>alert('x')</script>\n"
                  "if (a < b && c > d) {\n    return \"&amp;\";\n}\n```\n"
                  "and inline `<img src=x onerror=alert(1)>` plus **bold <i>text</i>**.")


def test_chat_renders_fenced_code_as_code_and_escapes_hostile_text(
        home: Path, open_window, qtbot) -> None:
    # The renderer itself: code in <pre> (highlighted: spans of colour only), every
    # character of the text escaped.
    out = render.markdown_html(HOSTILE_ANSWER)
    assert "<script>" not in out and "<img" not in out and "<i>" not in out
    code = re.sub(r"<span style=\"[^\"<>]*\">|</span>", "", out)
    assert out.count("<pre") == 1 and "&lt;script&gt;alert('x')&lt;/script&gt;" in code
    assert "&amp;amp;" in out  # an entity in the text stays text
    assert "<code style='font-family:monospace'>&lt;img" in out and "<b>bold &lt;i&gt;" in out
    unterminated = render.markdown_html("```python\nprint('<b>')")
    assert unterminated.startswith("<div") and "<pre" in unterminated
    assert "&lt;b&gt;" in unterminated and "<b>" not in unterminated

    # Where the user meets it: a saved conversation shown in the chat.
    conversation = conversations.new("fast-a").with_messages((
        ChatMessage("user", "Show me code"),
        ChatMessage("assistant", HOSTILE_ANSWER, model="fast-a", tokens_per_second=12.5)))
    conversations.save(conversation)
    win = open_window()
    win.open_chat("fast-a")
    qtbot.waitUntil(lambda: win.chat.conversation is not None
                    and win.chat.conversation.id == conversation.id, timeout=LONG)
    document = win.chat.transcript.document()
    text = document.toPlainText()
    # The hostile text is shown as text, character for character, not interpreted.
    assert "<script>alert('x')</script>" in text
    assert "<img src=x onerror=alert(1)>" in text and "<i>text</i>" in text
    assert "    return \"&amp;\";" in text  # indentation and the entity kept in the code
    assert document.toHtml().count("<img") == 0
    # The code block is set in a monospace font; the prose around it is not.
    for code in ("alert('x')", "return", "onerror"):
        cursor = document.find(code)
        assert not cursor.isNull() and cursor.charFormat().fontFamilies() == ["monospace"]
    for prose in ("Here you go", "plus", "bold"):
        cursor = document.find(prose)
        assert not cursor.isNull()
        assert "monospace" not in (cursor.charFormat().fontFamilies() or [])
    assert "12.5 tok/s" in text


def test_chat_answer_is_labelled_with_its_speed(home: Path, open_window, qtbot) -> None:
    win = open_window()
    win.open_chat("fast-a")
    answer = ask(win, qtbot, POEM)
    assert answer.tokens_per_second and answer.tokens_per_second > 0
    speed = f"{answer.tokens_per_second:.1f} tok/s"
    transcript = win.chat.transcript.toPlainText()
    assert f"fast-a on llama.cpp · {answer.identity[:12]} · {speed}" in transcript
    assert speed in win.chat.status.text()
    # Kept with the conversation: shown again after a restart.
    conversation_id = win.chat.conversation.id
    win.close()
    again = open_window()
    again.open_chat("fast-a")
    qtbot.waitUntil(lambda: again.chat.conversation.id == conversation_id, timeout=LONG)
    assert speed in again.chat.transcript.toPlainText()


# --------------------------------------------------------------------------- compare


def run_compare(view, qtbot) -> dict:
    with qtbot.waitSignal(view.busyChanged, timeout=LONG,
                          check_params_cb=lambda busy: not busy):
        view.run()
    assert view.result is not None
    return view.result


@pytest.mark.slow
def test_compare_marks_the_divergence_in_both_texts_with_each_speed_and_switches(
        home: Path, open_window, qtbot) -> None:
    win = open_window()
    view = win.compare
    win.open_compare("va")
    view.prompt.setPlainText(POEM)
    view.max_tokens.setValue(16)
    result = run_compare(view, qtbot)
    div = result["first_divergence"]
    assert div is not None and div < len(result["base"]["token_ids"])
    for side, name in ((view.base_side, "base"), (view.variant_side, "variant")):
        texts = [t[2].replace("\n", "") for t in side.tokens]  # lines become blocks
        assert [t[0] for t in side.tokens] == result[name]["token_ids"]
        plain, marked = marked_text(side.browser)
        # Everything from the first differing token on is marked, nothing before it.
        assert plain == "".join(texts[:div]) and marked == "".join(texts[div:]) != ""
        speed = result[name]["tokens_per_second"]
        assert speed > 0 and f"{speed:.1f} tok/s" in side.title.text()
    assert view.base_side.title.text().count("tok/s") == 1
    assert "va" in view.variant_side.title.text()
    assert resolve.identity(Catalog(), "va").short in view.variant_side.title.text()

    # Quick switch: the labels follow the new choice at once, the old texts go...
    view.select_variant("fast-b")
    assert view.variant.currentText() == "fast-b"
    fast_b = resolve.identity(Catalog(), "fast-b")
    assert fast_b.short in view.variant_side.title.text()
    assert "fast-b" in view.variant_side.title.text()
    assert "tok/s" not in view.variant_side.title.text()
    assert view.variant_side.browser.toPlainText() == ""
    assert not view.export_json.isEnabled()
    assert fast_b.base_only().short in view.base_side.title.text()
    # ...and a re-run compares the new variant.
    second = run_compare(view, qtbot)
    assert second["variant"]["name"] == "fast-b"
    assert second["variant"]["identity"] == fast_b.key
    assert second["base"]["identity"] == result["base"]["identity"]
    assert f"{second['variant']['tokens_per_second']:.1f} tok/s" in \
        view.variant_side.title.text()
    assert "fast-b" in view.variant_side.title.text()
    assert view.export_text("json") and '"fast-b"' in view.export_text("json")

    # Switching while a run is going stops it; nothing of it lands under new labels.
    view.run()
    old = view.reply
    assert old is not None and not view.run_button.isEnabled()
    with qtbot.waitSignal(old.done, timeout=LONG):  # its end arrives once this waits
        view.select_variant("va")
        assert view.reply is None and view.run_button.isEnabled()
    # "va" shows its own latest comparison again (recent comparisons are recalled by
    # variant), never the stopped run's partial answer.
    assert view.result is not None
    recalled = view.result
    assert recalled["variant"]["token_ids"] == result["variant"]["token_ids"]
    assert recalled["base"]["token_ids"] == result["base"]["token_ids"]
    assert view.variant_side.text == result["variant"]["text"]
    assert resolve.identity(Catalog(), "va").short in view.variant_side.title.text()


# --------------------------------------------------------------------------- library


def test_library_badges_a_base_model_whose_file_changed_on_disk(
        home: Path, open_window, tmp_path: Path, embedded_path: Path, base_info,
        qtbot) -> None:
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(embedded_path, copy)
    catalog = Catalog()
    imports.add_model(catalog, "copied", copy)
    lora = f.write_gguf_lora(tmp_path / "c.gguf", base_info, seed=9, strength=0.1)
    imports.add_adapter(catalog, "on-copy", "copied", lora)
    catalog.add_variant("copy-var", "copied", [AdapterSpec("on-copy", 1.0)], FAST)
    win = open_window()
    model = win.library.model

    def problem(name: str) -> str | None:
        index = model.index_of(name)
        return index.data(ProblemRole) if index.isValid() else "(not listed)"

    qtbot.waitUntil(lambda: "copied" in model.names("model")
                    and problem("copied") is None and problem("copy-var") is None,
                    timeout=LONG)
    # Flip one byte near the end (tensor data): same size, still a valid GGUF.
    with open(copy, "r+b") as handle:
        handle.seek(-100, 2)
        byte = handle.read(1)
        handle.seek(-100, 2)
        handle.write(bytes([byte[0] ^ 0xFF]))
    win.refresh()
    qtbot.waitUntil(lambda: problem("copied") is not None
                    and "changed on disk" in problem("copied"), timeout=LONG)
    assert "recorded" in problem("copied")
    assert problem(DEFAULT_MODEL_NAME) is None  # only the changed one
    qtbot.waitUntil(lambda: problem("copy-var") is not None, timeout=LONG)
    assert "changed on disk" in problem("copy-var")
    assert problem("fast-a") is None
    index = model.index_of("copied")
    assert "changed on disk" in index.data(Qt.ItemDataRole.ToolTipRole)
    # Its details say why, as a failed digest check.
    win.select("copied")
    qtbot.waitUntil(lambda: (win.detail.entry or {}).get("name") == "copied", timeout=LONG)
    checks = {row["name"]: row for row in win.detail.checks.rows}
    assert checks["digest"]["status"] == "fail"
    assert "changed on disk" in checks["digest"]["detail"]
    # And it is not served: the chat says why instead of answering.
    win.open_chat("copy-var")
    win.chat.input.setPlainText("Hello")
    win.chat.send()
    qtbot.waitUntil(lambda: win.chat.reply is None and
                    win.chat.conversation.messages[-1].role == "assistant", timeout=LONG)
    last = win.chat.conversation.messages[-1]
    assert last.error and "changed" in last.error and not last.content


# --------------------------------------------------------------------------- corrupt state


def test_a_corrupt_catalog_at_start_is_set_aside_and_the_banner_says_so(
        studio_home: Path, open_window, qtbot) -> None:
    studio_home.mkdir(parents=True, exist_ok=True)
    junk = b"{ this is not json \x00\xff"
    (studio_home / "catalog.json").write_bytes(junk)
    win = open_window()
    qtbot.waitUntil(lambda: win.banner.isVisible(), timeout=LONG)
    aside = list(studio_home.glob("catalog.json.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == junk  # kept, not deleted
    text = win.banner.label.text()
    assert "set aside" in text and "catalog.json" in text and aside[0].name in text
    assert not win.banner.retry.isVisible()  # an info banner, not an engine failure
    assert "#fdf3d8" in win.banner.styleSheet()
    # The window works on a fresh catalog: the embedded base and the demo.
    assert DEFAULT_MODEL_NAME in win.library.model.names("model")
    assert "tool-calls" in win.library.model.names("variant")
    win.banner.dismiss.click()
    assert not win.banner.isVisible()


def test_a_corrupt_conversation_at_start_is_set_aside_and_the_banner_says_so(
        home: Path, open_window, qtbot) -> None:
    good = conversations.new("fast-a").with_messages((ChatMessage("user", "kept"),))
    conversations.save(good)
    bad_id = "0" * 32
    bad = paths.conversations_dir() / f"{bad_id}.json"
    bad.write_text('{"id": "broken", "messages": [')
    win = open_window()
    qtbot.waitUntil(lambda: win.banner.isVisible(), timeout=LONG)
    text = win.banner.label.text()
    assert f"{bad_id}.json" in text and "set aside" in text
    assert not bad.exists()
    assert [p.read_text() for p in bad.parent.glob(f"{bad_id}.json.corrupt-*")] == \
        ['{"id": "broken", "messages": [']
    # The readable conversation is still there.
    win.open_chat("fast-a")
    qtbot.waitUntil(lambda: win.chat.conversation is not None
                    and win.chat.conversation.id == good.id, timeout=LONG)
    assert win.chat.list_model.rowCount() == 1


# --------------------------------------------------------------------------- hostile metadata

RAW_CONTROLS = ("\u202e", "\x1b", "\x07", "\x00", "\u200f", "\U000e0041", "\r")
HOSTILE_NAME = ("\u202eevil\x1b[31m\x07 ../../etc/x \x00\u200f\U000e0041\r" + "A" * 5000)


def all_printable(text: str) -> bool:
    return all(ch.isprintable() or ch in "\n\u2029\u2028" for ch in text)


def library_texts(win: MainWindow) -> list[str]:
    model = win.library.model
    out = []
    for section in range(model.rowCount()):
        parent = model.index(section, 0)
        for row in range(model.rowCount(parent)):
            index = model.index(row, 0, parent)
            for role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.ToolTipRole,
                         Qt.ItemDataRole.UserRole, ProblemRole):
                out.append(str(index.data(role) or ""))
    return out


def test_hostile_adapter_metadata_is_shown_escaped_never_raw(
        home: Path, open_window, tmp_path: Path, base_info, qtbot) -> None:
    weights = f.lora_weights(base_info, seed=11, strength=0.1)
    weights.base_name = HOSTILE_NAME  # general.base_model.0.name in the GGUF
    source = tmp_path / "evil\u202egguf.\x1b[0m.gguf"
    write_gguf(source, weights)
    win = open_window()
    dialog = win.import_adapter(str(source))
    wizard_next(qtbot, dialog)  # summary
    wizard_next(qtbot, dialog)  # base
    dialog.bases.setCurrentRow(0)
    wizard_next(qtbot, dialog)  # report: "no base digest declared" warns, naming that base
    dialog.ack.setChecked(True)
    wizard_next(qtbot, dialog)  # details
    name = dialog.name.text()
    assert all_printable(name) and "/" not in name and ".." not in name
    with qtbot.waitSignal(dialog.finished, timeout=LONG):
        wizard_next(qtbot, dialog)
    assert dialog.result_names["adapter"] == name
    record = Catalog().adapter(name)
    stored = Path(record["path"])
    assert stored.parent == paths.data_dir() / "adapters" / name  # no path from metadata

    qtbot.waitUntil(lambda: name in win.library.model.names("adapter"), timeout=LONG)
    win.select(name)
    qtbot.waitUntil(lambda: (win.detail.entry or {}).get("name") == name, timeout=LONG)
    shown = win.detail.browser.toPlainText()
    rows = [win.detail.checks.index(r, c).data() for r in range(win.detail.checks.rowCount())
            for c in (1, 2)]
    tips = [win.detail.checks.index(r, 2).data(Qt.ItemDataRole.ToolTipRole)
            for r in range(win.detail.checks.rowCount())]
    for text in (shown, *rows, *tips, *library_texts(win)):
        assert all_printable(text), repr(text[:200])
        for raw in RAW_CONTROLS:
            assert raw not in text
    # Escaped, readable, bounded: the override and escape are visible as codes.
    assert "\\u202eevil\\x1b[31m\\x07 ../../etc/x \\x00\\u200f\\U000e0041\\x0d" in shown
    assert "A" * 500 not in shown and "A" * 100 in shown
    assert "\\u202egguf." in shown  # the source path (the file's own name)
    expected_base = next(c for c in win.detail.checks.rows if c["name"] == "expected base")
    assert "\\u202eevil" in win.detail.checks.index(
        win.detail.checks.rows.index(expected_base), 2).data()
    assert len(max(shown.splitlines(), key=len)) < 700
    # The variant made from it and its chat are labelled only with validated names.
    variant = dialog.result_names["variant"]
    win.open_chat(variant)
    assert all_printable(win.chat.header.text())


def test_the_import_summary_shows_a_hostile_file_name_escaped(
        home: Path, open_window, tmp_path: Path, base_info, qtbot) -> None:
    source = f.write_gguf_lora(tmp_path / "evil\u202egguf.\x1b[0m.gguf", base_info, seed=12)
    win = open_window()
    dialog = win.import_adapter(str(source))
    wizard_next(qtbot, dialog)
    text = dialog.summary.toPlainText()
    dialog.reject()
    # The name is there, with its RTL override and escape shown as escapes.
    assert "evil\\u202egguf.\\x1b[0m.gguf" in text and all_printable(text)


# --------------------------------------------------------------------------- demo provenance


def test_details_show_the_training_provenance_of_the_shipped_demo_adapter(
        studio_home: Path, open_window, qtbot) -> None:
    from engine.training import demo

    win = open_window()  # a first run: the catalog gets the shipped demo
    assert demo.VARIANT_NAME in win.library.model.names("variant")
    assert demo.ADAPTER_NAME in win.library.model.names("adapter")
    record = Catalog().adapter(demo.ADAPTER_NAME)
    provenance = record["provenance"]
    assert record["curated"] and provenance["format"].startswith("variant-studio-provenance")
    win.select(demo.ADAPTER_NAME)
    qtbot.waitUntil(lambda: (win.detail.entry or {}).get("name") == demo.ADAPTER_NAME,
                    timeout=LONG)
    text = win.detail.browser.toPlainText()
    section = text[text.index("Training provenance"):]
    lines = section.splitlines()

    def value(key: str) -> str:
        return lines[lines.index(key) + 1]

    # The digests that tie it together: base, data, and the very bytes served.
    assert value("base_sha256") == provenance["base_sha256"] == Catalog().model(
        DEFAULT_MODEL_NAME)["sha256"]
    assert value("data_sha256").startswith(provenance["data_sha256"])
    assert "train.jsonl" in value("data_sha256")
    assert value("adapter_sha256").startswith(provenance["adapter_sha256"])
    assert provenance["adapter_sha256"] == record["sha256"]
    assert value("seed") == str(provenance["seed"]) == "7"
    config = value("config")
    for key in ("rank", "alpha", "lr", "steps", "seq_len", "seed"):
        assert f"{key}={provenance['config'][key]}" in config
    versions = value("versions")
    for package in ("torch", "llama-cpp-python", "variant-studio"):
        assert f"{package} {provenance['versions'][package]}" in versions
    loss = provenance["loss"]
    assert value("loss").startswith(f"{loss['first']:.4f} → {loss['last']:.4f}")
    assert loss["last"] < loss["first"]
    assert value("steps").startswith(f"{provenance['steps']} in ")
