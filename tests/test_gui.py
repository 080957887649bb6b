"""The desktop app, offscreen, on the real embedded model through the real engine.

Covers the done-when list of the GUI issue: the wizard's happy path and refusals,
the composer, chat streaming and stop, the comparison view, the recovery banner, and
that everything survives a restart.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt

from engine.catalog import resolve
from engine.catalog.store import Catalog
from engine.curated.embedded import DEFAULT_MODEL_NAME
from engine.runtime.messages import Abort
from engine.state import conversations, settings
from gui.main_window import MainWindow
from tests import factories as f
from tests.engine_helpers import populate
from tests.gui_helpers import LONG, wait_step


@pytest.fixture
def populated(studio_home: Path, tmp_path: Path, base_info, qtbot) -> MainWindow:
    populate(Catalog(), tmp_path, base_info)
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    yield win
    win.close()


def test_library_lists_sections_with_badges_and_search(populated: MainWindow) -> None:
    model = populated.library.model
    # The OpenVINO default is listed before its first use, marked as not built.
    assert model.names("model") == [DEFAULT_MODEL_NAME, f"{DEFAULT_MODEL_NAME}-openvino"]
    # A fresh catalog may also hold the curated demo (shipped in resources/).
    assert {"a", "b"} <= set(model.names("adapter"))
    assert {"va", "vb", "va0", "vab"} <= set(model.names("variant"))
    from gui.library import BadgesRole

    badges = model.index_of("a").data(BadgesRole)
    assert badges == ("llama.cpp", "user", "unverified")
    assert model.index_of(DEFAULT_MODEL_NAME).data(BadgesRole) == ("llama.cpp", "curated")
    assert model.index_of(f"{DEFAULT_MODEL_NAME}-openvino").data(BadgesRole) == (
        "OpenVINO", "curated", "not built")
    # Long names are elided beside their badges; the tooltip gives the whole name.
    tip = model.index_of(f"{DEFAULT_MODEL_NAME}-openvino").data(Qt.ItemDataRole.ToolTipRole)
    assert tip.startswith(f"{DEFAULT_MODEL_NAME}-openvino\n") and "not built" in tip
    populated.library.search.setText("vab")
    proxy = populated.library.proxy
    variants = proxy.index(2, 0)
    assert proxy.rowCount(variants) == 1 and proxy.rowCount(proxy.index(1, 0)) == 0


def test_detail_shows_provenance_checks_and_identity(populated: MainWindow) -> None:
    populated.select("a")
    entry = populated.detail.entry
    assert entry["kind"] == "adapter" and entry["sha256"] in populated.detail.browser.toHtml()
    checks = populated.detail.checks
    statuses = {checks.rows[i]["name"]: checks.index(i, 0).data(Qt.ItemDataRole.UserRole)
                for i in range(checks.rowCount())}
    assert statuses["coverage"] == "pass" and statuses["expected base"] == "warn"
    populated.select("vab")
    html = populated.detail.browser.toHtml()
    assert resolve.identity(Catalog(), "vab").key in html and "a @ 0.5" in html


def test_a_changed_adapter_is_badged_as_a_problem(populated: MainWindow, qtbot) -> None:
    stored = Path(Catalog().adapter("b")["path"])
    stored.write_bytes(stored.read_bytes()[:-8] + b"\0" * 8)
    populated.refresh()
    from gui.library import BadgesRole, ProblemRole

    # Hashing the changed file again is left to the background check.
    model = populated.library.model
    assert "unchecked" in model.index_of("b").data(BadgesRole)
    assert "unchecked" in model.index_of("vb").data(BadgesRole)
    assert "unchecked" not in model.index_of("a").data(BadgesRole)
    qtbot.waitUntil(lambda: bool(populated.library.model.index_of("b").data(ProblemRole)),
                    timeout=LONG)
    problem = populated.library.model.index_of("b").data(ProblemRole)
    assert problem and "changed after import" in problem
    assert "problem" in populated.library.model.index_of("vb").data(ProblemRole)
    assert "unchecked" not in populated.library.model.index_of("b").data(BadgesRole)


def test_wizard_imports_an_adapter_and_creates_a_variant(window: MainWindow, tmp_path: Path,
                                                         base_info, qtbot) -> None:
    source = f.write_gguf_lora(tmp_path / "poet.gguf", base_info, seed=3, strength=0.1)
    dialog = window.import_adapter(str(source))
    assert dialog.busy() and not dialog.next_button.isEnabled()  # inspecting, off-thread
    wait_step(qtbot, dialog)
    assert dialog.state.info is not None
    dialog.next()  # summary
    assert "poet.gguf" in dialog.summary.toHtml()
    with qtbot.waitSignal(dialog.stepReady, timeout=LONG):
        dialog.next()  # base: the only compatible one is chosen and validated off-thread
        assert dialog.bases.item(0).flags() & Qt.ItemFlag.ItemIsEnabled
        assert dialog.bases.currentRow() == 0 and not dialog.next_button.isEnabled()
    dialog.next()  # report
    assert not dialog.next_button.isEnabled() and dialog.ack.isVisible()
    dialog.ack.setChecked(True)
    dialog.next()  # details
    dialog.scale.setValue(0.8)
    dialog.variant_name.setText("smol-poet")
    with qtbot.waitSignal(dialog.finished, timeout=LONG):
        dialog.next()  # import, on a worker thread
    assert dialog.result_names == {"adapter": "poet", "variant": "smol-poet"}
    assert window.library.current() == ("variant", "smol-poet")
    assert Catalog().variant("smol-poet")["adapters"] == [{"name": "poet", "scale": 0.8}]


@pytest.mark.parametrize("case", ["junk", "base model", "other backend", "taken name"])
def test_wizard_refusals(window: MainWindow, tmp_path: Path, base_info, embedded_path: Path,
                         case: str, qtbot) -> None:
    catalog_bytes = (Path(Catalog().state.path)).read_bytes()
    if case == "junk":
        path = tmp_path / "junk.gguf"
        path.write_bytes(b"not a model at all")
    elif case == "base model":
        path = embedded_path
    elif case == "other backend":
        path = f.write_peft_lora(tmp_path / "peft", base_info)
    else:
        path = f.write_gguf_lora(tmp_path / "ok.gguf", base_info)
    dialog = window.import_adapter(str(path))
    wait_step(qtbot, dialog)
    dialog.next()
    if case in ("junk", "base model"):
        assert not dialog.next_button.isEnabled()
        assert "cannot be imported" in dialog.summary.toHtml()
        expected = "not a GGUF" if case == "junk" else "is a base model"
        # Said once, on the page; the line below says what to do.
        assert expected in dialog.summary.toPlainText()
        assert expected not in dialog.blocker.text() and "another file" in dialog.blocker.text()
        assert dialog.as_model.isVisible() == (case == "base model")
    elif case == "other backend":
        dialog.next()
        item = dialog.bases.item(0)
        assert not item.flags() & Qt.ItemFlag.ItemIsEnabled and "PEFT" in item.text()
        assert not dialog.next_button.isEnabled()
        assert "no base model" in dialog.blocker.text()
    else:
        with qtbot.waitSignal(dialog.stepReady, timeout=LONG):
            dialog.next()  # the only compatible base, chosen and validated
        dialog.next()
        dialog.ack.setChecked(True)
        dialog.next()
        dialog.name.setText(DEFAULT_MODEL_NAME)
        assert not dialog.next_button.isEnabled() and "already used" in dialog.blocker.text()
    dialog.reject()
    assert Path(Catalog().state.path).read_bytes() == catalog_bytes


def test_composer_orders_scales_and_previews_identity(populated: MainWindow) -> None:
    dialog = populated.compose(adapter="a")
    dialog.name.setText("mix")
    first_key = dialog.identity.text()
    dialog._add_row("b", 1.0)
    dialog.rows[1].spin.setValue(0.25)
    assert dialog.rows[1].slider.value() == 25
    with_b = dialog.identity.text()
    dialog._move(dialog.rows[1], -1)
    assert [s.name for s in dialog.specs()] == ["b", "a"]
    assert len({first_key, with_b, dialog.identity.text()}) == 3
    dialog.rows[0].spin.setValue(99)  # range-checked
    assert dialog.rows[0].spin.value() == 10.0
    dialog.rows[0].spin.setValue(0.25)
    dialog.system.setPlainText("Answer in one sentence.")
    dialog.save()
    record = Catalog().variant("mix")
    assert record["adapters"] == [{"name": "b", "scale": 0.25}, {"name": "a", "scale": 1.0}]
    assert record["profile"]["system_prompt"] == "Answer in one sentence."
    duplicate = populated.compose(duplicate_of="mix")
    assert duplicate.name.text() == "mix-copy"
    duplicate.save()
    assert Catalog().variant("mix-copy")["adapters"] == record["adapters"]
    populated.set_default("mix")
    assert settings.load().default_model == "mix"


@pytest.mark.slow
def test_chat_streams_stops_and_survives_a_restart(populated: MainWindow, qtbot) -> None:
    chat = populated.chat
    populated.open_chat("va")
    chat.input.setPlainText("Write a short poem about the sea.")
    with qtbot.waitSignal(chat.answered, timeout=LONG):
        chat.send()
    answer = chat.conversation.messages[-1]
    assert answer.role == "assistant" and answer.content and answer.model == "va"
    assert answer.identity == resolve.identity(Catalog(), "va").key
    assert "va" in chat.transcript.toPlainText() and answer.identity[:12] in \
        chat.transcript.toPlainText()
    # Stop: no token reaches the window after the stop.
    after_stop: list[str] = []
    stopped = {"flag": False}

    def on_tokens(_side: str, text: str, _toks: list) -> None:
        if stopped["flag"]:
            after_stop.append(text)
        else:
            stopped["flag"] = True
            chat.stop()

    chat.input.setPlainText("Tell me a very long story about a lighthouse keeper.")
    with qtbot.waitSignal(chat.busyChanged, timeout=LONG,
                          check_params_cb=lambda busy: not busy):
        chat.send()
        reply = chat.reply  # its events arrive once this block waits: none is missed
        reply.tokens.connect(on_tokens)
    assert reply.outcome == "cancelled" and stopped["flag"]
    assert after_stop == []
    assert chat.conversation.messages[-1].error == "stopped"
    conversation_id = chat.conversation.id
    populated.close()
    # A restart: the conversation and the catalog are still there.
    again = MainWindow()
    qtbot.addWidget(again)
    assert {"a", "b"} <= set(again.library.model.names("adapter"))
    again.open_chat("va")
    assert again.chat.conversation.id == conversation_id
    assert [m.role for m in again.chat.conversation.messages] == ["user", "assistant"] * 2
    assert conversations.load(conversation_id).messages[1].identity == answer.identity
    again.close()


@pytest.mark.slow
def test_compare_view_fills_both_sides_and_exports(populated: MainWindow, qtbot) -> None:
    view = populated.compare
    populated.open_compare("va")
    view.prompt.setPlainText("Write a short poem about the sea.")
    view.max_tokens.setValue(24)
    with qtbot.waitSignal(view.busyChanged, timeout=LONG,
                          check_params_cb=lambda busy: not busy):
        view.run()
    result = view.result
    assert result is not None and view.base_side.text == result["base"]["text"]
    assert view.variant_side.text == result["variant"]["text"] != view.base_side.text
    div = result["first_divergence"]
    assert div is not None and "highlighted" in view.summary.text()
    assert "rgba(224,118,43" in view.variant_side.browser.toHtml().replace(" ", "")
    assert f"{result['adapter_effect']:.4f}" in view.summary.toolTip()  # the figure, for experts
    assert view.plot.base == result["base"]["logprobs"] and view.plot.divergence == div
    exported = json.loads(view.export_text("json"))
    assert exported["adapter_effect"] == result["adapter_effect"]
    markdown = view.export_text("md")
    assert result["variant"]["identity"] in markdown and "Adapter effect" in markdown
    view.select_variant("vb")  # quick switch
    assert view.variant.currentText() == "vb"


@pytest.mark.slow
def test_recovery_banner_after_the_engine_is_killed(populated: MainWindow, qtbot) -> None:
    chat = populated.chat
    populated.open_chat(DEFAULT_MODEL_NAME)
    catalog_bytes = Path(Catalog().state.path).read_bytes()

    def kill_on_first_tokens(*_args: object) -> None:
        chat.reply.tokens.disconnect(kill_on_first_tokens)
        os.kill(populated.client.pid(), signal.SIGKILL)  # a crash, mid-answer

    chat.input.setPlainText("Tell me a very long story about a lighthouse keeper.")
    with qtbot.waitSignal(populated.client.stateChanged, timeout=LONG,
                          check_params_cb=lambda state, _d: state == "crashed"):
        chat.send()
        chat.reply.tokens.connect(kill_on_first_tokens)
    qtbot.waitUntil(lambda: chat.reply is None, timeout=LONG)
    assert populated.banner.isVisible() and "engine process stopped" in \
        populated.banner.label.text()
    failed = chat.conversation.messages[-1]
    assert failed.error and failed.error.startswith("engine stopped")
    assert conversations.load(chat.conversation.id).messages[0].content.startswith("Tell me")
    assert Path(Catalog().state.path).read_bytes() == catalog_bytes
    populated.banner.retry.click()
    assert not populated.banner.isVisible()
    with qtbot.waitSignal(chat.answered, timeout=LONG):
        chat.regenerate()
    assert chat.conversation.messages[-1].content and not chat.conversation.messages[-1].error


@pytest.mark.slow
def test_native_abort_leaves_the_window_and_state_intact(studio_home: Path, tmp_path: Path,
                                                         base_info, qtbot, monkeypatch) -> None:
    """A native abort in the engine (the test-only abort request calls os.abort())."""
    monkeypatch.setenv("VARIANT_STUDIO_TEST_HOOKS", "1")
    populate(Catalog(), tmp_path, base_info)
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    win.open_chat("va")
    win.chat.input.setPlainText("Say hello.")
    with qtbot.waitSignal(win.chat.answered, timeout=LONG):
        win.chat.send()
    conversation = win.chat.conversation
    # The window's presence file (<data>/run) says how its engine is, so it is left out
    # of the state that must not change, and checked on its own.
    def state_files() -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in studio_home.rglob("*.json")
                if p.parent.name != "run"}

    saved = state_files()
    with qtbot.waitSignal(win.client.stateChanged, timeout=LONG,
                          check_params_cb=lambda state, _d: state == "crashed"):
        win.client.submit(Abort())
    assert win.isVisible() and win.banner.isVisible()
    assert "SIGABRT" in win.banner.label.text()
    assert state_files() == saved
    # The window's own slot ran before this wait's (it connected first).
    assert json.loads(win.presence.path.read_text())["engine"]["state"] == "crashed"
    assert win.chat.conversation == conversation
    assert {"va", "vb", "va0", "vab"} <= set(win.library.model.names("variant"))
    win.banner.retry.click()
    win.chat.input.setPlainText("And goodbye.")
    with qtbot.waitSignal(win.chat.answered, timeout=LONG):
        win.chat.send()
    assert len(win.chat.conversation.messages) == 4
    win.close()


def test_backend_picker_explains_an_unavailable_backend(populated: MainWindow) -> None:
    populated.open_chat("va")
    picker = populated.chat.backend
    model = picker.model()
    labels = [model.item(i).text() for i in range(model.rowCount())]
    assert labels == ["llama.cpp", "OpenVINO"]
    assert picker.backend() is None  # the variant's own backend
    other = model.item(1)  # this catalog has no OpenVINO counterpart of the base
    assert not other.isEnabled() and not picker.isEnabled()
    assert "no counterpart on openvino" in other.toolTip()


def test_first_run_of_the_app_has_the_demo_and_a_train_tab(window: MainWindow) -> None:
    assert "tool-calls" in window.library.model.names("variant")
    titles = [window.tabs.tabText(i) for i in range(window.tabs.count())]
    assert titles == ["Details", "Chat", "Compare", "Train", "Evaluate", "Server"]
    assert window.train.base.count() >= 1
    # The window opens on something to look at, not an empty detail pane.
    assert window.library.current() == ("variant", "tool-calls")
    assert window.chat.model_name == "tool-calls"


@pytest.mark.slow
def test_openvino_from_the_window(populated: MainWindow, qtbot, tmp_path_factory) -> None:
    """Build the OpenVINO default, give an adapter its PEFT file, chat on OpenVINO."""
    from tests.openvino_helpers import first_build

    first_build(tmp_path_factory)  # the run's build cache: the window finds it there
    picker = populated.chat.backend
    populated.open_chat("va")
    assert not picker.model().item(1).isEnabled()
    # Before its first use the library lists it as not built, with only a Build button.
    name = "smollm2-135m-instruct-openvino"

    def row() -> Any:
        return populated.library.model.entry(populated.library.model.index_of(name))

    assert "not built" in row().badges
    populated.select(name)
    assert populated.detail.entry["built"] is False
    assert populated.detail.buttons["build"].isVisibleTo(populated.detail)
    assert not populated.detail.buttons["chat"].isVisibleTo(populated.detail)
    with qtbot.waitSignal(populated.openvino.finished, timeout=LONG) as built:
        populated.detail.buttons["build"].click()
    assert built.args == ["built"]
    qtbot.waitUntil(lambda: "not built" not in row().badges, timeout=LONG)
    assert populated.detail.entry["name"] == name and populated.detail.entry["sha256"]
    populated.select("a")
    # Waited on from before the conversion starts: its end cannot be missed.
    with qtbot.waitSignal(populated.events.catalogChanged, timeout=LONG,
                          check_params_cb=lambda kinds, names: names == ["a"]):
        populated.detail.buttons["convert"].click()
    assert "openvino" in Catalog().adapter("a").get("files", {})
    populated.select("va")
    populated.open_chat("va")
    assert picker.model().item(1).isEnabled() and picker.isEnabled()
    picker.setCurrentIndex(1)
    assert picker.backend() == "openvino"
    populated.chat.input.setPlainText("Write a short poem about the sea.")
    with qtbot.waitSignal(populated.chat.answered, timeout=LONG):
        populated.chat.send()
    answer = populated.chat.conversation.messages[-1]
    assert answer.backend == "openvino" and answer.content
    assert answer.identity == resolve.identity(Catalog(), "va", backend="openvino").key


def test_catalog_changes_are_announced_and_refresh_only_who_shows_them(
        window: MainWindow, qtbot, monkeypatch) -> None:
    """Each operation announces what it changed (kinds, names); each view refreshes for
    the kinds it shows, not after every change."""
    from PySide6.QtWidgets import QMessageBox

    refreshed: list[str] = []
    monkeypatch.setattr(window, "refresh", lambda: refreshed.append("library"))
    monkeypatch.setattr(window.train, "refresh", lambda: refreshed.append("train"))
    monkeypatch.setattr(window.compare, "set_variants",
                        lambda *_a, **_k: refreshed.append("compare"))
    announced: list[tuple[list[str], list[str]]] = []
    window.events.catalogChanged.connect(lambda kinds, names: announced.append((kinds, names)))

    dialog = window.compose(adapter="tool-calls-lora")
    dialog.name.setText("short-calls")
    dialog.save()
    assert announced[-1] == (["variant"], ["short-calls"])
    assert sorted(refreshed) == ["compare", "library"]  # the Train page lists no variants

    refreshed.clear()
    shown = window.library.current()[1]
    assert window.detail.buttons["default"].isEnabled()
    window.set_default(shown)
    assert announced[-1] == (["default"], [shown]) and refreshed == []
    assert settings.load().default_model == shown
    assert not window.detail.buttons["default"].isEnabled()  # shown at once

    refreshed.clear()
    monkeypatch.setattr(QMessageBox, "question",
                        lambda *_a, **_k: QMessageBox.StandardButton.Yes)
    window.remove_entry("short-calls")
    assert announced[-1] == (["variant"], ["short-calls"])
    assert sorted(refreshed) == ["compare", "library"]
    assert "short-calls" not in Catalog().data()["variants"]

    refreshed.clear()
    window.events.changed(["adapter"], ["tool-calls-lora"])  # as a conversion does
    assert sorted(refreshed) == ["library", "train"]
