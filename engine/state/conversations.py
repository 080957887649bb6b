"""Chat conversations, kept across restarts.

One JSON file per conversation under the data directory's `conversations/`, written
atomically under a lock (engine.statefile). File names are generated ids, never
taken from a model or a message. Each assistant message records the variant and the
identity key that produced it (and the seed it was sampled with), so an answer can
always be traced to its model.

Versions and branches: `messages` is the conversation as shown (one path). A message
that was regenerated, or a user message that was edited and sent again, keeps the
other versions of that point of the conversation in `others`: each one a *tail* (its
version of this message and everything that followed it), with `version` this one's
place among them all. `branch` adds a version, `switch` shows another one. A chat has
its own system prompt and sampling (`system_prompt`, `sampling`: None means the
variant's profile), and the tools its model may call (`tools`, OpenAI function tools,
with `tool_choice`). An answer that called tools keeps its calls (`tool_calls`), and the
user's result for a call is a `tool` message naming the call (`tool_call_id`, `name`).
Every field added since the first format has a default, so older files load unchanged;
unknown fields (from a newer version) are ignored.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from engine.errors import UsageError
from engine.state import paths
from engine.state.statefile import StateFile

_ID_RE = re.compile(r"^[0-9a-f]{32}$")


@dataclass(frozen=True)
class ChatToolCall:
    """A tool call an answer made: `arguments` is its JSON text, as OpenAI sends it."""

    id: str
    name: str
    arguments: str

    @staticmethod
    def from_dict(data: dict[str, Any]) -> ChatToolCall:
        if not isinstance(data, dict):
            raise TypeError("a tool call must be an object")
        return ChatToolCall(str(data["id"]), str(data["name"]), str(data["arguments"]))


@dataclass(frozen=True)
class ChatMessage:
    role: str  # "system" | "user" | "assistant" | "tool" (a tool's result)
    content: str
    model: str | None = None  # variant or base that answered
    identity: str | None = None  # full identity key of that session
    tokens_per_second: float | None = None
    created_at: float = field(default_factory=time.time)
    backend: str | None = None  # "llama" or "openvino" for answers
    error: str | None = None  # an answer that failed or was stopped says why
    seed: int | None = None  # the seed an answer was sampled with
    finish_reason: str | None = None  # "eos", "stop", "length" ... for answers
    # What regenerates an answer (engine.runtime.replay: identity, settings, seed,
    # prompt, token ids); None for answers from before it was recorded.
    replay: dict[str, Any] | None = None
    # The other versions of this point of the conversation (see the module docstring).
    others: tuple[tuple[ChatMessage, ...], ...] = ()
    version: int = 0
    # An answer's tool calls (its `content` is then the text beside them), and a tool
    # result's call id and tool name.
    tool_calls: tuple[ChatToolCall, ...] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def bare(self) -> ChatMessage:
        """This message without the versions kept at its place."""
        return replace(self, others=(), version=0)

    def versions(self) -> int:
        return len(self.others) + 1

    @staticmethod
    def from_dict(data: dict[str, Any]) -> ChatMessage:
        if not isinstance(data, dict):
            raise TypeError("a message must be an object")
        known = {f.name for f in fields(ChatMessage)}
        values = {k: v for k, v in data.items() if k in known}
        values["others"] = tuple(tuple(ChatMessage.from_dict(m) for m in tail)
                                 for tail in data.get("others") or ())
        if values.get("tool_calls") is not None:
            values["tool_calls"] = tuple(ChatToolCall.from_dict(c)
                                         for c in values["tool_calls"])
        return ChatMessage(**values)


@dataclass(frozen=True)
class Conversation:
    id: str
    model: str  # the variant or base this conversation talks to
    title: str
    messages: tuple[ChatMessage, ...] = ()
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    system_prompt: str | None = None  # None: the variant's profile
    sampling: dict[str, Any] | None = None  # overrides of the profile's sampling
    # The tools the model may call (OpenAI function tools, as the user gave them; None:
    # none) and `tool_choice` ("auto", "required", "none" or a tool's name).
    tools: tuple[dict[str, Any], ...] | None = None
    tool_choice: str = "auto"

    def with_messages(self, messages: tuple[ChatMessage, ...]) -> Conversation:
        title = self.title
        if title == "New chat":
            first = next((m.content for m in messages if m.role == "user"), "")
            title = (first.strip().splitlines() or ["New chat"])[0][:60] or "New chat"
        return replace(self, messages=messages, title=title, updated_at=time.time())

    def renamed(self, title: str) -> Conversation:
        title = " ".join(title.split())[:120]
        return replace(self, title=title or self.title, updated_at=time.time())

    def with_settings(self, system_prompt: str | None,
                      sampling: dict[str, Any] | None) -> Conversation:
        return replace(self, system_prompt=system_prompt, sampling=sampling or None,
                       updated_at=time.time())

    def with_tools(self, tools: tuple[dict[str, Any], ...] | None,
                   tool_choice: str = "auto") -> Conversation:
        return replace(self, tools=tools or None, tool_choice=tool_choice,
                       updated_at=time.time())

    # -- versions

    def _all_versions(self, index: int) -> list[tuple[ChatMessage, ...]]:
        head = self.messages[index]
        versions = list(head.others)
        versions.insert(head.version, (head.bare(), *self.messages[index + 1:]))
        return versions

    def branch(self, index: int, tail: tuple[ChatMessage, ...]) -> Conversation:
        """A new version of the conversation from `index` on (`tail`), shown; what was
        there (and after it) is kept as another version of that place."""
        if not tail:
            raise ValueError("a branch needs at least one message")
        versions = self._all_versions(index) if index < len(self.messages) else []
        first = replace(tail[0].bare(), others=tuple(versions), version=len(versions))
        return self.with_messages((*self.messages[:index], first, *tail[1:]))

    def switch(self, index: int, version: int) -> Conversation:
        """Show version `version` (0-based) of the place `index`."""
        versions = self._all_versions(index)
        if not 0 <= version < len(versions):
            raise ValueError(f"no version {version + 1} at message {index + 1}")
        chosen = versions.pop(version)
        first = replace(chosen[0], others=tuple(versions), version=version)
        return replace(self, messages=(*self.messages[:index], first, *chosen[1:]),
                       updated_at=time.time())

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict) -> Conversation:
        messages = tuple(ChatMessage.from_dict(m) for m in data.get("messages", []))
        sampling = data.get("sampling")
        system = data.get("system_prompt")
        tools = data.get("tools")
        choice = data.get("tool_choice")
        return Conversation(data["id"], data["model"], data.get("title", "New chat"),
                            messages, data.get("created_at", 0.0), data.get("updated_at", 0.0),
                            system if isinstance(system, str) else None,
                            sampling if isinstance(sampling, dict) else None,
                            tuple(t for t in tools if isinstance(t, dict)) or None
                            if isinstance(tools, list) else None,
                            choice if isinstance(choice, str) else "auto")

    def matches(self, query: str) -> bool:
        """Search: every word of `query` is in the title or in a message shown."""
        haystack = " ".join([self.title, *(m.content for m in self.messages)]).lower()
        return all(word in haystack for word in query.lower().split())

    # -- exports

    def to_markdown(self) -> str:
        lines = [f"# {self.title}", "", f"- model: {self.model}",
                 "- exported: " + time.strftime("%Y-%m-%d %H:%M", time.localtime())]
        if self.system_prompt is not None:
            lines.append(f"- system prompt: {self.system_prompt}")
        if self.sampling:
            lines.append("- sampling: " + ", ".join(f"{k} {v}" for k, v in
                                                    sorted(self.sampling.items())))
        if self.tools:
            lines.append("- tools: " + ", ".join(
                str((t.get("function") or t).get("name", "?")) for t in self.tools))
        for message in self.messages:
            if message.role == "user":
                head = "## You"
            elif message.role == "tool":
                head = f"## Result of {message.name or 'a tool'} (`{message.tool_call_id}`)"
            else:
                head = f"## {message.model or 'assistant'}"
                facts = [f"identity `{message.identity[:12]}`" if message.identity else "",
                         f"seed {message.seed}" if message.seed is not None else "",
                         f"{message.tokens_per_second:.1f} tok/s"
                         if message.tokens_per_second else "",
                         message.error or ""]
                facts = [f for f in facts if f]
                if facts:
                    head += " (" + ", ".join(facts) + ")"
            if message.versions() > 1:
                head += f" · version {message.version + 1} of {message.versions()}"
            lines += ["", head, "", message.content]
            for call in message.tool_calls or ():
                lines += ["", f"Calls `{call.name}` (`{call.id}`):", "", "```json",
                          call.arguments, "```"]
        return "\n".join(lines) + "\n"

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False)


def _file(conversation_id: str) -> Path:
    if not _ID_RE.match(conversation_id):
        raise UsageError(f"invalid conversation id {conversation_id!r}")
    return paths.conversations_dir() / f"{conversation_id}.json"


def new(model: str) -> Conversation:
    return Conversation(uuid.uuid4().hex, model, "New chat")


def save(conversation: Conversation) -> None:
    StateFile(_file(conversation.id), dict).save(conversation.to_dict())


def load(conversation_id: str) -> Conversation | None:
    state = StateFile(_file(conversation_id), dict)
    data = state.load()
    if not data:
        return None
    try:
        return Conversation.from_dict(data)
    except (KeyError, TypeError, ValueError):
        state.reject()  # set aside with a notice, never silently hidden
        return None


def delete(conversation_id: str) -> None:
    # The lock file stays: removing it could let two processes hold "the" lock.
    state = StateFile(_file(conversation_id), dict)
    with state.locked():
        state.path.unlink(missing_ok=True)


def list_all(model: str | None = None) -> list[Conversation]:
    """Every readable conversation (optionally for one model), newest first."""
    found = []
    for file in paths.conversations_dir().glob("*.json"):
        if not _ID_RE.match(file.stem):
            continue
        conversation = load(file.stem)
        if conversation is not None and (model is None or conversation.model == model):
            found.append(conversation)
    return sorted(found, key=lambda c: c.updated_at, reverse=True)
