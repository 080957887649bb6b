"""Prompts and rewards for the reinforcement loop (`variant-studio train-rl`).

Plain Python (no torch). The prompt file is JSONL, one prompt per line, checked as
strictly as training data (engine.training.data): every malformed line is reported
with its line number, in one error, before anything runs.

- `{"prompt": "..."}`: raw text, tokenized as serving tokenizes a raw prompt.
- `{"messages": [{"role": ..., "content": ...}, ...]}`: rendered with the model's
  sandboxed chat template and its generation prompt, as serving renders a chat; the
  conversation ends before the answer (its last turn is not the assistant's).
- `"answer"` (a string): the expected answer, needed by the `exact` reward on every
  line and allowed (unused) by the others; `id`, `meta` and `source` are bookkeeping.

Rewards (`--reward`):

- `exact`: 1 when the completion equals the line's answer (leading and trailing
  whitespace ignored on both), else 0.
- `json-schema:FILE`: 1 when the completion's first JSON object (the lenient parse the
  demo's score uses, engine.catalog.evaluation.first_json_object) validates against
  the schema in FILE (the `jsonschema` library, the draft the schema names), else 0.
- `python:FILE`: `reward(prompt, completion) -> float` from the user's own file. It is
  loaded only because the user named it, and only in the training worker process
  (never in the window, the CLI or the engine). `prompt` is the line's prompt as given
  (a string, or the list of message dicts); a raise, a non-number or a non-finite value
  stops the run with the reward file's line and the prompt file's line.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import RefusedError, UsageError
from engine.formats.safeio import open_regular, printable
from engine.formats.templates import ROLES, Message
from engine.training.data import DataError, parse_jsonl

REWARD_KINDS = ("exact", "json-schema", "python")
PROMPT_KEYS = frozenset({"prompt", "messages", "answer", "id", "meta", "source"})
MAX_REWARD_FILE = 4 << 20  # a schema or a Python reward is small: refuse a huge file


@dataclass(frozen=True)
class PromptLine:
    """One checked line of the prompt file."""

    line: int
    prompt: str | None = None
    messages: tuple[Message, ...] = ()
    answer: str | None = None

    def as_given(self) -> str | list[dict[str, str]]:
        """The prompt as the file gave it (what a Python reward receives)."""
        if self.prompt is not None:
            return self.prompt
        return [{"role": m.role, "content": m.content} for m in self.messages]


@dataclass(frozen=True)
class RewardSpec:
    """`--reward` parsed: the kind and, for schema and Python rewards, the file and the
    sha256 of its bytes when the run was prepared (the worker refuses a changed file)."""

    kind: str
    path: str | None = None
    sha256: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path, "sha256": self.sha256}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> RewardSpec:
        if not isinstance(data, dict) or set(data) != {"kind", "path", "sha256"}:
            raise UsageError("malformed reward")
        return RewardSpec(data["kind"], data["path"], data["sha256"])


# ---------------------------------------------------------------------------- prompts


def read_prompts(path: Path, need_answer: bool) -> tuple[tuple[PromptLine, ...], str]:
    """Parse and check every line; the prompts and the file's sha256."""
    lines, sha = parse_jsonl(
        path, lambda line, number: _parse_prompt(line, number, need_answer), "prompts")
    return tuple(lines), sha


