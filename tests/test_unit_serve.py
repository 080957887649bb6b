"""The local server's HTTP surface in-process: the real app behind its guard
(`engine.serve.app`), its bridge over an in-process engine on the fake backend
(`tests/inprocess_engine.py`), driven by Starlette's TestClient. Status codes,
OpenAI-shaped errors for every malformed request, streamed chunks, and identities kept
apart (a scale is part of what is served and cached)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from engine.catalog.profiles import Sampling
from engine.catalog.resolve import resolve
from engine.catalog.store import Catalog
from engine.runtime import messages as m
from engine.serve.app import create_app, guarded
from engine.serve.bridge import EngineBridge
from engine.serve.config import ServeConfig
from engine.serve.errors import TYPES
from tests import fake_backend as fb
from tests.inprocess_engine import InProcessEngine

pytestmark = pytest.mark.unit

URL = "http://127.0.0.1:8765"
QUESTION = [{"role": "user", "content": "Write a line about the sea."}]
GREEDY = {"temperature": 0, "max_tokens": 12, "repeat_penalty": 1.0}


def served(engine: InProcessEngine, catalog: Catalog, config: ServeConfig) -> TestClient:
    """The app behind its guard over `engine` (which stands in for the `EngineClient`:
    the bridge uses its `submit` and `cancel`), as a loopback client reaches it."""
    bridge = EngineBridge(engine, config.queue_limit)  # type: ignore[arg-type]
    return TestClient(guarded(create_app(config, bridge, catalog), config), base_url=URL)


@dataclass
class World:
    catalog: Catalog
    engine: InProcessEngine
    fake: fb.FakeBackend
    http: TestClient

    def app(self, **config: Any) -> TestClient:
        """Another app (another configuration) over the same engine."""
        return served(self.engine, self.catalog, ServeConfig(**config))


@pytest.fixture(scope="module")
def world(module_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    catalog = Catalog()
    fb.populate(catalog, tmp_path_factory.mktemp("fake"))
    config = ServeConfig(port=0, max_tokens=512, max_body_bytes=1 << 20)
    with pytest.MonkeyPatch.context() as patch, fb.install() as fake:
        # Every identity these tests serve keeps its session (the host reads this).
        patch.setenv("VARIANT_STUDIO_MAX_SESSIONS", "16")
        with InProcessEngine() as engine:
            yield World(catalog, engine, fake, served(engine, catalog, config))


@pytest.fixture(autouse=True)
def no_pauses(world: World) -> Iterator[None]:
    yield
    world.fake.before_load = world.fake.before_step = None


def chat(world: World, model: str, **body: Any) -> Any:
    return world.http.post("/v1/chat/completions",
                           json={"model": model, "messages": QUESTION, **GREEDY, **body})


def error_of(response: Any, status: int) -> dict[str, Any]:
    """The body of an OpenAI-shaped error with `status`: exactly message, type, param,
    code, with the type OpenAI gives that status."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == TYPES[status] and body["error"]["message"]
    return body["error"]


def sse_data(response: Any) -> list[str]:
    return [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]


# --------------------------------------------------------------------------- models


def test_the_models_are_listed_with_their_identities(world: World) -> None:
    response = world.http.get("/v1/models")
    assert response.status_code == 200
    listing = response.json()
    by_id = {entry["id"]: entry for entry in listing["data"]}
    assert listing["object"] == "list" and set(by_id) == {fb.BASE, *fb.VARIANTS}
    for name, entry in by_id.items():
        assert entry["identity"] == resolve(world.catalog, name).identity.key
    full, half = by_id["va"], by_id["va-half"]
    assert full["adapters"][0]["sha256"] == half["adapters"][0]["sha256"]
    assert (full["adapters"][0]["scale"], half["adapters"][0]["scale"]) == (1.0, 0.5)
    assert full["identity"] != half["identity"]
    one = world.http.get("/v1/models/va")
    assert one.status_code == 200 and one.json() == full
    assert error_of(world.http.get("/v1/models/nope"), 404)["code"] == "model_not_found"


