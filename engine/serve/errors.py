"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, with the
status a client acts on: 400 a malformed request, 401 a bad key, 404 an unknown model
(never a fall-back to another one), 413 too large, 429 busy (with Retry-After), 503 the
engine is restarting. The official client retries 408, 409, 429 and 5xx, so only what
may succeed on retry is a 429 or a 5xx."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from engine.errors import (
    ContextOverflowError,
    EngineError,
    RefusedError,
    StudioError,
    UnknownNameError,
    UsageError,
)

TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
         404: "invalid_request_error",
         405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
         500: "server_error", 503: "server_error"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None,
                 logged: bool = False) -> None:
        super().__init__(message)
        # Already in the server's request log (a reply logged it when it failed).
        self.logged = logged
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": TYPES.get(self.status, "server_error"),
                          "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def from_studio_error(exc: StudioError) -> ApiError:
    """The HTTP error for an engine or catalog error (never a traceback)."""
    if isinstance(exc, ContextOverflowError):
        return ApiError(413, exc.message, "messages", "context_length_exceeded")
    if isinstance(exc, UnknownNameError):
        return ApiError(404, exc.message, "model", "model_not_found")
    if isinstance(exc, UsageError | RefusedError):
        return ApiError(400, exc.message, None, "refused")
    if isinstance(exc, EngineError) and exc.message.startswith("engine stopped"):
        return ApiError(503, f"the engine is restarting ({exc.message}); try again",
                        None, "engine_restarting", {"Retry-After": "1"})
    return ApiError(500, f"the request failed: {exc.message}", None, "engine_error")