def _parse_prompt(value: dict[str, Any], number: int, need_answer: bool) -> PromptLine:
    def fail(reason: str) -> DataError:
        return DataError(f"line {number}: {reason}")

    unknown = sorted(set(value) - PROMPT_KEYS)
    if unknown:
        # A typo ("anwser") would otherwise score every sample against nothing.
        raise fail(f"unknown key{'s' if len(unknown) != 1 else ''} {', '.join(unknown)} "
                   "(a prompt line has prompt or messages, and optionally answer, id, "
                   "meta, source)")
    if ("prompt" in value) == ("messages" in value):
        raise fail("a prompt line has exactly one of prompt and messages")
    answer = value.get("answer")
    if answer is not None and not isinstance(answer, str):
        raise fail(f"answer must be a string, got {type(answer).__name__}")
    if need_answer and answer is None:
        raise fail("the exact reward needs an answer on every line")
    if "prompt" in value:
        prompt = value["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise fail("prompt must be a non-empty string")
        return PromptLine(number, prompt=prompt, answer=answer)
    items = value["messages"]
    if not isinstance(items, list) or not items:
        raise fail("messages must be a non-empty list")
    messages = []
    for i, item in enumerate(items):
        if (not isinstance(item, dict) or set(item) != {"role", "content"}
                or not isinstance(item["role"], str) or not isinstance(item["content"], str)):
            raise fail(f"message {i} must be an object with string role and content")
        if item["role"] not in ROLES:
            raise fail(f"message {i} has unknown role {item['role']!r} (use {', '.join(ROLES)})")
        messages.append(Message(item["role"], item["content"]))
    if messages[-1].role == "assistant":
        raise fail("messages must end before the answer (the loop samples it)")
    return PromptLine(number, messages=tuple(messages), answer=answer)


# ---------------------------------------------------------------------------- rewards


def parse_reward(text: str) -> RewardSpec:
    """`exact`, `json-schema:FILE` or `python:FILE`; a schema is checked here (in the
    caller's process: it is data), a Python file only hashed (it is code, run only in
    the worker)."""
    kind, sep, where = text.partition(":")
    if kind not in REWARD_KINDS or (kind == "exact") == bool(sep):
        raise UsageError(f"unknown reward {printable(text, 80)!r}: use exact, "
                         "json-schema:FILE or python:FILE")
    if kind == "exact":
        return RewardSpec("exact")
    path = Path(where).expanduser()
    if not where or not path.is_file():
        raise UsageError(f"reward file {printable(where or '(none)', 200)} does not exist")
    blob = _read_small(path)
    spec = RewardSpec(kind, str(path.absolute()), hashlib.sha256(blob).hexdigest())
    if kind == "json-schema":
        _schema_validator(blob, path.name)
    return spec


def _read_small(path: Path) -> bytes:
    handle, st = open_regular(path)
    with handle:
        if st.size > MAX_REWARD_FILE:
            raise RefusedError(f"{path.name}: {st.size} bytes is more than the "
                               f"{MAX_REWARD_FILE >> 20} MiB a reward file may have")
        return handle.read(MAX_REWARD_FILE + 1)


def _schema_validator(blob: bytes, name: str) -> Any:
    """A jsonschema validator for the schema in `blob`, or RefusedError saying why not."""
    try:
        schema = json.loads(blob.decode("utf-8"))
    except UnicodeDecodeError:
        raise RefusedError(f"schema {name} is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise RefusedError(f"schema {name} is not JSON ({exc.msg} at line {exc.lineno} "
                           f"column {exc.colno})") from None
    if not isinstance(schema, dict | bool):
        raise RefusedError(f"schema {name} must be a JSON object (or true/false), got "
                           f"{type(schema).__name__}")
    import jsonschema

    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise RefusedError(f"schema {name} is not a valid JSON Schema: "
                           f"{printable(exc.message, 200)}") from None
    return cls(schema)


Reward = Callable[[PromptLine, str], float]


class RewardError(RefusedError):
    """A reward function failed or returned something that is not a finite number."""


def load_reward(spec: RewardSpec) -> Reward:
    """The reward as a function of (prompt line, completion text). Worker side: a
    Python reward's file is executed here, once, after its sha256 is checked against
    the one the run was prepared with."""
    if spec.kind == "exact":
        def exact(line: PromptLine, completion: str) -> float:
            assert line.answer is not None  # read_prompts required it
            return 1.0 if completion.strip() == line.answer.strip() else 0.0
        return exact
    assert spec.path is not None
    path = Path(spec.path)
    blob = _read_small(path)
    if hashlib.sha256(blob).hexdigest() != spec.sha256:
        raise RefusedError(f"reward file {path.name} changed since the run was prepared")
    if spec.kind == "json-schema":
        from engine.catalog.evaluation import first_json_object

        validator = _schema_validator(blob, path.name)

        def schema(line: PromptLine, completion: str) -> float:
            found = first_json_object(completion)
            return 1.0 if found is not None and validator.is_valid(found) else 0.0
        return schema
    return _python_reward(path, blob)


def _python_reward(path: Path, blob: bytes) -> Reward:
    namespace: dict[str, Any] = {"__name__": "variant_studio_reward", "__file__": str(path)}
    try:
        code = compile(blob, str(path), "exec")
        exec(code, namespace)  # the user's own file, named explicitly on the command line
    except SyntaxError as exc:
        raise RewardError(f"python reward {path.name} line {exc.lineno}: syntax error "
                          f"({exc.msg})") from None
    except Exception as exc:
        raise RewardError(f"python reward {path.name} failed to load: "
                          f"{_where(exc, path)}") from None
    function = namespace.get("reward")
    if not callable(function):
        raise RewardError(f"python reward {path.name} defines no function "
                          "reward(prompt, completion)")

    def call(line: PromptLine, completion: str) -> float:
        try:
            value = function(line.as_given(), completion)
        except Exception as exc:
            raise RewardError(f"python reward {path.name} raised {_where(exc, path)} on "
                              f"prompt line {line.line}") from None
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise RewardError(f"python reward {path.name} returned "
                              f"{printable(repr(value), 60)} ({type(value).__name__}), not a "
                              f"number, on prompt line {line.line}")
        number = float(value)
        if not math.isfinite(number):
            raise RewardError(f"python reward {path.name} returned {number} (not finite) on "
                              f"prompt line {line.line}")
        return number
    return call


def _where(exc: BaseException, path: Path) -> str:
    """`TypeError: message (reward.py line 7)`: the exception and the deepest line of
    the reward file it passed through."""
    lines = [frame.lineno for frame in traceback.extract_tb(exc.__traceback__)
             if frame.filename == str(path)]
    text = f"{type(exc).__name__}: {printable(str(exc), 200)}"
    return f"{text} ({path.name} line {lines[-1]})" if lines else text
