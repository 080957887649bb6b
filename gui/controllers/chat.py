"""The chat's state and rules, without a widget: which model and conversation are on
show, the conversations listed, sending, regenerating, editing (a branch) and stepping
between versions, the chat's own system prompt and sampling, the answer being generated
and what is kept of it.

`ChatController` builds each answer's request with `engine.runtime.assembly` (as every
front end does), starts it through an `Engine` (`gui.controllers.engine_port`: the
window's `QtEngineClient`, or a test's fake), records the result in the conversation and
saves it through `engine.state.conversations`. It tells its view what changed through a
`ChatListener` (plain method calls, on the caller's thread); the view (`gui.chat`)
renders and forwards the user's actions. No Qt here.

Tools: a conversation may carry tools (OpenAI function tools, `set_tools`, saved with
it), sent with every answer's request through the assembly with the chat's tool choice.
An answer that calls tools keeps its calls apart from its text (`ChatMessage.
tool_calls`); the user writes each call's result (`start_tool_reply`, then `send`: a
`tool` message naming the call), and once every call of the answer has one the model
goes on from them.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from engine.catalog import resolve
from engine.catalog.profiles import Sampling
from engine.catalog.resolve import SessionSpec
from engine.catalog.store import Catalog
from engine.errors import StudioError, UsageError
from engine.formats.templates import Message, ToolCall
from engine.formats.tool_calls import Tool
from engine.formats.tool_match import tools_from_openai
from engine.runtime import assembly
from engine.runtime.constraint import schema_error
from engine.runtime.messages import Generate, Prompt
from engine.runtime.results import GenerationResult
from engine.state import conversations
from engine.state.conversations import ChatMessage, ChatToolCall, Conversation
from engine.wire import encode
from gui.controllers.engine_port import CurrentSink, Engine, Running
from gui.render import BACKEND_LABELS, unanswered_calls

# The per-chat sampling the panel offers (the rest stays the profile's).
CHAT_SAMPLING = ("temperature", "top_p", "max_tokens", "seed")
STATUS_INTERVAL = 0.5  # s between redraws of the "generating…" line


class ChatListener(Protocol):
    """What the view hears. Every call is made on the thread that called the
    controller (the GUI thread, in the window)."""

    def model_changed(self) -> None:
        """Another model (or none) is chatted with: the backends it offers changed."""

    def conversation_opened(self) -> None:
        """Another conversation is on show: its settings, its place in the list."""

    def show_conversation(self) -> None:
        """Draw the conversation on show again, whole (and the header, the buttons)."""

    def show_list(self) -> None:
        """The conversations listed (`listed`) changed."""

    def show_settings(self) -> None:
        """The chat's own settings changed (`settings()`)."""

    def show_status(self, text: str) -> None: ...

    def busy_changed(self, busy: bool) -> None: ...

    def stream_started(self) -> None:
        """An answer is being generated: its label, no text yet."""

    def stream_grew(self, text: str) -> None:
        """More of it arrived (`text`, since the last call)."""

    def answer_finished(self) -> None:
        """An answer ended well (after it was recorded and drawn)."""


@dataclass(frozen=True)
class ChatSettings:
    """A chat's system prompt and sampling as its panel shows them: the chat's own,
    else its model's profile's."""

    profile_system: str  # the profile's system prompt ("" when it has none)
    system: str
    temperature: float
    top_p: float
    max_tokens: int
    seed: int
    custom: bool  # the chat has settings of its own


@dataclass(frozen=True)
class ChatActions:
    """Which of the chat's actions can be taken now (the view enables its buttons by
    these; the rules are the controller's)."""

    send: bool
    stop: bool  # an answer is being generated
    regenerate: bool
    copy: bool  # a finished answer to copy (not while one is generated)
    rename: bool  # a chat that is listed (kept), none being generated
    delete: bool
    export: bool
    settings: bool
    compose: bool  # the message field: a model is chosen
    tools: bool = False  # the conversation's tools can be changed


