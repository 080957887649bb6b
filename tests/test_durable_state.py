"""Durable state: writers killed at random moments, concurrent app processes, and
corrupt files found at start.

Invariants: after a SIGKILL at any moment a state file loads as exactly the old or the
new version (never partial, never set aside, never older than what was acknowledged);
two processes writing at once lose nothing; a corrupt file is set aside with a
message, byte for byte, and never silently replaced.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

from engine.catalog.store import Catalog
from engine.curated import setup
from engine.errors import StateError
from engine.state import conversations, paths, settings, statefile
from engine.state.conversations import ChatMessage
from engine.state.statefile import StateFile
from tests.hostile_cases import mini_lora

ROOT = Path(__file__).resolve().parent.parent
ITERATIONS = int(os.environ.get("VARIANT_STUDIO_DURABLE_ITERATIONS", "200"))


def payload(n: int) -> dict:
    """State version n: big enough that a write takes a while, and self-checking."""
    blob = f"{n}-" + "x" * (20_000 + 997 * (n % 50))
    return {"n": n, "items": list(range(n % 300)), "blob": blob,
            "check": hashlib.sha256(f"{n}:{blob}".encode()).hexdigest()}


def consistent(data: dict) -> bool:
    n = data["n"]
    return (data["items"] == list(range(n % 300))
            and data["check"] == hashlib.sha256(f"{n}:{data['blob']}".encode()).hexdigest())


def _writer(path: Path, ack_fd: int) -> None:
    """Child process: increment the state forever, acknowledging each committed write."""
    state = StateFile(path, dict)
    while True:
        new = state.update(lambda d: payload(d.get("n", 0) + 1))
        os.write(ack_fd, f"{new['n']}\n".encode())


def _acks(fd: int, block_for: int) -> tuple[list[int], bool]:
    """Read acknowledgements; wait for at least `block_for` of them (or EOF)."""
    seen: list[int] = []
    buf = b""
    while True:
        if len(seen) >= block_for and not select.select([fd], [], [], 0)[0]:
            return seen, False
        chunk = os.read(fd, 65536)
        if not chunk:
            return seen, True
        buf += chunk
        *lines, buf = buf.split(b"\n")
        seen.extend(int(line) for line in lines if line)


@pytest.mark.slow
def test_writers_killed_at_random_moments_leave_the_old_or_the_new_version(
        tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    rng = random.Random(6)
    notices_before = len(statefile.notices())
    acknowledged = 0
    mid_write = 0
    for _ in range(ITERATIONS):
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the writer
            os.close(read_fd)
            try:
                _writer(path, write_fd)
            finally:
                os._exit(0)
        os.close(write_fd)
        # Let it commit 0-2 writes, then kill it a random 0-3 ms later.
        seen, _ = _acks(read_fd, rng.randint(0, 2))
        if rng.random() < 0.8:
            select.select([], [], [], rng.uniform(0, 0.003))  # the random moment
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        rest, eof = _acks(read_fd, 0)
        while not eof:
            more, eof = _acks(read_fd, 1)
            rest += more
        os.close(read_fd)
        seen += rest
        if any(p.name.endswith(".tmp") for p in tmp_path.iterdir()):
            mid_write += 1  # killed between creating the temp file and the rename
        data = StateFile(path, dict).load()
        last = seen[-1] if seen else acknowledged
        assert data.get("n", 0) in (last, last + 1), (data.get("n"), last)
        assert data.get("n", 0) >= acknowledged, "state went backwards"
        assert not data or consistent(data), "a partial or mixed version was read"
        acknowledged = data.get("n", 0)
    assert len(statefile.notices()) == notices_before, "a killed write corrupted the file"
    assert mid_write > 0, "no kill landed inside a write: the test proved nothing"
    # The next write cleans the temp files that killed writers left behind.
    StateFile(path, dict).update(lambda d: payload(d["n"] + 1))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json", "state.json.lock"]
    print(f"\n{ITERATIONS} writers killed, {mid_write} inside a write, "
          f"{acknowledged} versions committed, 0 lost")


CONCURRENT_STATE = textwrap.dedent("""
    import sys
    from pathlib import Path
    from engine.state.statefile import StateFile

    path, me, count = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    state = StateFile(path, dict)
    for i in range(count):
        def change(d):
            d["counter"] = d.get("counter", 0) + 1
            d.setdefault(me, []).append(i)
            return d
        state.update(change)
