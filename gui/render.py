"""Model output and chat messages as HTML: the one place the views get what they show of
a message (Markdown itself, safely, is `gui.markdown`).

- `message_html`: one message of a conversation, its label (who spoke, the model, its
  identity, speed and seed, the actions as links) above its body; `transcript_html`
  the whole conversation. An answer that is one JSON object or array (a tool call) is
  shown as a formatted code block (`answer_markdown`), not as a paragraph. An answer's
  tool calls are cards (`tool_call_html`: the function's name, its arguments as
  formatted, highlighted JSON, and, while the call has no result, a "Reply with result"
  link); a tool's result is labelled with the call it answers.
- `StreamingMarkdown`: the answer being generated, as frames. A finished Markdown block
  is rendered once and never again; each frame renders only the unfinished block at the
  end. The speaker's label is rendered apart from the body (`message_head_html`), so the
  body's first block (a numbered list) can never take the label in.
- `purpose_html`: what a model is for, for its empty chat.
- `marked_source`: where the comparison's marks go in a side's text.

Plain Python (no Qt): the controllers, their tests and the views share these functions.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engine.catalog import entries
from engine.catalog.store import Catalog
from engine.errors import StudioError
from engine.state.conversations import ChatMessage, ChatToolCall
from gui.markdown import CODE_STYLE, Rendered, fence_for, finished_length, markdown_html, render

__all__ = ["BACKEND_LABELS", "CODE_STYLE", "EMPTY_BODY", "TAIL_START", "TOKEN_START",
           "StreamFrame", "StreamingMarkdown", "answer_markdown", "markdown_html",
           "marked_markdown", "marked_source", "message_body_html", "message_head_html",
           "message_html", "purpose_html", "streaming_head_html", "streaming_markdown",
           "tool_call_html", "transcript_html", "unanswered_calls"]

# How a person reads a backend's name (the pickers, the labels, the status lines).
BACKEND_LABELS = {"llama": "llama.cpp", "openvino": "OpenVINO"}
LINK = "text-decoration:none"
EMPTY_BODY = "<span style='color:#888'>…</span>"  # an answer with no text yet
TOKEN_START, TAIL_START = "\ue000", "\ue001"  # private use: survive the rendering
# At a line's start, Markdown's block syntax must stay first on its line, or a marker
# would turn a heading, a list item or a code fence into a paragraph.
BLOCK_SYNTAX = re.compile(r"(?:[ \t]*(?:#{1,6}[ \t]|>[ \t]?|[-*+][ \t]|\d+[.)][ \t]|"
                          r"(?:`{3,}|~{3,})[^\n]*\n|\|))*")


# ---------------------------------------------------------------- messages

def _link(href: str, text: str, tip: str = "") -> str:
    title = f" title='{html.escape(tip)}'" if tip else ""
    return f"<a href='{href}' style='{LINK}'{title}>{text}</a>"


def answer_markdown(text: str) -> str:
    """The Markdown an answer is shown as: the text itself, or, when the whole answer
    is one JSON object or array, that value formatted in a json code block."""
    stripped = text.strip()
    if not stripped.startswith(("{", "[")):
        return text
    try:
        value = json.loads(stripped)
    except ValueError:
        return text
    pretty = json.dumps(value, indent=2, ensure_ascii=False)
    fence = fence_for(pretty)
    return f"{fence}json\n{pretty}\n{fence}"


def arguments_markdown(arguments: str) -> str:
    """A call's arguments as a formatted json code block (as the text they are, in a
    plain block, when they are not JSON)."""
    try:
        pretty = json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
        language = "json"
    except (ValueError, RecursionError):
        pretty, language = arguments, "text"
    fence = fence_for(pretty)
    return f"{fence}{language}\n{pretty}\n{fence}"


def unanswered_calls(messages: Sequence[ChatMessage]) -> list[ChatToolCall]:
    """The last answer's tool calls that no tool message answers yet (the ones a user
    can still reply to; an earlier answer's calls are settled)."""
    at = next((i for i in range(len(messages) - 1, -1, -1)
               if messages[i].role == "assistant"), None)
    if at is None or not messages[at].tool_calls or messages[at].error:
        return []
    answered = {m.tool_call_id for m in messages[at + 1:] if m.role == "tool"}
    return [c for c in messages[at].tool_calls or () if c.id not in answered]


def tool_call_html(call: ChatToolCall, dark: bool = False, first_block: int = 0,
                   reply: bool = False) -> Rendered:
    """A tool call as a card: the function's name and the call's id, its arguments as a
    highlighted json block, and with `reply` a "Reply with result" link
    (`toolresult:<call id>`)."""
    body = render(arguments_markdown(call.arguments), dark, first_block,
                  copy_links=True)
    link = (" &nbsp; " + _link(f"toolresult:{html.escape(call.id)}", "Reply with result",
                               "Write what the tool returned; the model goes on from it")
            if reply else "")
    border = "#555" if dark else "#bbb"
    body.html = (f"<table width='100%' cellspacing='0' cellpadding='6' "
                 f"style='border:1px solid {border};margin:4px 0'><tr><td>"
                 f"🔧 Calls <b><code>{html.escape(call.name)}</code></b>"
                 f"<span style='color:#888'> · {html.escape(call.id)}</span>{link}"
                 f"{body.html}</td></tr></table>")
    return body


