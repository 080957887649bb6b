"""Speed in the window (issue 14, item 6), offscreen on the real engine: the status bar
names the resident model from the first token on (not once the answer has ended); the
first token of each side is shown at once, not held for the delivery timer; Chat and
Compare show their speeds, Compare's two sides measured the same way; and `status`
sees the window's engine without starting one. The figures themselves are measured by
benchmarks/bench_gui.py (docs/performance.md)."""

from __future__ import annotations

import json
import re

import pytest

from engine import cli
from engine.curated.demo import VARIANT_NAME
from engine.curated.embedded import DEFAULT_MODEL_NAME as BASE
from tests.gui_helpers import LONG


@pytest.mark.slow
def test_the_status_bar_names_the_resident_model_from_the_first_token_on(
        window, qtbot, capsys: pytest.CaptureFixture) -> None:
    chat = window.chat
    window.open_chat(BASE)
    chat.settings_toggle.click()
    chat.chat_temperature.setValue(0.0)
    chat.chat_max_tokens.setValue(48)  # long enough for a describe between two tokens
    described: list[tuple[str, bool]] = []  # (status bar, still generating)
    window.client.described.connect(  # after the window's own slot: the label is set
        lambda _info: described.append((window.resident_label.text(), chat.reply is not None)))
    batches: list[int] = []
    chat.input.setPlainText("Count from 1 to 50, separated by commas.")
    with qtbot.waitSignal(chat.answered, timeout=LONG):
        chat.send()
        chat.reply.tokens.connect(lambda _side, _text, toks: batches.append(len(toks)))
    assert batches[0] == 1  # the first token shown alone, at once
    # While the answer was still streaming, the bar already named the resident base.
    assert any(BASE in text and "1 session" in text and generating
               for text, generating in described), described
    status = chat.status.text()
    assert re.search(r"\d+\.\d tok/s · \d+ tokens · first token \d+\.\d\d s", status), status
    assert chat.first_token_seconds is not None and chat.first_token_seconds > 0

    # `status` sees this window and its engine (read from <data>/run/), starting none.
    assert cli.main(["status", "--json"]) == 0
    engine = json.loads(capsys.readouterr().out)["engine"]
    (front,) = [f for f in engine["front_ends"] if f["kind"] == "app"]
    assert engine["state"] == "running" and front["engine"]["pid"] == window.client.pid()


@pytest.mark.slow
def test_compare_shows_both_sides_speeds_measured_the_same_way(window, qtbot) -> None:
    view = window.compare
    window.open_compare(VARIANT_NAME)
    view.prompt.setPlainText("What is the weather in Paris?")
    view.max_tokens.setValue(12)
    first: dict[str, int] = {}
    with qtbot.waitSignal(view.busyChanged, timeout=LONG,
                          check_params_cb=lambda busy: not busy):
        view.run_button.click()
        view.reply.tokens.connect(lambda side, _t, toks: first.setdefault(side, len(toks)))
    result = view.result
    assert result is not None and first == {"base": 1, "variant": 1}
    assert set(view.first_token_seconds) == {"base", "variant"}
    for side, name in ((view.base_side, "base"), (view.variant_side, "variant")):
        title = side.title.text()
        # The engine's decode rate of that side, and the view's clock to its first token.
        assert f"{result[name]['tokens_per_second']:.1f} tok/s" in title
        assert f"first token {view.first_token_seconds[name]:.2f} s" in title
