"""The Train page (offscreen): a short training run from the form to the new variant,
a cancelled run that imports nothing, and the hint when PyTorch is missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.catalog.store import Catalog
from engine.curated.embedded import DEFAULT_MODEL_NAME as BASE
from gui.train_page import TrainPage
from tests.gui_helpers import LONG
from tests.gui_helpers import make_train_page as make_page


def small_data(path: Path) -> Path:
    rows = [{"prompt": f"Q: {i} + 1 =", "completion": f" {i + 1}"} for i in range(12)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def page(qtbot, studio_home: Path):
    widget = make_page(qtbot)
    yield widget
    widget.controller.shutdown()  # never leave a worker behind


def fill(page: TrainPage, data: Path, name: str, steps: int) -> None:
    page.base.setCurrentText(BASE)
    page.data.setText(str(data))
    page.name.setText(name)
    page.variant.setText(f"{name}-v")
    page.steps.setValue(steps)
    page.advanced_toggle.setChecked(True)
    page.seq_len.setValue(40)
    page.batch.setValue(2)
    page.rank.setValue(4)


@pytest.mark.slow
def test_short_training_lands_on_the_new_variant(qtbot, page: TrainPage,
                                                 tmp_path: Path) -> None:
    fill(page, small_data(tmp_path / "d.jsonl"), "gui-a", 3)
    assert not page.advanced.isHidden()
    steps: list[int] = []
    page.client.progress.connect(lambda e: steps.append(e["step"]))
    warnings: list[str] = []
    page.client.warning.connect(warnings.append)
    with qtbot.waitSignal(page.controller.events.catalogChanged, timeout=LONG) as changed, \
            qtbot.waitSignal(page.controller.variantCreated, timeout=LONG) as created:
        page.start_button.click()
        assert page.busy() and not page.start_button.isEnabled()
        assert page.cancel_button.isEnabled() and not page.steps.isEnabled()
    assert created.args == ["gui-a-v"]
    assert changed.args == [["adapter", "variant"], ["gui-a", "gui-a-v"]]
    assert steps == [1, 2, 3]
    assert [s for s, _ in page.plot.points] == [1, 2, 3]
    assert page.progress.maximum() == 3 and page.progress.value() == 3
    assert any("small data" in w for w in warnings) and not page.warnings.isHidden()
    assert page.status.text().startswith("Done: adapter gui-a")
    assert not page.busy() and page.start_button.isEnabled() and page.steps.isEnabled()
    catalog = Catalog()
    assert catalog.variant("gui-a-v")["adapters"] == [{"name": "gui-a", "scale": 1.0}]
    record = catalog.adapter("gui-a")["provenance"]
    assert record["config"]["rank"] == 4 and record["steps"] == 3
    assert page.init_adapter.findText("gui-a") >= 0  # the page refreshed its choices


@pytest.mark.slow
def test_cancel_stops_the_run_and_imports_nothing(qtbot, page: TrainPage,
                                                  tmp_path: Path) -> None:
    fill(page, small_data(tmp_path / "d.jsonl"), "gui-c", 200)
    page.save_every.setValue(1)
    with qtbot.waitSignal(page.client.progress, timeout=LONG):
        page.start_button.click()
    with qtbot.assertNotEmitted(page.controller.variantCreated), \
            qtbot.assertNotEmitted(page.controller.events.catalogChanged), \
            qtbot.assertNotEmitted(page.client.finished), \
            qtbot.waitSignal(page.client.cancelled, timeout=120_000) as cancelled:
        page.cancel_button.click()
        assert page.status.text() == "Cancelling…" and not page.cancel_button.isEnabled()
    checkpoint = Path(cancelled.args[0])
    assert checkpoint.is_file()
    assert page.status.text().startswith("Cancelled. The last checkpoint is")
    assert not page.busy() and page.start_button.isEnabled()
    assert not page.cancel_button.isEnabled() and page.name.isEnabled()
    assert 1 <= len(page.plot.points) < 200
    data = Catalog().data()
    assert "gui-c" not in data["adapters"] and "gui-c-v" not in data["variants"]


def test_bad_requests_are_refused_in_the_page(qtbot, page: TrainPage, tmp_path: Path) -> None:
    page.start_button.click()
    assert page.status.text() == "give the new adapter a name" and not page.busy()
    fill(page, tmp_path / "missing.jsonl", "gui-x", 3)
    page.start_button.click()
    assert "does not exist" in page.status.text() and not page.busy()
    fill(page, small_data(tmp_path / "d.jsonl"), BASE, 3)
    page.progress.setValue(page.progress.maximum())  # as a finished earlier run leaves it
    page.start_button.click()
    assert f"the name '{BASE}' is already used by a model" == page.status.text()
    assert not page.busy() and page.progress.value() == 0


def test_a_run_too_large_is_refused_with_its_estimate(qtbot, page: TrainPage, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker estimates the run's peak memory before the base loads: the page shows
    the estimate, and the refusal with the settings that would fit. (The available memory
    is a cap in the environment: nothing is allocated.)"""
    from engine.training import memory

    monkeypatch.setenv(memory.MEMORY_ENV, "1.0")
    fill(page, small_data(tmp_path / "d.jsonl"), "gui-big", 3)
    page.batch.setValue(64)
    page.seq_len.setValue(1024)
    estimates: list[dict] = []
    page.client.memory.connect(estimates.append)
    with qtbot.waitSignal(page.client.failed, timeout=LONG):
        page.start_button.click()
    assert len(estimates) == 1 and estimates[0]["refusal"]
    assert not page.memory.isHidden()
    assert page.memory.text().startswith("Memory: about ")
    assert f"available ({memory.MEMORY_ENV}=1.0)" in page.memory.text()
    assert "Training failed: this run needs about" in page.status.text()
    assert "would fit" in page.status.text()
    assert not page.busy() and "gui-big" not in Catalog().data()["adapters"]


