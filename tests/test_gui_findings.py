"""Issue 14's findings in the window, each held here (offscreen; no model is run):
the composer's text and "Add adapter", the wizard's human text, its preselected base,
its typed path, its disabled OpenVINO base and its base-model hint, Settings' data
directory and backend names, full names in the library, a search that filters without
moving the selection, and Train's stale refusal."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QFontMetrics, QGuiApplication

from engine.catalog import imports
from engine.catalog.store import Catalog
from engine.curated import setup
from engine.curated.demo import ADAPTER_NAME, VARIANT_NAME
from engine.curated.embedded import DEFAULT_MODEL_NAME as BASE
from engine.state import paths
from gui.library import display_name
from gui.main_window import MainWindow
from gui.settings_dialog import SettingsDialog
from tests import factories as f
from tests.gui_helpers import LONG, SHORT, wait_step

PYTHON_REPR = re.compile(r"\[['\"]|\bNone\b|\bTrue\b|\bFalse\b")


@pytest.fixture
def win(studio_home: Path, tmp_path: Path, base_info, qtbot):
    catalog = Catalog()
    setup.first_run(catalog, with_demo=True)
    for name, seed in (("a", 1), ("b", 2)):
        imports.add_adapter(catalog, name, BASE,
                            f.write_gguf_lora(tmp_path / f"{name}.gguf", base_info, seed=seed,
                                              strength=0.1))
    window = MainWindow()
    qtbot.addWidget(window)
    window.show()
    yield window
    window.close()


def test_composer_adds_the_next_unused_adapter_and_shows_plain_text(win: MainWindow) -> None:
    dialog = win.compose()
    assert [r.spec().name for r in dialog.rows] == ["a"]
    dialog.add_button.click()
    dialog.add_button.click()
    assert [r.spec().name for r in dialog.rows] == ["a", "b", ADAPTER_NAME]
    assert not dialog.add_button.isEnabled() and "Every adapter" in dialog.add_button.toolTip()
    assert dialog.error.text() == ""  # no duplicate, no error
    dialog.add_button.click()
    assert len(dialog.rows) == 3
    dialog.name.setText(VARIANT_NAME)
    assert dialog.error.text() == f"the name '{VARIANT_NAME}' is already used"
    assert dialog.error.textFormat() == Qt.TextFormat.PlainText
    dialog.reject()


def test_the_wizard_speaks_plainly_and_preselects_the_only_base(win: MainWindow,
                                                                tmp_path: Path, base_info,
                                                                qtbot) -> None:
    source = f.write_gguf_lora(tmp_path / "plain.gguf", base_info, seed=9, strength=0.1)
    dialog = win.import_adapter()
    # A typed path is inspected once the typing pauses, without Enter.
    with qtbot.waitSignal(dialog.stepReady, timeout=LONG):
        qtbot.keyClicks(dialog.path, str(source))
    assert dialog.state.info is not None and dialog.state.path == source
    dialog.next()
    summary = dialog.summary.toPlainText()
    assert "attn_q, attn_v" in summary or "attn_" in summary
    assert not PYTHON_REPR.search(summary), summary
    assert "Targets" in summary and "not declared" in summary
    with qtbot.waitSignal(dialog.stepReady, timeout=LONG):
        dialog.next()
    assert dialog.state.base == BASE and dialog.bases.currentRow() == 0
    rows = [dialog.bases.item(r) for r in range(dialog.bases.count())]
    pending = [r for r in rows if "OpenVINO" in r.text()]
    assert pending and not pending[0].flags() & Qt.ItemFlag.ItemIsEnabled
    assert "not built yet" in pending[0].toolTip()
    assert "(llama.cpp)" in rows[0].text()
    dialog.reject()


def test_a_base_model_in_the_wizard_is_added_as_one(win: MainWindow, tmp_path: Path,
                                                    embedded_path: Path, qtbot) -> None:
    copy = tmp_path / "another-base.gguf"
    copy.write_bytes(embedded_path.read_bytes())
    dialog = win.import_adapter(str(copy))
    wait_step(qtbot, dialog)
    dialog.next()
    assert dialog.as_model.isVisible()
    with qtbot.waitSignal(win.events.catalogChanged, timeout=LONG) as changed:
        dialog.as_model.click()
    assert changed.args == [["model"], ["another-base"]]
    assert not dialog.isVisible() and win.library.current() == ("model", "another-base")


def test_settings_show_the_data_directory_whole_and_say_llama_cpp(win: MainWindow,
                                                                   qtbot) -> None:
    dialog = SettingsDialog("system", win)
    qtbot.addWidget(dialog)
    home = str(paths.data_dir())
    label = dialog.data_dir_now
    label.resize(160, label.height())
    shown = label.elided()
    assert label.toolTip() == home and "…" in shown
    assert shown.startswith(home[:2]) and shown.endswith(home[-3:])  # the middle goes
    assert [dialog.backend.itemText(i) for i in range(dialog.backend.count())] == \
        ["llama.cpp", "OpenVINO"]
    assert dialog.backend.currentData() == "llama"


def test_library_keeps_long_names_apart_and_search_keeps_the_selection(
        win: MainWindow, qtbot) -> None:
    metrics = QFontMetrics(win.library.tree.font())
    one, two = "smollm2-135m-instruct", "smollm2-135m-instruct-openvino"
    width = metrics.horizontalAdvance("smollm2-135m-i…")
    a, b = display_name(metrics, one, width), display_name(metrics, two, width)
    assert a != b and a.endswith("ruct") and b.endswith("vino")

    win.open_compare(VARIANT_NAME)
    assert win.library.current() == ("variant", VARIANT_NAME)
    win.library.search.setText("b")  # matches adapter b only: the variant is hidden
    assert win.library.current() == ("variant", VARIANT_NAME)
    assert win.compare.variant.currentText() == VARIANT_NAME
    assert win.chat.model_name == VARIANT_NAME
    win.library.search.setText("no-such-entry")
    assert win.library.no_matches.isVisible()
    section = win.library.proxy.index(2, 0)
    assert win.library.proxy.data(section) == "Variants  (0 of 1)"
    assert win.library.current() == ("variant", VARIANT_NAME)
    win.library.search.setText("")
    assert not win.library.no_matches.isVisible()
    assert win.library.current() == ("variant", VARIANT_NAME)
    index = win.library.tree.currentIndex()
    assert index.isValid() and index.data() == VARIANT_NAME


def test_train_forgets_a_refusal_once_the_user_acts_on_it(win: MainWindow, qtbot) -> None:
    page = win.train
    page.name.setText("")
    page.data.setText("")
    page.start()
    # Training is on: PyTorch is installed (scripts/setup.sh); without it this fails.
    assert page.status.text() == "give the new adapter a name"
    qtbot.keyClicks(page.name, "mine")
    qtbot.waitUntil(lambda: page.status.text() == "Ready.", timeout=SHORT)


def test_details_use_human_labels_and_short_digests_with_copy(win: MainWindow) -> None:
    win.select(VARIANT_NAME)
    text = win.detail.browser.toPlainText()
    assert "Start-of-text token" in text and "not added (token 1)" in text
    assert "Base digest" in text and "bos_policy" not in text and "base_sha256" not in text
    assert "Runtime\nllama.cpp" in text
    identity = win.detail.entry["identity"]
    assert identity not in text and f"{identity[:12]}…{identity[-4:]}" in text
    assert f'href="copy:{identity}"' in win.detail.browser.toHtml()
    win.detail.browser.anchorClicked.emit(QUrl(f"copy:{identity}"))
    assert QGuiApplication.clipboard().text() == identity
