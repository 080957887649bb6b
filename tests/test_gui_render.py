"""Messages as HTML (`gui.render`): a streaming answer renders each finished Markdown
block once (counted, not timed), which blocks count as finished, a JSON answer shown as
a formatted code block, and the streaming region of a document (`StreamRegion`) that
keeps the speaker's label a label and ends up with the blocks the finished answer has."""

from __future__ import annotations

import json

from PySide6.QtGui import QTextDocument

from engine.state.conversations import ChatMessage
from gui.markdown import finished_length
from gui.render import (
    EMPTY_BODY,
    StreamFrame,
    StreamingMarkdown,
    answer_markdown,
    message_html,
    streaming_head_html,
    streaming_markdown,
)
from gui.widgets.stream_region import StreamRegion

BLOCKS = ["## Step {n}", "Paragraph {n} with *emphasis*\nand a second line.",
          "1. first of {n}\n2. second of {n}", "```python\nx = {n}\n\ny = x + 1\n```",
          "> quoted {n}", "- a {n}\n- b {n}\n  - nested {n}"]


def long_answer(count: int) -> str:
    return "\n\n".join(BLOCKS[i % len(BLOCKS)].format(n=i) for i in range(count)) + "\n"


def test_each_finished_block_is_rendered_once_and_a_frame_renders_only_the_tail() -> None:
    text = long_answer(120)
    rendered: list[str] = []

    def render(piece: str) -> str:
        rendered.append(piece)
        return f"<p>{len(piece)}</p>"

    stream = StreamingMarkdown(render)
    longest_block = max(len(b.format(n=999)) for b in BLOCKS) + 2  # and its blank line
    step, fed, frames = 7, 0, 0
    finished: list[str] = []  # the finished pieces, in order
    while fed < len(text):
        before = len(rendered)
        done = stream.finished_chars
        frame = stream.feed(text[fed:fed + step])
        fed = min(fed + step, len(text))
        frames += 1
        calls = rendered[before:]
        # A frame renders what finished in it (once) and the unfinished rest: never
        # anything finished before it.
        if frame.finished:
            assert len(calls) == 2 and calls[0] == text[done:stream.finished_chars]
            finished.append(calls[0])
        else:
            assert len(calls) == 1
        assert calls[-1] == text[stream.finished_chars:fed]
        # The unfinished block, and the one before it until the next one's first line
        # is whole: bounded by the blocks, not by the answer.
        assert len(calls[-1]) <= 2 * longest_block + step
    assert "".join(finished) + rendered[-1] == text
    assert len(finished) >= 60  # blocks finished as they came (some frames end two)
    # What all frames rendered grows with the frames times one block, not with the
    # frames times the answer (re-rendering it whole: ~frames * len(text) / 2).
    total = sum(len(piece) for piece in rendered)
    assert total <= len(text) + frames * (2 * longest_block + step)
    assert frames * len(text) / 2 > 20 * total


def test_a_block_is_finished_only_once_the_next_one_has_a_whole_first_line() -> None:
    assert finished_length("Para") == 0
    assert finished_length("Para\n\nNext") == 0  # "Next" may still become anything
    assert finished_length("Para\n\nNext\n") == len("Para\n\n")
    assert finished_length("Para\n#") == 0  # "#x" would continue the paragraph
    assert finished_length("Para\n# H\n") == len("Para\n")
    assert finished_length("1. a\n2. b\n\n   more of b\n") == 0  # one list, still open
    assert finished_length("1. a\n\nText\n") == len("1. a\n\n")
    assert finished_length("```\ncode\n\nmore\n") == 0  # an open fence holds its blank lines
    assert finished_length("```\ncode\n```\nText\n") == len("```\ncode\n```\n")
    assert finished_length("Title\n") == 0 and finished_length("Title\n===\n") == 0
    assert finished_length("Para\r\n\r\nNext\r\n") == len("Para\r\n\r\n")


def test_a_json_answer_is_a_formatted_code_block() -> None:
    call = '{"tool": "get_weather", "args": {"city": "Paris", "day": "today"}}'
    pretty = json.dumps(json.loads(call), indent=2)
    assert answer_markdown(call) == f"```json\n{pretty}\n```"
    assert answer_markdown("  [1, 2]\n") == "```json\n[\n  1,\n  2\n]\n```"
    for text in ("Just words.", '{"unterminated": ', "[a link](http://x)", "42", '"str"'):
        assert answer_markdown(text) == text
    code: list[str] = []
    page = message_html(ChatMessage("assistant", call, model="m"), 1, code=code)
    assert code == [pretty] and "<pre" in page and "<p>{" not in page
    assert "json · <a href='copy:0'>Copy</a>" in page
    # Backticks in a value cannot close the fence.
    assert answer_markdown('{"a": "```"}').startswith("````json\n")
    # A question written as JSON stays the user's text.
    assert "<pre" not in message_html(ChatMessage("user", call))


def blocks(document: QTextDocument) -> list[tuple[str, str, int]]:
    """Each non-empty block: its text, its list marker, its heading level."""
    out, block = [], document.begin()
    while block.isValid():
        if block.text():
            marker = block.textList().itemText(block) if block.textList() else ""
            out.append((block.text(), marker, block.blockFormat().headingLevel()))
        block = block.next()
    return out


def test_the_label_stays_a_label_while_a_numbered_list_streams(qapp) -> None:  # noqa: ANN001
    text = "1. First\n2. Second\n\n# Done\n\nA table:\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\nEnd."
    whole = QTextDocument()
    whole.setHtml(message_html(ChatMessage("user", "List two.")) +
                  message_html(ChatMessage("assistant", text, model="model-name")))
    for step in (1, 2, 5, len(text)):
        document = QTextDocument()
        document.setHtml(message_html(ChatMessage("user", "List two.")))
        region = StreamRegion(document, streaming_head_html("model-name"))
        region.show(StreamFrame("", EMPTY_BODY))
        stream = streaming_markdown()
        for start in range(0, len(text), step):
            region.show(stream.feed(text[start:start + step]))
            label = document.findBlock(document.find("model-name").position())
            assert label.text() == "model-name" and label.textList() is None, step
        # Each finished block appears once; the blocks are those of the finished answer.
        assert blocks(document) == blocks(whole), step
    assert ("First", "1.", 0) in blocks(whole) and ("Done", "", 1) in blocks(whole)
