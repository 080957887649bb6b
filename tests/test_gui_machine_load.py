"""The status bar says when other programs slow the engine (issue 28, item 12).

The engine reports it in each answer's `machine_load` (tests/test_contention.py holds
how it is measured); here the window's side: the client passes every answer's load on,
and the status bar shows a short note while it is set and nothing once it is not.
"""

from __future__ import annotations

from engine.runtime import messages as m
from engine.runtime.results import CompareResult, MachineLoad
from gui.machine_load import load_of, note
from tests.gui_helpers import generation_result

BUSY = MachineLoad(other_cores=1.0, threads=1, max_threads=2, cpus=2)


class FinishedReply:
    """What `QtEngineClient._ended` reads of a generation that finished."""

    def __init__(self, result: object) -> None:
        self.outcome = "finished"
        self.request = object.__new__(m.Generate)  # only its type is read
        self.result = result
        self.op = "generate"
        self.error = None


def finished_reply(result: object) -> FinishedReply:
    return FinishedReply(result)


def test_the_status_bar_shows_the_slowdown_of_the_last_answer_only(window, qtbot) -> None:
    label = window.machine_label
    assert not label.isVisible()
    busy = generation_result("hi", machine_load=BUSY.to_dict())
    with qtbot.waitSignal(window.client.machineLoad) as signal:
        window.client._ended(finished_reply(busy))
    assert signal.args == [BUSY]
    assert label.isVisible() and label.text() == "busy machine: 1 of 2 threads"
    assert "1.0 of this machine's 2 CPU cores" in label.toolTip()
    # The next answer was not slowed: the note goes.
    window.client._ended(finished_reply(generation_result("hi")))
    assert not label.isVisible()


def test_the_note_for_a_thread_count_the_user_set() -> None:
    text, tooltip = note(MachineLoad(1.2, 2, 2, 2))
    assert text == "busy machine: slowed"
    assert "Settings → Engine threads" in tooltip and "0 (automatic)" in tooltip


def test_a_comparison_reports_its_later_side() -> None:
    plain = generation_result("a")
    busy = generation_result("b", machine_load=BUSY.to_dict())
    both = CompareResult(base=plain, variant=busy, first_divergence=0, adapter_effect=None)
    assert load_of(both) == BUSY
    assert load_of(CompareResult(base=plain, variant=plain, first_divergence=None,
                                 adapter_effect=None)) is None
    assert load_of({"not": "a result"}) is None


def test_the_status_bar_fits_a_1024_px_window_and_cuts_with_an_ellipsis(window, qtbot
                                                                         ) -> None:
    """Every status-bar note at once (a long resident list, the busy-machine note, a
    library check) fits a 1024 px window: the long texts are elided, whole in their
    tooltips. Before, the labels asked for the sum of their texts' widths and the status
    bar cut the last ones off mid-word, the busy-machine note first."""
    window.resident_label.setText("resident: " + " · ".join(
        f"a-rather-long-model-name-{i}" for i in range(8)) + " · 8 session(s)")
    window.check_label.setText("checking 12 files on disk: smollm2-135m-instruct …")
    window.check_label.show()
    window.client._ended(finished_reply(generation_result(
        "hi", machine_load=MachineLoad(1.2, 2, 2, 2).to_dict())))
    assert window.machine_label.isVisible()
    window.resize(1024, 700)
    qtbot.waitUntil(lambda: window.width() == 1024)
    assert window.statusBar().minimumSizeHint().width() <= 1024
    assert window.resident_label.is_elided()
    assert "a-rather-long-model-name-7" in window.resident_label.toolTip()
    # The busy-machine note is still on screen, whole or elided, never cut off.
    note = window.machine_label
    assert note.geometry().right() <= window.statusBar().width()
