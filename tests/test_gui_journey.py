"""End-to-end journeys the way a user takes them: no CLI, only the window.

Issue 5's "done when" (below, first) and issue 14's (last): add a base model and
download an adapter in the window, chat with a variant using a per-chat system prompt,
edit a message, regenerate and step between versions, export the chat, compare the
variant with its base, and find everything again after a restart.

Issue 5's:

Import a GGUF adapter for the embedded base through the wizard (typed path, chosen
base, acknowledged warnings, name, source, default scale, a variant), make the
variant's answers short and greedy in the composer, chat with it, compare it with
its base, read its provenance and compatibility, then close the window and check that
a new one on the same data directory has everything back. Real embedded model, real
engine process; every wait is on a signal or a condition.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from PySide6.QtCore import Qt, QUrl

from engine.catalog import resolve
from engine.catalog.store import Catalog
from engine.curated.embedded import DEFAULT_MODEL_NAME
from engine.runtime.messages import Generate
from engine.state import conversations
from gui.composer import ComposerDialog
from gui.download_dialog import DownloadDialog
from gui.library import BadgesRole
from gui.main_window import MainWindow
from gui.wizard import ImportDialog
from tests import factories as f
from tests.download_server import COMMIT, FileServer, serving
from tests.gui_helpers import LONG

SOURCE = "https://example.org/loras/poet.gguf"
PROMPT = "Write a short poem about the sea."


def visible(win: MainWindow, kind: type) -> list:
    return [d for d in win.findChildren(kind) if d.isVisible()]


def click_row(qtbot, view, row: int) -> None:
    rect = view.visualItemRect(view.item(row))
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())


def retype(qtbot, widget, text: str) -> None:
    widget.selectAll()
    qtbot.keyClicks(widget, text)


@pytest.mark.slow
def test_import_chat_compare_inspect_and_come_back(studio_home: Path, tmp_path: Path,
                                                   base_info, qtbot) -> None:
    adapter_file = f.write_gguf_lora(tmp_path / "poet.gguf", base_info, seed=3, strength=0.1)
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()

    # ---- import, through the wizard (File → Import adapter…)
    win.act_import.trigger()
    (dialog,) = visible(win, ImportDialog)
    qtbot.keyClicks(dialog.path, str(adapter_file))
    with qtbot.waitSignal(dialog.stepReady, timeout=LONG):
        qtbot.keyClick(dialog.path, Qt.Key.Key_Return)  # inspected off the GUI thread
    dialog.next_button.click()
    assert "poet.gguf" in dialog.summary.toPlainText()
    dialog.next_button.click()
    assert dialog.bases.item(0).text().startswith(DEFAULT_MODEL_NAME)
    with qtbot.waitSignal(dialog.stepReady, timeout=LONG):
        click_row(qtbot, dialog.bases, 0)  # validated (value scan) off the GUI thread
    assert dialog.state.base == DEFAULT_MODEL_NAME
    dialog.next_button.click()
    assert dialog.ack.isVisible() and not dialog.next_button.isEnabled()  # unverified base
    dialog.ack.click()
    dialog.next_button.click()
    retype(qtbot, dialog.name, "poet")
    retype(qtbot, dialog.source, SOURCE)
    dialog.scale.setValue(0.8)
    assert dialog.make_variant.isChecked()
    retype(qtbot, dialog.variant_name, "smol-poet")
    assert dialog.next_button.text() == "Import"
    with qtbot.waitSignal(dialog.finished, timeout=LONG):
        dialog.next_button.click()
    assert win.library.current() == ("variant", "smol-poet")
    assert win.detail.entry["name"] == "smol-poet"

    # ---- short, greedy answers: the variant's profile, in the composer (Edit)
    win.detail.buttons["edit"].click()
    (composer,) = visible(win, ComposerDialog)
    composer.temperature.setValue(0.0)
    composer.repeat.setValue(1.0)
    composer.max_tokens.setValue(16)
    with qtbot.waitSignal(composer.finished, timeout=LONG):
        composer.save_button.click()
    record = Catalog().variant("smol-poet")
    assert record["adapters"] == [{"name": "poet", "scale": 0.8}]
    assert record["profile"]["max_tokens"] == 16 and record["profile"]["temperature"] == 0.0
    identity = resolve.identity(Catalog(), "smol-poet")

    # ---- chat with the variant
    win.detail.buttons["chat"].click()
    chat = win.chat
    assert win.tabs.currentWidget() is chat and chat.model_name == "smol-poet"
    qtbot.keyClicks(chat.input, PROMPT)
    with qtbot.waitSignal(chat.answered, timeout=LONG):
        qtbot.keyClick(chat.input, Qt.Key.Key_Return)  # Enter sends
    answer = chat.conversation.messages[-1]
    assert answer.role == "assistant" and answer.content.strip() and not answer.error
    assert answer.model == "smol-poet" and answer.identity == identity.key
    transcript = chat.transcript.toPlainText()
    assert f"smol-poet on llama.cpp · {identity.short}" in transcript
    assert answer.content.strip()[:20] in transcript
    assert identity.short in chat.header.text()

    # ---- compare it with its base (Ctrl+K)
    win.act_compare.trigger()
    view = win.compare
    assert win.tabs.currentWidget() is view and view.variant.currentText() == "smol-poet"
    view.prompt.setPlainText(PROMPT)
    view.max_tokens.setValue(16)
    assert view.temperature.value() == 0.0
    with qtbot.waitSignal(view.busyChanged, timeout=LONG,
                          check_params_cb=lambda busy: not busy):
        view.run_button.click()
    result = view.result
    assert result is not None
    assert view.base_side.text.strip() and view.variant_side.text.strip()
    assert view.base_side.text == result["base"]["text"]
    assert view.variant_side.text == result["variant"]["text"]
    assert result["variant"]["identity"] == identity.key
    assert result["adapter_effect"] > 0  # the adapter is really applied
    assert f"{result['adapter_effect']:.4f}" in view.summary.toolTip()  # the figure, for experts

    # ---- provenance and compatibility of the adapter, in the detail pane
    win.library.select("poet")
    win.tabs.setCurrentWidget(win.detail)
    entry = win.detail.entry
    stored = Catalog().adapter("poet")
    page = win.detail.browser.toPlainText()
    assert entry["name"] == "poet" and entry["sha256"] == stored["sha256"]
    assert stored["sha256"] in page and SOURCE in page and "user-provided" in page
    assert "user" in win.library.model.index_of("poet").data(BadgesRole)
    checks = {row["name"]: row["status"] for row in win.detail.checks.rows}
    for name in ("digest", "format", "structure", "architecture", "coverage", "shapes",
                 "rank", "dtype", "values"):
        assert checks[name] == "pass", name
    assert checks["expected base"] == "warn"  # user-provided: no base digest declared
    assert "0 failed" in win.detail.summary.text()
    conversation_id = chat.conversation.id
    win.close()

    # ---- a new window on the same data directory
    again = MainWindow()
    qtbot.addWidget(again)
    again.show()
    assert again.library.current() == ("adapter", "poet")  # the selection
    assert again.detail.entry["name"] == "poet"
    assert "poet" in again.library.model.names("adapter")
    assert "smol-poet" in again.library.model.names("variant")
    assert Catalog().variant("smol-poet")["adapters"] == [{"name": "poet", "scale": 0.8}]
    again.open_chat("smol-poet")
    kept = again.chat.conversation
    assert kept.id == conversation_id
    assert [m.role for m in kept.messages] == ["user", "assistant"]
    assert kept.messages[0].content == PROMPT
    assert kept.messages[1].content == answer.content
    assert kept.messages[1].identity == identity.key
    assert answer.content.strip()[:20] in again.chat.transcript.toPlainText()
    assert conversations.load(conversation_id).messages[1].content == answer.content
    again.close()


@pytest.mark.slow
def test_add_a_base_download_an_adapter_chat_edit_regenerate_export_compare_come_back(
        studio_home: Path, tmp_path: Path, base_info, embedded_path: Path, qtbot,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 14's "done when", second bullet."""
    lora = f.write_gguf_lora(tmp_path / "poet.gguf", base_info, seed=3, strength=0.1)
    base_file = tmp_path / "my-base.gguf"
    shutil.copyfile(embedded_path, base_file)
    hub = FileServer(repos={"poets/sea-poet": {"poet.gguf": lora.read_bytes()}})
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    sent: list = []
    submit = win.client.submit

    def recording(request):  # noqa: ANN001, ANN202
        if type(request) is Generate:  # the chat's requests
            sent.append(request)
        return submit(request)

    win.client.submit = recording

    # ---- File → Add base model…: the file chosen, hashed in the background
    monkeypatch.setattr("gui.main_window.QFileDialog.getOpenFileName",
                        lambda *_a, **_k: (str(base_file), ""))
    with qtbot.waitSignal(win.events.catalogChanged, timeout=LONG):
        win.act_model.trigger()
    assert win.library.current() == ("model", "my-base")

    # ---- File → Download model or adapter…: from a (local) Hugging Face hub, for it
    with serving(hub):
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        win.act_download.trigger()
        (dialog,) = visible(win, DownloadDialog)
        assert dialog.base.currentText() == "my-base"  # the model on show
        qtbot.keyClicks(dialog.where, "poets/sea-poet")
        qtbot.keyClicks(dialog.filename, "poet.gguf")
        qtbot.keyClicks(dialog.revision, "main")
        qtbot.keyClicks(dialog.sha256, hashlib.sha256(lora.read_bytes()).hexdigest())
        assert dialog.name.text() == "poet"
        retype(qtbot, dialog.variant_name, "sea-poet")
        with qtbot.waitSignal(dialog.downloaded, timeout=LONG):
            dialog.download_button.click()
    adapter = Catalog().adapter("poet")
    assert adapter["base"] == "my-base" and adapter["download"]["commit"] == COMMIT
    assert win.library.current() == ("variant", "sea-poet")
    identity = resolve.identity(Catalog(), "sea-poet")

    # ---- chat with the variant, with this chat's own system prompt
    win.detail.buttons["chat"].click()
    chat = win.chat
    assert chat.model_name == "sea-poet"
    chat.settings_toggle.click()
    chat.system_prompt.setPlainText("You are a poet of the sea. Answer briefly.")
    chat.chat_temperature.setValue(0.9)  # sampled: a regenerate gives another answer
    chat.chat_max_tokens.setValue(12)
    qtbot.keyClicks(chat.input, "Say hello.")
    with qtbot.waitSignal(chat.answered, timeout=LONG):
        qtbot.keyClick(chat.input, Qt.Key.Key_Return)
    assert sent[-1].prompt.system == "You are a poet of the sea. Answer briefly."
    assert sent[-1].spec.identity.key == identity.key

    # ---- edit the message and send it again: a branch, the old path kept
    chat.transcript.anchorClicked.emit(QUrl("edit:0"))
    assert chat.input.toPlainText() == "Say hello."
    retype(qtbot, chat.input, "Say hello to the sea.")
    with qtbot.waitSignal(chat.answered, timeout=LONG):
        qtbot.keyClick(chat.input, Qt.Key.Key_Return)
    first, answer = chat.conversation.messages
    assert first.content == "Say hello to the sea." and (first.version, first.versions()) \
        == (1, 2)

    # ---- regenerate: a second version of the answer; step back and forth
    with qtbot.waitSignal(chat.answered, timeout=LONG):
        chat.transcript.anchorClicked.emit(QUrl("regenerate:"))
    regenerated = chat.conversation.messages[1]
    assert (regenerated.version, regenerated.versions()) == (1, 2)
    assert sent[-1].sampling.seed != sent[-2].sampling.seed
    assert "‹ 2/2 ›" in chat.transcript.toPlainText()
    chat.transcript.anchorClicked.emit(QUrl("prev:1"))
    assert chat.conversation.messages[1].content == answer.content
    assert "‹ 1/2 ›" in chat.transcript.toPlainText()
    chat.transcript.anchorClicked.emit(QUrl("next:1"))
    assert chat.conversation.messages[1].content == regenerated.content

    # ---- export the chat (Export… → Markdown)
    exported = tmp_path / "sea.md"
    monkeypatch.setattr("gui.chat.QFileDialog.getSaveFileName",
                        lambda *_a, **_k: (str(exported), "Markdown (*.md)"))
    chat.export_button.click()
    markdown = exported.read_text(encoding="utf-8")
    assert "- system prompt: You are a poet of the sea. Answer briefly." in markdown
    assert "Say hello to the sea." in markdown and regenerated.content.strip() in markdown
    conversation_id = chat.conversation.id

    # ---- compare the variant with its base (Ctrl+K)
    win.act_compare.trigger()
    view = win.compare
    assert view.variant.currentText() == "sea-poet"
    view.prompt.setPlainText("Write a short poem about the sea.")
    view.max_tokens.setValue(12)
    with qtbot.waitSignal(view.busyChanged, timeout=LONG,
                          check_params_cb=lambda busy: not busy):
        view.run_button.click()
    result = view.result
    assert result is not None and result["variant"]["identity"] == identity.key
    assert result["adapter_effect"] > 0 and view.base_side.text == result["base"]["text"]
    win.close()

    # ---- a new window on the same data directory: everything is there
    again = MainWindow()
    qtbot.addWidget(again)
    again.show()
    names = again.library.model
    assert "my-base" in names.names("model") and "poet" in names.names("adapter")
    assert "sea-poet" in names.names("variant")
    again.library.select("poet")
    page = again.detail.browser.toPlainText()
    assert "Hugging Face poets/sea-poet" in page and COMMIT in page
    again.open_chat("sea-poet")
    kept = conversations.load(conversation_id)
    again.chat.open_conversation(kept)
    assert again.chat.system_prompt.toPlainText() == \
        "You are a poet of the sea. Answer briefly."
    assert kept.messages[0].versions() == 2 and kept.messages[1].versions() == 2
    assert kept.messages[1].content == regenerated.content
    assert "‹ 2/2 ›" in again.chat.transcript.toPlainText()
    again.close()
