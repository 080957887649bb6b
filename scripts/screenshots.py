"""Render the main views of the real app into docs/screenshots/ (README images).

Run under a virtual display:  xvfb-run -a -s "-screen 0 1400x900x24" \
    .venv/bin/python scripts/screenshots.py
It uses a scratch data directory with the embedded model, a generated adapter and
(when present) the shipped demo variant, runs a real chat (edited and sent again, so it
has two versions), a real comparison (its first divergence marked), the local server
with one real request in its log, and a short real training run, and grabs each view.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "screenshots"


def demo_prompt() -> str:
    """A held-out request from the shipped demo task (what the demo variant learned)."""
    import json

    held_out = ROOT / "resources" / "demo" / "heldout.jsonl"
    if held_out.exists():
        line = held_out.read_text(encoding="utf-8").splitlines()[0]
        record = json.loads(line)
        for key in ("prompt", "request", "text"):
            if isinstance(record.get(key), str):
                return record[key]
        messages = record.get("messages")
        if messages:
            return messages[-2]["content"] if len(messages) > 1 else messages[0]["content"]
    return "Book a table for two at Luigi's tomorrow at 7pm"


def train_capture(window, wait) -> None:
    """A short real training run on the demo data, grabbed at its last step (before the
    window moves on to the new variant)."""
    page = window.train
    window.tabs.setCurrentWidget(page)
    page.data.setText(str(ROOT / "resources" / "demo" / "train.jsonl"))
    page.name.setText("tool-calls-quick")
    page.variant.setText("tool-calls-quick-v")
    steps = 16
    page.steps.setValue(steps)
    page.seq_len.setValue(128)
    page.batch.setValue(4)

    def grab_last(event: dict) -> None:
        if event.get("step") == steps:
            window.grab().save(str(OUT / "train.png"))

    page.client.progress.connect(grab_last)
    page.start()
    wait(window.training.trained, 900_000)


def server_capture(window, wait, settle) -> None:
    """The Server panel, running on a free port, with one request from the official
    client in its log."""
    import threading

    from openai import OpenAI

    panel = window.server
    window.tabs.setCurrentWidget(panel)
    panel.port.setValue(0)
    panel.key.setText("")
    panel.start()
    wait(window.server_controller.stateChanged, 120_000)
    if not window.server_controller.running():
        return
    port = window.server_controller.port
    done = threading.Event()

    def ask() -> None:
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
        client.chat.completions.create(
            model=panel.example_model.currentText(),
            messages=[{"role": "user", "content": "Set a timer for 5 minutes."}])
        done.set()

    threading.Thread(target=ask, daemon=True).start()
    wait(window.server_controller.requestLogged, 120_000)
    settle()
    window.grab().save(str(OUT / "server.png"))
    window.server_controller.stop()
    wait(window.server_controller.stateChanged, 60_000)


def main() -> int:
    os.environ["VARIANT_STUDIO_HOME"] = tempfile.mkdtemp(prefix="vs-shots-")
    sys.path.insert(0, str(ROOT))
    from PySide6.QtCore import QEventLoop, QTimer
    from PySide6.QtWidgets import QApplication

    from engine.catalog import imports
    from engine.catalog.store import AdapterSpec, Catalog
    from engine.curated import embedded as defaults
    from engine.curated import setup
    from engine.formats import artifacts
    from gui import theme
    from gui.main_window import MainWindow
    from tests import factories

    app = QApplication(sys.argv)
    catalog = Catalog()
    setup.first_run(catalog, with_demo=True)
    base = defaults.DEFAULT_MODEL_NAME
    info = artifacts.inspect_path(defaults.embedded_model_path())
    scratch = Path(tempfile.mkdtemp())
    adapter = factories.write_gguf_lora(scratch / "sea-poet.gguf", info, seed=1, strength=0.1)
    imports.add_adapter(catalog, "sea-poet", base, adapter,
                        source="generated for the screenshots")
    catalog.add_variant("smol-sea-poet", base, [AdapterSpec("sea-poet", 1.0)])
    variants = sorted(catalog.data()["variants"])
    demo = next((v for v in variants if v != "smol-sea-poet"), "smol-sea-poet")
    OUT.mkdir(parents=True, exist_ok=True)

    def wait(signal, ms: int = 120_000) -> None:
        loop = QEventLoop()
        signal.connect(loop.quit)
        QTimer.singleShot(ms, loop.quit)
        loop.exec()

    def settle(ms: int = 300) -> None:
        loop = QEventLoop()
        QTimer.singleShot(ms, loop.quit)
        loop.exec()

    for mode in ("light", "dark"):
        theme.apply(app, mode)
        window = MainWindow()
        window.resize(1280, 800)  # a laptop screen: the layout holds
        window.show()
        window.select(demo)
        window.tabs.setCurrentWidget(window.detail)
        settle()
        window.grab().save(str(OUT / f"details-{mode}.png"))
        window.open_compare(demo)
        prompt = demo_prompt() if demo != "smol-sea-poet" else \
            "Write a short poem about the sea."
        window.compare.prompt.setPlainText(prompt)
        window.compare.max_tokens.setValue(48)
        window.compare.run()
        wait(window.compare.busyChanged)
        settle()
        window.grab().save(str(OUT / f"compare-{mode}.png"))
        # A chat edited and sent again: the first question has two versions (‹ 2/2 ›).
        window.open_chat(base)
        window.chat.new_chat()
        window.chat.input.setPlainText("Write a Python function that reverses a string.")
        window.chat.send()
        wait(window.chat.answered)
        window.chat.edit_message(0)
        window.chat.input.setPlainText("Write a short Python function that adds two "
                                       "numbers, with a docstring.")
        window.chat.send()
        wait(window.chat.answered)
        window.chat.rename_chat("Small Python functions")
        settle()
        window.grab().save(str(OUT / f"chat-{mode}.png"))
        if mode == "light":
            server_capture(window, wait, settle)
        if mode == "light":
            # The wizard reads and checks files in the background: wait for each step.
            dialog = window.import_adapter(str(adapter))
            if dialog.step_task is not None:
                wait(dialog.stepReady)
            dialog.next()
            dialog.next()
            dialog.bases.setCurrentRow(0)
            if dialog.step_task is not None:
                wait(dialog.stepReady)
            dialog.next()
            settle()
            dialog.grab().save(str(OUT / "wizard-report.png"))
            dialog.reject()
            composer = window.compose(editing="smol-sea-poet")
            settle()
            composer.grab().save(str(OUT / "composer.png"))
            composer.reject()
            train_capture(window, wait)
        window.close()
    print(f"screenshots written to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
