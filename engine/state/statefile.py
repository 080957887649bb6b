"""Durable JSON state files: atomic writes under a file lock.

Every state file the app owns (catalog, settings, digest cache, conversations) goes
through `StateFile`. A write goes to a temporary file in the same directory, is
fsynced, then replaces the old file, so a crash leaves either the old or the new
version. Read-modify-write happens under an inter-process lock, so two running
instances cannot lose each other's updates. A file that does not parse is set aside
(renamed with a `.corrupt-<time>` suffix) with a notice, never silently replaced.

`stamp()` says whether a file may have changed since it was last read, without reading
it, so a long-lived reader (the catalog in the window or the server) parses it again
only when it did: the file's identity and times from `stat`, and a count of the writes
this process made to that path (two writes within one tick of the file system's clock
can leave the same times and size behind).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import filelock

from engine.errors import StateError

_notices: list[str] = []
_taken = 0
_notices_lock = threading.Lock()
# Writes this process made, per path (see `stamp`).
_writes: dict[str, int] = {}
_writes_lock = threading.Lock()

Stamp = tuple[Any, ...]


def _wrote(path: Path) -> None:
    with _writes_lock:
        _writes[str(path)] = _writes.get(str(path), 0) + 1


def file_stamp(path: Path) -> Stamp | None:
    """What changes whenever the file at `path` does (None: unknown, read it again).

    A missing file has a stamp too (it may be created later; the stamp then differs)."""
    with _writes_lock:
        writes = _writes.get(str(path), 0)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return (writes, "missing")
    except OSError:
        return None
    return (writes, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def notices() -> list[str]:
    """Messages about state files that were set aside, oldest first."""
    with _notices_lock:
        return list(_notices)


def take_notices() -> list[str]:
    """The messages not yet taken, oldest first (each is handed out once)."""
    global _taken
    with _notices_lock:
        fresh = _notices[_taken:]
        _taken = len(_notices)
        return fresh


def add_notice(message: str) -> None:
    with _notices_lock:
        _notices.append(message)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write `data` as JSON to `path` so that readers see the old or the new file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2, sort_keys=True, ensure_ascii=False)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        _wrote(path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    # The rename is durable only once the directory entry is on disk.
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class StateFile:
    """One JSON state file with locked read-modify-write."""

    def __init__(self, path: Path, default: Callable[[], Any]) -> None:
        self.path = path
        self._default = default
        # One lock object per path in this process (is_singleton), so that two
        # StateFile objects for the same file nest instead of deadlocking.
        self._lock = filelock.FileLock(str(path) + ".lock", timeout=30, is_singleton=True)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)  # the lock file lives there
        try:
            with self._lock:
                yield
        except filelock.Timeout as exc:
            raise StateError(f"{self.path.name} is locked by another process") from exc

    def stamp(self) -> Stamp | None:
        """See `file_stamp`: equal stamps mean the file was not changed in between."""
        return file_stamp(self.path)

    def load(self) -> Any:
        """Read the file; a missing file gives the default, a corrupt one is set aside."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return self._default()
        except OSError as exc:
            raise StateError(f"cannot read {self.path}: {exc.strerror}") from exc
        try:
            data = json.loads(raw.decode("utf-8"))
            if not isinstance(data, type(self._default())):
                raise ValueError("unexpected top-level type")
            return data
        except (ValueError, UnicodeDecodeError, RecursionError):
            return self._set_aside(raw)

    def _set_aside(self, raw: bytes) -> Any:
        with self.locked():
            try:
                current = self.path.read_bytes()
            except FileNotFoundError:
                return self._default()  # another process set it aside first
            if current != raw:
                return self.load()  # replaced meanwhile: judge the new content
            stamp = time.strftime("%Y%m%d-%H%M%S")
            aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{os.getpid()}")
            os.replace(self.path, aside)
            _wrote(self.path)
        add_notice(f"{self.path.name} was unreadable and was set aside as {aside.name}")
        return self._default()

    def reject(self) -> None:
        """Set the file aside because it parsed but made no sense (wrong fields)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return
        self._set_aside(raw)

    def _remove_stale_temps(self) -> None:
        """Temp files left by a writer that was killed mid-write (we hold the lock)."""
        for stale in self.path.parent.glob(f".{self.path.name}.*.tmp"):
            with contextlib.suppress(OSError):
                stale.unlink()

    def save(self, data: Any) -> None:
        with self.locked():
            write_json_atomic(self.path, data)
            self._remove_stale_temps()

    def update(self, change: Callable[[Any], Any]) -> Any:
        """Apply `change` to a copy of the current state and write the result.

        `change` may raise to abort; then nothing is written.
        """
        with self.locked():
            current = self.load()
            new = change(copy.deepcopy(current))
            if new is None:
                raise StateError("internal: state update returned nothing")
            if new != current:
                write_json_atomic(self.path, new)
                self._remove_stale_temps()
            return new


class MemoryState:
    """A state file's interface over a value in memory: what a read-only view of state
    that does not exist yet stands on (nothing is ever written to `path`)."""

    def __init__(self, path: Path, data: Any) -> None:
        self.path = path
        self._data = data
        self._revision = 0

    def stamp(self) -> Stamp:
        return ("memory", id(self), self._revision)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        yield

    def load(self) -> Any:
        return copy.deepcopy(self._data)

    def save(self, data: Any) -> None:
        self._data = copy.deepcopy(data)
        self._revision += 1

    def update(self, change: Callable[[Any], Any]) -> Any:
        self._data = change(copy.deepcopy(self._data))
        self._revision += 1
        return copy.deepcopy(self._data)