# --------------------------------------------------------------------------- answers


def test_a_chat_completion_is_the_engines_answer_for_that_identity(world: World) -> None:
    response = chat(world, "va")
    assert response.status_code == 200
    spec = resolve(world.catalog, "va")
    assert response.headers["x-variant-identity"] == spec.identity.key
    body = response.json()
    assert body["object"] == "chat.completion" and body["model"] == "va"
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "length"
    direct = world.engine.call(m.Generate(
        spec, m.Prompt(messages=(m.Message("user", QUESTION[0]["content"]),), chat=True),
        Sampling(**GREEDY)))
    assert choice["message"]["content"] == direct.text
    assert body["usage"] == {"prompt_tokens": direct.prompt_tokens,
                             "completion_tokens": 12,
                             "total_tokens": direct.prompt_tokens + 12}


def test_an_end_token_finishes_with_stop(world: World) -> None:
    body = chat(world, fb.BASE, max_tokens=100).json()
    assert body["choices"][0]["message"]["content"] == fb.GREEDY_ANSWER
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == len(fb.GREEDY_ANSWER)


def test_a_completion_reports_its_logprobs(world: World) -> None:
    response = world.http.post("/v1/completions", json={
        "model": fb.BASE, "prompt": "Letters:", "logprobs": 2, **GREEDY, "max_tokens": 5})
    assert response.status_code == 200
    choice = response.json()["choices"][0]
    assert choice["text"] == "abcde"
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == list("abcde") and logprobs["text_offset"] == [0, 1, 2, 3, 4]
    assert all(len(top) == 2 and max(top.values()) <= 0 for top in logprobs["top_logprobs"])
    assert all(top[token] == lp for top, token, lp in zip(
        logprobs["top_logprobs"], logprobs["tokens"], logprobs["token_logprobs"], strict=True))


def test_a_stream_sends_the_answer_in_chunks_then_usage_then_done(world: World) -> None:
    whole = chat(world, "vb").json()["choices"][0]["message"]["content"]
    with world.http.stream("POST", "/v1/chat/completions", json={
            "model": "vb", "messages": QUESTION, **GREEDY, "stream": True,
            "stream_options": {"include_usage": True}}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-variant-identity"] == resolve(world.catalog,
                                                                 "vb").identity.key
        data = sse_data(response)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    *tokens, last, usage = chunks
    assert len(tokens) >= 12  # the role chunk, then one per token
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in tokens) == whole
    assert last["choices"][0]["finish_reason"] == "length" and last["choices"][0]["delta"] == {}
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 12


