"""Chat formats with tools: OpenAI function tools into a prompt, and a model's output
back into text and tool calls, incrementally.

A model family writes its tool calls its own way. The format is read from the base's
chat template (`detect`), which is what the model was trained to answer:

- `hermes` (Qwen 2/2.5/3, Hermes, SmolLM3 templates):
  `<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>`, one tag per call;
- `llama3` (Llama 3.1-3.3): `{"name": "f", "parameters": {...}}` as the whole answer
  (optionally after `<|python_tag|>`), calls separated by `; `;
- `bracketed` (Mistral, Mixtral): `[TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]`;
- `generic` (any template that takes no tools: SmolLM2, Gemma, Phi-3, ...): the whole
  answer is `{"tool_calls": [{"name": "f", "arguments": {...}}, ...]}`;
- `tool-args`, which no template speaks and only a variant's profile declares (its
  `tool_format`): the whole answer is `{"tool": "f", "args": {...}}` (calls one per
  line), the format of an adapter trained on its own prompt (the shipped demo's).

A profile's `tool_format` replaces what the template says (`chat_format(declared=)`):
a variant whose adapter was trained to write another format than its base's.

Rendering (`prepare`): a template that takes `tools` (and is one of the first three
formats) gets the tools and the conversation's tool calls and results as Hugging Face
passes them, and renders them itself. Any other template gets the **generic format**: a
system section listing each tool's JSON schema and saying how to call them (`GENERIC_
INSTRUCTIONS`), assistant tool calls written as the JSON object above, and tool results
as user messages `{"tool_response": {"name": ..., "tool_call_id": ..., "content": ...}}`.
A declared `tool-args` variant's own system prompt describes its tools (its adapter
was trained on that prompt), so its tools are not rendered: they only constrain and
parse the answer. Either way the result is messages for the one renderer,
`engine.formats.templates` (sandboxed), called from `engine.runtime.prompting`.

Parsing (`CallParser`): fed the answer's text as it streams, it returns the text that is
plain content and the tool-call deltas (a call's id and name as soon as the name is
known, then its arguments' JSON text as it grows, as OpenAI streams them); `finish`
gives the content and the whole calls. Streamed and whole answers go through the same
parser, so they give the same calls.

Constraints (`grammar`): what a request demands of the answer (`Constraint`: a tool call
for `tool_choice` "required" or a named function, tool calls switched on lazily when the
model starts one under "auto", a JSON object, a JSON schema) as a Lark grammar for the
grammar engine (llguidance, `engine.runtime.constraint`), in the format's own syntax,
each tool's arguments constrained by its parameters' schema.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from engine import wire
from engine.errors import RefusedError
from engine.formats.templates import Message, ToolCall, plain_prompt, render

FORMATS = ("hermes", "llama3", "bracketed", "generic", "tool-args")
# Each format in a few words, for a person choosing a variant's (the composer).
FORMAT_LABELS = {
    "hermes": "Hermes: each JSON call in <tool_call> tags",
    "llama3": "Llama 3: a JSON call with its parameters as the answer",
    "bracketed": "Bracketed: [TOOL_CALLS] and a JSON list of calls",
    "generic": 'Generic: {"tool_calls": [...]}, tools listed in the system prompt',
    "tool-args": '{"tool": NAME, "args": {...}}, tools described by your system prompt',
}
MAX_TOOLS = 128
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# JSON in a grammar: one space after ':' and ',' (as json.dumps writes it), no newlines,
# so a constrained answer cannot spend its tokens on whitespace.
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
GENERIC_INSTRUCTIONS = (
    "You can call these tools (each line: a tool's name, what it does and the JSON "
    "schema of its arguments):\n{tools}\n"
    "To call tools, answer with only this JSON object and nothing else:\n"
    '{{"tool_calls": [{{"name": "<tool name>", "arguments": {{<the arguments>}}}}]}}\n'
    "A tool's result comes back as a user message "
    '{{"tool_response": {{"name": ..., "tool_call_id": ..., "content": ...}}}}. '
    "Otherwise answer normally.")


@dataclass(frozen=True)
class Tool(wire.Wire):
    """An OpenAI function tool: its name, description and arguments' JSON schema."""

    name: Annotated[str, wire.Size(1, 64)]
    description: str = ""
    parameters: dict[str, Any] | None = field(default=None, metadata=wire.OMIT_NONE)

    def __post_init__(self) -> None:
        wire.check(self)
        if not NAME_PATTERN.match(self.name):
            raise RefusedError(f"tool name {self.name!r}: letters, digits, _ and - only "
                               "(at most 64)")

    def schema(self) -> dict[str, Any]:
        """The arguments' schema (no parameters: an object with none)."""
        return self.parameters if self.parameters is not None else {
            "type": "object", "properties": {}}

    def openai(self) -> dict[str, Any]:
        """The tool as OpenAI's `tools` entry (what a template's `tools` receives)."""
        function: dict[str, Any] = {"name": self.name, "description": self.description,
                                    "parameters": self.schema()}
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class Constraint(wire.Wire):
    """What a request demands of its answer (part of the request and of its replay record).

    `tool_choice`: None (no tools), "auto" (calls constrained once the model starts one),
    "required" (at least one call), or a tool's name (exactly that tool). `response_format`
    "json_object" / "json_schema" (`schema`) constrains a plain answer."""

    tool_choice: str | None = field(default=None, metadata=wire.OMIT_NONE)
    parallel_tool_calls: bool = True
    response_format: Literal["text", "json_object", "json_schema"] = "text"
    schema: dict[str, Any] | None = field(default=None, metadata=wire.OMIT_NONE)

    def __post_init__(self) -> None:
        wire.check(self)
        if (self.response_format == "json_schema") != (self.schema is not None):
            raise RefusedError("a json_schema response format needs its schema (and only it)")

    @property
    def active(self) -> bool:
        """Does it constrain anything?"""
        return self.tool_choice not in (None, "none") or self.response_format != "text"


