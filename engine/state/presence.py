"""Which long-lived front ends are running on this data directory, and their engines.

Every CLI command that runs a model starts an engine process of its own and stops it
when it ends, so no command can ask "the" engine how it is. What lives on are the
desktop app and `variant-studio serve` (or the app's Server panel): each `announce`s
itself with a small file in `<data>/run/` (its pid, the process's start time, what it
is, its URL, and its engine's state and pid as they change), removed when it stops.
`status` reads those files (`running()`) and checks that each process is still the one
that wrote it; it never starts, asks or changes anything. A file left by a process
that was killed is reported as stale, and removed by the next `announce`.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from engine.state import paths
from engine.state.statefile import write_json_atomic

_numbers = itertools.count(1)


def run_dir(create: bool = False) -> Path:
    path = paths.data_dir(create) / "run"
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def process_start(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, Linux), so a reused pid is
    not mistaken for the process that wrote a file; None where /proc is not there."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        return int(fields[19])  # field 22 of stat(5); fields[0] is field 3
    except (OSError, IndexError, ValueError):
        return None


def alive(pid: int, started: int | None = None) -> bool:
    """Is `pid` running, and (when known) the same process that started at `started`?"""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: it exists
    return started is None or process_start(pid) in (None, started)


def resident_bytes(pid: int) -> int | None:
    """A running process's resident memory (Linux), read without asking it."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class Presence:
    """This process's file in `<data>/run/`: written at once, updated with the engine's
    state, removed by `close()` (or at exit)."""

    def __init__(self, kind: str, url: str | None = None) -> None:
        self.pid = os.getpid()
        self.path = run_dir(create=True) / f"{kind}-{self.pid}-{next(_numbers)}.json"
        self._lock = threading.Lock()
        self.record: dict[str, Any] = {
            "kind": kind, "pid": self.pid, "started": process_start(self.pid),
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "url": url,
            "engine": {"state": "stopped", "pid": None}}
        _remove_stale()
        self._write()
        atexit.register(self.close)

    def _write(self) -> None:
        with self._lock:
            if self.record is not None:
                write_json_atomic(self.path, self.record)

    def engine(self, state: str, pid: int | None) -> None:
        """The engine process changed state (running, stopped, crashed)."""
        if self.record is None:
            return
        self.record["engine"] = {"state": state, "pid": pid if state == "running" else None}
        self._write()

    def close(self) -> None:
        with self._lock:
            self.record = None  # type: ignore[assignment]
            self.path.unlink(missing_ok=True)
        atexit.unregister(self.close)


def announce(kind: str, url: str | None = None) -> Presence:
    """Say that this process (`kind`: "app" or "server") runs on this data directory."""
    return Presence(kind, url)


def running() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(live, stale) records of the front ends in `<data>/run/`. Read-only."""
    live, stale = [], []
    folder = run_dir(create=False)
    if not folder.is_dir():
        return live, stale
    for file in sorted(folder.glob("*.json")):
        try:
            record = json.loads(file.read_text(encoding="utf-8"))
            pid = int(record["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being written, or not ours
        if not alive(pid, record.get("started")):
            stale.append(record)
            continue
        engine = record.get("engine") or {}
        engine_pid = engine.get("pid")
        if engine.get("state") == "running" and engine_pid and not alive(int(engine_pid)):
            engine = {"state": "stopped", "pid": None}  # it died since the last update
        if engine.get("state") == "running" and engine_pid:
            engine["rss_bytes"] = resident_bytes(int(engine_pid))
        live.append({**record, "engine": engine})
    return live, stale


def _remove_stale() -> None:
    folder = run_dir(create=False)
    for file in folder.glob("*.json") if folder.is_dir() else ():
        try:
            record = json.loads(file.read_text(encoding="utf-8"))
            if not alive(int(record["pid"]), record.get("started")):
                file.unlink(missing_ok=True)
        except (OSError, ValueError, KeyError, TypeError):
            continue
