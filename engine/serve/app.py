"""The OpenAI-compatible ASGI app (Starlette, with sse-starlette for streaming).

Routes: `GET /v1/models[/{id}]`, `POST /v1/chat/completions`, `POST /v1/completions`,
`POST /v1/embeddings` (a clear "not supported"), `GET /v1/variant-studio/status`.
A request names a base or variant as its `model`; it is resolved against the catalog
at that moment, so its identity (base and adapter digests, scales, template, runtime)
is what the engine serves and caches under, and what the `x-variant-identity` header
reports. Warm state is never shared across identities, whatever the prompts.

`Guard` runs before any route: the Host header (loopback names only when bound to
loopback, so a web page cannot reach the server through DNS rebinding), the API key
(constant-time comparison) and the body size. CORS headers are sent only for the
origin given with `--cors-origin`.

The request log (`ServerState.record`, what the Server panel and `serve`'s stderr show)
holds every generation that reached the engine and every request answered with an
error, whichever step refused it (the guard, a malformed body, an unknown model or
endpoint), with its status and message. A generation is announced (`Pending`) when it
reaches the engine, saying whether the engine must load its base first.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import json
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from engine import __version__
from engine.catalog.resolve import SessionSpec
from engine.catalog.store import Catalog, Snapshot
from engine.errors import StudioError
from engine.formats.tool_calls import Constraint
from engine.runtime import messages as m
from engine.runtime.results import GenerationResult
from engine.serve import schemas, structured
from engine.serve.bridge import EngineBridge
from engine.serve.config import ServeConfig, is_loopback
from engine.serve.errors import ApiError, from_studio_error
from engine.serve.models import ServedModels

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}
LOG_ENTRIES = 500


@dataclass(frozen=True)
class LogEntry:
    """One served request, as the request log and the app's Server panel show it."""

    time: float
    path: str
    model: str
    identity: str  # short identity key ("" when the request failed before resolving)
    prompt_tokens: int
    completion_tokens: int
    tokens_per_second: float
    status: int
    seconds: float
    reason: str = ""  # why a request failed ("" when it was served)
    id: str = ""  # the reply's id, as its `Pending` announced it ("" when refused early)


@dataclass(frozen=True)
class Pending:
    """A generation that reached the engine and has not ended yet: the Server panel shows
    it at once (a first request waits while the engine loads the model, 20 s for a small
    one on a laptop, and a user must see why), then replaces it with its `LogEntry`."""

    id: str
    time: float
    path: str
    model: str
    base: str  # the base model's name: what is loading
    loading: bool  # the engine has not served this base since it started


@dataclass
class ServerState:
    config: ServeConfig
    bridge: EngineBridge
    models: ServedModels
    log: deque[LogEntry] = dataclasses.field(default_factory=lambda: deque(maxlen=LOG_ENTRIES))
    listeners: list[Callable[[LogEntry], None]] = dataclasses.field(default_factory=list)
    pending_listeners: list[Callable[[Pending], None]] = dataclasses.field(
        default_factory=list)
    started: float = dataclasses.field(default_factory=time.time)
    # (backend, base path) the engine answered for since its process started: a request
    # for another one makes the engine load its base first.
    warm: set[tuple[str, str]] = dataclasses.field(default_factory=set)

    def record(self, entry: LogEntry) -> None:
        self.log.append(entry)
        for listener in list(self.listeners):
            with contextlib.suppress(Exception):  # a listener must not break serving
                listener(entry)

    def refused(self, path: str, model: str, error: ApiError) -> None:
        """A request answered with an error before it reached the engine (a bad key, a
        malformed body, an unknown model or endpoint): logged with its status and
        message, which is what someone debugging a client looks for."""
        self.record(LogEntry(time.time(), path, model, "", 0, 0, 0.0, error.status, 0.0,
                             error.message))

    def loading(self, spec: SessionSpec) -> bool:
        """Whether the engine must load this request's base before answering."""
        if not self.bridge.engine_running():
            self.warm.clear()  # a new engine process (at start, or after a crash) is cold
        return (spec.backend, spec.base_path) not in self.warm

    def announce(self, pending: Pending) -> None:
        for listener in list(self.pending_listeners):
            with contextlib.suppress(Exception):  # a listener must not break serving
                listener(pending)


