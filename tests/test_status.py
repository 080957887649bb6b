"""`status` reports the engine honestly and counts what `list` shows: it reads which
long-lived front ends (the app, the local server) run on the data directory, from the
files they keep in `<data>/run/` (engine.state.presence); it never starts an engine to
describe one, and writes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine import cli
from engine.catalog.store import Catalog
from engine.runtime import service
from engine.serve.config import ServeConfig
from engine.serve.server import ServerThread
from engine.state import presence


def status(capsys: pytest.CaptureFixture, json_out: bool = True) -> dict | str:
    code = cli.main(["status", "--json"] if json_out else ["status"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out) if json_out else out


@pytest.fixture
def no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Starting an engine process fails the test: status must not."""
    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("status started an engine process")

    monkeypatch.setattr(service, "ChildProcess", refuse)


def test_on_a_fresh_home_no_engine_runs_counts_agree_with_list_and_nothing_is_written(
        studio_home: Path, no_engine: None, capsys: pytest.CaptureFixture) -> None:
    info = status(capsys)
    assert info["engine"]["state"] == "none" and info["engine"]["front_ends"] == []
    assert "each command starts its own engine" in info["engine"]["note"]
    assert cli.main(["list", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    recorded = [m for m in listing["models"] if m["built"]]
    pending = [m["name"] for m in listing["models"] if not m["built"]]
    assert info["catalog"]["models"] == len(recorded)
    assert info["pending"] == {"models": len(pending), "names": pending}
    text = status(capsys, json_out=False)
    assert (f"catalog: {len(listing['models'])} models ({len(pending)} not built yet: "
            f"{pending[0]}), {len(listing['adapters'])} adapters, "
            f"{len(listing['variants'])} variants") in text
    assert "engine: none running" in text
    assert not studio_home.exists()  # read-only: not even the data directory


def test_a_running_server_and_its_engine_are_reported(studio_home: Path, no_engine: None,
                                                       capsys: pytest.CaptureFixture) -> None:
    server = ServerThread(ServeConfig(port=0), Catalog()).start()
    try:
        (front,) = status(capsys)["engine"]["front_ends"]
        assert (front["kind"], front["pid"], front["url"]) == ("server", os.getpid(),
                                                              server.url)
        assert front["engine"]["state"] == "stopped"  # it starts with the first request
        assert status(capsys)["engine"]["state"] == "idle"
        assert f"idle in the local server at {server.url} (pid {os.getpid()})" in status(
            capsys, json_out=False)
    finally:
        server.stop()
    after = status(capsys)["engine"]
    assert (after["state"], after["front_ends"], after["stale_records"]) == ("none", [], 0)


def test_an_engine_is_running_while_its_process_is_alive(studio_home: Path, no_engine: None,
                                                         capsys: pytest.CaptureFixture) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    app = presence.announce("app")
    try:
        app.engine("running", child.pid)
        info = status(capsys)["engine"]
        assert info["state"] == "running"
        (front,) = info["front_ends"]
        assert front["engine"]["pid"] == child.pid and front["engine"]["rss_bytes"] > 0
        text = status(capsys, json_out=False)
        assert f"running in the desktop app (pid {os.getpid()}): engine pid {child.pid}, " \
            in text and "MiB resident" in text
        child.communicate(b"")  # the engine exits: not running any more, even unannounced
        assert status(capsys)["engine"]["state"] == "idle"
    finally:
        app.close()
        if child.poll() is None:
            child.kill()
    assert status(capsys)["engine"]["state"] == "none"


def test_a_file_left_by_a_killed_process_is_stale_and_kept_until_the_next_announce(
        studio_home: Path, no_engine: None, capsys: pytest.CaptureFixture) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    folder = presence.run_dir(create=True)
    left = folder / f"app-{dead.stdout.strip()}-1.json"
    left.write_text(json.dumps({"kind": "app", "pid": int(dead.stdout), "started": None,
                                "engine": {"state": "running", "pid": int(dead.stdout)}}))
    info = status(capsys)["engine"]
    assert info["state"] == "none" and info["stale_records"] == 1
    assert left.exists()  # status changes nothing
    presence.announce("server", "http://127.0.0.1:1").close()
    assert not left.exists()
