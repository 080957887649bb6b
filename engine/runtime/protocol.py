"""The engine wire protocol: JSON lines over pipes.

Client -> engine: `{"id", "op", "params"}`; `{"op": "cancel", "target": id}`;
`{"op": "shutdown"}`.
Engine -> client: `{"id", "event", ...}` where event is `token` or `progress` while a
request runs, and exactly one of `finished` (with `result`), `failed` (with
`error`: type, message, details) or `cancelled` at its end. The engine announces
itself with `{"event": "ready", "pid", "versions"}`.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from typing import IO, Any

from engine import errors

TERMINAL = ("finished", "failed", "cancelled")
MAX_LINE = 64 << 20

ERROR_TYPES: dict[str, type[errors.StudioError]] = {
    cls.__name__: cls
    for cls in (errors.StudioError, errors.UsageError, errors.RefusedError,
                errors.InspectionError, errors.ValidationError, errors.ContextOverflowError,
                errors.UnknownNameError,
                errors.Cancelled, errors.EngineError, errors.StateError)
}


def read_messages(stream: IO[bytes], dispatch: Callable[[dict[str, Any]], None]) -> None:
    """Call `dispatch` for every JSON object line until the stream ends."""
    for raw in stream:
        try:
            message = json.loads(raw)
        except (ValueError, RecursionError):
            continue
        if isinstance(message, dict):
            dispatch(message)


def read_log(stream: IO[bytes], lines: deque[str]) -> None:
    """Keep a child process's stderr lines (the ring buffer bounds them)."""
    for raw in stream:
        line = raw.decode("utf-8", "replace").rstrip()
        if line:
            lines.append(line)


def encode(message: dict[str, Any]) -> bytes:
    return (json.dumps(message, separators=(",", ":"), ensure_ascii=False) + "\n").encode()


def error_payload(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, errors.StudioError):
        # Subclasses the client does not know (templates.TemplateError, ...) travel as
        # their nearest known type, so a refusal stays a RefusedError on the other side.
        known = next(c for c in type(exc).__mro__ if ERROR_TYPES.get(c.__name__) is c)
        return {"type": known.__name__, "message": exc.message,
                "details": list(exc.details)}
    return {"type": "EngineError", "message": f"internal error: {type(exc).__name__}: {exc}",
            "details": []}


def error_from_payload(payload: dict[str, Any]) -> errors.StudioError:
    cls = ERROR_TYPES.get(payload.get("type", ""), errors.EngineError)
    if cls is errors.StudioError:
        cls = errors.EngineError
    # templates.TemplateError and other subclasses travel as their nearest known type.
    return cls(str(payload.get("message", "engine error")),
               details=tuple(str(d) for d in payload.get("details", [])))
