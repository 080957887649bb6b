"""File → Download model or adapter… in the window, offscreen, against a local HTTP
server (tests/download_server.py): progress and the new entries in the library, Resume
after a failure, Cancel that keeps nothing, and input mistakes that start nothing."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import pytest

from engine.catalog.store import Catalog
from engine.curated.embedded import DEFAULT_MODEL_NAME as BASE
from gui.download_dialog import DownloadDialog
from tests import factories as f
from tests.download_server import COMMIT, FileServer, left_behind, serving
from tests.gui_helpers import LONG

URL_PATH = "loras/poet.gguf"


@pytest.fixture
def lora(tmp_path: Path, base_info) -> bytes:  # noqa: ANN001
    return f.write_gguf_lora(tmp_path / "poet.gguf", base_info, seed=3, strength=0.1
                             ).read_bytes()


@pytest.fixture
def server(lora: bytes, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    with serving(FileServer(files={URL_PATH: lora},
                            repos={"org/poet": {"poet.gguf": lora}})) as running:
        monkeypatch.setenv("HF_ENDPOINT", running.endpoint)
        yield running


def open_dialog(window) -> DownloadDialog:  # noqa: ANN001
    window.act_download.trigger()
    (dialog,) = [d for d in window.findChildren(DownloadDialog) if d.isVisible()]
    return dialog


def test_an_adapter_by_url_lands_in_the_library_with_its_variant(window, server: FileServer,
                                                                 lora: bytes, qtbot) -> None:
    dialog = open_dialog(window)
    assert window.act_download.shortcut().toString() == "Ctrl+Shift+D"
    qtbot.keyClicks(dialog.where, server.url(URL_PATH))
    assert dialog.name.text() == "poet"  # the wizard's naming rule, from the file name
    assert dialog.base.currentText() == BASE and dialog.make_variant.isChecked()
    dialog.variant_name.setText("smol-poet")
    seen: list[int] = []
    with qtbot.waitSignal(dialog.downloaded, timeout=LONG) as shown:
        dialog.download_button.click()
        assert dialog.task is not None and not dialog.download_button.isEnabled()
        dialog.task.progress.connect(lambda done, _total: seen.append(done))
    assert shown.args == ["smol-poet"] and seen
    record = Catalog().adapter("poet")
    assert record["sha256"] == hashlib.sha256(lora).hexdigest()
    assert record["source"] == server.url(URL_PATH)
    assert Catalog().variant("smol-poet")["adapters"] == [{"name": "poet", "scale": 1.0}]
    # Announced: the library has both and shows the variant.
    assert "poet" in window.library.model.names("adapter")
    assert window.library.current() == ("variant", "smol-poet")


def test_a_failed_download_is_resumed_from_the_dialog(window, server: FileServer, lora: bytes,
                                                      qtbot) -> None:
    server.drop_after[URL_PATH] = 300_000
    server.down_after_drop = True  # then 503 until the test brings it back
    dialog = open_dialog(window)
    dialog.where.setText(server.url(URL_PATH))
    dialog.make_variant.setChecked(False)
    with qtbot.waitSignal(dialog.ended, timeout=LONG) as ended:
        dialog.download_button.click()
    assert ended.args == ["failed"]
    assert "Resume continues it" in dialog.message.text()
    assert dialog.download_button.text() == "Resume" and dialog.download_button.isEnabled()
    kept = left_behind(window.catalog.state.path.parent, "poet")
    assert [Path(p).name for p in kept if p.endswith(".part")] == ["poet.gguf.part"]
    assert "poet" not in Catalog().data()["adapters"]
    server.unavailable.clear()
    with qtbot.waitSignal(dialog.downloaded, timeout=LONG):
        dialog.download_button.click()
    assert server.requests(URL_PATH)[-1].range == "bytes=300000-"
    assert Path(Catalog().adapter("poet")["path"]).read_bytes() == lora


def test_cancel_keeps_nothing(window, server: FileServer, qtbot) -> None:
    release = threading.Event()
    server.hold_after[URL_PATH] = (300_000, release)  # caught in flight
    dialog = open_dialog(window)
    dialog.where.setText(server.url(URL_PATH))
    before = Catalog().data()
    with qtbot.waitSignal(dialog.ended, timeout=LONG) as ended:
        try:
            dialog.download_button.click()
            qtbot.waitUntil(lambda: dialog.progress.value() > 0, timeout=LONG)
            assert dialog.cancel_button.text() == "Cancel download"
            dialog.cancel_button.click()
        finally:
            release.set()
    assert ended.args == ["cancelled"] and "nothing was added" in dialog.stage.text()
    assert Catalog().data() == before
    assert left_behind(window.catalog.state.path.parent, "poet") == []
    assert dialog.isVisible() and dialog.download_button.text() == "Download"


def test_a_model_from_a_repo_and_input_mistakes(window, server: FileServer, qtbot) -> None:
    dialog = open_dialog(window)
    dialog.where.setText("not a repo!")
    dialog.download_button.click()
    assert dialog.task is None and "invalid Hugging Face repo id" in dialog.message.text()
    dialog.where.setText("org/poet")
    dialog.as_model.setChecked(True)
    assert not dialog.base.isEnabled() and not dialog.make_variant.isEnabled()
    dialog.download_button.click()
    assert dialog.task is None and "needs its file name" in dialog.message.text()
    assert Catalog().data()["models"].keys() == {BASE}
    # A GGUF from the repo, as a base model: a LoRA is refused, nothing is added.
    dialog.filename.setText("poet.gguf")
    dialog.name.setText("not-a-base")
    with qtbot.waitSignal(dialog.ended, timeout=LONG) as ended:
        dialog.download_button.click()
    assert ended.args == ["failed"] and "is a LoRA adapter" in dialog.message.text()
    assert left_behind(window.catalog.state.path.parent, "not-a-base") == []
    assert [r.path for r in server.log if r.method == "GET"][-1] == \
        f"/org/poet/resolve/{COMMIT}/poet.gguf"
