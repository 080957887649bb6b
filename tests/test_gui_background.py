"""Long work stays off the GUI thread, with progress and a working cancel; the
engine picks up a changed thread count when it restarts.

Offscreen, on the real embedded model and real files. Where a test has to catch work
in the middle, it holds the worker at a gate (a threading.Event) that only the GUI
thread opens: if that work ran on the GUI thread, the gate could never open and the
test would fail rather than pass by luck. Nothing waits on a sleep.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QPushButton

from engine.catalog import digest, imports, validation
from engine.catalog.resolve import resolve
from engine.catalog.store import Catalog
from engine.catalog.wizard import ImportWizard
from engine.curated.embedded import DEFAULT_MODEL_NAME
from engine.runtime.messages import Open
from engine.state import paths, settings
from gui.library import BadgesRole, ProblemRole
from gui.main_window import MainWindow
from gui.settings_dialog import SettingsDialog
from gui.wizard import ImportDialog
from tests import factories as f
from tests.engine_helpers import populate
from tests.gui_helpers import LONG, drive_modal, wait_step

GATE = 120  # s: how long a held worker waits for the GUI thread before giving up


def on_gui_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def threads_text(count: int) -> str:
    return f"{count} thread{'' if count == 1 else 's'}"


def catalog_bytes() -> bytes:
    return Path(Catalog().state.path).read_bytes()


def to_details(qtbot, dialog: ImportDialog) -> None:
    """Drive the wizard from a chosen file to its last page, the user's way."""
    wait_step(qtbot, dialog)
    dialog.next()  # summary
    dialog.next()  # base
    with qtbot.waitSignal(dialog.stepReady, timeout=LONG):
        dialog.bases.setCurrentRow(0)
    dialog.next()  # report
    dialog.ack.setChecked(True)
    dialog.next()  # details
    assert dialog.next_button.text() == "Import" and dialog.next_button.isEnabled()


def hold_hashing(monkeypatch: pytest.MonkeyPatch, which: Any) -> tuple[threading.Event,
                                                                       threading.Event]:
    """Hold the hashing of files for which `which(path)` is true after its first chunk.

    Returns (reached, release): reached is set on the worker once a chunk has been
    hashed and reported; the worker then waits for release.
    """
    reached, release = threading.Event(), threading.Event()
    real = digest.hash_uncached

    def held(path: Path, progress=None, cancelled=None):
        if not which(Path(path)):
            return real(path, progress, cancelled)
        assert not on_gui_thread(), f"{Path(path).name} is hashed on the GUI thread"

        def first_chunk(done: int, total: int) -> None:
            if progress:
                progress(done, total)
            if not reached.is_set():
                reached.set()
                assert release.wait(GATE), "the GUI thread never released the worker"

        return real(path, first_chunk, cancelled)

    monkeypatch.setattr(digest, "hash_uncached", held)
    return reached, release


# --------------------------------------------------------------------------- engine threads


def test_a_thread_change_in_settings_reaches_the_restarted_engine(window: MainWindow,
                                                                  qtbot) -> None:
    with qtbot.waitSignal(window.client.described, timeout=LONG) as first:
        window.client.describe()
    before = first.args[0]
    target = 3 if before["n_threads"] != 3 else 2
    assert window.threads_label.text() == threads_text(before["n_threads"])

    def change_threads(dialog: SettingsDialog) -> None:
        dialog.threads.setValue(target)
        dialog.save()  # OK: saves and accepts

    drive_modal(lambda: next((d for d in window.findChildren(SettingsDialog)
                              if d.isVisible()), None), change_threads)
    with qtbot.waitSignal(window.client.described, timeout=LONG,
                          check_params_cb=lambda info: info["pid"] != before["pid"]) as after:
        window.open_settings()  # thread changes restart the engine
    info = after.args[0]
    assert settings.load().threads == target
    assert info["n_threads"] == target
    assert window.threads_label.text() == threads_text(target)
    # A restart the user asked for is no crash: no banner, the engine runs again.
    assert not window.banner.isVisible()
    assert window.client.state == "running" and window.client.pid() == info["pid"]
    environ = Path(f"/proc/{info['pid']}/environ").read_bytes().split(b"\0")
    assert f"VARIANT_STUDIO_THREADS={target}".encode() in environ
    # The sessions the new engine opens (the llama.cpp context) use that count.
    # The reply's events are delivered on this thread's event loop: none arrives before
    # the wait below has begun.
    reply = window.client.submit(Open(resolve(window.catalog, DEFAULT_MODEL_NAME)))
    with qtbot.waitSignal(reply.finished, timeout=LONG) as opened:
        pass
    described = opened.args[0]
    assert described["n_threads"] == target
    assert [r["base"] for r in described["residents"]] == [DEFAULT_MODEL_NAME]