# --------------------------------------------------------------------------- formats


@dataclass(frozen=True)
class Syntax:
    """How a format writes a group of calls: `opener` then calls joined by `separator`
    then `closer`; a call is `{"<name_key>": "...", "<args_key>": {...}}`. `trigger` is
    the start of `opener` (or of the first call) that tells a call is coming; `anchored`:
    only at the start of the answer (after whitespace)."""

    opener: str
    separator: str
    closer: str
    args_key: str
    trigger: str
    anchored: bool
    name_key: str = "name"

    @property
    def call_head(self) -> str:
        """A call's text up to its function's name."""
        return '{"' + self.name_key + '": "'


SYNTAX = {
    "hermes": Syntax("<tool_call>\n", "\n</tool_call>\n<tool_call>\n", "\n</tool_call>",
                     "arguments", "<tool_call>", False),
    "llama3": Syntax("", "; ", "", "parameters", '{"name"', True),
    "bracketed": Syntax("[TOOL_CALLS][", ", ", "]", "arguments", "[TOOL_CALLS]", False),
    "generic": Syntax('{"tool_calls": [', ", ", "]}", "arguments", '{"tool_calls"', True),
    "tool-args": Syntax("", "\n", "", "args", '{"tool"', True, name_key="tool"),
}


def detect(template: str | None) -> str:
    """The tool-call format a chat template speaks (`generic` when it takes no tools)."""
    if not template or "tools" not in template:
        return "generic"
    if "<tool_call>" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template:
        return "bracketed"
    if "<|python_tag|>" in template or ("ipython" in template and "<|eot_id|>" in template):
        return "llama3"
    return "generic"


def call_id(seed: str, index: int, fmt: str) -> str:
    """A call's id, the same for the same prompt and index (Mistral's templates insist on
    nine letters and digits; OpenAI's look like `call_...`)."""
    digest = hashlib.sha256(f"{seed}:{index}".encode()).hexdigest()
    return digest[:9] if fmt == "bracketed" else f"call_{digest[:24]}"


def call_json(call: ToolCall, fmt: str) -> str:
    """One call as the format's JSON object."""
    try:
        arguments: Any = json.loads(call.arguments)
    except (ValueError, RecursionError):
        arguments = call.arguments
    syntax = SYNTAX[fmt]
    return json.dumps({syntax.name_key: call.name, syntax.args_key: arguments},
                      ensure_ascii=False)


def write_calls(calls: Sequence[ToolCall], fmt: str) -> str:
    """Calls as the model writes them in the format (a generic-format history's
    assistant turn)."""
    syntax = SYNTAX[fmt]
    return syntax.opener + syntax.separator.join(call_json(c, fmt) for c in calls) + \
        syntax.closer


