"""The server's request log in-process (the real app behind its guard, the fake
backend): every request answered with an error is logged with its status and message,
whichever step refused it (the guard's key check, a malformed body, an unknown model,
an unknown endpoint), and a generation is announced when it reaches the engine, saying
whether the engine loads its base first (the Server panel's "loading <model>…")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.catalog.store import Catalog
from engine.serve.app import LogEntry, Pending
from engine.serve.config import ServeConfig
from tests import fake_backend as fb
from tests.inprocess_engine import InProcessEngine
from tests.test_unit_serve import GREEDY, QUESTION, served

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def engine_and_catalog(module_home: Path, tmp_path_factory: pytest.TempPathFactory
                       ) -> Iterator[tuple[InProcessEngine, Catalog]]:
    catalog = Catalog()
    fb.populate(catalog, tmp_path_factory.mktemp("fake"))
    with fb.install(), InProcessEngine() as engine:
        yield engine, catalog


def test_refused_requests_are_logged_with_status_and_message(
        engine_and_catalog: tuple[InProcessEngine, Catalog]) -> None:
    engine, catalog = engine_and_catalog
    http = served(engine, catalog, ServeConfig(port=0, api_key="a-long-enough-key"))
    state = http.app.app.state.server  # the guard's app
    logged: list[LogEntry] = []
    state.listeners.append(logged.append)
    key = {"Authorization": "Bearer a-long-enough-key"}

    wrong = http.post("/v1/chat/completions", headers={"Authorization": "Bearer nope-nope"},
                      json={"model": "va", "messages": QUESTION})
    unknown = http.post("/v1/chat/completions", headers=key,
                        json={"model": "no-such-model", "messages": QUESTION})
    malformed = http.post("/v1/chat/completions", headers=key,
                          json={"model": "va", "messages": "not a list"})
    not_json = http.post("/v1/completions", headers=key, content=b"{not json")
    no_endpoint = http.post("/chat/completions", headers=key, json={})
    statuses = [wrong.status_code, unknown.status_code, malformed.status_code,
                not_json.status_code, no_endpoint.status_code]
    assert statuses == [401, 404, 400, 400, 404]

    assert [(e.status, e.path, e.model) for e in logged] == [
        (401, "/v1/chat/completions", ""),
        (404, "/v1/chat/completions", "no-such-model"),
        (400, "/v1/chat/completions", "va"),
        (400, "/v1/completions", ""),
        (404, "/chat/completions", "")]
    # Each with the message the client was given.
    for entry, response in zip(logged, (wrong, unknown, malformed, not_json, no_endpoint),
                               strict=True):
        assert entry.reason == response.json()["error"]["message"], entry
        assert entry.identity == "" and entry.completion_tokens == 0
    assert list(state.log) == logged


def test_a_generation_is_announced_loading_once_then_logged_with_its_id(
        engine_and_catalog: tuple[InProcessEngine, Catalog]) -> None:
    engine, catalog = engine_and_catalog
    http = served(engine, catalog, ServeConfig(port=0))
    state = http.app.app.state.server
    events: list[LogEntry | Pending] = []
    state.listeners.append(events.append)
    state.pending_listeners.append(events.append)

    for _ in range(2):
        response = http.post("/v1/chat/completions",
                             json={"model": "va", "messages": QUESTION, **GREEDY})
        assert response.status_code == 200, response.text
    streamed = http.post("/v1/chat/completions", json={
        "model": "va", "messages": QUESTION, "stream": True, **GREEDY})
    assert streamed.status_code == 200 and "[DONE]" in streamed.text

    kinds = [type(event).__name__ for event in events]
    assert kinds == ["Pending", "LogEntry"] * 3
    first, second, third = events[0], events[2], events[4]
    assert isinstance(first, Pending) and isinstance(second, Pending) \
        and isinstance(third, Pending)
    # This app's engine had not served the base: the first request loads it.
    assert (first.loading, second.loading, third.loading) == (True, False, False)
    assert first.model == "va" and first.base == fb.BASE
    for pending, entry in zip(events[::2], events[1::2], strict=True):
        assert isinstance(entry, LogEntry) and entry.status == 200
        assert entry.id == pending.id and entry.id.startswith("chatcmpl-")
    assert len({event.id for event in events}) == 3
