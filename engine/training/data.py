"""Training data: JSONL lines checked one by one, then tokenized with the model's own
tokenizer into sequences with a loss mask.

Accepted lines (one JSON object each; blank lines are skipped):

- `{"text": ...}`: every token is trained.
- `{"prompt": ..., "completion": ...}`: raw text; the prompt is masked from the loss.
- `{"messages": [{"role": ..., "content": ...}, ...]}`: rendered with the model's
  chat template exactly as serving renders it; assistant turns are trained.
  With `"tools": [OpenAI function tools]` beside the messages, an assistant turn may make
  `tool_calls` (OpenAI's shape; its content may then be empty or null) and `tool`
  messages (`tool_call_id`, optional `name`) carry a call's result. The line is rendered
  as a served request with those tools is (`engine.formats.tool_calls.render_chat`), and
  a turn with calls is trained on the text the server's parser reads back as those calls
  (`tool_calls.answer_text`); a template that writes the calls otherwise is refused.
- `{"tokens": [id, ...], "mask": [0 | 1, ...]}`: the token ids themselves (a served
  answer or an RL rollout, trained on exactly the ids that were sampled, never
  re-tokenized); 1 marks a trained position, `mask` left out trains every token but
  the first. The ids are checked against the base's vocabulary.
- Preference pairs for DPO: `{"prompt": ... | "messages": [...], "chosen": ...,
  "rejected": ...}`.

Every line may carry `"weight"` (a finite number, negative allowed, default 1) and
the bookkeeping keys `id`, `meta`, `source`. Anything else is refused, with the line
number, so a typo never trains silently on the wrong field. With `train_eot` the
end-of-turn token after each trained answer is a target too, so answers learn to stop;
token lines are left as their mask says (their ids are exact; a warning says so).

A KL text (`load_kl_text`) is plain text, one passage per non-empty line, that the
adapter must leave alone: the KL penalty toward the base is measured on it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from engine.errors import RefusedError
from engine.formats import tool_calls as tool_formats
from engine.formats.safeio import open_regular
from engine.formats.templates import CHAT_ROLES, Message, TemplateError, ToolCall
from engine.formats.tool_calls import Tool
from engine.formats.tool_match import calls_from_openai, same_calls, tools_from_openai

MAX_DATA_BYTES = 1 << 30
T = TypeVar("T")
MAX_REPORTED = 8
EXTRA_KEYS = frozenset({"id", "meta", "source"})
MESSAGE_KEYS = frozenset({"role", "content", "tool_calls", "tool_call_id", "name"})
TOKEN_KEYS = frozenset({"tokens", "mask"})
# The memorisation warning: fewer examples than this, or more passes than this.
SMALL_EXAMPLES = 32
MANY_EPOCHS = 8.0


class DataError(RefusedError):
    """The data file has malformed lines; the message lists them with line numbers."""


class TruncatedAway(DataError):
    """A line whose trained tokens all lie beyond seq-len; `needed` is the shortest
    seq-len that keeps one of them."""

    def __init__(self, message: str, needed: int) -> None:
        super().__init__(message)
        self.needed = needed


@dataclass(frozen=True)
class Record:
    """One checked line, before tokenization."""

    line: int
    kind: str  # text | pair | chat | preference | tokens
    weight: float
    text: str | None = None
    prompt: str | None = None
    completion: str | None = None
    messages: tuple[Message, ...] = ()
    chosen: str | None = None
    rejected: str | None = None
    tokens: tuple[int, ...] = ()
    mask: tuple[bool, ...] | None = None  # None: every token but the first is trained
    tools: tuple[Tool, ...] | None = None  # a chat line's tools (OpenAI function tools)


@dataclass(frozen=True)
class Sequence:
    """Token ids and, per position, whether that token is a training target."""

    tokens: tuple[int, ...]
    targets: tuple[bool, ...]

    @property
    def n_targets(self) -> int:
        return sum(self.targets)


@dataclass(frozen=True)
class Example:
    """One line, tokenized: one sequence, or (chosen, rejected) for DPO."""

    line: int
    weight: float
    sequences: tuple[Sequence, ...]
    truncated: bool = False


@dataclass(frozen=True)
class DataSet:
    path: str
    sha256: str
    examples: tuple[Example, ...]
    kinds: tuple[str, ...]
    warnings: tuple[str, ...]
    system_prompt: str | None = None  # the system message every chat example shares

    @property
    def n_target_tokens(self) -> int:
        return sum(s.n_targets for e in self.examples for s in e.sequences)

    def summary(self) -> dict[str, Any]:
        return {"file": Path(self.path).name, "sha256": self.sha256,
                "examples": len(self.examples), "kinds": list(self.kinds),
                "target_tokens": self.n_target_tokens,
                "tokens": sum(len(s.tokens) for e in self.examples for s in e.sequences),
                "truncated": sum(e.truncated for e in self.examples),
                # Kept in the run's provenance: the composer offers it to a new variant
                # of the adapter (`engine.catalog.profiles.trained_system_prompt`).
                **({"system_prompt": self.system_prompt} if self.system_prompt else {})}


# ---------------------------------------------------------------------------- parsing


def read_records(path: Path, dpo: bool, n_vocab: int | None = None
                 ) -> tuple[list[Record], str]:
    """Parse and check every line; returns the records and the file's sha256.

    `n_vocab` is the base's vocabulary size: given, token lines' ids are checked against
    it here, so a bad id is reported together with every other malformed line."""
    return parse_jsonl(path, lambda line, number: _parse_line(line, number, dpo, n_vocab),
                       "examples")


def parse_jsonl(path: Path, parse: Callable[[dict[str, Any], int], T], items: str
                ) -> tuple[list[T], str]:
    """Every non-blank line of a JSONL file, a JSON object, through `parse(object,
    number)`, and the file's sha256. Every malformed line is reported, with its number,
    in one DataError; `items` names what the lines are, for an empty file ("examples",
    "prompts")."""
    raw = read_bounded(path)
    sha = hashlib.sha256(raw).hexdigest()
    parsed: list[T] = []
    problems: list[str] = []
    for number, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            parsed.append(parse(_json_object(line, number), number))
        except DataError as exc:
            problems.append(exc.message)
    name = Path(path).name
    if problems:
        more = len(problems) - MAX_REPORTED
        shown = "; ".join(problems[:MAX_REPORTED]) + (f"; and {more} more" if more > 0 else "")
        raise DataError(f"{name}: {len(problems)} malformed line"
                        f"{'s' if len(problems) != 1 else ''}: {shown}",
                        details=tuple(problems))
    if not parsed:
        raise DataError(f"{name}: no {items} (the file is empty)")
    return parsed, sha


def read_bounded(path: Path) -> bytes:
    """A regular file's bytes (FIFOs and devices are refused), refused over the size limit."""
    handle, st = open_regular(Path(path))
    with handle:
        if st.size > MAX_DATA_BYTES:
            raise DataError(f"{Path(path).name}: {st.size} bytes is more than the "
                            f"{MAX_DATA_BYTES >> 20} MiB limit")
        return handle.read(MAX_DATA_BYTES + 1)


