"""The one worker service (engine.runtime.service): every request ends exactly once
(finished, failed or cancelled), cancel takes effect during work, a crash fails what
was in flight and the next request starts a fresh child; and the engine host, the merge
worker and the training worker are all its workers."""

from __future__ import annotations

import ast
import threading
from pathlib import Path
from typing import Any

import pytest

from engine.errors import Cancelled, EngineError, RefusedError
from engine.runtime import messages as m
from engine.runtime.client import EngineClient
from engine.runtime.merge.work import MergeWorker
from engine.runtime.service import ServiceClient

ROOT = Path(__file__).resolve().parent.parent


class Recorder:
    """The events of one request, and a flag set on its terminal one."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.terminal = threading.Event()
        self.progressed = threading.Event()  # the request is at work

    def __call__(self, event: Any) -> None:
        self.events.append(event)
        if isinstance(event, m.TERMINAL):
            self.terminal.set()
        elif isinstance(event, m.Progress):
            self.progressed.set()

    def terminals(self) -> list[Any]:
        return [e for e in self.events if isinstance(e, m.TERMINAL)]


@pytest.fixture
def client() -> Any:
    states: list[tuple[str, str]] = []
    service = ServiceClient("tests.service_child", what="the test worker",
                            stopped="test worker",
                            on_state=lambda state, detail: states.append((state, detail)))
    service.states = states  # type: ignore[attr-defined]
    yield service
    service.close()


def test_a_request_finishes_once_with_its_result(client: ServiceClient) -> None:
    events = Recorder()
    handle = client.submit_raw("echo", {"a": [1, 2]}, events)
    assert handle.wait(60) == {"a": [1, 2]}
    assert handle.outcome == "finished"
    assert events.terminals() == [m.Finished({"a": [1, 2]})]


def test_errors_end_the_request_as_failed_with_the_reason(client: ServiceClient) -> None:
    with pytest.raises(RefusedError, match="refused on purpose"):
        client.submit_raw("refuse", {}).wait(60)
    bug = client.submit_raw("bug", {})
    with pytest.raises(EngineError) as info:
        bug.wait(60)
    assert "a bug" in info.value.message
    # A bug (not one of our errors) carries its traceback for the log.
    assert any("ValueError" in line for line in info.value.details)
    # The worker lives on: the next request is served by the same process.
    assert client.submit_raw("echo", 7).wait(60) == 7
    assert client.starts == 1


def test_cancel_takes_effect_during_work_and_ends_once(client: ServiceClient) -> None:
    events = Recorder()
    handle = client.submit_raw("wait", {}, events)
    assert events.progressed.wait(60)
    client.cancel(handle)
    with pytest.raises(Cancelled):
        handle.wait(60)
    assert handle.outcome == "cancelled"
    assert events.terminals() == [m.Cancelled()]
    # Quiet after a cancel: the child's "late" event (sent after the cancel) is dropped.
    assert [type(e) for e in events.events] == [m.Progress, m.Cancelled]
    client.cancel(handle)  # a second cancel of an ended request changes nothing
    assert events.terminals() == [m.Cancelled()]


def test_events_after_a_cancel_arrive_when_asked_for() -> None:
    client = ServiceClient("tests.service_child", what="the test worker",
                           stopped="test worker", quiet_after_cancel=False,
                           decode=lambda message, kind: m.decode_event(message, kind)
                           or message["event"])
    try:
        events = Recorder()
        handle = client.submit_raw("wait", {}, events)
        assert events.progressed.wait(60)  # it is working: the cancel reaches it mid-work
        client.cancel(handle)
        with pytest.raises(Cancelled):
            handle.wait(60)
        assert events.events[-2:] == ["late", m.Cancelled()]
    finally:
        client.close()


def test_a_crash_fails_what_was_in_flight_and_the_next_request_starts_afresh(
        client: ServiceClient) -> None:
    waiting, exiting = Recorder(), Recorder()
    first = client.submit_raw("wait", {}, waiting)
    crash = client.submit_raw("exit", {}, exiting)  # behind "wait": one at a time
    client.cancel(first)  # "wait" ends; then "exit" takes the process down
    with pytest.raises(Cancelled):
        first.wait(60)
    with pytest.raises(EngineError) as info:
        crash.wait(60)
    assert info.value.message == "test worker stopped: the test worker exited with code 3"
    assert exiting.terminals() == [m.Failed(info.value)]
    assert client.states[-1][0] == "crashed"  # type: ignore[attr-defined]
    assert client.submit_raw("echo", "again").wait(60) == "again"
    assert client.starts == 2


def test_closing_stdin_cancels_the_request_in_flight(client: ServiceClient) -> None:
    events = Recorder()
    handle = client.submit_raw("wait", {}, events)
    client.close(timeout=60)  # shutdown: the child cancels its work and exits
    assert handle.done.wait(60)
    assert handle.outcome in ("cancelled", "failed")
    assert len(events.terminals()) == 1
    assert not client.running()


def test_every_worker_of_the_engine_is_a_worker_of_the_service() -> None:
    assert issubclass(EngineClient, ServiceClient)
    merge = MergeWorker.__init__.__code__.co_names
    assert "ServiceClient" in merge
    # The child side: each worker module serves through the service, and nothing but
    # the service (and llama.cpp's quantizer, a plain child with no requests) starts a
    # child process or reads requests by hand.
    for module in ("engine/runtime/host.py", "engine/runtime/merge/work.py",
                   "engine/training/worker.py"):
        source = (ROOT / module).read_text()
        assert "service" in source and "sys.stdin" not in source, module
    starters = []
    for path in sorted((ROOT / "engine").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ChildProcess":
                starters.append(path.relative_to(ROOT).as_posix())
    assert sorted(set(starters)) == ["engine/runtime/llama/quantize.py",
                                     "engine/runtime/service.py"]