""")


def test_two_processes_updating_one_state_file_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "shared.json"
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT_STATE, str(path), name, "150"],
                              cwd=ROOT) for name in ("a", "b")]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    data = json.loads(path.read_text())
    assert data["counter"] == 300
    assert data["a"] == list(range(150)) and data["b"] == list(range(150))


CONCURRENT_APP = textwrap.dedent("""
    import sys
    from pathlib import Path
    from engine import cli
    from engine.state import conversations, settings
    from engine.state.conversations import ChatMessage

    me, source = sys.argv[1], sys.argv[2]
    for i in range(3):
        assert cli.main(["adapter", "add", f"{me}{i}", "--base", sys.argv[3],
                         "--file", source]) == 0
    assert cli.main(["variant", "add", f"v{me}", "--base", sys.argv[3],
                     "--adapter", f"{me}0", "--adapter", f"{me}1:0.5"]) == 0
    for i in range(5):
        chat = conversations.new(f"v{me}").with_messages((ChatMessage("user", f"{me} {i}"),))
        conversations.save(chat)
    settings.update(**{"threads" if me == "a" else "context_size": 3 if me == "a" else 2048})
""")


def test_two_app_processes_importing_at_once_lose_nothing(studio_home: Path,
                                                          tmp_path: Path) -> None:
    """Two CLI processes import adapters, compose variants, save conversations and
    change settings at the same time: every change of both survives."""
    from engine.curated.embedded import DEFAULT_MODEL_NAME

    setup.first_run(Catalog())
    source = tmp_path / "a.gguf"
    source.write_bytes(mini_lora())
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT_APP, name, str(source),
                               DEFAULT_MODEL_NAME], cwd=ROOT, stderr=subprocess.PIPE,
                              stdout=subprocess.DEVNULL, env=os.environ.copy())
             for name in ("a", "b")]
    errors = [p.communicate(timeout=300)[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    catalog = Catalog().data()
    assert set(catalog["adapters"]) == {"a0", "a1", "a2", "b0", "b1", "b2"}
    assert set(catalog["variants"]) == {"va", "vb"}
    for name, record in catalog["adapters"].items():
        stored = Path(record["path"])
        assert stored.parent == paths.adapter_store(name)
        assert hashlib.sha256(stored.read_bytes()).hexdigest() == record["sha256"]
    assert sorted(c.model for c in conversations.list_all()) == ["va"] * 5 + ["vb"] * 5
    current = settings.load()
    assert (current.threads, current.context_size) == (3, 2048)
    assert not [p for p in studio_home.rglob("*.corrupt-*")]


def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine.cli", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=os.environ.copy())


def test_a_corrupt_catalog_at_start_is_set_aside_with_a_warning(studio_home: Path) -> None:
    studio_home.mkdir(parents=True, exist_ok=True)
    garbage = b'{"version": 1, "models": {"half-written'
    (studio_home / "catalog.json").write_bytes(garbage)
    done = run_cli("list", "--json")
    assert done.returncode == 0, done.stderr
    (warning,) = done.stderr.strip().splitlines()
    assert warning.startswith("warning: catalog.json was unreadable and was set aside as "
                              "catalog.json.corrupt-")
    (aside,) = studio_home.glob("catalog.json.corrupt-*")
    assert aside.name in warning and aside.read_bytes() == garbage
    # A fresh catalog replaced it, with the embedded base (listed now, written by the
    # first command that changes state), and the next run is quiet.
    built = [m["name"] for m in json.loads(done.stdout)["models"] if m["built"]]
    fresh = setup.preview(Catalog())
    assert built == [fresh.data()["models"][name]["name"] for name in fresh.data()["models"]]
    assert len(built) == 1
    again = run_cli("list")
    assert again.returncode == 0 and again.stderr == ""


def test_a_failing_command_still_reports_the_set_aside_file(studio_home: Path) -> None:
    studio_home.mkdir(parents=True, exist_ok=True)
    (studio_home / "catalog.json").write_bytes(b"\xff\xfe not json")
    done = run_cli("show", "nothing")
    assert done.returncode == 4
    warning, error = done.stderr.strip().splitlines()
    assert warning.startswith("warning: catalog.json was unreadable and was set aside")
    assert error.startswith("error: no model, adapter or variant named")


def test_a_catalog_from_a_newer_version_is_refused_not_set_aside(studio_home: Path) -> None:
    studio_home.mkdir(parents=True, exist_ok=True)
    future = json.dumps({"version": 99, "models": {}, "adapters": {}, "variants": {}})
    (studio_home / "catalog.json").write_text(future)
    done = run_cli("list")
    assert done.returncode == StateError.exit_code
    assert "unknown layout (version 99)" in done.stderr
    assert (studio_home / "catalog.json").read_text() == future
    assert not list(studio_home.glob("*.corrupt-*"))


def test_corrupt_conversations_and_settings_are_set_aside_not_replaced(
        studio_home: Path) -> None:
    chat = conversations.new("va").with_messages((ChatMessage("user", "keep me"),))
    conversations.save(chat)
    broken = conversations.new("vb")
    file = paths.conversations_dir() / f"{broken.id}.json"
    file.write_text('{"id": "' + broken.id + '", "messages": [')
    paths.settings_file().write_text("{threads: 4")
    statefile.take_notices()
    assert [c.id for c in conversations.list_all()] == [chat.id]
    assert settings.load() == settings.Settings()
    taken = statefile.take_notices()
    assert any(f"{broken.id}.json was unreadable" in n for n in taken)
    assert any("settings.json was unreadable" in n for n in taken)
    (aside,) = paths.conversations_dir().glob(f"{broken.id}.json.corrupt-*")
    assert aside.read_text().endswith('"messages": [')
    assert len(list(studio_home.glob("settings.json.corrupt-*"))) == 1
    assert statefile.take_notices() == []  # each notice is handed out once


@pytest.mark.parametrize("bad", ["[]", "null", "\"text\"", "{" * 100_000])
def test_valid_json_of_the_wrong_shape_is_set_aside_too(tmp_path: Path, bad: str) -> None:
    path = tmp_path / "s.json"
    path.write_text(bad)
    assert StateFile(path, dict).load() == {}
    (aside,) = tmp_path.glob("s.json.corrupt-*")
    assert aside.read_text() == bad


@pytest.mark.slow
def test_cli_imports_killed_at_random_moments_never_leave_a_broken_catalog(
        studio_home: Path, tmp_path: Path) -> None:
    """`adapter add` SIGKILLed at a random moment (copying, validating, hashing or
    writing the catalog): the catalog still loads, and every entry it holds has its
    stored file with the recorded digest. An entry is all there or not there."""
    from engine.curated.embedded import DEFAULT_MODEL_NAME

    setup.first_run(Catalog())
    source = tmp_path / "a.gguf"
    source.write_bytes(mini_lora())
    rng = random.Random(7)
    outcomes = Counter()
    start = time.monotonic()  # one import, uninterrupted, sets the range of kill moments
    assert run_cli("adapter", "add", "ref", "--base", DEFAULT_MODEL_NAME,
                   "--file", str(source)).returncode == 0
    full = time.monotonic() - start
    for i in range(6):
        proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "adapter", "add", f"k{i}",
                                 "--base", DEFAULT_MODEL_NAME, "--file", str(source)],
                                cwd=ROOT, env=os.environ.copy(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            proc.wait(timeout=rng.uniform(0.1, 1.1) * full)  # the random moment
            outcomes["finished"] += 1
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            outcomes["killed"] += 1
        statefile.take_notices()
        catalog = Catalog().data()
        assert statefile.take_notices() == [], "a killed import corrupted the catalog"
        for name, record in catalog["adapters"].items():
            stored = Path(record["path"])
            assert hashlib.sha256(stored.read_bytes()).hexdigest() == record["sha256"], name
    print(f"\nCLI imports: {dict(outcomes)}")
    assert outcomes["killed"] > 0, outcomes
    # A later import of a name whose store folder a killed import left behind works.
    done = run_cli("adapter", "add", "k0", "--base", DEFAULT_MODEL_NAME, "--file", str(source))
    assert done.returncode in (0, 2), done.stderr  # 2: k0 was already imported
    assert "k0" in Catalog().data()["adapters"]