def _json_object(raw: bytes, number: int) -> dict[str, Any]:
    def fail(reason: str) -> DataError:
        return DataError(f"line {number}: {reason}")

    try:
        value = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise fail("not valid UTF-8") from None
    except json.JSONDecodeError as exc:
        raise fail(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(value, dict):
        raise fail(f"expected a JSON object, got {type(value).__name__}")
    return value


def _parse_line(value: dict[str, Any], number: int, dpo: bool, n_vocab: int | None
                ) -> Record:
    def fail(reason: str) -> DataError:
        return DataError(f"line {number}: {reason}")

    weight = value.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(
            weight):
        raise fail(f"weight must be a finite number, got {weight!r}")
    keys = set(value) - EXTRA_KEYS - {"weight"}

    def text(key: str, allow_empty: bool = False) -> str:
        item = value[key]
        if not isinstance(item, str):
            raise fail(f"{key} must be a string, got {type(item).__name__}")
        if not allow_empty and not item.strip():
            raise fail(f"{key} is empty")
        return item

    def messages(require_assistant: bool, tools: tuple[Tool, ...] | None = None
                 ) -> tuple[Message, ...]:
        items = value["messages"]
        if not isinstance(items, list) or not items:
            raise fail("messages must be a non-empty list")
        out: list[Message] = []
        for i, item in enumerate(items):
            if (not isinstance(item, dict) or set(item) - MESSAGE_KEYS
                    or not isinstance(item.get("role"), str)):
                raise fail(f"message {i} must be an object with string role and content")
            role = item["role"]
            if role not in CHAT_ROLES:
                raise fail(f"message {i} has unknown role {role!r} "
                           f"(use {', '.join(CHAT_ROLES)})")
            content = item.get("content")
            if content is None and role == "assistant" and item.get("tool_calls"):
                content = ""  # OpenAI's shape: a turn that only calls has null content
            if not isinstance(content, str):
                raise fail(f"message {i} must be an object with string role and content")
            if role != "tool" and {"tool_call_id", "name"} & set(item):
                raise fail(f"message {i}: only a tool message has tool_call_id and name")
            calls = None
            if "tool_calls" in item:
                # OpenAI's shape: trained as the model's calls (with the line's tools), or
                # what a score set's tool-call exact match compares the answer's calls with.
                if role != "assistant":
                    raise fail(f"message {i}: only an assistant message has tool_calls")
                try:
                    calls = calls_from_openai(item["tool_calls"])
                except RefusedError as exc:
                    raise fail(f"message {i}: {exc.message}") from None
                _check_calls(calls, tools, i, fail)
            if role == "tool":
                out.append(_tool_result(item, content, out, i, fail))
                continue
            out.append(Message(role, content, tool_calls=calls))
        if require_assistant:
            if not any(m.role == "assistant" for m in out):
                raise fail("messages have no assistant turn to train on")
            if out[0].role == "assistant":
                raise fail("messages start with an assistant turn (nothing to answer)")
            if any(not m.content.strip() and not m.tool_calls
                   for m in out if m.role == "assistant"):
                raise fail("an assistant turn is empty")
        elif out[-1].role == "assistant":
            raise fail("preference messages must end before the answer (the answers are "
                       "chosen and rejected)")
        return tuple(out)

    preference = {"chosen", "rejected"} & keys
    if preference:
        if not dpo:
            raise fail("chosen/rejected is preference data: train it with --dpo")
        if keys not in ({"prompt", "chosen", "rejected"}, {"messages", "chosen", "rejected"}):
            raise fail(f"a preference line has prompt or messages, chosen and rejected; "
                       f"got {', '.join(sorted(keys))}")
        chosen, rejected = text("chosen"), text("rejected")
        if chosen == rejected:
            raise fail("chosen and rejected are the same text")
        if "prompt" in keys:
            return Record(number, "preference", float(weight), prompt=text("prompt"),
                          chosen=chosen, rejected=rejected)
        return Record(number, "preference", float(weight), messages=messages(False),
                      chosen=chosen, rejected=rejected)
    if "tools" in keys and keys != {"messages", "tools"}:
        # Tools belong to a conversation: a served request offers them beside messages.
        raise fail("tools go with messages only (a chat line: messages and tools)")
    if dpo:
        if keys & TOKEN_KEYS:
            raise fail("token lines cannot be trained with --dpo: a preference line scores "
                       "chosen and rejected answers after one prompt (prompt or messages, "
                       "chosen, rejected)")
        raise fail("--dpo needs preference lines: prompt or messages, chosen, rejected")
    if keys & TOKEN_KEYS:
        return _token_record(value, keys, number, float(weight), n_vocab)
    if keys == {"text"}:
        return Record(number, "text", float(weight), text=text("text"))
    if keys == {"prompt", "completion"}:
        return Record(number, "pair", float(weight), prompt=text("prompt", allow_empty=True),
                      completion=text("completion"))
    if keys == {"messages"}:
        return Record(number, "chat", float(weight), messages=messages(True))
    if keys == {"messages", "tools"}:
        tools = _tools(value["tools"], fail)
        return Record(number, "chat", float(weight), messages=messages(True, tools),
                      tools=tools)
    found = ", ".join(sorted(keys)) or "nothing"
    raise fail(f"expected text, prompt+completion, messages, tokens(+mask), or "
               f"chosen+rejected; found {found}")


def _tools(value: Any, fail: Callable[[str], DataError]) -> tuple[Tool, ...]:
    """A line's `tools`: OpenAI function tools, each schema one the grammar engine
    compiles (the server refuses any other, so a variant is never trained on tools it
    could not be served with)."""
    if not isinstance(value, list) or not value:
        raise fail("tools must be a non-empty list of OpenAI function tools")
    for i, entry in enumerate(value):
        if not isinstance(entry, dict) or entry.get("type") != "function" \
                or not isinstance(entry.get("function"), dict):
            raise fail(f"tool {i + 1}: expected {{\"type\": \"function\", \"function\": "
                       "{\"name\": ..., \"parameters\": {...}}}")
    try:
        tools = tools_from_openai(value)
    except RefusedError as exc:
        raise fail(f"tools: {exc.message}") from None
    for tool in tools:
        error = _schema_error(json.dumps(tool.schema(), sort_keys=True))
        if error:
            raise fail(f"tool {tool.name}: its parameters cannot be compiled to a grammar, "
                       f"so the server would refuse it: {error}")
    return tools


@functools.lru_cache(maxsize=256)
def _schema_error(schema: str) -> str | None:
    """Why a schema (JSON text) does not compile, cached: every line of a file usually
    repeats the same tools."""
    # Imported here: the grammar engine (llguidance) loads only for data with tools.
    from engine.runtime.constraint import schema_error

    return schema_error(json.loads(schema))


def _check_calls(calls: tuple[ToolCall, ...], tools: tuple[Tool, ...] | None, index: int,
                 fail: Callable[[str], DataError]) -> None:
    """Each call's arguments are a JSON object; with the line's tools, each call names one
    of them and its arguments satisfy that tool's schema (what the server's constraint
    would have let the model write)."""
    by_name = {t.name: t for t in tools or ()}
    for k, call in enumerate(calls, start=1):
        where = f"message {index}: tool call {k} ({call.name})"
        try:
            arguments = json.loads(call.arguments)
        except (ValueError, RecursionError):
            raise fail(f"{where}: arguments are not valid JSON") from None
        if not isinstance(arguments, dict):
            raise fail(f"{where}: arguments must be a JSON object")
        if tools is None:
            continue
        tool = by_name.get(call.name)
        if tool is None:
            raise fail(f"{where}: calls a tool that is not in the line's tools "
                       f"({', '.join(by_name)})")
        problem = _schema_problem(tool.schema(), arguments)
        if problem:
            raise fail(f"{where}: arguments do not match its parameters: {problem}")


def _schema_problem(schema: dict[str, Any], value: Any) -> str | None:
    import jsonschema

    try:
        validator = jsonschema.validators.validator_for(schema)(schema)
        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    except jsonschema.exceptions.SchemaError as exc:
        return f"the schema is invalid ({exc.message})"
    if error is None:
        return None
    path = "/".join(str(p) for p in error.absolute_path)
    return f"{path + ': ' if path else ''}{error.message}"


def _tool_result(item: dict[str, Any], content: str, earlier: list[Message], index: int,
                 fail: Callable[[str], DataError]) -> Message:
    """A `tool` message: the result of an earlier call, named by its id (its tool's name
    filled in from that call when left out, as the server does)."""
    call_id = item.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise fail(f"message {index}: a tool message needs the tool_call_id of the call "
                   "it answers")
    found = [c for m in earlier for c in m.tool_calls or () if c.id == call_id]
    if not found:
        raise fail(f"message {index}: tool_call_id {call_id!r} answers no earlier tool "
                   "call")
    if len(found) > 1:
        raise fail(f"message {index}: tool_call_id {call_id!r} names more than one earlier "
                   "call (give each call its own id)")
    name = item.get("name")
    if name is not None and name != found[0].name:
        raise fail(f"message {index}: name {name!r} is not the tool that call {call_id!r} "
                   f"called ({found[0].name})")
    return Message("tool", content, tool_call_id=call_id, name=found[0].name)


def _token_record(value: dict[str, Any], keys: set[str], number: int, weight: float,
                  n_vocab: int | None) -> Record:
    """A `tokens` line: ids exactly as given, and which of them are trained."""

    def fail(reason: str) -> DataError:
        return DataError(f"line {number}: {reason}")

    if not keys <= TOKEN_KEYS or "tokens" not in keys:
        # Mixing is refused rather than guessed at: which of text and ids would be trained?
        raise fail(f"a token line has tokens and optionally mask, nothing else; got "
                   f"{', '.join(sorted(keys))}")
    ids = value["tokens"]
    if not isinstance(ids, list) or not ids:
        raise fail("tokens must be a non-empty list of token ids")
    for index, item in enumerate(ids):
        # bool is an int subclass and 3.0 == 3: both would pass a looser check silently.
        if isinstance(item, bool) or not isinstance(item, int):
            raise fail(f"token {item!r} (index {index}) is not a whole-number token id")
    problem = vocab_problem(ids, n_vocab)
    if problem:
        raise fail(problem)
    mask: tuple[bool, ...] | None = None
    if "mask" in keys:
        flags = value["mask"]
        if not isinstance(flags, list):
            raise fail(f"mask must be a list of 0 and 1, got {type(flags).__name__}")
        if len(flags) != len(ids):
            raise fail(f"mask has {len(flags)} values for {len(ids)} tokens")
        for index, item in enumerate(flags):
            if isinstance(item, bool) or not isinstance(item, int) or item not in (0, 1):
                raise fail(f"mask value {item!r} (index {index}) is not 0 or 1")
        if flags[0] == 1:
            raise fail("mask[0] is 1, but the first token cannot be trained (nothing "
                       "precedes it to predict it from)")
        if 1 not in flags:
            raise fail("mask trains no token (it has no 1)")
        mask = tuple(item == 1 for item in flags)
    elif len(ids) < 2:
        raise fail("a single token has nothing to train (the first token cannot be "
                   "trained)")
    return Record(number, "tokens", weight, tokens=tuple(ids), mask=mask)


def vocab_problem(ids: list[int] | tuple[int, ...], n_vocab: int | None) -> str | None:
    """Why these ids are not all in the base's vocabulary (None: they are).

    Negative ids are refused even when the vocabulary size is unknown."""
    if min(ids) >= 0 and (n_vocab is None or max(ids) < n_vocab):
        return None  # the common case, checked at C speed
    index, bad = next((i, t) for i, t in enumerate(ids)
                      if t < 0 or (n_vocab is not None and t >= n_vocab))
    if n_vocab is None:
        return f"token {bad} (index {index}) is negative"
    return f"token {bad} (index {index}) is outside the base's vocabulary (0..{n_vocab - 1})"


# ---------------------------------------------------------------------------- tokenizing


def encode(records: list[Record], tokenizer: Any, seq_len: int, train_eot: bool
           ) -> list[Example]:
    """Tokenize checked records; problems are reported with their line numbers."""
    examples: list[Example] = []
    problems: list[str] = []
    needed = 0  # the shortest seq-len that leaves every line something to train
    for record in records:
        try:
            examples.append(_encode(record, tokenizer, seq_len, train_eot))
        except DataError as exc:
            problems.append(exc.message)
            if isinstance(exc, TruncatedAway):
                needed = max(needed, exc.needed)
        except TemplateError as exc:
            problems.append(f"line {record.line}: {exc.message}")
    if problems:
        more = len(problems) - MAX_REPORTED
        raise DataError(f"{len(problems)} example{'s' if len(problems) != 1 else ''} cannot "
                        "be trained: " + "; ".join(problems[:MAX_REPORTED])
                        + (f"; and {more} more" if more > 0 else "")
                        + (f" (--seq-len {needed} or more leaves every line a token to train)"
                           if needed else ""), details=tuple(problems))
    return examples


def _encode(record: Record, tok: Any, seq_len: int, train_eot: bool) -> Example:
    def fail(reason: str) -> DataError:
        return DataError(f"line {record.line}: {reason}")

    pieces: list[list[tuple[list[int], bool]]]
    if record.kind == "tokens":
        # The ids are used as given: no BOS, no template, no --train-eot token.
        problem = vocab_problem(record.tokens, tok.n_vocab)
        if problem:
            raise fail(problem)
        if record.mask is None:
            pieces = [[(list(record.tokens[:1]), False), (list(record.tokens[1:]), True)]]
        else:
            pieces = [[([t], m) for t, m in zip(record.tokens, record.mask, strict=True)]]
    elif record.kind == "text":
        tokens = tok.prompt_tokens(record.text)
        pieces = [[(tokens[:1], False), (tokens[1:], True)]]
    elif record.kind == "pair":
        pieces = [_completion(tok, tok.prompt_tokens(record.prompt) if record.prompt else [],
                              record.completion, train_eot, record.line)]
    elif record.kind == "chat":
        if record.tools is None and any(m.tool_calls for m in record.messages):
            # A served request whose answer is a call offers its tools; without them the
            # prompt trained on is one no request would send.
            raise fail("assistant tool_calls need the line's tools (\"tools\": [OpenAI "
                       "function tools] beside the messages) to be trained")
        pieces = [_chat(tok, list(record.messages), train_eot, record.line, record.tools)]
    else:
        pieces = []
        for answer in (record.chosen, record.rejected):
            if record.messages:
                pieces.append(_chat(tok, [*record.messages, Message("assistant", answer)],
                                    train_eot, record.line))
            else:
                pieces.append(_completion(tok, tok.prompt_tokens(record.prompt), answer,
                                          train_eot, record.line))
    sequences = []
    truncated = False
    for parts in pieces:
        tokens, targets = [], []
        for ids, trained in parts:
            tokens += ids
            targets += [trained] * len(ids)
        if targets and targets[0]:
            targets[0] = False  # the first token has nothing before it to predict it
        if not any(targets):
            raise fail("no tokens to train on")
        if len(tokens) > seq_len:
            truncated = True
            # Target i is predicted from tokens[:i + 1]: it survives a seq-len over i.
            needed = targets.index(True) + 1
            tokens, targets = tokens[:seq_len], targets[:seq_len]
            if not any(targets):
                raise TruncatedAway(f"line {record.line}: nothing left to train after "
                                    f"truncating to seq-len {seq_len} (this line needs "
                                    f"{needed} or more)", needed)
        sequences.append(Sequence(tuple(tokens), tuple(targets)))
    return Example(record.line, record.weight, tuple(sequences), truncated)


def _completion(tok: Any, prompt: list[int], completion: str, train_eot: bool, line: int
                ) -> list[tuple[list[int], bool]]:
    parts = [(prompt, False), (tok.tokenize(completion), True)]
    if train_eot:
        eos = tok.info.eos_token_id
        if eos is None or not tok.is_end(eos):
            raise DataError(f"line {line}: --train-eot: this model declares no "
                            "end-of-generation token")
        parts.append(([eos], True))
    return parts


def _chat(tok: Any, messages: list[Message], train_eot: bool, line: int,
          tools: tuple[Tool, ...] | None = None) -> list[tuple[list[int], bool]]:
    """Segments of a conversation; each assistant answer (and its end of turn) trained.

    Every prefix is rendered with the line's tools, as the served request for that turn
    would be (`tok.render`: the one chat rendering). An answer with tool calls is trained
    on the text the server's parser reads back as exactly those calls."""

    def fail(reason: str) -> DataError:
        return DataError(f"line {line}: {reason}")

    def render(upto: int, add_generation_prompt: bool) -> str:
        # Only a line with tools passes them (a duck-typed tokenizer need not know tools).
        if tools is None:
            return tok.render(messages[:upto], add_generation_prompt=add_generation_prompt)
        return tok.render(messages[:upto], add_generation_prompt=add_generation_prompt,
                          tools=tools)

    parts: list[tuple[list[int], bool]] = []
    covered = ""
    for index, message in enumerate(messages):
        if message.role != "assistant":
            continue
        prefix = render(index, True)
        if not prefix.startswith(covered):
            raise fail("the chat template does not render turns incrementally; "
                       "use prompt/completion data instead")
        if covered:
            parts.append((tok.tokenize(prefix[len(covered):], parse_special=True), False))
        else:
            parts.append((tok.prompt_tokens(prefix), False))
        full = render(index + 1, False)
        tail = full[len(prefix):] if full.startswith(prefix) else None
        answer = message.content
        if message.tool_calls:
            fmt = tok.tool_format(messages[:index + 1], tools) or "generic"
            answer = _call_answer(message, fmt, tail, fail)
        elif tail is None or not tail.startswith(answer):
            raise fail("the chat template changes the assistant's text; use "
                       "prompt/completion data instead")
        assert tail is not None
        parts.append((tok.tokenize(answer), True))
        rest = tok.tokenize(tail[len(answer):], parse_special=True)
        if train_eot:
            if not rest or not tok.is_end(rest[0]):
                raise fail("--train-eot: the chat template puts no end-of-turn token "
                           "after the answer")
            parts.append((rest[:1], True))
            rest = rest[1:]
        parts.append((rest, False))
        covered = full
    return parts


def _call_answer(message: Message, fmt: str, tail: str | None,
                 fail: Callable[[str], DataError]) -> str:
    """The text to train for an assistant turn with tool calls: the calls as the server's
    parser for format `fmt` reads them (`tool_calls.answer_text`). Refused unless the
    template renders the turn as exactly that text (a native template may write calls
    its own way) and the parser gives back exactly these calls: a variant must never
    learn to write calls the server would not return as calls."""
    assert message.tool_calls
    answer = tool_formats.answer_text(message, fmt)
    if tail is None or not tail.startswith(answer):
        written = (tail or "").split("\n")[0][:80]
        raise fail(f"the chat template writes this turn's tool calls differently from "
                   f"what the server parses in its {fmt} format (expected "
                   f"{answer[:80]!r}, the template writes {written!r}...); such a turn "
                   "cannot be trained for this model")
    content, calls = tool_formats.split(answer, fmt, "training")
    if not same_calls(calls, message.tool_calls) or content.strip() != message.content.strip():
        reason = ("the generic format reads calls only when they are the whole answer: "
                  "leave the content empty" if fmt == "generic" and message.content.strip()
                  else "its text does not parse back as these calls")
        raise fail(f"the server would not read this turn's answer as its tool calls "
                   f"({fmt} format): {reason}")
    return answer


# ---------------------------------------------------------------------------- KL text


@dataclass(frozen=True)
class KlText:
    """Passages of unrelated text, tokenized as served scoring tokenizes prose (no
    special tokens): the KL penalty holds the adapter to the base on them."""

    path: str
    sha256: str
    passages: tuple[tuple[int, ...], ...]
    truncated: int

    def summary(self) -> dict[str, Any]:
        return {"file": Path(self.path).name, "sha256": self.sha256,
                "passages": len(self.passages),
                "tokens": sum(len(p) for p in self.passages), "truncated": self.truncated}


def load_kl_text(path: Path, tokenizer: Any, seq_len: int) -> KlText:
    """Every non-empty line of a UTF-8 text file as a passage, cut to `seq_len` tokens;
    refused when a line is not UTF-8 or no line has two tokens (nothing to predict)."""
    raw = read_bounded(path)
    name = Path(path).name
    passages, truncated = [], 0
    for number, line in enumerate(raw.split(b"\n"), start=1):
        try:
            text = line.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise DataError(f"{name}: line {number}: not valid UTF-8") from None
        if not text:
            continue
        ids = tokenizer.tokenize(text, add_special=False, parse_special=False)
        if len(ids) > seq_len:
            ids, truncated = ids[:seq_len], truncated + 1
        if len(ids) >= 2:
            passages.append(tuple(ids))
    if not passages:
        raise DataError(f"{name}: no text to hold the adapter to (the KL text is empty)")
    return KlText(str(path), hashlib.sha256(raw).hexdigest(), tuple(passages), truncated)


# ---------------------------------------------------------------------------- the whole file


def load(path: Path, tokenizer: Any, seq_len: int, train_eot: bool, dpo: bool,
         steps: int, batch: int) -> DataSet:
    records, sha = read_records(path, dpo, tokenizer.n_vocab)
    examples = encode(records, tokenizer, seq_len, train_eot)
    kinds = tuple(sorted({r.kind for r in records}))
    systems = {r.messages[0].content if r.messages and r.messages[0].role == "system"
               else None for r in records}
    system = systems.pop() if len(systems) == 1 else None
    warnings = warnings_for(examples, steps, batch, seq_len)
    exact = sum(r.kind == "tokens" for r in records)
    if train_eot and exact:
        warnings.append(f"--train-eot does not apply to the {exact} token line"
                        f"{'s' if exact != 1 else ''}: {'their' if exact != 1 else 'its'} "
                        "mask says exactly which ids are trained")
    return DataSet(str(path), sha, tuple(examples), kinds, tuple(warnings), system)


def warnings_for(examples: list[Example], steps: int, batch: int, seq_len: int) -> list[str]:
    """Warnings shown before the first step (small data, truncation, negative weights)."""
    out = []
    n = len(examples)
    epochs = steps * batch / max(n, 1)
    if n < SMALL_EXAMPLES or epochs > MANY_EPOCHS:
        out.append(f"small data: {n} example{'s' if n != 1 else ''}, each seen about "
                   f"{epochs:.1f} times in {steps} steps of {batch}; the adapter is likely "
                   "to memorise them rather than learn the task (add examples, use fewer "
                   "steps, and hold some out to check)")
    cut = sum(e.truncated for e in examples)
    if cut:
        out.append(f"{cut} example{'s were' if cut != 1 else ' was'} truncated to seq-len "
                   f"{seq_len} tokens")
    negative = sum(e.weight < 0 for e in examples)
    if negative:
        out.append(f"{negative} example{'s have' if negative != 1 else ' has'} a negative "
                   f"weight: {'their' if negative != 1 else 'its'} likelihood is pushed down")
    return out