def message_head_html(message: ChatMessage, index: int | None = None,
                      last: bool = False) -> str:
    """A message's label: who spoke (the model, its backend, identity, speed, seed) and,
    with `index`, its actions as links (versions, edit, copy, replay, and regenerate on
    the last answer). Inline HTML, no block of its own."""
    actions = []
    if index is not None and message.versions() > 1:
        actions.append(_link(f"prev:{index}", "‹", "Previous version") +
                       f" {message.version + 1}/{message.versions()} " +
                       _link(f"next:{index}", "›", "Next version"))
    if index is not None and message.role == "user":
        actions.append(_link(f"edit:{index}", "Edit", "Edit and send again (a new branch)"))
    if index is not None and message.role == "assistant" and (message.content
                                                             or message.tool_calls):
        actions.append(_link(f"copymsg:{index}", "Copy", "Copy this answer"))
        if message.replay:
            actions.append(_link(f"replay:{index}", "Replay", "Regenerate this answer with "
                                 "the same identity, settings and seed, and compare"))
        if last:
            actions.append(_link("regenerate:", "Regenerate", "A new answer (new seed)"))
    if message.role == "user":
        head = "<b>You</b>"
    elif message.role == "tool":
        head = (f"<b>Result of <code>{html.escape(message.name or 'a tool')}</code></b>"
                f"<span style='color:#888'> · {html.escape(message.tool_call_id or '')}"
                "</span>")
    else:
        label = html.escape(message.model or "assistant")
        if message.backend:
            label += (f" <span style='color:#888'>on "
                      f"{BACKEND_LABELS.get(message.backend, '?')}</span>")
        ident = f" · <code>{html.escape((message.identity or '')[:12])}</code>" \
            if message.identity else ""
        speed = f" · {message.tokens_per_second:.1f} tok/s" \
            if message.tokens_per_second else ""
        seed = f" · seed {message.seed}" if message.seed is not None else ""
        cut = " · cut at max tokens" if message.finish_reason == "length" else ""
        head = f"<b>{label}</b><span style='color:#888'>{ident}{speed}{seed}{cut}</span>"
    if actions:
        head += "<span style='color:#888'> &nbsp; " + " · ".join(actions) + "</span>"
    return head


def message_body_html(message: ChatMessage, dark: bool = False,
                      code: list[str] | None = None,
                      replyable: Sequence[str] = ()) -> str:
    """A message's text as HTML, and its tool calls as cards (those in `replyable` with
    a "Reply with result" link); with `code`, each code block gets a Copy link and its
    text is appended to `code` (the links are numbered by their place in it)."""
    if not message.content and not message.tool_calls:
        return EMPTY_BODY
    parts = []
    if message.content:
        text = answer_markdown(message.content) if message.role in ("assistant", "tool") \
            else message.content
        rendered = render(text, dark, len(code) if code is not None else 0,
                          copy_links=code is not None)
        if code is not None:
            code.extend(rendered.code)
        parts.append(rendered.html)
    for call in message.tool_calls or ():
        card = tool_call_html(call, dark, len(code) if code is not None else 0,
                              reply=code is not None and call.id in replyable)
        if code is not None:
            code.extend(card.code)
        parts.append(card.html)
    return "".join(parts)


def message_html(message: ChatMessage, index: int | None = None, dark: bool = False,
                 code: list[str] | None = None, last: bool = False,
                 replyable: Sequence[str] = ()) -> str:
    """One message; with `index`, its actions as links (edit, versions, copy, and
    regenerate on the last answer, a reply to each call in `replyable`); code blocks'
    texts are appended to `code`."""
    error = (f"<div style='color:#d23c3c'>{html.escape(message.error)}</div>"
             if message.error else "")
    body = message_body_html(message, dark, code, replyable if index is not None else ())
    return (f"<div style='margin:8px 0'>{message_head_html(message, index, last)}"
            f"<div>{body}</div>{error}</div>")


def transcript_html(messages: Sequence[ChatMessage], busy: bool,
                    dark: bool = False) -> Rendered:
    """A conversation as shown: every message, with actions unless an answer is being
    generated (`busy`), regenerate on the last answer; `code` holds the code blocks'
    texts, numbered as their Copy links."""
    page = Rendered("")
    last = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
    replyable = [c.id for c in unanswered_calls(messages)]
    page.html = "".join(message_html(m, None if busy else i, dark, page.code, last=i == last,
                                     replyable=replyable)
                        for i, m in enumerate(messages))
    return page