# --------------------------------------------------------------------------- guard


class Guard:
    """Host header, API key and body size, checked before anything else (pure ASGI, so
    streaming and disconnects pass through untouched)."""

    def __init__(self, app: Any, config: ServeConfig, state: ServerState | None = None
                 ) -> None:
        self.app = app
        self.config = config
        self.state = state  # where its refusals are logged
        self.key = config.api_key.encode() if config.api_key else None

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        error = self._check(scope, headers)
        length = headers.get("content-length")
        if error is None and length is not None and (
                not length.isdigit() or int(length) > self.config.max_body_bytes):
            error = _too_large(self.config)
        if error is not None:
            if self.state is not None:
                self.state.refused(scope.get("path", ""), "", error)
            await error.response()(scope, receive, send)
            return
        seen = 0

        async def bounded_receive() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.config.max_body_bytes:
                    raise _too_large(self.config)
            return message

        await self.app(scope, bounded_receive, send)

    def _check(self, scope: dict, headers: dict[str, str]) -> ApiError | None:
        if self.config.loopback and not _loopback_host(headers.get("host", "")):
            return ApiError(403, "this server answers only requests addressed to the loopback "
                            "host (the Host header names another)", None, "forbidden_host")
        if self.key is None or scope.get("method") == "OPTIONS":
            return None
        given = headers.get("authorization", "")
        token = given[7:].strip() if given[:7].lower() == "bearer " else ""
        if not hmac.compare_digest(token.encode("latin-1", "replace"), self.key):
            return ApiError(401, "missing or wrong API key (send Authorization: Bearer KEY)",
                            None, "invalid_api_key")
        return None


def _loopback_host(host: str) -> bool:
    name = host.rsplit(":", 1)[0] if not host.startswith("[") else host.split("]")[0] + "]"
    return is_loopback(name)  # any 127.0.0.0/8 address the server may be bound to


def _too_large(config: ServeConfig) -> ApiError:
    return ApiError(413, f"request body larger than {config.max_body_bytes} bytes", None,
                    "request_too_large")


# --------------------------------------------------------------------------- routes


def state_of(request: Request) -> ServerState:
    return request.app.state.server


async def list_models(request: Request) -> Response:
    return JSONResponse(state_of(request).models.listing())


async def get_model(request: Request) -> Response:
    state = state_of(request)
    name = request.path_params["model"]
    request.state.model = name[:200]  # for the request log, if it fails
    state.models.spec(name)  # 404 for an unknown name
    entry = state.models.entry(name)
    if entry is None:
        raise ApiError(400, f"{name} cannot be served now", "model", "model_unavailable")
    return JSONResponse(entry)


async def status(request: Request) -> Response:
    state = state_of(request)
    try:
        engine: dict[str, Any] = (await state.bridge.call(m.Describe())).to_dict()
    except StudioError as exc:
        engine = {"state": "unavailable", "error": exc.message}
    config = state.config
    return JSONResponse({
        "server": {"version": __version__, "host": config.host, "port": config.port,
                   "started": state.started, "in_flight": state.bridge.in_flight,
                   "served": state.bridge.served, "queue_limit": config.queue_limit,
                   "max_sessions": config.max_sessions, "max_tokens": config.max_tokens,
                   "api_key": config.api_key is not None,
                   # As the Server panel's checkboxes set it now (None: every model).
                   "exposed": None if state.models.exposed is None
                   else list(state.models.exposed)},
        "engine": engine})


async def embeddings(request: Request) -> Response:
    raise ApiError(400, "embeddings are not supported: Variant Studio serves text generation "
                   "with adapters (chat and completions)", None, "unsupported_endpoint")


async def chat_completions(request: Request) -> Response:
    state = state_of(request)
    body = schemas.parse(schemas.ChatCompletionRequest, await _json(request))
    snapshot = state.models.offered(body.model)
    try:
        prompt, constraint = structured.chat_request(body)
    except StudioError as exc:  # a value the engine's own types refuse
        raise structured.studio_error(exc) from None
    return await _serve(request, state, snapshot, body, prompt, chat=True,
                        constraint=constraint)


