"""The local OpenAI-compatible server on a loopback port, driven by the official `openai`
client and by raw HTTP: model listing, answers equal to the engine's own, concurrency,
streaming, every error status, the guard (Host, key, size), disconnects, shutdown."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import socket
from typing import Any

import openai
import pytest

from engine.errors import UsageError
from engine.runtime import messages
from engine.serve.config import ServeConfig
from engine.serve.server import ServerThread
from tests.engine_helpers import BASE, generate
from tests.world import Recipe, World

pytestmark = pytest.mark.slow  # a real engine behind a real server
QUESTION = "Write a short poem about the sea."
GREEDY = {"temperature": 0, "max_tokens": 24, "extra_body": {"repeat_penalty": 1.0}}


WORLD = Recipe(adapters=True)


def raw(server: ServerThread, method: str, path: str, body: Any = None,
        headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
    """One HTTP request; (status, headers, decoded JSON body or text)."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=300)
    data = body if isinstance(body, bytes) else (json.dumps(body).encode()
                                                   if body is not None else None)
    connection.request(method, path, data, {"Content-Type": "application/json",
                                            **(headers or {})})
    response = connection.getresponse()
    text = response.read().decode()
    connection.close()
    try:
        decoded: Any = json.loads(text)
    except ValueError:
        decoded = text
    return response.status, {k.lower(): v for k, v in response.getheaders()}, decoded


def chat(world: World, model: str, **kw: Any) -> Any:
    return world.openai.chat.completions.create(
        model=model, messages=[{"role": "user", "content": QUESTION}], **{**GREEDY, **kw})


def test_models_lists_every_base_and_variant_with_its_identity(world: World) -> None:
    listing = world.openai.models.list()
    by_id = {m.id: m for m in listing.data}
    assert {BASE, "va", "vb", "va0", "vab"} <= set(by_id)
    va = by_id["va"].model_dump()
    from engine.catalog import resolve

    spec = resolve.resolve(world.catalog, "va")
    assert va["kind"] == "variant" and va["base"] == BASE and va["backend"] == "llama"
    assert va["identity"] == spec.identity.key
    assert va["adapters"] == [{"name": "a", "sha256": spec.adapters[0].sha256, "scale": 1.0}]
    assert by_id[BASE].model_dump()["adapters"] == []
    status, _, one = raw(world.server, "GET", "/v1/models/va")
    assert status == 200 and one["identity"] == spec.identity.key


def test_answers_equal_what_generate_gives(world: World) -> None:
    engine = world.server.client
    for name in (BASE, "va"):
        ours = generate(engine, world.catalog, name,
                        prompt=messages.Prompt(messages=(messages.Message("user", QUESTION),),
                                               chat=True))
        served = chat(world, name)
        assert served.choices[0].message.content == ours["text"]
        assert served.usage.completion_tokens == len(ours["token_ids"])
        assert served.usage.prompt_tokens == ours["prompt_tokens"]
    assert chat(world, "va").choices[0].message.content != chat(
        world, BASE).choices[0].message.content