def history(messages: Sequence[ChatMessage]) -> tuple[Message, ...]:
    """What an answer is asked from: the messages before it, failed answers left out,
    with the answers' tool calls and the tools' results."""
    return tuple(Message(m.role, m.content, tool_calls=tuple(
        ToolCall(c.id, c.name, c.arguments) for c in m.tool_calls) if m.tool_calls else None,
        tool_call_id=m.tool_call_id, name=m.name) for m in messages if not m.error)


def read_tools(text: str) -> tuple[Tool, ...]:
    """The tools a user typed (OpenAI function tools as JSON; empty: none), each one's
    parameters checked to compile as a grammar, so a call to it can be enforced;
    StudioError saying what is wrong."""
    if not text.strip():
        return ()
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"the tools are not JSON: {exc}") from None
    tools = tools_from_openai(value)
    for tool in tools:
        error = schema_error(tool.parameters) if tool.parameters is not None else None
        if error:
            raise UsageError(f"{tool.name}: its parameters cannot be compiled to a grammar, "
                             f"so its calls cannot be enforced: {error}")
    return tools


def without_messages(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """A replay record as a chat answer keeps it: without the conversation's messages
    (see `ChatController.replay_record`; the prompt's token digest still checks them)."""
    if not record or not isinstance(record.get("prompt"), dict):
        return record
    return {**record, "prompt": {**record["prompt"], "messages": []}}


class ChatController:
    def __init__(self, engine: Engine, catalog: Catalog, listener: ChatListener,
                 backend: Callable[[], str | None] = lambda: None,
                 clock: Callable[[], float] = time.perf_counter,
                 new_seed: Callable[[], int] = lambda: random.randrange(2**31)) -> None:
        self.engine = engine
        self.catalog = catalog
        self.listener = listener
        self._backend = backend  # the backend chosen for the next answer (None: default)
        self._clock = clock
        self._new_seed = new_seed
        self.model_name: str | None = None
        self.listed: list[Conversation] = []  # the conversations read last, newest first
        self.conversation: Conversation | None = None
        self.editing: int | None = None  # the user message being edited, if any
        self.reply: Running | None = None  # the answer being generated
        self._sink: CurrentSink | None = None  # its events' listener
        self._parts: list[str] = []  # its text so far, in the pieces it came in
        self._calling: list[str] = []  # the tool calls it has started, by name
        self._chars = 0
        self._started = 0.0
        # Its tokens so far (and those of its first delivery) and when the last came:
        # a stopped answer keeps the speed it was decoding at.
        self._tokens = self._first_tokens = 0
        self._last_at = 0.0
        # When the last answer's first token was shown (seconds after it was asked for),
        # and when the status line was last redrawn while streaming.
        self.first_token_seconds: float | None = None
        self._status_at = 0.0
        self._sampling: Sampling | None = None  # of the answer being generated
        # A regenerated answer becomes a new version at this place of this conversation.
        self._branch: tuple[int, Conversation] | None = None
        self.replying: str | None = None  # the tool call whose result is being written

    # ---------------------------------------------------------------- queries

    @property
    def stream_text(self) -> str:
        """The answer being generated, so far."""
        return "".join(self._parts)

    def model_exists(self) -> bool:
        if self.model_name is None:
            return False
        try:
            self.catalog.find(self.model_name)
        except StudioError:
            return False
        return True

    def matching(self, query: str) -> list[Conversation]:
        """The conversations listed that a search for `query` finds."""
        query = query.strip()
        return [c for c in self.listed if not query or c.matches(query)]

    def spec(self) -> SessionSpec:
        """What the current model is served as: the spec `request` sends, whose identity
        the header shows (a plain base's context size from Settings, as everywhere)."""
        assert self.model_name is not None
        return assembly.spec(self.catalog, self.model_name, backend=self._backend())

    def header(self) -> tuple[str, bool]:
        """The header line and whether the model can be served: the identity the next
        answer will have (the same spec `request` sends), or why it cannot be."""
        assert self.model_name is not None
        try:
            return f"{self.model_name} · identity {self.spec().identity.short}", True
        except StudioError as exc:
            return f"{self.model_name} · {exc.message}", False

    def footer(self) -> str:
        """The footer of the conversation on show: its last answer's figures, or
        nothing (never another model's or chat's)."""
        last = next((m for m in reversed(self.conversation.messages)
                     if m.role == "assistant"), None) if self.conversation else None
        if last is None or self.reply is not None:
            return ""
        parts = [last.model or "", f"{(last.identity or '')[:12]}"]
        if last.tokens_per_second:
            parts.append(f"{last.tokens_per_second:.1f} tok/s")
        if last.error:
            parts.append(last.error)
        return "last answer: " + " · ".join(p for p in parts if p)

    def has_chat(self) -> bool:
        """Is the conversation on show a chat of the list (kept)? A new chat is not,
        until its first message (or its own settings) is saved."""
        return self.conversation is not None and \
            any(c.id == self.conversation.id for c in self.listed)

    def actions(self) -> ChatActions:
        busy = self.reply is not None
        messages = self.conversation.messages if self.conversation is not None else ()
        listed = self.has_chat()
        return ChatActions(
            send=self.model_name is not None and not busy, stop=busy,
            regenerate=not busy and any(m.role == "user" for m in messages),
            copy=not busy and any(m.role == "assistant" and m.content for m in messages),
            rename=listed and not busy, delete=listed and not busy,
            export=bool(messages), settings=self.conversation is not None and not busy,
            compose=self.model_name is not None,
            tools=self.conversation is not None and not busy)

    def message_text(self, index: int) -> str | None:
        if self.conversation is None or not 0 <= index < len(self.conversation.messages):
            return None
        message = self.conversation.messages[index]
        if not message.tool_calls:
            return message.content
        # Its calls in OpenAI's shape, after the text beside them.
        calls = json.dumps([{"id": c.id, "type": "function", "function": {
            "name": c.name, "arguments": c.arguments}} for c in message.tool_calls],
            indent=2, ensure_ascii=False)
        return f"{message.content}\n{calls}" if message.content else calls

    def last_answer_text(self) -> str | None:
        if self.conversation is None:
            return None
        return next((m.content for m in reversed(self.conversation.messages)
                     if m.role == "assistant" and m.content), None)

    def request(self, asked: tuple[Message, ...], fresh_seed: bool = False) -> Generate:
        """The next answer's request (`runtime.assembly`, as every front end builds it):
        the profile's sampling with this chat's own settings, and a new seed for a
        regenerate (unless greedy: the seed changes nothing then)."""
        assert self.model_name is not None
        own = {k: v for k, v in ((self.conversation.sampling or {}) if self.conversation
                                 else {}).items() if k in CHAT_SAMPLING}
        # The system prompt: this chat's own, else None (the profile's, in the spec).
        system = self.conversation.system_prompt if self.conversation else None
        request = assembly.request(self.catalog, self.model_name,
                                   Prompt(messages=asked, chat=True, system=system),
                                   backend=self._backend(), tools=self.tools(),
                                   tool_choice=self.conversation.tool_choice
                                   if self.conversation else "auto", **own)
        if fresh_seed and not request.sampling.greedy:
            request = assembly.with_seed(request, self._new_seed())
        return request

    def replay_record(self, index: int) -> dict[str, Any] | None:
        """What regenerates answer `index` (`gui.controllers.replay`), None if nothing
        was recorded. The record leaves out the messages it was asked from (they are
        the conversation up to this answer: storing them in every answer would make a
        conversation file grow with the square of its length), so they are put back."""
        if self.conversation is None or not 0 <= index < len(self.conversation.messages):
            return None
        record = self.conversation.messages[index].replay
        if not record:
            return None
        return {**record, "prompt": {**record["prompt"], "messages": [
            encode(m) for m in history(self.conversation.messages[:index])]}}

    # ---------------------------------------------------------------- conversations

    def set_model(self, name: str | None) -> None:
        if name == self.model_name:
            return
        self.abandon()
        self.model_name = name
        self.listener.model_changed()
        self.conversation = None
        self.refresh_list()
        if name is None:
            self.listener.show_conversation()
            self.listener.show_status(self.footer())
            return
        self.open(self.listed[0] if self.listed else conversations.new(name))

    def refresh_list(self) -> None:
        """Read the model's conversations from their files again."""
        self.listed = conversations.list_all(self.model_name) \
            if self.model_name is not None else []
        self.listener.show_list()

    def open(self, conversation: Conversation) -> None:
        self.conversation = conversation
        self.replying = None
        self.listener.conversation_opened()
        self.listener.show_conversation()
        self.listener.show_status(self.footer())

    def pick(self, conversation_id: str) -> None:
        """The user chose a conversation in the list (not while an answer runs)."""
        if self.reply is not None or (self.conversation is not None and
                                      conversation_id == self.conversation.id):
            return
        loaded = conversations.load(conversation_id)
        if loaded is not None:
            self.open(loaded)

    def new_chat(self) -> None:
        if self.model_name is None:
            return
        self.abandon()
        self.open(conversations.new(self.model_name))

    def delete(self) -> None:
        if self.conversation is None or self.reply is not None:
            return
        conversations.delete(self.conversation.id)
        self.conversation = None
        self.refresh_list()
        model, self.model_name = self.model_name, None
        self.set_model(model)  # its newest other conversation, or a new one

    def rename(self, conversation_id: str, title: str) -> None:
        loaded = self.conversation if self.conversation is not None and \
            self.conversation.id == conversation_id else conversations.load(conversation_id)
        if loaded is None:
            return
        renamed = loaded.renamed(title)
        conversations.save(renamed)
        if self.conversation is not None and self.conversation.id == conversation_id:
            self.conversation = renamed
        self.refresh_list()

    def keep(self) -> None:
        """Save the conversation on show even if it has no message yet (an empty chat
        is listed once it is named)."""
        self.save(force=True)

    def export(self, path: str) -> str:
        """Save the conversation as Markdown (.md) or JSON (.json)."""
        assert self.conversation is not None
        text = self.conversation.to_json() if path.lower().endswith(".json") else \
            self.conversation.to_markdown()
        Path(path).write_text(text, encoding="utf-8")
        self.listener.show_status(f"exported to {path}")
        return path

    def save(self, force: bool = False) -> None:
        if self.conversation is not None and (self.conversation.messages or force):
            conversations.save(self.conversation)
            self.refresh_list()

    # ---------------------------------------------------------------- the chat's settings

    def _profile(self) -> tuple[str, Sampling] | None:
        if self.model_name is None:
            return None
        try:
            profile = resolve.profile(self.catalog, self.model_name)
            return (str(profile.get("system_prompt") or ""),
                    resolve.sampling(self.catalog, self.model_name))
        except StudioError:
            return None

    def settings(self) -> ChatSettings | None:
        """The conversation's settings (the profile's where it has none)."""
        defaults = self._profile()
        if defaults is None or self.conversation is None:
            return None
        system, sampling = defaults
        own = self.conversation.sampling or {}
        return ChatSettings(
            system, self.conversation.system_prompt
            if self.conversation.system_prompt is not None else system,
            float(own.get("temperature", sampling.temperature)),
            float(own.get("top_p", sampling.top_p)),
            int(own.get("max_tokens", sampling.max_tokens)),
            int(own.get("seed", sampling.seed)), self.custom_settings())

    def custom_settings(self) -> bool:
        return self.conversation is not None and (
            self.conversation.system_prompt is not None or bool(self.conversation.sampling))

    def edit_settings(self, system: str, temperature: float, top_p: float, max_tokens: int,
                      seed: int) -> None:
        """The panel's values: only what differs from the profile is the chat's own, so
        a later profile edit still reaches the settings the user did not touch."""
        defaults = self._profile()
        if defaults is None or self.conversation is None:
            return
        profile_system, sampling = defaults
        values = {"temperature": round(temperature, 4), "top_p": round(top_p, 4),
                  "max_tokens": max_tokens, "seed": seed}
        own = {k: v for k, v in values.items() if v != getattr(sampling, k)}
        self.conversation = self.conversation.with_settings(
            system if system != profile_system else None, own)
        self.save(force=True)

    # ---------------------------------------------------------------- tools

    def tools(self) -> tuple[Tool, ...]:
        """The tools the conversation's model may call (checked when they were set)."""
        if self.conversation is None or not self.conversation.tools:
            return ()
        return tools_from_openai(list(self.conversation.tools))

    def tools_text(self) -> str:
        """The conversation's tools as the Tools dialog shows them (formatted JSON)."""
        if self.conversation is None or not self.conversation.tools:
            return ""
        return json.dumps(list(self.conversation.tools), indent=2, ensure_ascii=False)

    def set_tools(self, text: str, tool_choice: str = "auto") -> str | None:
        """Give the conversation the tools in `text` (OpenAI function tools as JSON;
        empty: none) and the tool choice; saved with it. Returns what is wrong (nothing
        changes then), or None."""
        if self.conversation is None:
            return "no conversation"
        try:
            tools = read_tools(text)
        except StudioError as exc:
            return exc.message
        if tool_choice not in ("none", "auto", "required", *(t.name for t in tools)):
            return f"tool choice {tool_choice!r} is not one of the tools"
        self.conversation = self.conversation.with_tools(
            tuple(t.openai() for t in tools) or None, tool_choice if tools else "auto")
        self.save(force=True)
        return None

    def pending_calls(self) -> list[ChatToolCall]:
        """The last answer's tool calls that have no result yet (in the order made)."""
        return unanswered_calls(self.conversation.messages) if self.conversation else []

    def start_tool_reply(self, call_id: str) -> ChatToolCall | None:
        """Write the result of tool call `call_id` (one of `pending_calls`): the next
        `send` adds it as the tool's message."""
        if self.reply is not None:
            return None
        call = next((c for c in self.pending_calls() if c.id == call_id), None)
        if call is not None:
            self.replying, self.editing = call.id, None
        return call

    def stop_tool_reply(self) -> bool:
        replying, self.replying = self.replying, None
        return replying is not None

    def _send_tool_result(self, text: str) -> bool:
        """The result of the call being replied to, as a `tool` message; once every call
        of the answer has its result, the model goes on from them."""
        assert self.conversation is not None
        call = next((c for c in self.pending_calls() if c.id == self.replying), None)
        self.replying = None
        if call is None:
            return False
        self.conversation = self.conversation.with_messages((
            *self.conversation.messages,
            ChatMessage("tool", text, tool_call_id=call.id, name=call.name)))
        if self.pending_calls():
            self.save()  # more calls to answer first
            self.listener.show_conversation()
            return True
        self._start()
        self.save()
        return True

    def reset_settings(self) -> None:
        if self.conversation is None:
            return
        self.conversation = self.conversation.with_settings(None, None)
        self.save(force=True)
        self.listener.show_settings()

    # ---------------------------------------------------------------- versions

    def start_editing(self, index: int) -> bool:
        """Edit user message `index`: sending it makes a branch."""
        if self.conversation is None or self.reply is not None or \
                not 0 <= index < len(self.conversation.messages) or \
                self.conversation.messages[index].role != "user":
            return False
        self.editing, self.replying = index, None
        return True

    def stop_editing(self) -> bool:
        """Stop editing; whether a message was being edited."""
        editing, self.editing = self.editing, None
        return editing is not None

    def send(self, text: str) -> bool:
        """Ask `text` (a new branch from the message being edited, if one is)."""
        text = text.strip()
        if not text or self.model_name is None or self.conversation is None or \
                self.reply is not None:
            return False
        if self.replying is not None:
            return self._send_tool_result(text)
        editing, self.editing = self.editing, None
        if editing is not None and editing < len(self.conversation.messages):
            # Edited and sent again: a new branch from that message; the old path stays
            # as another version of it.
            self.conversation = self.conversation.branch(editing, (ChatMessage("user", text),))
        else:
            self.conversation = self.conversation.with_messages(
                (*self.conversation.messages, ChatMessage("user", text)))
        # The request goes out first: saving (an fsync'd write, ~20-30 ms) happens while
        # the engine reads the prompt, not before it is asked.
        self._start()
        self.save()
        return True

    def regenerate(self) -> bool:
        """A new answer to the last question, kept beside the old one (‹ 1/2 ›), with a
        new seed unless the sampling is greedy (which would give the same answer)."""
        if self.conversation is None or self.reply is not None:
            return False
        messages = self.conversation.messages
        index = len(messages)
        while index > 0 and messages[index - 1].role == "assistant":
            index -= 1
        if index == 0:
            return False
        if index < len(messages):
            self._branch = (index, self.conversation)
            self.conversation = replace(self.conversation, messages=messages[:index])
        self._start(fresh_seed=True)
        return True

    def switch_version(self, index: int, step: int) -> None:
        if self.conversation is None or self.reply is not None or \
                not 0 <= index < len(self.conversation.messages):
            return
        message = self.conversation.messages[index]
        target = message.version + step
        if not 0 <= target < message.versions():
            return
        self.conversation = self.conversation.switch(index, target)
        self.save()
        self.listener.show_conversation()
        self.listener.show_status(self.footer())

    # ---------------------------------------------------------------- generation

    def _start(self, fresh_seed: bool = False) -> None:
        assert self.conversation is not None and self.model_name is not None
        try:
            request = self.request(history(self.conversation.messages), fresh_seed)
        except StudioError as exc:
            self._sampling = None
            self._append_answer("", error=exc.message)
            self.listener.show_conversation()
            return
        self._sampling = request.sampling
        self._parts, self._chars = [], 0
        self._calling = []
        self._tokens = self._first_tokens = 0
        self._started = self._clock()
        self.first_token_seconds = None
        sink = self._sink = CurrentSink(lambda: self._sink is sink, self._on_tokens,
                                        self._on_finished, self._on_failed,
                                        self._on_cancelled)
        self.reply = self.engine.start(request, sink)
        # Drawn once it runs: no actions on messages while it does.
        self.listener.show_conversation()
        self.listener.stream_started()
        self.listener.show_status("generating…")
        self.listener.busy_changed(True)

    def stop(self) -> None:
        """Stop the answer: what came so far is kept, marked stopped (when the engine
        confirms, `cancelled`)."""
        if self.reply is not None:
            self.reply.stop()

    def abandon(self) -> None:
        """The user moves on while an answer is generated: stop it, and keep what came
        so far, marked stopped, in the conversation it was asked in."""
        reply = self.reply
        if reply is None:
            return
        self._sink = None  # nothing it still delivers is heard
        reply.stop()
        self._stopped()
        self._finish()

    def _on_tokens(self, _side: str, text: str, tokens: list) -> None:
        # A tool call being written shows as its name in the status, not as its JSON.
        self._calling += [name for token in tokens for name in token[3]]
        self._parts.append(text)
        self._chars += len(text)
        self.listener.stream_grew(text)
        now = self._clock()
        self._tokens += len(tokens)
        self._last_at = now
        if self.first_token_seconds is None:
            self.first_token_seconds = now - self._started
            self._first_tokens = self._tokens
        # Twice a second is enough for a running count, and a label's new text makes
        # every layout up to the window recompute (several ms offscreen, CPU the engine
        # needs on a small machine).
        if now - self._status_at >= STATUS_INTERVAL:
            self._status_at = now
            calling = f"calling {', '.join(self._calling)}… " if self._calling else ""
            self.listener.show_status(f"generating… {calling}{self._chars} chars, "
                                      f"{now - self._started:.1f} s")

    def _on_finished(self, result: GenerationResult) -> None:
        self._append_answer(result.text, result=result)
        # The name asked for: the engine reports its session's, which is shared by every
        # name of one identity (two variants with the same parts).
        finish = result.finish_reason
        # The figures first, the model last: a narrow window cuts the line at its end
        # (the answer's own label names the model and its identity).
        self.listener.show_status(" · ".join(p for p in (
            self._speed_text(result.tokens_per_second, len(result.token_ids)),
            "cut at max tokens" if finish == "length" else finish or "",
            f"{self.model_name}, {BACKEND_LABELS.get(result.backend, '?')}") if p))
        self._finish()
        self.listener.answer_finished()

    def _speed_text(self, tokens_per_second: float | None, tokens: int) -> str:
        parts = [f"{tokens_per_second:.1f} tok/s" if tokens_per_second else "",
                 f"{tokens} token{'' if tokens == 1 else 's'}" if tokens else "",
                 f"first token {self.first_token_seconds:.2f} s"
                 if self.first_token_seconds is not None else ""]
        return " · ".join(p for p in parts if p)

    def stopped_speed(self) -> float | None:
        """How fast the answer being generated came so far: its tokens after the first
        delivery (which waited for the prompt) over the time since it, None when too
        little came to tell."""
        if self.first_token_seconds is None:
            return None
        span = self._last_at - (self._started + self.first_token_seconds)
        later = self._tokens - self._first_tokens
        return later / span if later > 0 and span > 0 else None

    def _stopped(self) -> None:
        """Keep what came of a stopped answer, with its speed, marked stopped."""
        speed = self.stopped_speed()
        self._append_answer(self.stream_text, error="stopped", tokens_per_second=speed)
        self.listener.show_status(" · ".join(
            p for p in ("stopped", self._speed_text(speed, self._tokens)) if p))

    def _on_cancelled(self) -> None:
        self._stopped()
        self._finish()

    def _on_failed(self, message: str) -> None:
        self._append_answer(self.stream_text, error=message)
        self.listener.show_status("failed")
        self._finish()

    def _finish(self) -> None:
        self.reply = None
        self._sink = None
        self.listener.busy_changed(False)
        self.listener.show_conversation()

    def _append_answer(self, text: str, error: str | None = None,
                       result: GenerationResult | None = None,
                       tokens_per_second: float | None = None) -> None:
        assert self.conversation is not None
        calls = None
        if result is not None and result.tool_calls:
            # The calls apart (cards in the view), the text beside them as the content.
            text = result.content or ""
            calls = tuple(ChatToolCall(c.id, c.name, c.arguments) for c in result.tool_calls)
        message = ChatMessage(
            "assistant", text, model=self.model_name, tool_calls=calls,
            identity=result.identity if result else None,
            tokens_per_second=result.tokens_per_second if result else tokens_per_second,
            error=error,
            backend=result.backend if result else None,
            seed=self._sampling.seed if self._sampling else None,
            finish_reason=result.finish_reason if result else None,
            replay=without_messages(result.replay if result else None))
        branch, self._branch = self._branch, None
        if branch is not None and branch[1].id == self.conversation.id:
            index, before = branch
            self.conversation = replace(before, system_prompt=self.conversation.system_prompt,
                                        sampling=self.conversation.sampling
                                        ).branch(index, (message,))
        else:
            self.conversation = self.conversation.with_messages(
                (*self.conversation.messages, message))
        self.save()