# --------------------------------------------------------------------------- base models


def test_adding_a_base_model_shows_progress_and_cancel_adds_nothing(
        window: MainWindow, tmp_path: Path, embedded_path: Path, qtbot,
        monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / "my-base.gguf"
    shutil.copyfile(embedded_path, copy)  # a ~100 MB file whose digest is not cached
    before = catalog_bytes()
    real_hash = digest.hash_uncached
    reached, release = hold_hashing(monkeypatch, lambda p: p == copy)
    task = window.add_model(str(copy))
    dialog = window.model_progress
    assert task is not None and dialog is not None and dialog.isVisible()
    qtbot.waitUntil(reached.is_set, timeout=LONG)
    qtbot.waitUntil(lambda: dialog.value() > 0, timeout=LONG)  # progress is shown
    assert dialog.value() < dialog.maximum()
    cancel = dialog.findChild(QPushButton)
    assert cancel.text() == "Cancel"
    with qtbot.waitSignal(task.done, timeout=LONG):
        cancel.click()
        release.set()
    assert catalog_bytes() == before
    assert "my-base" not in Catalog().data()["models"]
    assert "my-base" not in window.library.model.names("model")
    assert digest.cached_digest(copy) is None  # the hash stopped part-way
    assert not dialog.isVisible()
    assert "nothing was added" in window.statusBar().currentMessage()

    # Without a cancel it is added, selected, and the progress ran to the end. The wait
    # begins before the work does, so its end cannot be missed.
    monkeypatch.setattr(digest, "hash_uncached", real_hash)
    values: list[int] = []
    with qtbot.waitSignal(window.events.catalogChanged, timeout=LONG,
                          check_params_cb=lambda kinds, names: (kinds, names) == (
                              ["model"], ["my-base"])):
        task = window.add_model(str(copy))
        task.progress.connect(lambda done, _total: values.append(done))
    assert task.outcome == "succeeded"
    assert values and values[-1] == 1000
    assert Catalog().model("my-base")["sha256"] == digest.cached_digest(copy)
    assert window.library.current() == ("model", "my-base")


def test_file_add_base_model_asks_for_a_file_and_suggests_a_valid_name(
        window: MainWindow, tmp_path: Path, embedded_path: Path, qtbot,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """File → Add base model: the file dialog's choice is added (not the action's
    `checked` flag), under an ASCII name valid for the catalog."""
    copy = tmp_path / "modèle (v2).gguf"
    shutil.copyfile(embedded_path, copy)
    asked: list[str] = []

    def choose(_parent, title, *_args, **_kwargs) -> tuple[str, str]:
        asked.append(title)
        return str(copy), ""

    monkeypatch.setattr("gui.main_window.QFileDialog.getOpenFileName", choose)
    with qtbot.waitSignal(window.events.catalogChanged, timeout=LONG) as changed:
        window.act_model.trigger()
    assert asked == ["Base model (GGUF)"]
    assert changed.args == [["model"], ["modele-v2"]]
    assert Path(Catalog().model("modele-v2")["path"]).resolve() == copy.resolve()
    assert window.library.current() == ("model", "modele-v2")
    assert "added base model modele-v2" in window.statusBar().currentMessage()


# --------------------------------------------------------------------------- the wizard


def test_the_wizard_inspects_and_validates_off_the_gui_thread_and_can_stop(
        window: MainWindow, tmp_path: Path, base_info, qtbot,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A rank-64 adapter: ~15 MB of weights for the value scan to read.
    source = f.write_gguf_lora(tmp_path / "big.gguf", base_info, rank=64, seed=4)
    threads: dict[str, list[bool]] = {"inspect": [], "validate": [], "values": []}
    for method in ("inspect", "validate"):
        real_method = getattr(ImportWizard, method)

        def recorded(self, *args, _real=real_method, _name=method, **kwargs):
            threads[_name].append(on_gui_thread())
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(ImportWizard, method, recorded)
    # The value scan waits until the GUI thread has shown it is free (a timer on it
    # fired three times), then until the test releases it.
    ticks: list[int] = []
    gui_alive, release = threading.Event(), threading.Event()
    timer = QTimer()
    timer.setInterval(5)
    timer.timeout.connect(lambda: (ticks.append(1), len(ticks) >= 3 and gui_alive.set()))
    real_values = validation._values

    def held_values(adapter, progress=None, cancelled=None):
        threads["values"].append(on_gui_thread())
        assert gui_alive.wait(GATE), "the GUI thread is blocked during the value scan"
        assert release.wait(GATE)
        return real_values(adapter, progress, cancelled)

    monkeypatch.setattr(validation, "_values", held_values)

    dialog = window.import_adapter(str(source))
    wait_step(qtbot, dialog)
    assert dialog.state.info is not None and dialog.state.info.rank == 64
    dialog.next()
    timer.start()
    # The base page chooses the only compatible base: stopped by the user while the
    # scan runs.
    dialog.next()
    assert dialog.bases.currentRow() == 0
    assert dialog.busy() and dialog.progress.isVisible()
    assert not dialog.next_button.isEnabled() and dialog.cancel_button.text() == "Stop"
    qtbot.waitUntil(gui_alive.is_set, timeout=LONG)
    with qtbot.waitSignal(dialog.stepReady, timeout=LONG):
        dialog.cancel_button.click()
        release.set()
    assert dialog.isVisible() and not dialog.busy()  # stopping the check keeps the dialog
    assert dialog.state.base is None and dialog.state.report is None
    assert "stopped" in dialog.blocker.text() and not dialog.next_button.isEnabled()
    # Chosen again (a click on it): it runs to the end and its report is applied.
    with qtbot.waitSignal(dialog.stepReady, timeout=LONG):
        rect = dialog.bases.visualItemRect(dialog.bases.item(0))
        qtbot.mouseClick(dialog.bases.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    timer.stop()
    assert dialog.state.base == DEFAULT_MODEL_NAME
    values = [c for c in dialog.state.report.checks if c.name == "values"]
    assert [c.status for c in values] == ["pass"]
    assert dialog.next_button.isEnabled()
    assert threads["inspect"] == [False] and threads["validate"] == [False, False]
    assert threads["values"] == [False, False]
    dialog.reject()


def test_cancelling_the_import_of_a_large_adapter_adds_nothing(
        window: MainWindow, tmp_path: Path, base_info, qtbot,
        monkeypatch: pytest.MonkeyPatch) -> None:
    source = f.write_gguf_lora(tmp_path / "large.gguf", base_info, rank=64, seed=6)
    dialog = window.import_adapter(str(source))
    to_details(qtbot, dialog)
    before = catalog_bytes()
    store = paths.data_dir() / "adapters"
    stored_before = sorted(p.name for p in store.iterdir()) if store.exists() else []
    # Hold the hash of the staged copy (the last pass before the catalog is written).
    reached, release = hold_hashing(monkeypatch, lambda p: ".import-" in str(p))
    dialog.next()  # Import
    task = dialog.task
    assert task is not None and dialog.cancel_button.text() == "Cancel import"
    qtbot.waitUntil(reached.is_set, timeout=LONG)
    qtbot.waitUntil(lambda: dialog.progress.value() > 666, timeout=LONG)  # copy, scan done
    assert dialog.progress.isVisible() and not dialog.next_button.isEnabled()
    with qtbot.waitSignal(task.done, timeout=LONG):
        dialog.cancel_button.click()
        release.set()
    assert catalog_bytes() == before
    assert "large" not in Catalog().data()["adapters"]
    assert sorted(p.name for p in store.iterdir()) == stored_before  # no copy, no staging
    assert dialog.isVisible() and dialog.result_names == {}
    assert "nothing was added" in dialog.blocker.text()
    assert "large" not in window.library.model.names("adapter")
    dialog.reject()


# --------------------------------------------------------------------------- the library


def test_a_refresh_reads_no_whole_file_on_the_gui_thread(
        studio_home: Path, tmp_path: Path, base_info, embedded_path: Path, qtbot,
        monkeypatch: pytest.MonkeyPatch) -> None:
    catalog = Catalog()
    populate(catalog, tmp_path, base_info)
    copy = tmp_path / "other-base.gguf"
    shutil.copyfile(embedded_path, copy)
    imports.add_model(catalog, "other-base", copy)
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    reads: list[tuple[str, bool]] = []
    real_hash, real_values = digest.hash_uncached, validation._values

    def hash_recorded(path, progress=None, cancelled=None):
        reads.append((Path(path).name, on_gui_thread()))
        return real_hash(path, progress, cancelled)

    def values_recorded(adapter, progress=None, cancelled=None):
        reads.append((Path(adapter.path).name, on_gui_thread()))
        return real_values(adapter, progress, cancelled)

    monkeypatch.setattr(digest, "hash_uncached", hash_recorded)
    monkeypatch.setattr(validation, "_values", values_recorded)
    # Unchanged files: everything is answered from the caches and the import records.
    win.refresh()
    for name in ("a", "va", "vab", DEFAULT_MODEL_NAME):
        win.select(name)
        assert win.detail.entry["name"] == name
    assert reads == [] and not win.check_label.isVisible()

    # The second base changes on disk: its entry waits for the background check,
    # which the user can stop and start again.
    with copy.open("ab") as handle:
        handle.write(b"\0" * 64)
    reached, release = hold_hashing(monkeypatch, lambda p: p == copy)
    win.refresh()
    model = win.library.model
    assert "unchecked" in model.index_of("other-base").data(BadgesRole)
    assert "unchecked" not in model.index_of(DEFAULT_MODEL_NAME).data(BadgesRole)
    assert model.index_of("other-base").data(ProblemRole) is None  # not known yet
    win.select("other-base")
    assert win.detail.entry is None and "Checking" in win.detail.browser.toPlainText()
    qtbot.waitUntil(reached.is_set, timeout=LONG)
    assert win.check_label.isVisible() and win.check_button.text() == "Stop"
    with qtbot.waitSignal(win.library_check.task.done, timeout=LONG):
        win.check_button.click()
        release.set()
    assert "stopped" in win.check_label.text() and win.check_button.text() == "Check now"
    assert "unchecked" in model.index_of("other-base").data(BadgesRole)
    monkeypatch.setattr(digest, "hash_uncached", hash_recorded)
    reads.clear()
    win.check_button.click()  # Check now
    qtbot.waitUntil(lambda: bool(model.index_of("other-base").data(ProblemRole)),
                    timeout=LONG)
    assert "file changed on disk" in model.index_of("other-base").data(ProblemRole)
    assert "unchecked" not in model.index_of("other-base").data(BadgesRole)
    assert reads == [(copy.name, False)]  # one read, on the worker
    assert win.detail.entry["name"] == "other-base"  # the pane caught up by itself
    assert not win.check_label.isVisible()
    win.close()