async def completions(request: Request) -> Response:
    state = state_of(request)
    body = schemas.parse(schemas.CompletionRequest, await _json(request))
    snapshot = state.models.offered(body.model)
    if not body.text():
        raise ApiError(400, "the prompt is empty", "prompt", "invalid_value")
    return await _serve(request, state, snapshot, body, m.Prompt(body.text()), chat=False,
                        constraint=structured.completion_constraint(body))


async def _json(request: Request) -> Any:
    raw = await request.body()
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, f"the body is not valid JSON ({type(exc).__name__})", None,
                       "invalid_json") from None
    if isinstance(data, dict) and isinstance(data.get("model"), str):
        request.state.model = data["model"][:200]  # for the request log, if it fails
    return data


def _generate(state: ServerState, snapshot: Snapshot, body: Any, prompt: m.Prompt,
              constraint: Constraint | None = None) -> m.Generate:
    """The engine request (`runtime.assembly`, as every front end builds it): the
    model's profile with the request's sampling fields on top."""
    limit = body.token_limit()
    if limit is not None and limit > state.config.max_tokens:
        field = "max_completion_tokens" if getattr(body, "max_completion_tokens", None) \
            else "max_tokens"
        raise ApiError(400, f"{field} {limit} is more than this server allows "
                       f"({state.config.max_tokens})", field, "invalid_value")
    return state.models.request(snapshot, body.model, prompt, body.alternatives(),
                                max_tokens=limit, temperature=body.temperature,
                                top_p=body.top_p, seed=body.seed, top_k=body.top_k,
                                repeat_penalty=body.repeat_penalty, stop=body.stops(),
                                constraint=constraint)


async def _serve(request: Request, state: ServerState, snapshot: Snapshot, body: Any,
                 prompt: m.Prompt, chat: bool, constraint: Constraint | None = None
                 ) -> Response:
    generate = _generate(state, snapshot, body, prompt, constraint)
    spec = generate.spec
    reply = Reply(state, request.url.path, spec, chat, body)
    reply.loading = state.loading(spec)
    headers = {"x-variant-identity": spec.identity.key}
    if body.stream:
        state.bridge.check_capacity()  # a full queue is a 429, before the stream's 200
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return EventSourceResponse(reply.chunks(generate, include_usage), headers=headers,
                                   ping=15)
    result = await reply.whole(generate, request)
    return JSONResponse(result, headers=headers)


