"""Chat templates rendered in a sandbox with limits.

A chat template comes from the model file, so it is untrusted code: it renders in
jinja2's ImmutableSandboxedEnvironment (no attribute access to Python internals, no
mutation of the values we pass in), with a deadline and a call-depth limit enforced
by a trace hook (a template loop that never ends, or nesting that would reach Python's
recursion limit, is stopped), a cap on the output size, a cap on the memory it may
claim, and any failure reported as a TemplateError with the template's own message.

The memory cap touches nothing process-wide (lowering RLIMIT_AS would also fail the
allocations of every other thread of the process while a render runs): the trace hook
reads the process's resident memory every few milliseconds and stops a render that grew it
by more than MEMORY_HEADROOM (a string doubled in a loop), and the operations that can
claim unbounded memory in one C call, where no hook runs (`'x' * n`, `'x'.ljust(n)`,
`'%999999999s' % x`, `replace` on many matches, a `join` of many long strings, the
`center`/`indent`/`format` filters), are sized before they run and refused past MAX_OUTPUT_CHARS.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
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
MEMORY_HEADROOM = 64 << 20  # bytes of resident memory a render may add (the output cap
# is 4 Mi characters: 16 MiB at most as a Python string)
MEMORY_CHECK_SECONDS = 0.002  # between two reads of the resident memory
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

    def __init__(self, seconds: float, max_depth: int, memory: _Resident) -> None:
        self.deadline = time.monotonic() + seconds
        self.max_depth = max_depth
        self.depth = 0
        self.compiling = True
        self.memory = memory
        self.memory_limit = memory.now() + MEMORY_HEADROOM
        self.next_memory_check = 0.0

    def __call__(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "call":
            self.depth += 1
            if self.depth > self.max_depth:
                raise TemplateError("chat template is nested too deeply to compile"
                                    if self.compiling else "chat template recursed too deeply")
        elif event == "return":
            self.depth -= 1
        now = time.monotonic()
        if now > self.deadline:
            raise TemplateError(f"chat template did not finish within {DEADLINE_SECONDS:g} s")
        if now >= self.next_memory_check:
            self.next_memory_check = now + MEMORY_CHECK_SECONDS
            if self.memory.now() > self.memory_limit:
                raise MemoryError  # reported as "used too much memory"
        return self


def _depth_budget() -> int:
    """Python frames a render may add: at most MAX_CALL_DEPTH, always leaving 200 spare."""
    depth, frame = 0, sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    return max(50, min(MAX_CALL_DEPTH, sys.getrecursionlimit() - depth - 200))


class _Resident:
    """The process's resident memory in bytes, from /proc/self/statm (0 where there is
    none: the output cap and the size checks still hold)."""

    def __init__(self) -> None:
        try:
            self._fd: int | None = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            self._fd = None
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    def now(self) -> int:
        if self._fd is None:
            return 0
        return int(os.pread(self._fd, 128, 0).split()[1]) * self._page

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


_WIDTH = re.compile(r"\d+")


def _too_large(size: int) -> None:
    if size > MAX_OUTPUT_CHARS:
        raise TemplateError(f"chat template output exceeds {MAX_OUTPUT_CHARS} chars")


def _check_sizes(args: Sequence[Any]) -> None:
    """No size argument (a width, a count, a tab size) beyond the output cap."""
    for value in args:
        if isinstance(value, int) and not isinstance(value, bool):
            _too_large(abs(value))
        elif isinstance(value, str):
            # A width inside a format string ('%999999999s', '{:>999999999}').
            for digits in _WIDTH.findall(value):
                _too_large(int(digits) if len(digits) < 12 else MAX_OUTPUT_CHARS + 1)


def _check_growth(obj: Any, name: str, args: Sequence[Any]) -> None:
    """The result size of the string methods that can grow a string in one C call."""
    if not isinstance(obj, str):
        return
    if name == "replace" and len(args) >= 2 and isinstance(args[0], str) \
            and isinstance(args[1], str):
        matches = obj.count(args[0]) if args[0] else len(obj) + 1
        _too_large(len(obj) + matches * max(0, len(args[1]) - len(args[0])))
    elif name == "expandtabs":
        size = args[0] if args and isinstance(args[0], int) else 8
        _too_large(len(obj) + obj.count("\t") * max(0, size))
    elif name in ("format", "format_map"):
        _check_sizes([obj])
    elif name == "join" and args:
        _check_join(args[0], obj)


def _check_join(items: Any, separator: Any) -> None:
    """A join's result size, from its strings (a list of a thousand 4-million-character
    strings is small; joined, it is 4 billion characters in one C call)."""
    if isinstance(items, list | tuple) and isinstance(separator, str):
        _too_large(sum(len(x) for x in items if isinstance(x, str))
                   + len(separator) * max(0, len(items) - 1))


def _bounded_filter(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """A filter whose size arguments are checked before it runs (`functools.wraps` keeps
    the attributes that tell jinja which context to pass)."""

    @functools.wraps(function)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        values = [*args, *kwargs.values()]
        _check_sizes([v for v in values if not isinstance(v, str)])
        strings = [v for v in args if isinstance(v, str)]
        if name == "format" and strings:
            _check_sizes(strings[:1])  # the format string: `'%999999999s' | format(x)`
        if name == "replace" and len(strings) >= 3:
            _check_growth(strings[0], "replace", strings[1:3])
        if name == "join":  # (eval context, items, separator="", attribute=None)
            items = next((v for v in args if isinstance(v, list | tuple)), None)
            _check_join(items, strings[0] if strings else kwargs.get("d", ""))
        return function(*args, **kwargs)

    return bounded


# Filters that take a size (or a format string, or strings to join) and build a string.
_SIZED_FILTERS = ("center", "indent", "format", "wordwrap", "truncate", "replace", "join")


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """Sizes, before they run, the operations that can claim unbounded memory in one C
    call (see the module docstring)."""

    intercepted_binops = frozenset(["*", "**", "%"])

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        for name in _SIZED_FILTERS:
            self.filters[name] = _bounded_filter(name, self.filters[name])

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**":
            if isinstance(left, int) and isinstance(right, int) and (
                    left.bit_length() * abs(right) > 1 << 20):
                raise TemplateError("chat template computes an absurd power")
            return left**right
        if operator == "%":
            if isinstance(left, str):
                _check_sizes([left, *(right if isinstance(right, tuple) else (right,))])
            return left % right
        for seq, count in ((left, right), (right, left)):
            if (isinstance(seq, str | list | tuple) and isinstance(count, int)
                    and len(seq) * count > MAX_OUTPUT_CHARS):
                raise TemplateError(f"chat template output exceeds {MAX_OUTPUT_CHARS} chars")
        return left * right

    def call(self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        # The sandbox hands `str.format` over wrapped (its safe formatter); the method
        # itself is `__wrapped__`.
        method = getattr(__obj, "__wrapped__", __obj)
        owner = getattr(method, "__self__", None)
        if isinstance(owner, str | list | tuple):
            _check_sizes([*args, *kwargs.values()])
            _check_growth(owner, getattr(method, "__name__", ""), args)
        return super().call(__context, __obj, *args, **kwargs)


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
    memory = _Resident()
    try:
        guard = _Guard(deadline, _depth_budget(), memory)
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
            memory.close()
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
    """Parse and compile under the render's deadline and memory watch.

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
