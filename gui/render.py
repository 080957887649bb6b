"""Kept for callers of the first renderer: model output as safe HTML is now
`gui.markdown` (Markdown by markdown-it-py, code highlighted by Pygments)."""

from __future__ import annotations

from gui.markdown import CODE_STYLE, markdown_html

__all__ = ["CODE_STYLE", "markdown_html"]