class Reply:
    """One completion request: its engine events turned into OpenAI's shapes."""

    def __init__(self, state: ServerState, path: str, spec: SessionSpec, chat: bool,
                 body: Any) -> None:
        self.state = state
        self.path = path
        self.spec = spec
        self.chat = chat
        self.body = body
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.started = time.monotonic()
        self.fingerprint = f"vs-{__version__}-{spec.identity.short}"
        self.loading = False  # the engine loads the base first (`ServerState.loading`)

    def _begin(self) -> None:
        """Submitted to the engine: the panel shows the request while it runs."""
        self.state.announce(Pending(self.id, time.time(), self.path, self.spec.name,
                                    self.spec.base_name, self.loading))

    def _head(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created,
                "model": self.spec.name, "system_fingerprint": self.fingerprint}

    def _log(self, status: int, result: GenerationResult | None, reason: str = "") -> None:
        if result is not None:  # the engine holds this base now
            self.state.warm.add((self.spec.backend, self.spec.base_path))
        self.state.record(LogEntry(
            time.time(), self.path, self.spec.name, self.spec.identity.short,
            result.prompt_tokens if result else 0, len(result.token_ids) if result else 0,
            result.tokens_per_second if result else 0.0, status,
            time.monotonic() - self.started, reason, self.id))

    @staticmethod
    def usage(result: GenerationResult) -> dict[str, int]:
        prompt, completion = result.prompt_tokens, len(result.token_ids)
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion}

    # ------------------------------------------------------------------ whole

    async def whole(self, generate: m.Generate, request: Request) -> dict[str, Any]:
        tokens: list[m.Token] = []
        async with self.state.bridge.stream(generate) as events:
            self._begin()
            gone = asyncio.ensure_future(_disconnected(request))
            try:
                async for event in _until(events, gone):
                    if isinstance(event, m.Token):
                        tokens.append(event)
                    elif isinstance(event, m.Finished):
                        result = event.result
                        break
                    elif isinstance(event, m.Failed):
                        error = from_studio_error(event.error)
                        self._log(error.status, None, error.message)
                        error.logged = True
                        raise error
                    elif isinstance(event, m.Cancelled):
                        self._log(499, None, "cancelled")
                        raise ApiError(503, "the request was cancelled", None, "cancelled",
                                       logged=True)
                else:  # the client went away: leaving the block cancels the generation
                    self._log(499, None, "client disconnected")
                    raise ApiError(499, "client disconnected", logged=True)
            finally:
                gone.cancel()
        self._log(200, result)
        finish = FINISH.get(result.finish_reason or "", "stop")
        logprobs = self._logprobs(tokens) if generate.top_logprobs else None
        if self.chat:
            message, called = structured.message(result)
            if called and finish == "stop":
                finish = "tool_calls"
            choice = {"index": 0, "message": message, "logprobs": logprobs,
                      "finish_reason": finish}
            return {**self._head("chat.completion"), "choices": [choice],
                    "usage": self.usage(result), **self.extra(result)}
        choice = {"index": 0, "text": result.text, "logprobs": logprobs,
                  "finish_reason": finish}
        return {**self._head("text_completion"), "choices": [choice],
                "usage": self.usage(result), **self.extra(result)}

    @staticmethod
    def extra(result: GenerationResult) -> dict[str, Any]:
        """Our own field (OpenAI clients keep unknown ones): what `variant-studio replay`
        regenerates this answer from."""
        return {"variant_studio": {"replay": result.replay}}

    def _logprobs(self, tokens: list[m.Token]) -> dict[str, Any]:
        if self.chat:
            wanted = self.body.top_logprobs or 0
            return {"content": [
                {"token": t.piece, "logprob": t.logprob, "bytes": list(t.piece.encode()),
                 "top_logprobs": [{"token": text, "logprob": lp, "bytes": list(text.encode())}
                                  for _id, text, lp in t.top[:wanted]]}
                for t in tokens]}
        offsets, at = [], 0
        for t in tokens:
            offsets.append(at)
            at += len(t.text)
        return {"tokens": [t.piece for t in tokens],
                "token_logprobs": [t.logprob for t in tokens],
                "top_logprobs": [{text: lp for _id, text, lp in t.top} for t in tokens],
                "text_offset": offsets}

    # ------------------------------------------------------------------ streaming

    async def chunks(self, generate: m.Generate, include_usage: bool) -> AsyncIterator[str]:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        extra = {"usage": None} if include_usage else {}

        calls = structured.StreamedCalls()
        shown = 0  # characters of content sent

        def chunk(delta: str | None, finish: str | None, logprobs: Any = None,
                  role: bool = False, tool_calls: list[dict[str, Any]] | None = None) -> str:
            if self.chat:
                content: dict[str, Any] = {"role": "assistant"} if role else {}
                if delta is not None:
                    content["content"] = delta
                if tool_calls:
                    content["tool_calls"] = tool_calls
                choice = {"index": 0, "delta": content, "logprobs": logprobs,
                          "finish_reason": finish}
            else:
                choice = {"index": 0, "text": delta or "", "logprobs": logprobs,
                          "finish_reason": finish}
            return json.dumps({**self._head(kind), "choices": [choice], **extra})

        result: GenerationResult | None = None
        try:
            async with self.state.bridge.stream(generate) as events:
                self._begin()
                if self.chat:
                    yield chunk("", None, role=True)
                async for event in events:
                    if isinstance(event, m.Token):
                        logprobs = self._logprobs([event]) if generate.top_logprobs else None
                        text = event.text if event.content is None else event.content
                        shown += len(text)
                        pieces = calls.deltas(event.calls) if self.chat else []
                        if text or logprobs:
                            yield chunk(text, None, logprobs)
                        if pieces:
                            yield chunk(None, None, tool_calls=pieces)
                    elif isinstance(event, m.Finished):
                        result = event.result
                    elif isinstance(event, m.Failed):
                        error = from_studio_error(event.error)
                        self._log(error.status, None, error.message)
                        yield json.dumps(error.body())
                        return
                    elif isinstance(event, m.Cancelled):
                        self._log(499, None, "cancelled")
                        return
        except ApiError as error:  # refused before it started (the queue is full)
            self._log(error.status, None, error.message)
            yield json.dumps(error.body())
            return
        except asyncio.CancelledError:  # the client disconnected: the engine was told
            self._log(499, None, "client disconnected")
            raise
        assert result is not None
        self._log(200, result)
        finish = FINISH.get(result.finish_reason or "", "stop")
        # What the parser held back until the end (the engine's result has it all).
        whole = result.content if result.content is not None else result.text
        if len(whole) > shown:
            yield chunk(whole[shown:], None)
        if self.chat and result.tool_calls:
            rest = calls.rest(result.tool_calls)
            if rest:
                yield chunk(None, None, tool_calls=rest)
            if finish == "stop":
                finish = "tool_calls"
        yield chunk(None, finish)
        if include_usage:
            yield json.dumps({**self._head(kind), "choices": [], "usage": self.usage(result)})
        yield "[DONE]"


