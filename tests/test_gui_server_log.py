"""The Server panel's request log with a real server started from the window: a
client's mistakes appear with their status and message (404 for an unknown model, 400
for a malformed body, 401 for a wrong key), the log's message column takes the panel's
width, and the first request after Start says "loading <model>…" while the server's
engine loads the model, in its row and above the log, until its answer replaces it."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import openai
import pytest
from PySide6.QtCore import QSize
from PySide6.QtWidgets import QApplication

from engine.curated.demo import VARIANT_NAME
from engine.curated.embedded import DEFAULT_MODEL_NAME
from gui.main_window import MainWindow
from gui.server_panel import COLUMNS, MESSAGE
from tests.gui_helpers import LONG, SHORT

KEY = "log-test-key-123"


def start(window: MainWindow, qtbot) -> str:  # noqa: ANN001
    panel, controller = window.server, window.server_controller
    window.tabs.setCurrentWidget(panel)
    panel.port.setValue(0)
    panel.key.setText(KEY)
    with qtbot.waitSignal(controller.stateChanged, timeout=LONG,
                          check_params_cb=lambda state, _d: state in ("running", "failed")):
        panel.start_button.click()
    assert controller.running(), panel.state_label.text()
    return f"http://127.0.0.1:{controller.port}/v1"


def stop(window: MainWindow, qtbot) -> None:  # noqa: ANN001
    with qtbot.waitSignal(window.server_controller.stateChanged, timeout=LONG,
                          check_params_cb=lambda state, _d: state == "stopped"):
        window.server.start_button.click()


def test_failed_requests_appear_with_status_and_message(window: MainWindow, qtbot) -> None:
    size = QSize(1024, 700)
    window.resize(size)
    qtbot.waitUntil(lambda: window.size() == size, timeout=SHORT)
    panel = window.server
    url = start(window, qtbot)
    client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError) as unknown:
        client.chat.completions.create(model="no-such-model", max_tokens=2,
                                       messages=[{"role": "user", "content": "hi"}])
    body = json.dumps({"model": VARIANT_NAME, "messages": "not a list"}).encode()
    request = urllib.request.Request(f"{url}/chat/completions", data=body, headers={
        "Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as malformed:
        urllib.request.urlopen(request, timeout=30)  # noqa: S310 (our loopback server)
    assert malformed.value.code == 400
    malformed_message = json.loads(malformed.value.read())["error"]["message"]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url, api_key="wrong-key-456", max_retries=0).models.list()

    qtbot.waitUntil(lambda: panel.log_model.rowCount() == 3, timeout=SHORT)
    rows = panel.log_rows()
    assert [row[1] for row in rows] == ["404 Not Found", "400 Bad Request",
                                        "401 Unauthorized"]
    assert [row[2] for row in rows] == ["no-such-model", VARIANT_NAME, "—"]
    assert rows[0][MESSAGE] == unknown.value.body["message"]  # type: ignore[index]
    assert rows[1][MESSAGE] == malformed_message
    assert "API key" in rows[2][MESSAGE]
    # The message column takes what the other columns leave of the table's width.
    QApplication.processEvents()
    view = panel.log_view
    header = view.horizontalHeader()
    used = sum(header.sectionSize(c) for c in range(len(COLUMNS)))
    assert used >= view.viewport().width() - 2, (used, view.viewport().width())
    assert header.sectionSize(MESSAGE) >= 200, header.sectionSize(MESSAGE)
    assert window.minimumSizeHint().width() <= size.width()
    stop(window, qtbot)


@pytest.mark.slow
def test_the_first_request_after_start_says_the_model_is_loading(
        window: MainWindow, qtbot) -> None:
    panel = window.server
    url = start(window, qtbot)
    # What the panel shows the moment the request reached the engine (connected after
    # the panel, so it runs once the panel has drawn it).
    seen: list[tuple[list[list[str]], bool, str]] = []
    window.server_controller.requestStarted.connect(lambda _pending: seen.append(
        (panel.log_rows(), panel.activity.isVisibleTo(panel), panel.activity.text())))
    client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
    answers: list[str] = []
    asked = threading.Thread(target=lambda: answers.append(
        client.chat.completions.create(
            model=VARIANT_NAME, max_tokens=4, temperature=0,
            messages=[{"role": "user", "content": "hi"}]).choices[0].message.content or ""))
    asked.start()
    qtbot.waitUntil(lambda: bool(seen), timeout=LONG)
    rows, shown, activity = seen[0]
    assert len(rows) == 1 and rows[0][1] == "…" and rows[0][2] == VARIANT_NAME
    assert rows[0][MESSAGE] == f"loading {DEFAULT_MODEL_NAME}…"
    assert shown and activity.startswith(f"Loading {DEFAULT_MODEL_NAME}…")
    qtbot.waitUntil(lambda: panel.log_rows()[0][1] == "200 OK", timeout=LONG)
    asked.join(60)
    assert answers and panel.log_model.rowCount() == 1  # replaced in place
    assert not panel.activity.isVisibleTo(panel)
    # The next request finds the model loaded: no loading row.
    client.chat.completions.create(model=VARIANT_NAME, max_tokens=2, temperature=0,
                                   messages=[{"role": "user", "content": "hi"}])
    qtbot.waitUntil(lambda: panel.log_model.rowCount() == 2
                    and panel.log_rows()[1][1] == "200 OK", timeout=LONG)
    assert len(seen) == 2 and seen[1][0][1][MESSAGE] == "answering…" and not seen[1][1]
    stop(window, qtbot)