# --------------------------------------------------------------------------- rendering


def prepare(messages: Sequence[Message], tools: Sequence[Tool], fmt: str
            ) -> tuple[list[Message], list[dict[str, Any]] | None]:
    """The messages and `tools` argument to render with a template of format `fmt`.

    A native format renders the tools and the calls itself (`tools` returned for the
    template); the generic format gets its system section, calls written as text and
    results as user messages (no `tools`: the template never sees them); `tool-args`
    the same without the section (the variant's system prompt describes its tools)."""
    if fmt not in ("generic", "tool-args"):
        return list(messages), [t.openai() for t in tools] if tools else None
    out: list[Message] = []
    for message in messages:
        if message.role == "assistant" and message.tool_calls:
            out.append(Message("assistant", answer_text(message, fmt)))
        elif message.role == "tool":
            out.append(Message("user", json.dumps({"tool_response": {
                "name": message.name, "tool_call_id": message.tool_call_id,
                "content": message.content}}, ensure_ascii=False)))
        else:
            out.append(Message(message.role, message.content))
    if tools and fmt == "generic":
        section = generic_section(tools)
        if out and out[0].role == "system":
            out[0] = Message("system", f"{out[0].content}\n\n{section}" if out[0].content
                             else section)
        else:
            out.insert(0, Message("system", section))
    return out, None


def answer_text(message: Message, fmt: str) -> str:
    """An assistant turn as the model writes it in format `fmt`: its content, then its
    calls as the server's parser reads them (`write_calls`), on a line of their own
    after any content. Training trains exactly this text."""
    if not message.tool_calls:
        return message.content
    calls = write_calls(message.tool_calls, fmt)
    return f"{message.content}\n{calls}" if message.content else calls


def chat_format(template: str | None, messages: Sequence[Message],
                tools: Sequence[Tool] | None, declared: str | None = None) -> str | None:
    """The tool-call format a conversation is rendered and answered in (None: it has no
    tools, tool calls or tool results): the profile's `declared` one, else the
    template's (`generic` when it takes no tools)."""
    if not tools and not any(m.role == "tool" or m.tool_calls for m in messages):
        return None
    return declared or detect(template)


def render_chat(template: str | None, messages: Sequence[Message],
                tools: Sequence[Tool] | None, *, bos_token: str = "", eos_token: str = "",
                add_generation_prompt: bool = True, declared: str | None = None) -> str:
    """A conversation (with its tools, calls and results) as the prompt's text: `prepare`
    for its format, then the sandboxed template (a plain transcript without one).

    The one rendering of chats: serving (`engine.runtime.prompting`) and training
    (`engine.training.tokenizer`) both call it, so a variant trained on a conversation
    sees the same text when that conversation is served."""
    fmt = chat_format(template, messages, tools, declared)
    rendered_tools = None
    if fmt is not None:
        messages, rendered_tools = prepare(messages, tools or (), fmt)
    if not template:
        return plain_prompt(messages)
    return render(template, messages, bos_token=bos_token, eos_token=eos_token,
                  add_generation_prompt=add_generation_prompt, tools=rendered_tools)


def generic_section(tools: Sequence[Tool]) -> str:
    lines = "\n".join(json.dumps({"name": t.name, "description": t.description,
                                  "parameters": t.schema()}, ensure_ascii=False)
                      for t in tools)
    return GENERIC_INSTRUCTIONS.format(tools=lines)


# --------------------------------------------------------------------------- grammar


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _tail_head(name: str, key: str) -> str:
    """A call's text after its name's opening quote, up to its arguments."""
    return name + '", "' + key + '": '


def _json_rule(schema: dict[str, Any]) -> str:
    styled = dict(schema)
    styled["x-guidance"] = {**JSON_STYLE, **(schema.get("x-guidance") or {})}
    return "%json " + json.dumps(styled, ensure_ascii=False)