async def _disconnected(request: Request) -> None:
    """Returns when the client closes the connection (the body was already read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _until(events: AsyncIterator[m.Event], gone: asyncio.Future
                 ) -> AsyncIterator[m.Event]:
    """`events`, stopping early (without an error) once `gone` completes."""
    while True:
        step = asyncio.ensure_future(anext(events))
        done, _ = await asyncio.wait({step, gone}, return_when=asyncio.FIRST_COMPLETED)
        if step not in done:
            step.cancel()
            return
        try:
            yield step.result()
        except StopAsyncIteration:
            return


# --------------------------------------------------------------------------- errors


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    if not exc.logged:
        # Refused before a reply existed (a bad field, an unknown model, a schema that
        # cannot be compiled): the request log shows it too, with the reason.
        state_of(request).refused(request.url.path, getattr(request.state, "model", ""),
                                  exc)
    return exc.response()


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = {404: f"no such endpoint: {request.method} {request.url.path}",
               405: f"{request.method} is not allowed on {request.url.path}"}.get(
        exc.status_code, str(exc.detail))
    error = ApiError(exc.status_code, message, None, "not_found" if exc.status_code == 404
                     else None)
    # A client with a wrong base URL (no /v1) sees its 404s in the log.
    state_of(request).refused(request.url.path, "", error)
    return error.response()


async def _internal_error(request: Request, exc: Exception) -> Response:
    # Never a traceback in a response: the type is enough for a bug report.
    error = from_studio_error(exc) if isinstance(exc, StudioError) else ApiError(
        500, f"internal error ({type(exc).__name__})", None, "internal_error")
    state_of(request).refused(request.url.path, getattr(request.state, "model", ""), error)
    return error.response()


def create_app(config: ServeConfig, bridge: EngineBridge,
               catalog: Catalog | None = None) -> Starlette:
    routes = [
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", get_model, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/v1/variant-studio/status", status, methods=["GET"]),
    ]
    middleware = []
    if config.cors_origin:
        middleware.append(Middleware(
            CORSMiddleware, allow_origins=[config.cors_origin], allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type"],
            expose_headers=["x-variant-identity"]))
    app = Starlette(routes=routes, middleware=middleware, exception_handlers={
        ApiError: _api_error, HTTPException: _http_error, Exception: _internal_error})
    app.state.server = ServerState(config, bridge, ServedModels(catalog or Catalog(),
                                                                config.variants))
    return app


def guarded(app: Starlette, config: ServeConfig) -> Guard:
    """The app behind its guard: what the HTTP server runs."""
    return Guard(app, config, app.state.server)
