"""The Server panel, offscreen: the engine's refusals shown as typed, a real server
started from the window on a free port, its Python example run as the user would
copy it (the official `openai` client), the request's row in the live log, exposure
followed at once, and the settings kept for the next start without starting by itself.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
from pathlib import Path

import openai
import pytest
from PySide6.QtCore import QSettings, Qt

from engine.catalog import resolve
from engine.catalog.store import Catalog
from engine.curated.demo import VARIANT_NAME
from gui.controllers.server import ServerController
from gui.main_window import MainWindow
from gui.server_panel import ServerPanel, curl_example, python_example
from tests.gui_helpers import LONG, SHORT


def test_examples_are_exact_commands_for_the_url_model_and_key() -> None:
    curl = curl_example("http://127.0.0.1:4242/v1", "tool-calls", "k3y'with-quote")
    assert curl.splitlines()[0] == "curl http://127.0.0.1:4242/v1/chat/completions \\"
    assert "-H 'Authorization: Bearer k3y'\"'\"'with-quote'" in curl  # shell-quoted
    assert '"model": "tool-calls"' in curl
    assert "Authorization" not in curl_example("http://127.0.0.1:1/v1", "m", None)
    python = python_example("http://127.0.0.1:4242/v1", "tool-calls", None)
    compile(python, "example", "exec")  # valid Python
    assert 'base_url="http://127.0.0.1:4242/v1", api_key="unused"' in python


def test_a_non_loopback_address_needs_a_key_and_says_so(window: MainWindow) -> None:
    panel = window.server
    panel.host.setCurrentIndex(1)  # 0.0.0.0
    panel.key.setText("")
    assert not panel.start_button.isEnabled()
    assert "refusing to listen on 0.0.0.0 without --api-key" in panel.state_label.text()
    panel.key.setText("short")
    assert "at least 8 printable characters" in panel.state_label.text()
    panel.key.setText("a-long-enough-key")
    assert panel.start_button.isEnabled() and panel.state_label.text() == "Stopped."
    assert "use this computer's address" in panel.example_note.text()
    panel.host.setCurrentIndex(0)
    assert panel.config().host == "127.0.0.1"


@pytest.mark.slow
def test_the_panel_serves_the_openai_client_and_logs_each_request(
        window: MainWindow, qtbot) -> None:
    panel, controller = window.server, window.server_controller
    window.tabs.setCurrentWidget(panel)
    panel.port.setValue(0)
    panel.key.setText("panel-test-key")
    panel.select_model(VARIANT_NAME)
    assert "PORT" in panel.python.toPlainText()  # not chosen yet
    with qtbot.waitSignal(controller.stateChanged, timeout=LONG,
                          check_params_cb=lambda state, _d: state in ("running", "failed")):
        panel.start_button.click()
    assert controller.running(), panel.state_label.text()
    port = controller.port
    assert port and panel.state_label.text() == f"Running at http://127.0.0.1:{port}/v1"
    assert not panel.port.isEnabled() and panel.start_button.text() == "Stop server"

    # The example, exactly as the user copies it, run as a script.
    example = panel.python.toPlainText()
    assert f'base_url="http://127.0.0.1:{port}/v1", api_key="panel-test-key"' in example
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(example, "example", "exec"), {})  # noqa: S102
    answer = printed.getvalue().strip()
    assert answer.startswith("{")  # the demo variant answers with a JSON tool call
    if shutil.which("curl"):  # the curl example too, as a shell runs it
        shown = subprocess.run(["bash", "-c", panel.curl.toPlainText()], capture_output=True,
                               text=True, timeout=LONG / 1000, check=True).stdout
        assert json.loads(shown)["choices"][0]["message"]["content"] == answer

    qtbot.waitUntil(lambda: panel.log_model.rowCount() == (2 if shutil.which("curl") else 1),
                    timeout=SHORT)
    _time, status, model, identity, tokens, speed, _message = panel.log_rows()[0]
    prompt, completion = tokens.split(" → ")
    assert (model, status) == (VARIANT_NAME, "200 OK")
    assert identity == resolve.identity(Catalog(), VARIANT_NAME).short
    assert int(prompt) > 0 and int(completion) > 0 and float(speed) > 0

    # Unticking a model hides it from the running server at once.
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="panel-test-key",
                           max_retries=0)
    item = panel.exposed.findItems(VARIANT_NAME, Qt.MatchFlag.MatchExactly)[0]
    item.setCheckState(Qt.CheckState.Unchecked)
    assert VARIANT_NAME not in [m.id for m in client.models.list().data]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model=VARIANT_NAME, max_tokens=2,
                                       messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="wrong-key-123",
                      max_retries=0).models.list()

    with qtbot.waitSignal(controller.stateChanged, timeout=LONG,
                          check_params_cb=lambda state, _d: state == "stopped"):
        panel.start_button.click()
    assert not controller.running() and panel.port.isEnabled()

    # Kept for the next start, which does not start the server by itself.
    store = QSettings(window.window_state.fileName(), QSettings.Format.IniFormat)
    assert store.value("server/api_key") == "panel-test-key"
    assert int(store.value("server/port")) == 0
    assert (Path(store.fileName()).stat().st_mode & 0o077) == 0  # holds the key
    again = ServerPanel(ServerController(Catalog()), Catalog(), window.events, store)
    qtbot.addWidget(again)
    assert again.key.text() == "panel-test-key" and again.port.value() == 0
    assert VARIANT_NAME in again.hidden()
    assert not again.autostart.isChecked()
    again.autostart_if_asked()
    assert not again.controller.running() and again.controller.task is None