def test_the_page_shows_the_estimate_and_seconds_per_step(qtbot, page: TrainPage) -> None:
    page.client._on_event({"event": "memory", "total": 3 << 30, "batch": 1, "seq_len": 256,
                           "parts": {"file": 2 << 30, "layer": 1 << 29, "logits": 1 << 28,
                                     "checkpoints": 1 << 27},
                           "available": 20 << 30, "available_source": "MemAvailable",
                           "keep_products": False, "refusal": None})
    assert page.memory.text() == (
        "Memory: about 3.0 GB at the peak for batch 1 × seq-len 256, recomputing each layer "
        "whole (file 2.0 GB, layer 512 MB, logits 256 MB, checkpoints 128 MB); 20.0 GB "
        "available (MemAvailable).")
    page.client._on_event({"event": "progress", "step": 3, "steps": 10, "loss": 1.5,
                           "lr": 1e-3, "seconds": 36.0, "step_seconds": 12.0, "eta": 84.0})
    assert "12.0 s/step" in page.status.text() and "about 1:24 left" in page.status.text()
    assert page.progress.value() == 3


def test_missing_torch_explains_how_to_enable_training(qtbot, studio_home: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("engine.training.torch_available", lambda: False)
    widget = make_page(qtbot)
    assert "Training is off" in widget.hint.text()
    assert "pip install 'variant-studio[train]'" in widget.hint.text()
    assert not widget.start_button.isEnabled()


@pytest.mark.slow
def test_a_run_from_the_window_lands_on_the_new_variant(qtbot, window, tmp_path: Path
                                                        ) -> None:
    """In the app, the finished run's variant is selected in the library and shown."""
    page = window.train
    window.tabs.setCurrentWidget(page)
    fill(page, small_data(tmp_path / "d.jsonl"), "win-a", 2)
    with qtbot.waitSignal(window.training.variantCreated, timeout=LONG):
        page.start_button.click()
    qtbot.waitUntil(lambda: window.library.current() == ("variant", "win-a-v"),
                    timeout=60_000)
    assert "win-a" in window.library.model.names("adapter")
    assert window.detail.entry["name"] == "win-a-v"
    assert window.detail.entry["adapters"][0]["name"] == "win-a"
    assert window.chat.model_name == "win-a-v"
    assert "trained variant win-a-v" in window.statusBar().currentMessage()


def test_the_kl_setting_goes_with_supervised_runs_only(qtbot, page: TrainPage,
                                                        tmp_path: Path) -> None:
    fill(page, small_data(tmp_path / "d.jsonl"), "gui-kl", 3)
    page.kl.setValue(0.5)
    assert page.request().settings["kl"] == 0.5 and page.request().kl_text is None
    page.kl_text.setText(" /data/prose.txt ")
    assert page.request().kl_text == "/data/prose.txt"
    page.dpo.setChecked(True)  # DPO's reference is its beta: no KL setting is sent
    assert "kl" not in page.request().settings and page.request().kl_text is None
    page.dpo.setChecked(False)
    assert page.kl.isVisibleTo(page) and page.kl_text.isVisibleTo(page)
    page.method.setCurrentIndex(page.method.findData("reinforce"))
    assert not page.kl.isVisibleTo(page) and not page.kl_text.isVisibleTo(page)


def test_the_suggested_variant_name_is_replaced_by_what_the_user_types(page: TrainPage,
                                                                      qtbot) -> None:
    from PySide6.QtCore import QEvent, Qt
    from PySide6.QtGui import QFocusEvent
    from PySide6.QtWidgets import QApplication

    qtbot.keyClicks(page.name, "gui-style")
    assert page.variant.text() == "gui-style-variant" and page.variant.is_suggestion()
    # Coming to the field (a click) selects the suggestion, so typing replaces it.
    QApplication.sendEvent(page.variant, QFocusEvent(QEvent.Type.FocusIn,
                                                      Qt.FocusReason.MouseFocusReason))
    qtbot.waitUntil(page.variant.hasSelectedText)
    qtbot.keyClicks(page.variant, "gui-style-chat")
    assert page.variant.text() == "gui-style-chat" and not page.variant.is_suggestion()
    # The user's own name stays when the adapter name changes again.
    qtbot.keyClicks(page.name, "2")
    assert page.variant.text() == "gui-style-chat"
    # Cleared on purpose (adapter only): it stays empty.
    page.variant.clear()
    qtbot.keyClicks(page.variant, "x")
    qtbot.keyClick(page.variant, Qt.Key.Key_Backspace)
    qtbot.keyClicks(page.name, "3")
    assert page.variant.text() == ""
