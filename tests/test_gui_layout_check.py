"""The layout check (issue 28): the window's main flows at 1024×700, 1280×800 and
1600×1000, in the light and the dark theme, each one checked and photographed.

The flows: the library with a variant's details, the chat after a long streamed answer
(headings, a list, code, a long paragraph), a finished comparison with long side
headers, the Server panel with served, refused and running requests, the Train page
after a run (the loss plot, the memory line, a flagged served check) and the import
wizard's report on the shipped adapter, and the composer. The engine is the point of
none of them, so the chat's answer comes through a fake engine, the comparison's result
is built and the server's rows are its own `LogEntry`s (the real engine's flows have
tests of their own); the catalog, the wizard's inspection and every view are the real
ones.

A state fails when
- the window asks for more than it was given (`minimumSizeHint`), or grew by itself;
- a splitter's pane is collapsed, or squeezed below its own minimum;
- a label a user must read is cut where space exists: a library name elided though it
  fits its row (at 1280 px and wider every name is whole), an elided line whose text
  would fit, a wrapped label given fewer lines than its text needs, a one-line label
  narrower than its text.

Every state's screenshot is saved (`window.grab()`), under `$LAYOUT_SHOTS` or
.tmp/layout-shots/ (the path is printed: `pytest -s` shows it). With
`VARIANT_STUDIO_README_SHOTS=1` the README's screenshots (docs/screenshots/) are
written from the same states at 1280×800, checked the same way, with no welcome banner
and a real chat, comparison and server (the window's engine, a client over HTTP):
`scripts/screenshots.py` runs that.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import QApplication, QLabel, QScrollArea, QSplitter, QWidget

from engine.curated import demo
from engine.curated.demo import VARIANT_NAME
from engine.curated.embedded import DEFAULT_MODEL_NAME
from engine.serve.app import LogEntry, Pending
from gui import theme
from gui.library import display_name, name_font, name_room
from gui.main_window import MainWindow
from gui.widgets.elided_label import ElidedLabel
from gui.wizard import Step
from tests.gui_helpers import LONG, SHORT, FakeEngine, generation_result
from tests.test_gui_layout import finish_a_comparison

ROOT = Path(__file__).resolve().parents[1]
SIZES = [(1024, 700), (1280, 800), (1600, 1000)]
THEMES = ["light", "dark"]
README_SIZE = (1280, 800)
# state name -> the README's file for it, per theme (None: that theme is not shown).
README_SHOTS = {"details": {"light": "details-light.png", "dark": "details-dark.png"},
                "chat": {"light": "chat-light.png", "dark": "chat-dark.png"},
                "compare": {"light": "compare-light.png", "dark": "compare-dark.png"},
                "server": {"light": "server.png"},
                "train": {"light": "train.png"},
                "wizard": {"light": "wizard-report.png"},
                "composer": {"light": "composer.png"}}
ANSWER = (
    "## Packing for a week in Zurich\n\n"
    "Zurich in spring changes its mind often, so pack for **rain and sun** alike. "
    + "Layers work better than one heavy coat, and a small umbrella fits any bag. " * 6
    + "\n\n1. A waterproof jacket\n2. Two warm sweaters\n3. Comfortable walking shoes\n"
    "4. A travel adapter (type J sockets)\n\n"
    "To check the forecast from a script:\n\n"
    "```python\nimport json\n\nforecast = {\"city\": \"Zurich\", \"days\": 7}\n"
    "print(json.dumps(forecast, indent=2))\n```\n\n"
    + "The lake is cold until June, but the walks along it are worth every step. " * 8)


@pytest.fixture(scope="module")
def shots() -> Path:
    folder = Path(os.environ.get("LAYOUT_SHOTS") or ROOT / ".tmp" / "layout-shots")
    folder.mkdir(parents=True, exist_ok=True)
    print(f"\nlayout screenshots: {folder}")
    return folder


@pytest.fixture
def themed() -> Iterator[QApplication]:
    app = QApplication.instance()
    yield app
    theme.apply(app, "system")


def settle() -> None:
    """Posted events (palette changes, layout requests, queued signals) delivered."""
    for _ in range(3):
        QApplication.sendPostedEvents()
        QApplication.processEvents()


# --------------------------------------------------------------------------- checks


def along(splitter: QSplitter, size: QSize) -> int:
    return size.width() if splitter.orientation() == Qt.Orientation.Horizontal \
        else size.height()


def splitter_problems(root: QWidget) -> list[str]:
    problems = []
    for splitter in root.findChildren(QSplitter):
        if not splitter.isVisible():
            continue
        for index, size in enumerate(splitter.sizes()):
            pane = splitter.widget(index)
            if not pane.isVisibleTo(splitter):
                continue
            # As Qt's layouts read a minimum: the one set, else the widget's hint.
            least = along(splitter, pane.minimumSize()) or \
                along(splitter, pane.minimumSizeHint())
            if size <= 0 or size < least:
                problems.append(f"splitter {splitter.objectName() or splitter.parent()!r}: "
                                f"pane {index} ({type(pane).__name__}) is {size} px, its "
                                f"minimum {least} px")
    return problems


def shown(widget: QWidget) -> bool:
    """Visible and not clipped away entirely (a scroll area may hide it)."""
    return widget.isVisible() and not widget.visibleRegion().isEmpty()


def in_scroll_area(widget: QWidget) -> bool:
    """Inside a scroll area's content: it may be taller or wider than what is in view,
    and the user scrolls to it."""
    parent = widget.parentWidget()
    while parent is not None:
        if isinstance(parent, QScrollArea):
            return True
        parent = parent.parentWidget()
    return False


def label_problems(root: QWidget) -> list[str]:
    problems = []
    for label in root.findChildren(QLabel):
        if not shown(label) or not label.text().strip():
            continue
        where = f"{type(label.parentWidget()).__name__} label {label.text()[:60]!r}"
        if isinstance(label, ElidedLabel):
            room = label.contentsRect().width()
            if label.is_elided() and label.fontMetrics().horizontalAdvance(
                    label.text()) <= room:
                problems.append(f"{where} is elided in {room} px, where it fits")
            continue
        if label.pixmap() is not None and not label.pixmap().isNull():
            continue
        if in_scroll_area(label):
            continue
        if label.wordWrap():
            need = label.heightForWidth(label.width())
            if need > label.height() + 1:
                problems.append(f"{where} needs {need} px of height, has {label.height()}")
        elif label.textFormat() != Qt.TextFormat.RichText and "<" not in label.text():
            need = label.fontMetrics().horizontalAdvance(label.text()) \
                + label.margin() * 2 + 2 * label.indent() if label.indent() > 0 else \
                label.fontMetrics().horizontalAdvance(label.text())
            if need > label.contentsRect().width() + 1:
                problems.append(f"{where} needs {need} px, has "
                                f"{label.contentsRect().width()}")
    return problems


def library_problems(window: MainWindow, width: int) -> list[str]:
    """Names elided though they fit their row; at 1280 px and wider, any name elided."""
    tree = window.library.tree
    model = tree.model()
    bold = QFontMetrics(name_font(tree.font()))
    problems = []
    for section in range(model.rowCount()):
        parent = model.index(section, 0)
        for row in range(model.rowCount(parent)):
            entry = model.index(row, 0, parent)
            name = str(entry.data())
            room = name_room(tree.visualRect(entry).width())
            fits = bold.horizontalAdvance(name) <= room
            if fits and display_name(bold, name, room) != name:
                problems.append(f"library name {name!r} elided in {room} px, where it fits")
            if width >= 1280 and not fits:
                problems.append(f"library name {name!r} cut at {width} px ({room} px)")
    return problems


def fit_problems(widget: QWidget, size: QSize, exact: bool) -> list[str]:
    """What does not fit `size` in `widget` (settled first): its minimum size, its own
    size (`exact`: it must be `size`, else at most that), its splitters and labels."""
    settle()
    problems = []
    hint = widget.minimumSizeHint()
    if hint.width() > size.width() or hint.height() > size.height():
        problems.append(f"asks for {hint.width()}x{hint.height()}")
    if widget.size() != size if exact else (
            widget.width() > size.width() or widget.height() > size.height()):
        problems.append(f"is {widget.width()}x{widget.height()}")
    return problems + splitter_problems(widget) + label_problems(widget)


def located(size: QSize, state: str, problems: list[str]) -> list[str]:
    return [f"{size.width()}x{size.height()} {state}: {problem}" for problem in problems]


def check(window: MainWindow, size: QSize, state: str) -> list[str]:
    problems = fit_problems(window, size, exact=True)
    return located(size, state, problems + library_problems(window, size.width()))


def dialog_problems(dialog: QWidget, size: QSize, state: str) -> list[str]:
    return located(size, state, fit_problems(dialog, size, exact=False))


# --------------------------------------------------------------------------- flows


def details(window: MainWindow) -> None:
    window.select(VARIANT_NAME)
    window.tabs.setCurrentWidget(window.detail)


def chat(window: MainWindow) -> None:
    # The base model: a long Markdown answer is what it gives (the demo variant answers
    # with one JSON tool call).
    window.open_chat(DEFAULT_MODEL_NAME)
    view = window.chat
    engine = FakeEngine()
    view.controller.engine = engine
    view.input.setPlainText("What should I pack for a week in Zurich in April? Give me a "
                            "list, and a script to check the forecast.")
    view.send()
    pieces = [ANSWER[i:i + 40] for i in range(0, len(ANSWER), 40)]
    for start in range(0, len(pieces), 8):  # streamed: the view draws block by block
        chunk = pieces[start:start + 8]
        engine.last.sink.tokens("main", "".join(chunk),
                                [[start + i, -0.1, p, []] for i, p in enumerate(chunk)])
        settle()
    engine.last.sink.finished(generation_result(ANSWER, DEFAULT_MODEL_NAME, tokens=pieces,
                                                tokens_per_second=4.7))


def real_chat(window: MainWindow, qtbot) -> None:  # noqa: ANN001
    """For the README: a real answer of the shipped model, through the window's engine."""
    window.open_chat(DEFAULT_MODEL_NAME)
    view = window.chat
    view.new_chat()
    view.input.setPlainText("Write a short Python function that reverses a string, with a "
                            "docstring and an example.")
    with qtbot.waitSignal(view.answered, timeout=LONG):
        view.send()