def grammar(constraint: Constraint, tools: Sequence[Tool], fmt: str) -> str | None:
    """The Lark grammar (llguidance's dialect) an answer must match; None when the
    request constrains nothing."""
    choice = constraint.tool_choice
    response = None
    if constraint.response_format == "json_object":
        response = _json_rule({"type": "object"})
    elif constraint.response_format == "json_schema":
        assert constraint.schema is not None
        response = _json_rule(constraint.schema)
    if choice in (None, "none") or not tools:
        if choice not in (None, "none", "auto"):
            raise RefusedError(f"tool_choice {choice!r} needs tools")
        return None if response is None else f"start: {response}\n"
    if choice in ("auto", "required"):
        chosen = list(tools)
    else:
        chosen = [t for t in tools if t.name == choice]
        if not chosen:
            raise RefusedError(f"tool_choice names {choice!r}, which is not one of the tools")
    syntax = SYNTAX[fmt]
    rules = [f"tail_{i}: {_literal(_tail_head(t.name, syntax.args_key))} "
             f"{_json_rule(t.schema())} {_literal('}')}" for i, t in enumerate(chosen)]
    rules.append("tail: " + " | ".join(f"tail_{i}" for i in range(len(chosen))))
    rules.append(f"call: {_literal(syntax.call_head)} tail")
    more = f"({_literal(syntax.separator)} call)*" if constraint.parallel_tool_calls else ""
    closer = _literal(syntax.closer) if syntax.closer else ""
    if choice != "auto":
        opener = _literal(syntax.opener) if syntax.opener else ""
        rules.insert(0, f"start: {opener} call {more} {closer}")
        return "\n".join(rules) + "\n"
    # Lazy: free text until the model writes the trigger, then the calls.
    after = (syntax.opener + syntax.call_head)[len(syntax.trigger):]
    first = f"{_literal(after)} tail" if after else "tail"
    head = ["%llguidance {}"]
    if response is not None:
        head.append(f"start: answer | trig {first} {more} {closer}")
        head.append(f"answer: {response}")
        head.append(f"trig: {_literal(syntax.trigger)}")
    else:
        head.append(f"start: TEXT | trig {first} {more} {closer}")
        head.append(f"trig[lazy]: TEXT {_literal(syntax.trigger)}")
        head.append("TEXT: /(.|\\n)*/")
    return "\n".join(head + rules) + "\n"


# --------------------------------------------------------------------------- parsing


@dataclass(frozen=True)
class CallDelta(wire.Wire):
    """A piece of a streamed tool call: `id` and `name` with a call's first piece,
    then pieces of its `arguments` text."""

    index: int
    arguments: str = ""
    id: str | None = field(default=None, metadata=wire.OMIT_NONE)
    name: str | None = field(default=None, metadata=wire.OMIT_NONE)


_CLOSERS = {"hermes": "</tool_call>", "bracketed": "]", "generic": "]", "llama3": "",
            "tool-args": ""}
_SEPARATORS = {"hermes": "", "bracketed": ",", "generic": ",", "llama3": ";",
               "tool-args": ""}


