"""Speed in the window, offscreen (writes benchmarks/out/gui.json).

The window's Chat and Compare against the engine client driven directly with the same
request, side by side in one run, rounds alternating, medians:

- Chat: the `Generate` the chat view sends (captured as it is submitted) is sent again
  through the window's own `EngineClient` (the same engine process, the Qt layer and
  the rendering left out). Time to first token: from the click (send) to the first token
  rendered in the transcript, against submit to the first token event. Speed: the figure
  the chat shows (the engine's decode rate, tokens / decode seconds), and the rate at
  which tokens reached the screen (first to last delivery), against the same two figures
  of the direct request. Aim: tok/s ratio >= 0.95, TTFT within 50 ms.
- Compare: the same for the `Compare` the view sends, per side; the two sides' figures
  are measured the same way (the engine's per-side decode time), and their ratio says
  whether the sides agree.
- The status bar: how long after the first token of the first answer it names the
  resident model (it used to say "resident: none" until the answer ended).
- The front end's own CPU time per answer (this process: the window's rendering and the
  client's reader thread) in both modes: the machine's load moves the speeds from round
  to round, this figure much less.

Usage: QT_QPA_PLATFORM=offscreen .venv/bin/python -m benchmarks.bench_gui [--rounds N]
       [--tokens N] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from benchmarks.common import median, scratch_home, write

PROMPT = ("Write a long story about a lighthouse keeper who finds a message in a bottle. "
          "Describe the sea, the weather and the town in detail.")
VARIANT = "bench-variant"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1,
                        help="engine threads (1: stable on a shared 2-core machine)")
    args = parser.parse_args()
    scratch_home()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ["VARIANT_STUDIO_THREADS"] = str(args.threads)

    from PySide6.QtCore import QEventLoop, QTimer
    from PySide6.QtWidgets import QApplication

    from engine.catalog.store import AdapterSpec, Catalog
    from engine.curated import demo, embedded, setup
    from engine.runtime import messages as m
    from gui.main_window import MainWindow

    app = QApplication.instance() or QApplication([])
    catalog = Catalog()
    setup.first_run(catalog, with_demo=True)
    base = embedded.DEFAULT_MODEL_NAME
    # Greedy, no repeat penalty, a long budget: every round decodes the same tokens.
    profile = {"temperature": 0.0, "repeat_penalty": 1.0, "max_tokens": args.tokens}
    catalog.add_variant(VARIANT, base, [AdapterSpec(demo.ADAPTER_NAME, 1.0)], profile)

    win = MainWindow()
    win.resize(1280, 800)
    win.show()
    sent: list[m.Request] = []
    submit = win.client.submit

    def recording(request: m.Request) -> Any:
        sent.append(request)
        return submit(request)

    win.client.submit = recording  # type: ignore[method-assign]

    def wait(signal: Any, check: Any = None, timeout_s: float = 600.0) -> None:
        """Turn the event loop until `signal` fires (with `check(*args)` true)."""
        loop = QEventLoop()
        got: list[bool] = []

        def hit(*values: Any) -> None:
            if check is None or check(*values):
                got.append(True)
                loop.quit()

        signal.connect(hit)
        QTimer.singleShot(int(timeout_s * 1000), loop.quit)
        loop.exec()
        signal.disconnect(hit)
        if not got:
            raise RuntimeError(f"timed out waiting for {signal}")

    # ------------------------------------------------------------------ chat

    resident_after: list[float] = []

    def chat_round() -> dict[str, float]:
        chat = win.chat
        win.open_chat(VARIANT)
        chat.new_chat()
        chat.input.setPlainText(PROMPT)
        marks: dict[str, Any] = {"first": None, "last": None, "tokens": 0}

        def on_tokens(_side: str, _text: str, toks: list) -> None:
            now = time.perf_counter()
            if marks["first"] is None:
                marks["first"] = now
                marks["first_batch"] = len(toks)
            marks["last"] = now
            marks["tokens"] += len(toks)

        cpu = time.process_time()
        start = time.perf_counter()
        chat.send()
        reply = chat.reply
        assert reply is not None
        # Connected after the chat's own slot: it runs once the text is in the document.
        reply.tokens.connect(on_tokens)
        if not resident_after:
            def watch(_info: dict) -> None:
                if marks["first"] is not None and not resident_after and \
                        base in win.resident_label.text():
                    resident_after.append(time.perf_counter() - marks["first"])

            win.client.described.connect(watch)
        wait(chat.answered)
        result = reply.result
        assert result is not None and f"{result['tokens_per_second']:.1f} tok/s" in \
            chat.status.text(), chat.status.text()
        return {"ttft_s": marks["first"] - start,
                "front_end_cpu_s": time.process_time() - cpu,
                "shown_tokens_per_second": result["tokens_per_second"],
                "screen_tokens_per_second": (marks["tokens"] - marks["first_batch"])
                / (marks["last"] - marks["first"]),
                "tokens": len(result["token_ids"])}

    def direct(request: m.Request) -> dict[str, dict[str, float]]:
        client = win.client._client  # the same engine process, no Qt in between
        times: dict[str, list[float]] = {}
        cpu = time.process_time()
        start = time.perf_counter()
        handle = client.submit(request, lambda e: times.setdefault(e.side, []).append(
            time.perf_counter()) if isinstance(e, m.Token) else None)
        result = handle.wait(600)
        cpu = time.process_time() - cpu
        sides = {"base": result["base"], "variant": result["variant"]} \
            if isinstance(request, m.Compare) else {"main": result}
        out = {}
        for side, side_result in sides.items():
            stamps = times[side]
            out[side] = {"ttft_s": stamps[0] - start, "front_end_cpu_s": cpu,
                         "shown_tokens_per_second": side_result["tokens_per_second"],
                         "screen_tokens_per_second": (len(stamps) - 1)
                         / (stamps[-1] - stamps[0]),
                         "tokens": len(side_result["token_ids"])}
        return out

    # ------------------------------------------------------------------ compare

    def compare_round() -> dict[str, dict[str, float]]:
        view = win.compare
        win.open_compare(VARIANT)
        view.prompt.setPlainText(PROMPT)
        view.max_tokens.setValue(args.tokens)
        view.temperature.setValue(0.0)
        marks: dict[str, dict[str, Any]] = {}

        def on_tokens(side: str, _text: str, toks: list) -> None:
            now = time.perf_counter()
            mark = marks.setdefault(side, {"first": now, "first_batch": len(toks),
                                           "tokens": 0})
            mark["last"] = now
            mark["tokens"] += len(toks)

        cpu = time.process_time()
        start = time.perf_counter()
        view.run_button.click()
        reply = view.reply
        assert reply is not None
        reply.tokens.connect(on_tokens)
        wait(view.busyChanged, check=lambda busy: not busy)
        result = view.result
        assert result is not None
        cpu = time.process_time() - cpu
        out = {}
        for side in ("base", "variant"):
            mark = marks[side]
            shown = result[side]["tokens_per_second"]
            title = (view.base_side if side == "base" else view.variant_side).title.text()
            assert f"{shown:.1f} tok/s" in title, title
            out[side] = {"ttft_s": mark["first"] - start, "front_end_cpu_s": cpu,
                         "shown_tokens_per_second": shown,
                         "screen_tokens_per_second": (mark["tokens"] - mark["first_batch"])
                         / (mark["last"] - mark["first"]),
                         "tokens": len(result[side]["token_ids"])}
        return out

    # ------------------------------------------------------------------ rounds

    def last(kind: type) -> Any:
        return next(r for r in reversed(sent) if isinstance(r, kind))

    wait(win.client.described)  # the engine is up
    chat_round()  # warm: the model loaded, the session and its prefix cache made
    chat_request = last(m.Generate)  # the same every round: a new chat, the same prompt
    direct(chat_request)
    compare_round()
    compare_request = last(m.Compare)
    direct(compare_request)
    rows: dict[str, list[dict[str, float]]] = {
        "chat": [], "chat_direct": [], "compare_base": [], "compare_variant": [],
        "compare_direct_base": [], "compare_direct_variant": []}
    for index in range(args.rounds):
        # Alternate which goes first, so a trend in the machine's load favours neither.
        order = ("window", "direct") if index % 2 == 0 else ("direct", "window")
        for who in order:
            if who == "window":
                rows["chat"].append(chat_round())
                assert last(m.Generate) == chat_request  # the very same request
            else:
                rows["chat_direct"].append(direct(chat_request)["main"])
        for who in order:
            both = compare_round() if who == "window" else direct(compare_request)
            prefix = "compare_" if who == "window" else "compare_direct_"
            rows[prefix + "base"].append(both["base"])
            rows[prefix + "variant"].append(both["variant"])
            assert last(m.Compare) == compare_request

    def med(name: str, key: str) -> float:
        return median([r[key] for r in rows[name]])

    def versus(window: str, engine: str) -> dict[str, Any]:
        return {
            "window": {k: med(window, k) for k in rows[window][0]},
            "engine_client": {k: med(engine, k) for k in rows[engine][0]},
            "shown_tokens_per_second_ratio": med(window, "shown_tokens_per_second")
            / med(engine, "shown_tokens_per_second"),
            "screen_tokens_per_second_ratio": med(window, "screen_tokens_per_second")
            / med(engine, "screen_tokens_per_second"),
            "ttft_difference_ms": 1000 * (med(window, "ttft_s") - med(engine, "ttft_s")),
        }

    data = {
        "settings": {"rounds": args.rounds, "tokens": args.tokens, "threads": args.threads,
                     "prompt": PROMPT, "variant": f"{base} + {demo.ADAPTER_NAME}@1.0",
                     "load_average": os.getloadavg()},
        "chat": versus("chat", "chat_direct"),
        "compare": {"base": versus("compare_base", "compare_direct_base"),
                    "variant": versus("compare_variant", "compare_direct_variant"),
                    "variant_over_base_shown_tokens_per_second":
                        med("compare_variant", "shown_tokens_per_second")
                        / med("compare_base", "shown_tokens_per_second")},
        "status_bar_resident_after_first_token_ms":
            1000 * resident_after[0] if resident_after else None,
        "targets": {"tokens_per_second_ratio": ">= 0.95", "ttft_difference_ms": "<= 50"},
    }
    win.close()
    app.processEvents()
    write("gui", data)


if __name__ == "__main__":
    main()