def compare(window: MainWindow) -> None:
    finish_a_comparison(window)


def real_compare(window: MainWindow, qtbot) -> None:  # noqa: ANN001
    """For the README: the demo variant against its base on a request of its task (a
    real comparison, through the window's engine)."""
    window.open_compare(VARIANT_NAME)
    view = window.compare
    view.prompt.setPlainText("Do I need an umbrella in Zurich tomorrow?")
    view.max_tokens.setValue(64)
    with qtbot.waitSignal(view.busyChanged, timeout=LONG,
                          check_params_cb=lambda busy: not busy):
        view.run()


def composer(window: MainWindow) -> QWidget:
    return window.compose(editing=VARIANT_NAME)


def server(window: MainWindow) -> None:
    panel = window.server
    window.tabs.setCurrentWidget(panel)
    panel.clear_requests()
    now = time.time()
    path = "/v1/chat/completions"
    panel.add_log_row(LogEntry(now, path, VARIANT_NAME, "d0bae8f37620", 96, 18, 4.7, 200,
                               4.1, id="chatcmpl-1"))
    # The server's own messages for these mistakes (engine/serve).
    panel.add_log_row(LogEntry(now + 2, path, "tool-call", "", 0, 0, 0.0, 404, 0.0,
                               "the model 'tool-call' does not exist or is not served here "
                               "(GET /v1/models lists what is)"))
    panel.add_log_row(LogEntry(now + 3, path, VARIANT_NAME, "", 0, 0, 0.0, 400, 0.0,
                               "invalid messages: Input should be a valid list"))
    panel.add_log_row(LogEntry(now + 4, "/v1/models", "", "", 0, 0, 0.0, 401, 0.0,
                               "missing or wrong API key (send Authorization: Bearer KEY)"))
    panel.add_pending_row(Pending("chatcmpl-2", now + 5, path, "smollm2-135m-instruct",
                                  "smollm2-135m-instruct", True))
    panel.save_log()
    panel.log_view.setFocus()  # (the address field's cursor blinked in the screenshot)


