"""The engine host's scheduler in-process on the fake backend (`tests/inprocess_engine.py`):
requests advance together and give what they give alone, quick requests are answered
between steps while exclusive ones wait, every request ends with exactly one terminal
event (a cancel mid-generation and before the start included), and malformed requests
are refused without disturbing the rest.

The fake backend's pauses hold the engine thread at a load or a decoding step, and
`InProcessEngine.handled` says when the host has read what was sent: no sleeps."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from engine.catalog.profiles import Sampling
from engine.catalog.resolve import resolve
from engine.catalog.store import Catalog
from engine.errors import Cancelled, RefusedError, StudioError
from engine.runtime import messages as m
from engine.runtime.results import EngineStatus, GenerationResult
from tests import fake_backend as fb
from tests.inprocess_engine import InProcessEngine, RequestHandle

pytestmark = pytest.mark.unit

PROMPT = m.Prompt("Write a line about the sea.", chat=True)


@pytest.fixture
def engine(fake: fb.FakeBackend, fake_catalog: Catalog) -> Iterator[InProcessEngine]:
    with InProcessEngine() as running:
        yield running


def generate(catalog: Catalog, name: str, max_tokens: int = 6) -> m.Generate:
    return m.Generate(resolve(catalog, name), PROMPT,
                      Sampling(temperature=0.0, repeat_penalty=1.0, max_tokens=max_tokens))


def only_terminal(handle: RequestHandle) -> m.Event:
    """The request's one terminal event, checked to be its last message as well."""
    handle.done.wait(30)
    assert len(handle.terminal) == 1, handle.messages
    assert handle.messages[-1]["event"] in ("finished", "failed", "cancelled")
    assert sum(x["event"] in ("finished", "failed", "cancelled") for x in handle.messages) == 1
    return handle.terminal[0]


def test_requests_advance_together_and_give_what_they_give_alone(
        fake: fb.FakeBackend, fake_catalog: Catalog, engine: InProcessEngine) -> None:
    order: list[tuple[str, int]] = []  # (request, token index), as the engine sent them

    def record(name: str) -> Any:
        return lambda e: order.append((name, e.index)) if isinstance(e, m.Token) else None

    fake.before_load = pause = fb.Pause()
    names = ("va", "vb", fb.BASE)
    handles = {n: engine.submit(generate(fake_catalog, n), record(n)) for n in names}
    engine.handled()  # all three are queued behind the first one's load
    assert pause.reached.wait(30)
    pause.go.set()
    together = {n: h.wait() for n, h in handles.items()}
    firsts = [order.index((n, 0)) for n in names]
    lasts = [order.index((n, 5)) for n in names]
    assert max(firsts) < min(lasts), order  # every one started before any ended
    assert len(fake.models) == 1  # one resident base served the three identities
    for name in names:
        alone = engine.call(generate(fake_catalog, name))
        assert isinstance(alone, GenerationResult)
        assert (alone.token_ids, alone.logprobs) == (together[name].token_ids,
                                                     together[name].logprobs)
    assert together[fb.BASE].text == fb.GREEDY_ANSWER[:6]
    assert len({r.identity for r in together.values()}) == 3


def test_a_cancel_mid_generation_ends_it_with_exactly_one_terminal_event(
        fake: fb.FakeBackend, fake_catalog: Catalog, engine: InProcessEngine) -> None:
    fake.before_step = pause = fb.Pause(after=2)
    handle = engine.submit(generate(fake_catalog, "va", max_tokens=200))
    assert pause.reached.wait(30)
    engine.cancel(handle)
    engine.handled()  # the host has set the request's cancel flag
    pause.go.set()
    assert isinstance(only_terminal(handle), m.Cancelled)
    with pytest.raises(Cancelled):
        handle.wait()
    tokens = [e for e in handle.events if isinstance(e, m.Token)]
    assert 1 <= len(tokens) <= 4  # stopped at the step after the cancel, not at 200
    status = engine.call(m.Describe())  # answered after anything the request could send
    assert isinstance(status, EngineStatus)
    assert len(handle.messages) == len(tokens) + 1  # nothing came after its end
    assert [s.busy for s in status.sessions] == [False]  # its session was released
    again = engine.call(generate(fake_catalog, "va"))  # and serves the next request
    assert isinstance(again, GenerationResult) and len(again.token_ids) == 6


def test_a_request_cancelled_before_it_starts_never_runs(
        fake: fb.FakeBackend, fake_catalog: Catalog, engine: InProcessEngine) -> None:
    fake.before_load = pause = fb.Pause()
    first = engine.submit(generate(fake_catalog, "va"))
    assert pause.reached.wait(30)  # the engine thread is busy loading for the first
    second = engine.submit(generate(fake_catalog, "vb"))
    engine.cancel(second)
    engine.handled()
    pause.go.set()
    assert isinstance(only_terminal(second), m.Cancelled)
    assert second.messages == [{"id": second.id, "event": "cancelled"}]  # no token
    assert isinstance(only_terminal(first), m.Finished)
    assert len(first.wait().token_ids) == 6


def test_quick_requests_pass_running_ones_and_exclusive_ones_wait(
        fake: fb.FakeBackend, fake_catalog: Catalog, engine: InProcessEngine) -> None:
    ended: list[str] = []

    def record(name: str) -> Any:
        return lambda e: ended.append(name) if isinstance(e, m.TERMINAL) else None

    fake.before_step = pause = fb.Pause(after=1)
    running = engine.submit(generate(fake_catalog, "va"), record("generate"))
    assert pause.reached.wait(30)
    engine.submit(m.Ping(), record("ping"))
    engine.submit(m.Open(resolve(fake_catalog, "vb")), record("open"))
    later = engine.submit(generate(fake_catalog, fb.BASE), record("later"))
    engine.handled()
    pause.go.set()
    later.wait()
    assert ended == ["ping", "generate", "open", "later"]
    assert len(running.wait().token_ids) == 6


@pytest.mark.parametrize(("op", "params", "message"), [
    ("generate", {"spec": "not a spec"}, "malformed generate request"),
    ("generate", "a string", "params must be an object"),
    ("no_such_op", {}, "unknown engine request 'no_such_op'"),
    ("abort", {}, "unknown engine request 'abort'"),  # the test hook is off here
])
def test_a_malformed_request_is_refused_and_the_others_are_served(
        fake_catalog: Catalog, engine: InProcessEngine, op: str, params: Any,
        message: str) -> None:
    bad = engine.submit_raw(op, params)
    good = engine.submit(generate(fake_catalog, fb.BASE))
    end = only_terminal(bad)
    assert isinstance(end, m.Failed) and isinstance(end.error, StudioError)
    assert message in end.error.message
    assert good.wait().text == fb.GREEDY_ANSWER[:6]


def test_a_sampling_value_out_of_range_on_the_wire_is_refused_by_name(
        fake_catalog: Catalog, engine: InProcessEngine) -> None:
    params = generate(fake_catalog, "va").to_params()
    params["sampling"]["temperature"] = 99.0
    end = only_terminal(engine.submit_raw("generate", params, kind=m.Generate))
    assert isinstance(end, m.Failed) and isinstance(end.error, RefusedError)
    assert "temperature" in end.error.message