def test_identities_are_served_and_cached_apart(world: World) -> None:
    names = (fb.BASE, "va0", "va", "va-half")
    answers = {n: chat(world, n, logprobs=True) for n in names}
    keys = {n: r.headers["x-variant-identity"] for n, r in answers.items()}
    assert len(set(keys.values())) == len(names)
    logprobs = {n: [t["logprob"] for t in r.json()["choices"][0]["logprobs"]["content"]]
                for n, r in answers.items()}
    assert logprobs["va0"] == logprobs[fb.BASE]  # scale 0 computes the base...
    assert logprobs["va"] != logprobs["va-half"] != logprobs[fb.BASE]
    status = world.http.get("/v1/variant-studio/status").json()
    sessions = status["engine"]["sessions"]
    # ...but every identity has its own session: nothing warm is shared between them.
    assert set(keys.values()) <= {s["identity"] for s in sessions}
    assert len({s["identity"] for s in sessions}) == len(sessions)
    assert not any(s["busy"] for s in sessions)
    assert status["server"]["in_flight"] == 0


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(("path", "body", "status", "param", "code"), [
    ("/v1/chat/completions", b"{not json", 400, None, "invalid_json"),
    ("/v1/chat/completions", b"[1, 2]", 400, None, None),
    ("/v1/chat/completions", {"model": "va"}, 400, "messages", "invalid_value"),
    ("/v1/chat/completions", {"model": "va", "messages": [{"role": "robot", "content": "x"}]},
     400, "messages.0.role", "invalid_value"),
    ("/v1/chat/completions", {"model": "va", "messages": QUESTION, "temperature": "hot"},
     400, "temperature", "invalid_value"),
    ("/v1/chat/completions", {"model": "va", "messages": QUESTION, "max_tokens": 100000},
     400, "max_tokens", "invalid_value"),
    ("/v1/chat/completions", {"model": "va", "messages": QUESTION, "n": 2},
     400, "n", "unsupported_field"),
    ("/v1/chat/completions", {"model": "va", "messages": QUESTION, "tools_please": True},
     400, "tools_please", "unsupported_field"),
    ("/v1/chat/completions", {"model": "nope", "messages": QUESTION}, 404, "model",
     "model_not_found"),
    ("/v1/chat/completions", {"model": "va", "messages": [
        {"role": "user", "content": "x" * 5000}]}, 413, "messages", "context_length_exceeded"),
    ("/v1/completions", {"model": "va", "prompt": ""}, 400, "prompt", "invalid_value"),
    ("/v1/embeddings", {"model": "va", "input": "x"}, 400, None, "unsupported_endpoint"),
])
def test_a_malformed_request_gets_an_openai_shaped_error(
        world: World, path: str, body: Any, status: int, param: str | None,
        code: str | None) -> None:
    if isinstance(body, bytes):
        response = world.http.post(path, content=body,
                                   headers={"content-type": "application/json"})
    else:
        response = world.http.post(path, json=body)
    error = error_of(response, status)
    assert (error["param"], error["code"]) == (param, code)
    assert "Traceback" not in error["message"]


def test_unknown_routes_and_methods_are_openai_shaped_too(world: World) -> None:
    assert error_of(world.http.get("/v1/nothing"), 404)["code"] == "not_found"
    assert error_of(world.http.get("/v1/chat/completions"), 405)["message"].startswith("GET")


def test_the_guard_checks_host_key_and_size_before_any_route(world: World) -> None:
    forbidden = world.http.get("/v1/models", headers={"host": "evil.example"})
    assert error_of(forbidden, 403)["code"] == "forbidden_host"
    large = world.http.post("/v1/chat/completions", content=b"x" * ((1 << 20) + 1))
    assert error_of(large, 413)["code"] == "request_too_large"
    keyed = world.app(api_key="sesame-open-1")
    assert error_of(keyed.get("/v1/models"), 401)["code"] == "invalid_api_key"
    assert error_of(keyed.get("/v1/models", headers={"authorization": "Bearer wrong-key-1"}),
                    401)["code"] == "invalid_api_key"
    assert keyed.get("/v1/models",
                     headers={"authorization": "Bearer sesame-open-1"}).status_code == 200


def test_a_full_queue_is_a_429_with_retry_after(world: World) -> None:
    narrow = world.app(queue_limit=1)
    world.fake.before_step = pause = fb.Pause()
    first: list[Any] = []
    worker = threading.Thread(target=lambda: first.append(narrow.post(
        "/v1/chat/completions", json={"model": "va", "messages": QUESTION, **GREEDY})))
    worker.start()
    assert pause.reached.wait(30)  # the first request is in the engine, holding the slot
    busy = narrow.post("/v1/chat/completions",
                       json={"model": "va", "messages": QUESTION, **GREEDY})
    streamed = narrow.post("/v1/chat/completions",
                           json={"model": "va", "messages": QUESTION, **GREEDY,
                                 "stream": True})
    pause.go.set()
    worker.join(30)
    for refused in (busy, streamed):  # a stream is refused before its 200, too
        assert error_of(refused, 429)["code"] == "rate_limit_exceeded"
        assert refused.headers["retry-after"] == "1"
    assert first[0].status_code == 200