def real_server(window: MainWindow, qtbot) -> None:  # noqa: ANN001
    """For the README: the server started from the panel, a real answer and a client's
    three mistakes (an unknown model, a malformed body, a wrong key) in its log."""
    panel, controller = window.server, window.server_controller
    window.tabs.setCurrentWidget(panel)
    panel.clear_requests()
    panel.port.setValue(0)
    panel.key.setText("readme-example-key")
    with qtbot.waitSignal(controller.stateChanged, timeout=LONG,
                          check_params_cb=lambda state, _d: state in ("running", "failed")):
        panel.start_button.click()
    assert controller.running(), panel.state_label.text()
    url = f"http://127.0.0.1:{controller.port}/v1/chat/completions"

    def post(body: dict, key: str = "readme-example-key") -> None:
        request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={
            "Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        with contextlib.suppress(urllib.error.HTTPError):
            urllib.request.urlopen(request, timeout=LONG / 1000).read()  # noqa: S310

    ask = [{"role": "user", "content": "Set a timer for 10 minutes"}]
    post({"model": VARIANT_NAME, "messages": ask, "max_tokens": 32})
    post({"model": "tool-call", "messages": ask})
    post({"model": VARIANT_NAME, "messages": "Set a timer"})
    post({"model": VARIANT_NAME, "messages": ask}, key="wrong-key-123")
    qtbot.waitUntil(lambda: panel.log_model.rowCount() == 4, timeout=SHORT)
    panel.log_view.setFocus()


def stop_server(window: MainWindow, qtbot) -> None:  # noqa: ANN001
    if window.server_controller.running():
        with qtbot.waitSignal(window.server_controller.stateChanged, timeout=LONG,
                              check_params_cb=lambda state, _d: state == "stopped"):
            window.server.start_button.click()


def train(window: MainWindow) -> None:
    page = window.train
    window.tabs.setCurrentWidget(page)
    page.name.setText("gui-style")
    page.variant.setText("gui-style-chat")
    page.plot.reset(100)
    for step in range(1, 101):
        page._progress({"step": step, "steps": 100, "loss": 0.4 + 2.2 * 0.96 ** step,
                        "step_seconds": 0.8, "seconds": 0.8 * step,
                        "eta": 0.8 * (100 - step)})
    page._status("Trained gui-style in 1 min 20 s: final loss 0.44; variant "
                 "gui-style-chat is ready.")
    page.memory.setText("Estimated peak memory 1.2 GiB (the base mapped, 0.4 GiB of "
                        "activations); measured 0.8 s per step.")
    page.memory.show()
    page._checks({  # as the training worker's event delivers it
        "parity": {"top1_agreement": 0.984, "mean_abs_logprob_diff": 0.057,
                   "max_abs_logprob_diff": 0.41, "positions": 4096},
        "drift": {"base": 2.912, "variant": 3.109, "delta": 0.197, "tokens": 2048}})


def wizard(window: MainWindow, qtbot) -> QWidget:  # noqa: ANN001
    dialog = window.import_adapter()
    dialog.path.setText(str(demo.resources_dir() / demo.SHIPPED_ADAPTER))
    # Enter, as a user goes on: the file is read, then the wizard moves to its report.
    with qtbot.waitSignal(dialog.stepReady, timeout=LONG):
        dialog.path.returnPressed.emit()
    settle()
    assert dialog.state.step == Step.SUMMARY, dialog.state.step
    return dialog


# --------------------------------------------------------------------------- the check


@pytest.mark.parametrize("theme_name", THEMES)
@pytest.mark.parametrize("width,height", SIZES)
def test_the_main_flows_hold_their_shape(window: MainWindow, qtbot, themed: QApplication,
                                         shots: Path, width: int, height: int,
                                         theme_name: str) -> None:
    theme.apply(themed, theme_name)
    size = QSize(width, height)
    window.resize(size)
    qtbot.waitUntil(lambda: window.size() == size, timeout=SHORT)
    readme = os.environ.get("VARIANT_STUDIO_README_SHOTS") == "1" and \
        (width, height) == README_SIZE
    problems: list[str] = []

    def photograph(widget: QWidget, state: str) -> None:
        settle()
        name = f"{width}x{height}-{theme_name}-{state}.png"
        assert widget.grab().save(str(shots / name)), name
        target = README_SHOTS.get(state, {}).get(theme_name)
        if readme and target:
            assert widget.grab().save(str(ROOT / "docs" / "screenshots" / target)), target

    if readme:  # the README's images: no welcome banner, real answers
        window.banner.dismiss.click()
    window.tabs.setCurrentWidget(window.detail)
    problems += check(window, size, "library")
    photograph(window, "library")
    for state, flow in (("details", details), ("chat", chat), ("compare", compare),
                        ("server", server), ("train", train)):
        if readme and state == "chat":
            real_chat(window, qtbot)
        elif readme and state == "compare":
            real_compare(window, qtbot)
        elif readme and state == "server":
            real_server(window, qtbot)
        else:
            flow(window)
        problems += check(window, size, state)
        photograph(window, state)
        if state == "server":
            stop_server(window, qtbot)
    # After every flow, every tab still fits (a finished comparison once grew the
    # window on all of them).
    for index in range(window.tabs.count()):
        window.tabs.setCurrentIndex(index)
        problems += check(window, size, f"tab {window.tabs.tabText(index)}")

    dialog = wizard(window, qtbot)
    problems += dialog_problems(dialog, size, "wizard")
    photograph(dialog, "wizard")
    dialog.reject()

    dialog = composer(window)
    problems += dialog_problems(dialog, size, "composer")
    photograph(dialog, "composer")
    dialog.reject()
    assert not problems, "\n".join(problems)