class CallParser:
    """Splits a streamed answer of format `fmt` into content and tool calls (see the
    module doc). `seed` makes the calls' ids (the prompt's token digest: the same
    request gives the same ids)."""

    def __init__(self, fmt: str, seed: str) -> None:
        if fmt not in FORMATS:
            raise RefusedError(f"unknown tool-call format {fmt!r}")
        self.fmt = fmt
        self.syntax = SYNTAX[fmt]
        self.seed = seed
        self.content = ""
        self.calls: list[ToolCall] = []
        self.buf = ""
        self.in_calls = False
        self.after_generic = False  # the generic object's closing brace is still due
        self.bracket_due = False  # Mistral's '[' after [TOOL_CALLS] is still due
        self.current: dict[str, Any] | None = None  # the call being streamed

    # ------------------------------------------------------------------ public

    def feed(self, text: str) -> tuple[str, list[CallDelta]]:
        """Add streamed text; returns (content to show now, call deltas)."""
        self.buf += text
        return self._run(final=False)

    def finish(self) -> tuple[str, list[CallDelta]]:
        """The end of the answer: whatever was held back."""
        return self._run(final=True)

    # ------------------------------------------------------------------ states

    def _run(self, final: bool) -> tuple[str, list[CallDelta]]:
        shown: list[str] = []
        deltas: list[CallDelta] = []
        while True:
            progressed = (self._calls_step(shown, deltas, final) if self.in_calls
                          else self._text_step(shown, final))
            if not progressed:
                break
        text = "".join(shown)
        self.content += text
        return text, deltas

    def _text_step(self, shown: list[str], final: bool) -> bool:
        trigger = self.syntax.trigger
        if self.after_generic:  # the generic object's '}' after its calls
            rest = self.buf.lstrip()
            if not rest and not final:
                return False
            self.after_generic = False
            if rest.startswith("}"):
                self.buf = rest[1:]
            return True
        if self.syntax.anchored:
            if self.content.strip() or "".join(shown).strip():
                return self._emit_all(shown)
            stripped = self.buf.lstrip()
            if not stripped:
                if final:
                    return self._emit_all(shown)
                return False
            if self.fmt == "llama3" and not final and _maybe_prefix(stripped,
                                                                    "<|python_tag|>"):
                return False
            if self.fmt == "llama3" and stripped.startswith("<|python_tag|>"):
                stripped = stripped[len("<|python_tag|>"):].lstrip()
                if not stripped and not final:
                    return False
            key = '"' + self.syntax.name_key + '"'
            pattern = (r'\{\s*"tool_calls"\s*:\s*\[' if self.fmt == "generic"
                       else r'\{\s*' + key)
            match = re.match(pattern, stripped)
            if match:
                self.buf = stripped[match.end():] if self.fmt == "generic" else stripped
                self.in_calls, self.after_generic = True, self.fmt == "generic"
                return True
            prefix = self.syntax.opener if self.fmt == "generic" else "{" + key
            if not final and _maybe_prefix(stripped, prefix):
                return False
            return self._emit_all(shown)
        at = self.buf.find(trigger)
        if at != -1:
            shown.append(self.buf[:at])
            self.buf = self.buf[at + len(trigger):]
            self.bracket_due = self.fmt == "bracketed"
            self.in_calls = True
            return True
        hold = 0 if final else max((n for n in range(1, len(trigger))
                                    if self.buf.endswith(trigger[:n])), default=0)
        cut = len(self.buf) - hold
        if cut > 0:
            shown.append(self.buf[:cut])
            self.buf = self.buf[cut:]
        return False

    def _emit_all(self, shown: list[str]) -> bool:
        if self.buf:
            shown.append(self.buf)
            self.buf = ""
        return False

    def _calls_step(self, shown: list[str], deltas: list[CallDelta], final: bool) -> bool:
        # Between calls: whitespace and separators, or the group's end.
        separator = _SEPARATORS[self.fmt]
        i = 0
        while i < len(self.buf) and (self.buf[i].isspace() or (separator and
                                                               self.buf[i] == separator)):
            i += 1
        self.buf = self.buf[i:]
        if self.bracket_due:
            if not self.buf:
                return False
            self.bracket_due = False
            if self.buf[0] == "[":
                self.buf = self.buf[1:]
            return True
        closer = _CLOSERS[self.fmt]
        if closer and self.buf.startswith(closer):
            self.buf = self.buf[len(closer):]
            self.in_calls = False
            return True
        if self.fmt == "hermes" and self.buf.startswith("<tool_call>"):
            self.buf = self.buf[len("<tool_call>"):]
            return True
        if not self.buf:
            return False
        if self.buf[0] != "{":
            if not final and closer and _maybe_prefix(self.buf, closer):
                return False
            # Not a call: what follows is plain text again.
            self.in_calls = False
            return True
        walk = _walk_object(self.buf, self.syntax.name_key)
        if walk.error:
            self.in_calls = False
            return True
        self._stream(walk, deltas)
        if walk.end is None:
            if final:  # the answer ended inside a call: kept as text
                self.in_calls = False
                self.current = None
                return True
            return False
        body = self.buf[:walk.end]
        self.buf = self.buf[walk.end:]
        self._complete(body, walk, shown, deltas)
        return True

    # ------------------------------------------------------------------ calls

    def _stream(self, walk: _Walk, deltas: list[CallDelta]) -> None:
        """Send what is known of the call being written: its name, then its arguments'
        text as it grows (only when they follow the name and are an object)."""
        if walk.name is None:
            return
        if self.current is None:
            index = len(self.calls)
            self.current = {"index": index, "id": call_id(self.seed, index, self.fmt),
                            "name": walk.name, "sent": 0, "streaming": False}
            deltas.append(CallDelta(index, "", self.current["id"], walk.name))
        if walk.args_start is not None and walk.name_before_args and \
                self.buf[walk.args_start] in "{[":
            self.current["streaming"] = True
            upto = walk.args_end if walk.args_end is not None else len(self.buf)
            text = self.buf[walk.args_start + self.current["sent"]:upto]
            if text:
                self.current["sent"] += len(text)
                deltas.append(CallDelta(self.current["index"], text))

    def _complete(self, body: str, walk: _Walk, shown: list[str], deltas: list[CallDelta]
                  ) -> None:
        try:
            value = json.loads(body)
        except (ValueError, RecursionError):
            value = None
        name = value.get(self.syntax.name_key) if isinstance(value, dict) else None
        if not isinstance(name, str):
            shown.append(body)  # an object that is not a call: shown as text
            self.current = None
            return
        args: Any = value.get(self.syntax.args_key, value.get("arguments",
                                                               value.get("parameters", {})))
        if self.current is not None and self.current["streaming"]:
            assert walk.args_start is not None and walk.args_end is not None
            arguments = body[walk.args_start:walk.args_end]
            rest = arguments[self.current["sent"]:]
            if rest:
                deltas.append(CallDelta(self.current["index"], rest))
        else:
            arguments = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            if self.current is None:
                index = len(self.calls)
                self.current = {"index": index, "id": call_id(self.seed, index, self.fmt)}
                deltas.append(CallDelta(index, "", self.current["id"], name))
            deltas.append(CallDelta(self.current["index"], arguments))
        self.calls.append(ToolCall(self.current["id"], name, arguments))
        self.current = None


