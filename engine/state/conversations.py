"""Chat conversations, kept across restarts.

One JSON file per conversation under the data directory's `conversations/`, written
atomically under a lock (engine.statefile). File names are generated ids, never
taken from a model or a message. Each assistant message records the variant and the
identity key that produced it, so an answer can always be traced to its model.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from engine.errors import UsageError
from engine.state import paths
from engine.state.statefile import StateFile

_ID_RE = re.compile(r"^[0-9a-f]{32}$")


@dataclass(frozen=True)
class ChatMessage:
    role: str  # "system" | "user" | "assistant"
    content: str
    model: str | None = None  # variant or base that answered
    identity: str | None = None  # full identity key of that session
    tokens_per_second: float | None = None
    created_at: float = field(default_factory=time.time)
    backend: str | None = None  # "llama" or "openvino" for answers
    error: str | None = None  # an answer that failed or was stopped says why


@dataclass(frozen=True)
class Conversation:
    id: str
    model: str  # the variant or base this conversation talks to
    title: str
    messages: tuple[ChatMessage, ...] = ()
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)

    def with_messages(self, messages: tuple[ChatMessage, ...]) -> Conversation:
        title = self.title
        if title == "New chat":
            first = next((m.content for m in messages if m.role == "user"), "")
            title = (first.strip().splitlines() or ["New chat"])[0][:60] or "New chat"
        return replace(self, messages=messages, title=title, updated_at=time.time())

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict) -> Conversation:
        messages = tuple(ChatMessage(**m) for m in data.get("messages", []))
        return Conversation(data["id"], data["model"], data.get("title", "New chat"),
                            messages, data.get("created_at", 0.0), data.get("updated_at", 0.0))


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
