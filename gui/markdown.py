"""Model output as safe, readable HTML for Qt's rich text: Markdown (CommonMark with
tables and strikethrough, by markdown-it-py), code blocks highlighted by Pygments, a
"Copy" link per code block.

Safety first: raw HTML in the text is never markup (markdown-it's `html` option is
off, so it is escaped), images are shown as their alt text and never loaded (a
QTextBrowser would read a local file named by the model), and links keep only the
schemes markdown-it validates (no `javascript:`); the views open http(s) links only.

Why markdown-it-py rather than `QTextDocument.setMarkdown`: Qt's importer gives no hook
to highlight a code block or put a button beside it, and its output cannot be marked
(the comparison marks the first differing token inside the rendered text). markdown-it-py
is a maintained CommonMark implementation whose renderer rules are overridable.
`render` takes `marks`: private-use characters that survive rendering, which a view
turns into formats after the HTML is in its document (`gui.compare`).

`document_html` renders the app's own documentation (Help → Documentation) with the
same rules, its wrapped paragraphs joined and its headings anchored.

`finished_length` tells which part of a text that is still arriving is made of finished
blocks (their HTML cannot change any more), so a streaming answer renders each finished
block once (`gui.render.StreamingMarkdown`).
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from typing import Any

from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_by_name
from pygments.util import ClassNotFound

CODE_STYLE = ("background:rgba(127,127,127,0.16);padding:6px;"
              "font-family:monospace;white-space:pre-wrap")
INLINE_CODE = "<code style='font-family:monospace'>"
LIGHT_STYLE, DARK_STYLE = "default", "monokai"
MAX_HIGHLIGHT = 200_000  # characters: larger blocks are shown plain (Pygments is linear,
# but a megabyte of spans makes QTextDocument slow to lay out)
LINE_BREAK = re.compile(r"\r\n?|\n")  # as markdown-it counts lines


@dataclass
class Rendered:
    html: str
    code: list[str] = field(default_factory=list)  # each code block's text, in order


def _parser(breaks: bool = True) -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "breaks": breaks, "typographer": False})
    md.enable("table").enable("strikethrough")
    return md


_MD = _parser()
# The app's own documentation (`document_html`): its paragraphs are wrapped in the file,
# so a line break inside one is a space, as on GitHub.
_DOCS = _parser(breaks=False)
SLUG_DROP = re.compile(r"[^\w\- ]")


def slug(title: str) -> str:
    """A heading's anchor as GitHub makes it ("Parity gate" -> "parity-gate"), so the
    documents' links to their own sections work."""
    return SLUG_DROP.sub("", title.strip().lower()).replace(" ", "-")


def _highlight(code: str, language: str, dark: bool) -> str:
    if not language or len(code) > MAX_HIGHLIGHT:
        return html.escape(code)
    try:
        lexer = get_lexer_by_name(language, stripnl=False, ensurenl=False)
    except ClassNotFound:
        lexer = TextLexer()
    formatter = HtmlFormatter(nowrap=True, noclasses=True,
                              style=DARK_STYLE if dark else LIGHT_STYLE)
    out = highlight(code, lexer, formatter)
    return out[:-1] if out.endswith("\n") and not code.endswith("\n") else out


def render(text: str, dark: bool = False, first_block: int = 0,
           copy_links: bool = True, document: bool = False) -> Rendered:
    """HTML for `text`; code blocks are numbered from `first_block` ("copy:N" links).
    `document`: the app's own documentation (a line break inside a paragraph is a
    space, and each heading is an anchor named by `slug`)."""
    result = Rendered("")
    md = _DOCS if document else _MD
    renderer: Any = md.renderer

    def fence(tokens: list, idx: int, _options: Any, _env: Any) -> str:
        token = tokens[idx]
        language = (token.info or "").strip().split(" ")[0][:32]
        code = token.content
        if code.endswith("\n"):
            code = code[:-1]
        number = first_block + len(result.code)
        result.code.append(code)
        label = html.escape(language) if language else "code"
        link = (f" · <a href='copy:{number}'>Copy</a>" if copy_links else "")
        return (f"<p style='margin:6px 0 0 0;color:#888;font-size:small'>{label}{link}</p>"
                f"<pre style='{CODE_STYLE}'>{_highlight(code, language, dark)}</pre>\n")

    def code_inline(tokens: list, idx: int, _options: Any, _env: Any) -> str:
        return f"{INLINE_CODE}{html.escape(tokens[idx].content)}</code>"

    def image(tokens: list, idx: int, _options: Any, _env: Any) -> str:
        token = tokens[idx]
        alt = "".join(" " if child.type in ("softbreak", "hardbreak") else child.content
                      for child in token.children or []) or "image"
        return f"[{html.escape(alt)}]"

    def heading_open(tokens: list, idx: int, _options: Any, _env: Any) -> str:
        title = tokens[idx + 1].content if idx + 1 < len(tokens) else ""
        return f"<{tokens[idx].tag}><a name='{html.escape(slug(title))}'></a>"

    rules = {"fence": fence, "code_block": fence, "code_inline": code_inline,
             "image": image}
    if document:
        rules["heading_open"] = heading_open
    saved = {name: renderer.rules.get(name) for name in rules}
    renderer.rules.update(rules)
    try:
        body = md.render(text)
    finally:
        for name, rule in saved.items():
            if rule is None:
                renderer.rules.pop(name, None)  # a token the renderer draws by default
            else:
                renderer.rules[name] = rule
    # Qt's rich text: <strong>/<em> work, but <b> and <i> are what older tests and
    # QTextDocument round-trips use; tables get a border to be readable.
    body = (body.replace("<strong>", "<b>").replace("</strong>", "</b>")
            .replace("<table>", "<table border='1' cellspacing='0' cellpadding='4' "
                     "style='border-collapse:collapse'>"))
    result.html = f"<div>{body}</div>"
    return result


def markdown_html(text: str, dark: bool = False) -> str:
    return render(text, dark, copy_links=False).html


def document_html(text: str, dark: bool = False) -> str:
    """One of the app's documents (README.md, docs/*.md) for Help → Documentation."""
    return render(text, dark, copy_links=False, document=True).html


def fence_for(text: str) -> str:
    """A code fence longer than any run of backticks in `text`: the text cannot close it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def finished_length(text: str) -> int:
    """How many characters at the start of `text` (Markdown still arriving) are finished
    top-level blocks: blocks that more text can no longer change, so their HTML can be
    kept. 0 when there is none.

    A top-level block is finished once another one has started after it (CommonMark
    reads blocks line by line: a block closed by the next one stays closed). The next
    block's first line must be whole: a line such as "#" starts a heading, but "#x" is
    a lazy continuation of the paragraph before it. Not covered: a link reference
    defined after the block that uses it (the final render, whole, resolves it)."""
    starts = [token.map[0] for token in _MD.parse(text)
              if token.level == 0 and token.map is not None and token.nesting >= 0]
    if len(starts) < 2:
        return 0
    last = starts[-1]  # a block after the first: line 1 or later
    breaks = [match.end() for match in LINE_BREAK.finditer(text)]
    if len(breaks) <= last:  # the last block's first line has no line break yet
        return 0
    return breaks[last - 1]