def split(text: str, fmt: str, seed: str) -> tuple[str, list[ToolCall]]:
    """A whole answer's content and tool calls (the streaming parser, fed at once)."""
    parser = CallParser(fmt, seed)
    parser.feed(text)
    parser.finish()
    return parser.content, parser.calls


def _maybe_prefix(text: str, marker: str) -> bool:
    """Could `text` still grow into something starting with `marker`?"""
    return marker.startswith(text) if len(text) < len(marker) else False


# --------------------------------------------------------------------------- JSON walking


@dataclass
class _Walk:
    end: int | None = None  # one past the object's closing brace (None: not yet)
    name: str | None = None
    args_start: int | None = None
    args_end: int | None = None
    name_before_args: bool = False
    error: bool = False


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _string_end(text: str, i: int) -> int | None:
    """One past the JSON string starting at text[i] == '"' (None: incomplete)."""
    i += 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == '"':
            return i + 1
        i += 1
    return None


def _value_end(text: str, i: int) -> int | None:
    """One past the JSON value starting at text[i] (None: incomplete; a malformed value
    ends where its brackets balance, and json.loads says the rest)."""
    if i >= len(text):
        return None
    if text[i] == '"':
        return _string_end(text, i)
    if text[i] in "{[":
        depth = 0
        while i < len(text):
            c = text[i]
            if c == '"':
                end = _string_end(text, i)
                if end is None:
                    return None
                i = end
                continue
            if c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        return None
    j = i
    while j < len(text) and text[j] not in ",}] \t\r\n":
        j += 1
    return j if j < len(text) else None


def _walk_object(text: str, name_key: str) -> _Walk:
    """What is known of the JSON object at the start of `text` (which may be cut); its
    function's name is under `name_key`."""
    walk = _Walk()
    i = 1
    while True:
        i = _skip_ws(text, i)
        if i >= len(text):
            return walk
        if text[i] == "}":
            walk.end = i + 1
            return walk
        if text[i] == ",":
            i += 1
            continue
        if text[i] != '"':
            walk.error = True
            return walk
        key_end = _string_end(text, i)
        if key_end is None:
            return walk
        try:
            key = json.loads(text[i:key_end])
        except ValueError:
            walk.error = True
            return walk
        i = _skip_ws(text, key_end)
        if i >= len(text):
            return walk
        if text[i] != ":":
            walk.error = True
            return walk
        i = _skip_ws(text, i + 1)
        if i >= len(text):
            return walk
        end = _value_end(text, i)
        if key == name_key and end is not None and text[i] == '"':
            try:
                walk.name = json.loads(text[i:end])
            except ValueError:
                walk.error = True
                return walk
        if key in ("arguments", "parameters", "args") and walk.args_start is None:
            walk.args_start, walk.args_end = i, end
            walk.name_before_args = walk.name is not None
        if end is None:
            return walk
        i = end
