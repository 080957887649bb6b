"""Turning model output into safe, readable HTML: fenced code blocks, inline code,
bold, paragraphs. Everything is escaped first; nothing in the text becomes markup
unless these rules make it so."""

from __future__ import annotations

import html
import re

_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)\n?(.*?)(?:```|\Z)", re.DOTALL)
_INLINE = re.compile(r"`([^`\n]+)`")
_BOLD = re.compile(r"\*\*([^*\n]+)\*\*")

CODE_STYLE = ("background:rgba(127,127,127,0.16);padding:6px;border-radius:4px;"
              "font-family:monospace;white-space:pre-wrap")


def _inline(text: str) -> str:
    escaped = html.escape(text)
    escaped = _INLINE.sub(r"<code style='font-family:monospace'>\1</code>", escaped)
    escaped = _BOLD.sub(r"<b>\1</b>", escaped)
    return escaped.replace("\n", "<br>")


def markdown_html(text: str) -> str:
    out = []
    position = 0
    for match in _FENCE.finditer(text):
        out.append(_inline(text[position:match.start()]))
        language = html.escape(match.group(1))
        label = (f"<div style='color:#888;font-size:small'>{language}</div>"
                 if language else "")
        out.append(f"{label}<pre style='{CODE_STYLE}'>{html.escape(match.group(2))}</pre>")
        position = match.end()
    out.append(_inline(text[position:]))
    return "".join(out)
