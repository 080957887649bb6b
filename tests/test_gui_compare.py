"""A comparison anyone can read (offscreen, from a comparison's result, no model run):
rendered Markdown on both sides, the first differing token marked on its own and the
tail shaded lighter (also at token 0 and at a heading), how each side ended, the adapter
effect in words with its scale, recent comparisons kept across a switch, and a Markdown
export whose fences the content cannot close, saved through *.md / *.json filters."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt

from engine.catalog.store import AdapterSpec
from engine.curated.demo import VARIANT_NAME
from engine.runtime.results import AdapterUse, CompareResult
from gui.compare import TAIL_COLOR, TOKEN_COLOR, comparison_markdown, fence_for, summary_text
from gui.main_window import MainWindow


def fragments(browser) -> dict[str, str]:  # noqa: ANN001
    """Text by background: 'token', 'tail' or 'plain' (blocks joined with '|')."""
    out = {"token": "", "tail": "", "plain": ""}
    block = browser.document().begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            brush = fragment.charFormat().background()
            color = brush.color() if brush.style() != Qt.BrushStyle.NoBrush else None
            key = ("token" if color == TOKEN_COLOR else "tail" if color == TAIL_COLOR
                   else "plain")
            out[key] += fragment.text()
            it += 1
        block = block.next()
        for key in out:
            out[key] += "|"
    return {k: " ".join(v.replace("|", " ").split()) for k, v in out.items()}


def side(text_tokens: list[str], name: str, finish: str = "eos") -> dict[str, Any]:
    return {"name": name, "kind": "variant", "text": "".join(text_tokens),
            "token_ids": list(range(len(text_tokens))),
            "logprobs": [-0.5] * len(text_tokens), "tokens_per_second": 12.0,
            "finish_reason": finish, "identity": "f" * 64, "identity_short": "f" * 12,
            "backend": "llama", "prompt_tokens": 3, "reused_tokens": 0,
            "prompt_seconds": 0.01,
            "adapters": [{"name": "tool-calls-lora", "scale": 1.0, "sha256": "a" * 64}]}


def show(view, base: list[str], variant: list[str], div: int, effect: float = 1.2,
         finish: str = "eos", prompt: str = "Hi") -> CompareResult:  # noqa: ANN001
    result = CompareResult.from_dict({
        "base": side(base, "base"), "variant": side(variant, VARIANT_NAME, finish),
        "first_divergence": div, "adapter_effect": effect})
    view.params = {"prompt": {"text": prompt, "chat": True},
                   "sampling": {"max_tokens": 8, "temperature": 0.0, "stop": []}}
    view.base_side.reset("Base")
    view.variant_side.reset("Variant")
    view.base_side.tokens = [[i, -0.5, t] for i, t in enumerate(base)]
    view.variant_side.tokens = [[i, -0.5, t] for i, t in enumerate(variant)]
    view.show_result(result)
    return result


def test_the_first_differing_token_is_marked_on_its_own_in_rendered_text(
        window: MainWindow) -> None:
    view = window.compare
    base = ["The", " sea", " is", " **calm**", " today."]
    variant = ["The", " waves", " are", " *high*", ".\n\n", "```", "python\n", "x = 1\n",
               "```"]
    show(view, base, variant, 1, finish="length")
    marked = fragments(view.base_side.browser)
    assert marked == {"plain": "The", "token": "sea", "tail": "is calm today."}
    assert "**" not in view.base_side.browser.toPlainText()  # Markdown, rendered
    cursor = view.base_side.browser.document().find("calm")
    assert cursor.charFormat().fontWeight() > 400  # bold
    marked = fragments(view.variant_side.browser)
    assert marked["token"] == "waves" and marked["tail"].startswith("are high") and \
        "x = 1" in marked["tail"] and "```" not in view.variant_side.browser.toPlainText()
    assert "cut at max tokens (8)" in view.variant_side.title.text()
    assert "ended (end of text)" in view.base_side.title.text()

    # At token 0: the first token alone is marked, not the whole text.
    show(view, ["Hello", " there", "!"], ["Hi", " there", "!"], 0)
    assert fragments(view.base_side.browser) == {"plain": "", "token": "Hello",
                                                 "tail": "there!"}
    # A heading at the divergence stays a heading; its text is what is marked.
    show(view, ["# Title", "\n", "body"], ["# Other", "\n", "text"], 0)
    browser = view.variant_side.browser
    assert browser.document().begin().blockFormat().headingLevel() == 1
    assert fragments(browser)["token"].startswith("O")


def test_the_summary_explains_the_effect_and_the_history_survives_a_switch(
        window: MainWindow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    view = window.compare
    result = show(view, ["A"], ["B"], 0, effect=1.31)
    text = view.summary.text()
    # In words anyone reads: no units, no log-probabilities, no token numbers.
    assert text == ("The answers differ from the very start (highlighted). <b>Adapter "
                    "effect: large</b> — the adapter changes the model's next-word choices "
                    "a lot on this answer.")
    for jargon in ("nats", "log", "token", "|Δ"):
        assert jargon not in text
        assert jargon not in view.plot.x_axis.titleText() + view.plot.y_axis.titleText()
    # The figures for whoever wants them, in the tooltip; the scale it quotes is the
    # one the words follow.
    details = view.summary.toolTip()
    assert "1.3100 nats per token at scale 1" in details and "token 0" in details
    assert "Small under 0.05, moderate from 0.05 to 0.5, large over 0.5" in details
    for effect, word in ((0.01, "small"), (0.049, "small"), (0.05, "moderate"),
                         (0.49, "moderate"), (0.5, "large"), (2.21, "large"),
                         (0.0, "none")):
        assert f"<b>Adapter effect: {word}</b>" in summary_text(
            replace(result, adapter_effect=effect)), effect
    assert "part ways at the highlighted spot" in summary_text(
        replace(result, first_divergence=3))
    assert summary_text(replace(result, first_divergence=None)).startswith(
        "The two answers are the same.")
    zero = replace(result, variant=replace(result.variant, adapters=(
        AdapterUse("x", "b" * 64, 0.0),)), adapter_effect=0.0)
    assert "switched off (scale 0), so it changes nothing" in summary_text(zero)
    assert "not measured" in summary_text(replace(result, adapter_effect=None))

    # A switch of variant (as an import or a new variant makes) keeps it in the history.
    window.catalog.add_variant("other", "smollm2-135m-instruct",
                               [AdapterSpec("tool-calls-lora", 0.5)])
    window.events.changed(["variant"], ["other"])
    view.select_variant("other")
    assert view.result is None and view.recent.count() == 1
    view.recent.activated.emit(0)
    assert view.result is result and view.variant_side.text == "B"
    assert fragments(view.variant_side.browser)["token"] == "B"

    # Exports: fences the content cannot close; words, not Python values.
    tricky = show(view, ["x"], ["Here:\n", "````", "\ncode\n", "````"], 0,
                  prompt="Use ``` fences")
    assert fence_for("a ```` b") == "`````" and fence_for("plain") == "```"
    md = comparison_markdown(view.params, tricky)
    assert "`````text\nHere:\n````\ncode\n````\n`````" in md
    assert "````text\nUse ``` fences\n````" in md
    assert "| stop | none |" in md and "[]" not in md
    asked: list[str] = []

    def save(_parent, _title, name, filters):  # noqa: ANN001, ANN202
        asked.append(filters)
        return str(tmp_path / Path(name).stem), filters

    monkeypatch.setattr("gui.compare.QFileDialog.getSaveFileName", save)
    view._export("md")
    view._export("json")
    assert asked == ["Markdown (*.md);;All files (*)", "JSON (*.json);;All files (*)"]
    assert (tmp_path / "comparison.md").read_text(encoding="utf-8") == md
    assert '"adapter_effect"' in (tmp_path / "comparison.json").read_text(encoding="utf-8")


def test_compare_says_what_to_do_next_when_empty(window: MainWindow) -> None:
    view = window.compare
    view.select_variant(VARIANT_NAME)
    view._choice_changed()
    assert "Write a prompt and run it (Ctrl+Enter)" in view.summary.text()
    view.set_variants([])
    assert "No variant to compare yet" in view.summary.text()