def streaming_head_html(model: str | None) -> str:
    """The label of an answer being generated: the model's name, nothing else yet."""
    head = message_head_html(ChatMessage("assistant", "", model=model))
    return f"<div style='margin:8px 0 0 0'>{head}</div>"


# ---------------------------------------------------------------- streaming

@dataclass(frozen=True)
class StreamFrame:
    """What a streaming answer's view does next: append `finished` (the HTML of the
    blocks finished since the last frame, never drawn again) and replace the previous
    frame's tail with `tail` (the HTML of the unfinished rest)."""

    finished: str
    tail: str


class StreamingMarkdown:
    """Markdown that arrives in pieces, rendered so that the cost of a frame does not
    grow with what is already finished: each finished top-level block is rendered once
    (`gui.markdown.finished_length` says which are), only the unfinished rest again.

    `render_html` renders a piece of Markdown (a test counts its calls). The finished
    answer is rendered whole by the view once it ends (`message_html`)."""

    def __init__(self, render_html: Callable[[str], str]) -> None:
        self._render = render_html
        self._tail = ""  # the text not yet in a finished block
        self.finished_chars = 0  # how much of the text is in finished blocks

    def feed(self, text: str) -> StreamFrame:
        self._tail += text
        cut = finished_length(self._tail)
        finished = ""
        if cut:
            finished = self._render(self._tail[:cut])
            self._tail = self._tail[cut:]
            self.finished_chars += cut
        return StreamFrame(finished, self._render(self._tail) if self._tail else "")


def streaming_markdown(dark: bool = False) -> StreamingMarkdown:
    """An answer's body as it streams (no Copy links until it is finished)."""
    return StreamingMarkdown(lambda text: render(text, dark, copy_links=False).html)


# ---------------------------------------------------------------- a model's purpose

def purpose_html(catalog: Catalog, name: str) -> str:
    """What a model is for, for its empty chat: the variant's description, or its
    system prompt and its adapters' source and training."""
    try:
        kind, record = catalog.find(name)
    except StudioError:
        return ""
    esc = html.escape
    parts = []
    if record.get("description"):
        parts.append(esc(str(record["description"])))
    if kind == "model":
        meta = record.get("metadata") or {}
        arch = esc(str(meta.get("architecture", "?")))
        parts.append(f"<b>{esc(name)}</b> is a base model ({arch}, "
                     f"{esc(str(meta.get('file_type', '')))}) with no adapter: the "
                     "reference every variant of it is compared with.")
    else:
        adapters = ", ".join(f"{esc(a['name'])} at scale {a['scale']:g}"
                             for a in record.get("adapters", []))
        parts.append(f"<b>{esc(name)}</b> is {esc(record['base'])} with {adapters}.")
        system = (record.get("profile") or {}).get("system_prompt")
        if system:
            parts.append(f"Its system prompt: <i>“{esc(system)}”</i>")
        for a in record.get("adapters", []):
            try:
                adapter = catalog.adapter(a["name"])
            except StudioError:
                continue
            facts = []
            if adapter.get("source"):
                facts.append(esc(str(adapter["source"])))
            provenance = adapter.get("provenance")
            if isinstance(provenance, dict) and provenance:
                try:
                    lines = entries.provenance_lines(provenance)
                except (KeyError, TypeError, ValueError, AttributeError):
                    lines = []
                for line in lines:
                    key, _, value = line.partition(": ")
                    if key == "data_sha256" and "(" in value:
                        facts.append("trained on " + esc(value[value.index("(") + 1:]
                                                         .rstrip(")")))
                    elif key in ("method", "loss"):
                        facts.append(f"{esc(key)} {esc(value)}")
            if facts:
                parts.append(f"Adapter {esc(a['name'])}: " + "; ".join(facts) + ".")
    return ("<div style='color:#888;margin:24px 8px'>" + "<br><br>".join(parts) +
            "<br><br>Ask it something below.</div>")


# ---------------------------------------------------------------- comparison marks

def marked_source(tokens: list[str], divergence: int) -> tuple[str, int, int]:
    """The text with the marks' places: (text, token start, tail start) as positions
    where TOKEN_START and TAIL_START go, moved past block syntax at a line's start."""
    text = "".join(tokens)
    start = len("".join(tokens[:divergence]))
    end = start + len(tokens[divergence]) if divergence < len(tokens) else start
    if start == 0 or text[start - 1] == "\n":
        start += BLOCK_SYNTAX.match(text, start).end() - start  # type: ignore[union-attr]
        line_end = text.find("\n", start)
        limit = len(text) if line_end < 0 else line_end
        end = min(max(end, start + 1), max(limit, start))
    return text, start, max(end, start)


def marked_markdown(tokens: list[str], divergence: int) -> str:
    """A side's text with TOKEN_START before the first differing token and TAIL_START
    before the rest of the divergent tail."""
    text, start, end = marked_source(tokens, divergence)
    return text[:start] + TOKEN_START + text[start:end] + TAIL_START + text[end:]
