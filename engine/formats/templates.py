"""Chat templates rendered in a sandbox with limits.

A chat template comes from the model file, so it is untrusted code: it renders in
jinja2's ImmutableSandboxedEnvironment (no attribute access to Python internals, no
mutation of the values we pass in), with a deadline and a call-depth limit enforced
by a trace hook (a template loop that never ends, or nesting that would reach Python's
recursion limit, is stopped), a cap on the output size, a cap on the
memory it may claim (the process's address-space limit is lowered for the duration
of the render, so a string doubled forty times fails with MemoryError instead of
taking the machine down), and any failure reported as a TemplateError with the
template's own message.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.errors import RefusedError
from engine.formats.safeio import printable
from engine.wire import OMIT_NONE

MAX_TEMPLATE_CHARS = 256 << 10
MAX_OUTPUT_CHARS = 4 << 20
DEADLINE_SECONDS = 2.0
MEMORY_HEADROOM = 256 << 20  # bytes of address space a render may add
MAX_CALL_DEPTH = 500  # Python frames a render may add (the parser uses ~12 per nesting level)
ROLES = ("system", "user", "assistant")
# A prompt may also carry tool results (`engine.formats.tool_calls`); training data and
# the chat's own conversations use ROLES.
CHAT_ROLES = (*ROLES, "tool")


class TemplateError(RefusedError):
    """The chat template could not be rendered safely."""


@dataclass(frozen=True)
class ToolCall:
    """A call an assistant made: `arguments` is its JSON text, as OpenAI sends it."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Message:
    role: str
    content: str
    # An assistant's tool calls, and a tool result's call id and tool name (left out of
    # the JSON while unset, so a plain message reads and writes as it always did).
    tool_calls: tuple[ToolCall, ...] | None = field(default=None, metadata=OMIT_NONE)
    tool_call_id: str | None = field(default=None, metadata=OMIT_NONE)
    name: str | None = field(default=None, metadata=OMIT_NONE)

    def template_dict(self) -> dict[str, Any]:
        """The message as chat templates read it (Hugging Face's shape: tool calls with
        their arguments as a mapping when they are a JSON object)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.name, "arguments": _arguments_value(c.arguments)}}
                for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


def _arguments_value(arguments: str) -> Any:
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        return arguments
    return value if isinstance(value, dict) else arguments


def _raise_exception(message: str) -> None:
    raise TemplateError(f"chat template refused the conversation: {message}")


class _Guard:
    """A trace function that aborts compiling or rendering past the deadline, or when
    the template drives Python calls too deep.

    Jinja's parser recurses once per nesting level and macros may call themselves;
    left alone, either reaches Python's recursion limit, where any finalizer that
    happens to run fails too ("Exception ignored ..."). Counting call depth stops
    them well before that, with a clear reason.
    """

    def __init__(self, seconds: float, max_depth: int) -> None:
        self.deadline = time.monotonic() + seconds
        self.max_depth = max_depth
        self.depth = 0
        self.compiling = True

    def __call__(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "call":
            self.depth += 1
            if self.depth > self.max_depth:
                raise TemplateError("chat template is nested too deeply to compile"
                                    if self.compiling else "chat template recursed too deeply")
        elif event == "return":
            self.depth -= 1
        if time.monotonic() > self.deadline:
            raise TemplateError(f"chat template did not finish within {DEADLINE_SECONDS:g} s")
        return self


def _depth_budget() -> int:
    """Python frames a render may add: at most MAX_CALL_DEPTH, always leaving 200 spare."""
    depth, frame = 0, sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    return max(50, min(MAX_CALL_DEPTH, sys.getrecursionlimit() - depth - 200))


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """Bounds the two operators that can do unbounded work inside one C call."""

    intercepted_binops = frozenset(["*", "**"])

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**":
            if isinstance(left, int) and isinstance(right, int) and (
                    left.bit_length() * abs(right) > 1 << 20):
                raise TemplateError("chat template computes an absurd power")
            return left**right
        for seq, count in ((left, right), (right, left)):
            if (isinstance(seq, str | list | tuple) and isinstance(count, int)
                    and len(seq) * count > MAX_OUTPUT_CHARS):
                raise TemplateError(f"chat template output exceeds {MAX_OUTPUT_CHARS} chars")
        return left * right


_rlimit_lock = threading.Lock()


@contextlib.contextmanager
def _memory_cap(headroom: int) -> Iterator[None]:
    """Lower RLIMIT_AS to the current address space plus `headroom` while rendering.

    Single C calls ('x'.ljust(10**9), a string doubled in a loop) cannot be stopped
    by the trace hook; with the limit they raise MemoryError instead. Where the
    platform has no RLIMIT_AS or /proc/self/statm, rendering runs without this cap.
    """
    try:
        import resource

        with open("/proc/self/statm", encoding="ascii") as handle:
            current = int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError, AttributeError):
        yield
        return
    limit = current + headroom
    if (soft != resource.RLIM_INFINITY and soft <= limit) or (
            hard != resource.RLIM_INFINITY and hard < limit):
        yield  # an existing limit is already tighter
        return
    with _rlimit_lock:  # one capped render at a time per process
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
        try:
            yield
        finally:
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _environment() -> ImmutableSandboxedEnvironment:
    env = _BoundedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        undefined=jinja2.StrictUndefined, autoescape=False)
    env.globals["raise_exception"] = _raise_exception
    return env


def check_messages(messages: Sequence[Message]) -> None:
    if not messages:
        raise RefusedError("a chat needs at least one message")
    for message in messages:
        if message.role not in CHAT_ROLES:
            raise RefusedError(f"unknown chat role {message.role!r}")


def render(
    template: str,
    messages: Sequence[Message],
    *,
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    deadline: float = DEADLINE_SECONDS,
    tools: Sequence[dict[str, Any]] | None = None,
) -> str:
    """Render `messages` with `template`; raises TemplateError with a clear reason.

    `tools` (OpenAI function definitions, `{"type": "function", "function": {...}}`)
    reach the template as `tools`, as Hugging Face passes them; without it the template
    sees no `tools` at all, as before."""
    check_messages(messages)
    if len(template) > MAX_TEMPLATE_CHARS:
        raise TemplateError(f"chat template longer than {MAX_TEMPLATE_CHARS} characters")
    env = _environment()
    context = {
        "messages": [m.template_dict() for m in messages],
        "bos_token": bos_token,
        "eos_token": eos_token,
        "add_generation_prompt": add_generation_prompt,
    }
    if tools is not None:
        context["tools"] = [dict(tool) for tool in tools]
    pieces: list[str] = []
    size = 0
    previous = sys.gettrace()
    try:
        with _memory_cap(MEMORY_HEADROOM):
            guard = _Guard(deadline, _depth_budget())
            sys.settrace(guard)
            try:
                compiled = _compile(env, template)
                guard.compiling = False
                for piece in compiled.generate(context):
                    size += len(piece)
                    if size > MAX_OUTPUT_CHARS:
                        raise TemplateError(
                            f"chat template output exceeds {MAX_OUTPUT_CHARS} chars")
                    pieces.append(piece)
            finally:
                sys.settrace(previous)
    except TemplateError:
        raise
    except jinja2.exceptions.SecurityError as exc:
        raise TemplateError(f"chat template tried something unsafe: {exc}") from None
    except jinja2.TemplateError as exc:
        raise TemplateError(f"chat template failed: {exc}") from None
    except RecursionError:
        raise TemplateError("chat template recursed too deeply") from None
    except MemoryError:
        raise TemplateError("chat template used too much memory") from None
    except Exception as exc:  # anything else a template can provoke
        raise TemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from None
    return "".join(pieces)


def _compile(env: ImmutableSandboxedEnvironment, template: str) -> jinja2.Template:
    """Parse and compile under the render's deadline and memory cap.

    Jinja's parser recurses once per nesting level: `{{ ((((...1)))) }}` or a few
    hundred nested `{% if %}` raise RecursionError while compiling, before any
    rendering starts (found by fuzzing).
    """
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"chat template has a syntax error (line {exc.lineno}): "
                            f"{printable(str(exc.message))}") from None
    except RecursionError:
        raise TemplateError("chat template is nested too deeply to compile") from None
    except (TemplateError, MemoryError):
        raise
    except Exception as exc:  # e.g. Python's own limits on the generated code
        raise TemplateError(f"chat template could not be compiled: {type(exc).__name__}: "
                            f"{printable(str(exc))}") from None


def plain_prompt(messages: Sequence[Message]) -> str:
    """A fallback for models without a template: role-labelled lines."""
    check_messages(messages)
    return "".join(f"{m.role}: {m.content}\n" for m in messages) + "assistant:"