def test_streaming_agrees_with_non_streaming_and_reports_usage(world: World) -> None:
    whole = chat(world, "vb")
    chunks = list(chat(world, "vb", stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and set(finishes[:-1]) == {None}
    # One extra chunk with no choices and the usage, last; the others carry usage: null.
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == (
        whole.usage.completion_tokens)
    assert all(c.usage is None for c in chunks[:-1])
    plain = list(chat(world, "vb", stream=True))
    assert all(c.usage is None for c in plain) and all(c.choices for c in plain)


def test_completions_and_logprobs(world: World) -> None:
    client = world.openai
    done = client.completions.create(model="va", prompt="The capital of France is",
                                     temperature=0, max_tokens=8, logprobs=2)
    choice = done.choices[0]
    assert choice.text and done.object == "text_completion"
    assert len(choice.logprobs.tokens) == done.usage.completion_tokens
    assert all(len(top) >= 1 for top in choice.logprobs.top_logprobs)
    answer = chat(world, "va", logprobs=True, top_logprobs=3, max_tokens=6)
    content = answer.choices[0].logprobs.content
    assert len(content) == answer.usage.completion_tokens
    assert all(len(t.top_logprobs) == 3 for t in content)
    # Greedy: the chosen token is the most likely one.
    assert all(t.logprob == pytest.approx(t.top_logprobs[0].logprob) for t in content)


def test_concurrent_requests_each_get_exactly_their_solo_output(world: World) -> None:
    names = [BASE, "va", "vb", BASE, "va", "vb"]
    solo = {name: chat(world, name).choices[0].message.content for name in set(names)}

    def ask(index: int) -> str:
        name = names[index]
        if index % 2:  # half of them stream
            return "".join(c.choices[0].delta.content or "" for c in chat(world, name,
                                                                        stream=True))
        return chat(world, name).choices[0].message.content

    with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
        answers = list(pool.map(ask, range(len(names))))
    assert answers == [solo[n] for n in names]


def test_identity_header_and_fingerprint(world: World) -> None:
    from engine.catalog import resolve

    response = world.openai.chat.completions.with_raw_response.create(
        model="vab", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    key = resolve.resolve(world.catalog, "vab").identity.key
    assert response.headers["x-variant-identity"] == key
    assert key[:12] in response.parse().system_fingerprint


def test_an_unknown_model_is_a_404_naming_it_never_another_model(world: World
                                                                  ) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        chat(world, "no-such-variant")
    assert "no-such-variant" in str(raised.value)
    status, _, body = raw(world.server, "GET", "/v1/models/no-such-variant")
    assert status == 404 and body["error"]["code"] == "model_not_found"


@pytest.mark.parametrize(("body", "param"), [
    (b"{not json", None),
    (b"[" * 100000, None),
    ({"model": "va"}, "messages"),
    ({"model": "va", "messages": [{"role": "user", "content": "x"}], "n": 2}, "n"),
    ({"model": "va", "messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "function", "function": {"name": "no spaces"}}]},
     "tools.0.function.name"),
    ({"model": "va", "messages": [{"role": "user", "content": "x"}], "temperature": 9},
     "temperature"),
    ({"model": "va", "messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
    ({"model": "va", "messages": [{"role": "tool", "content": "x"}]},
     "messages.0.tool_call_id"),
    ({"model": "va", "messages": [{"role": "user", "content": "x"}], "frobnicate": 1},
     "frobnicate"),
    ({"model": "va", "messages": [{"role": "user", "content": "x"}], "max_tokens": 10**6},
     "max_tokens"),
])
def test_malformed_requests_are_400_naming_the_field(world: World, body: Any,
                                                     param: str | None) -> None:
    status, _, answer = raw(world.server, "POST", "/v1/chat/completions", body)
    assert status == 400, answer
    error = answer["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert "Traceback" not in error["message"]
    if param:
        assert param.split(".")[0] in error["message"]


def test_size_bounds_are_413(world: World) -> None:
    server = world.server
    status, _, body = raw(server, "POST", "/v1/chat/completions",
                          b"{" + b" " * (server.config.max_body_bytes + 10) + b"}")
    assert status == 413 and body["error"]["code"] == "request_too_large"
    long = "sea " * 6000  # more tokens than the 4096-token context
    status, _, body = raw(server, "POST", "/v1/chat/completions",
                          {"model": "va", "messages": [{"role": "user", "content": long}]})
    assert status == 413 and body["error"]["code"] == "context_length_exceeded"


def test_embeddings_are_refused_clearly(world: World) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        world.openai.embeddings.create(model="va", input="x")
    assert "not supported" in str(raised.value)


def test_a_foreign_host_header_is_refused(world: World) -> None:
    status, _, body = raw(world.server, "GET", "/v1/models",
                          headers={"Host": "attacker.example:8765"})
    assert status == 403 and body["error"]["code"] == "forbidden_host"
    status, _, _ = raw(world.server, "GET", "/v1/models",
                       headers={"Host": f"localhost:{world.server.port}"})
    assert status == 200


def test_no_cors_headers_unless_an_origin_is_given(world: World) -> None:
    _, headers, _ = raw(world.server, "GET", "/v1/models",
                        headers={"Origin": "http://evil.example"})
    assert not any(h.startswith("access-control-") for h in headers)


def test_a_disconnect_cancels_the_generation(world: World) -> None:
    server = world.server
    sock = socket.create_connection(("127.0.0.1", server.port))
    body = json.dumps({"model": "va", "stream": True, "max_tokens": 2000, "temperature": 0,
                       "messages": [{"role": "user", "content": "Count to ten thousand."}]})
    sock.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                  f"{body}").encode())
    received = b""
    while received.count(b"data:") < 3:  # it is generating
        received += sock.recv(4096)
    sock.close()
    # The engine stops that generation: the next request is answered, and the server's
    # log records the cancelled one as 499 with fewer tokens than it asked for.
    assert chat(world, BASE, max_tokens=2).choices
    entries = [e for e in server.state.log if e.model == "va" and e.status == 499]
    assert entries
    status, _, info = raw(server, "GET", "/v1/variant-studio/status")
    assert status == 200 and not any(s["busy"] for s in info["engine"]["sessions"])
    assert info["server"]["in_flight"] == 0


def test_status_reports_sessions_and_their_memory(world: World) -> None:
    chat(world, "va", max_tokens=2)
    status, _, info = raw(world.server, "GET", "/v1/variant-studio/status")
    assert status == 200 and info["server"]["max_sessions"] == 4
    sessions = info["engine"]["sessions"]
    assert sessions and all(s["kv_bytes"] > 0 for s in sessions)
    assert len(sessions) <= 4


def test_a_key_is_required_when_set_and_the_queue_is_bounded(
        world: World) -> None:
    server = ServerThread(ServeConfig(port=0, api_key="s3cret-key", queue_limit=1),
                          world.catalog).start()
    try:
        status, _, body = raw(server, "GET", "/v1/models")
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
        status, _, _ = raw(server, "GET", "/v1/models",
                           headers={"Authorization": "Bearer wrong-key-1"})
        assert status == 401
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="s3cret-key",
                               max_retries=0, timeout=300)
        assert client.models.list().data
        long = {"model": "va", "stream": True, "max_tokens": 400, "temperature": 0,
                "messages": [{"role": "user", "content": "Tell me a long story."}]}
        stream = client.chat.completions.create(**long)
        next(iter(stream))  # one request in flight
        with pytest.raises(openai.RateLimitError) as raised:
            client.chat.completions.create(model="va", max_tokens=2,
                                           messages=[{"role": "user", "content": "x"}])
        assert raised.value.response.headers["retry-after"] == "1"
        # A streamed request is refused the same way: a 429 status, not a 200 whose
        # stream carries the error.
        with pytest.raises(openai.RateLimitError) as raised:
            client.chat.completions.create(model="va", max_tokens=2, stream=True,
                                           messages=[{"role": "user", "content": "x"}])
        assert raised.value.response.headers["retry-after"] == "1"
        stream.close()
    finally:
        server.stop()


def test_engine_restart_is_a_503_then_it_serves_again(world: World) -> None:
    server = ServerThread(ServeConfig(port=0), world.catalog).start()
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0,
                               timeout=300)
        stream = client.chat.completions.create(
            model="va", stream=True, max_tokens=400, temperature=0,
            messages=[{"role": "user", "content": "Tell me a long story."}])
        chunks = iter(stream)
        next(chunks)
        server.client.kill()  # the engine process dies mid-answer
        with pytest.raises(openai.APIError) as raised:
            for _ in chunks:
                pass
        assert "restarting" in str(raised.value)
        assert client.chat.completions.create(
            model="va", max_tokens=2, messages=[{"role": "user", "content": "x"}]).choices
    finally:
        server.stop()


def test_binding_beyond_loopback_needs_a_key_and_the_server_stops_cleanly(
        world: World) -> None:
    with pytest.raises(UsageError, match="without --api-key"):
        ServeConfig(host="0.0.0.0")
    ServeConfig(host="0.0.0.0", api_key="long-enough-key")  # allowed with a key
    server = ServerThread(ServeConfig(port=0), world.catalog).start()
    port = server.port
    server.stop()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=5)
