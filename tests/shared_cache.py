"""Artifacts the tests build once and share: between the xdist workers of a run, and
between runs while everything an artifact depends on is unchanged.

An artifact lives in `<parent>/<key>/` (`.tmp/test-cache/<name>/` for most), where the
key is a digest of what it depends on (`digest`: source files, package versions, input
files), so a changed dependency is a new key and a stale artifact is never used.

`shared(parent, key, build)`: the first process that needs the artifact builds it under
the parent's file lock (`filelock`) into a staging folder beside it and publishes it by
one rename; the others wait on the lock and reuse it; a crash leaves only a staging
folder, removed by the next build. `folder(parent, key)` is the same for a folder that
is filled as it is used (the OpenVINO build cache: the engine locks each build itself).

A process that uses a key holds a shared `flock` on `<parent>/<key>.inuse` until it
exits. A build prunes the parent's other keys, but only those no process holds and
none used in the last `KEEP_UNUSED_S`: a run started before a source change keeps its
artifacts while a newer run builds beside them (concurrent runs in one working tree).

Time spent here (building, or waiting for another process's build) is counted in
`spent()`: tests/conftest.py leaves it out of the tiers' time budgets, since it is paid
once per source version, not per test.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO

try:
    import fcntl
except ImportError:  # not POSIX: nothing is pruned (nothing can tell a key in use)
    fcntl = None  # type: ignore[assignment]

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / ".tmp" / "test-cache"
LOCK = "build.lock"
KEEP_UNUSED_S = 3600.0
_held: dict[Path, IO[bytes]] = {}  # the in-use locks of this process, open until exit
_spent = [0.0]


def digest(*parts: str | Path | Iterable[Path]) -> str:
    """A key over `parts`: a string as it is, a file by its bytes, a folder by every
    `.py` file under it (relative path and bytes), an iterable of paths likewise."""
    h = hashlib.sha256()

    def add_file(path: Path, label: str) -> None:
        h.update(f"\0file {label} {path.stat().st_size}\0".encode())
        h.update(path.read_bytes())

    for part in parts:
        if isinstance(part, str):
            h.update(f"\0str {part}\0".encode())
            continue
        for path in ([part] if isinstance(part, Path) else list(part)):
            if path.is_dir():
                for found in sorted(path.rglob("*.py")):
                    if "__pycache__" not in found.parts:
                        add_file(found, found.relative_to(path).as_posix())
            else:
                add_file(path, path.name)
    return h.hexdigest()[:20]


def versions(*distributions: str) -> str:
    """"name=version;" for each distribution ("missing" where it is not installed)."""
    out = []
    for name in distributions:
        try:
            out.append(f"{name}={importlib.metadata.version(name)};")
        except importlib.metadata.PackageNotFoundError:
            out.append(f"{name}=missing;")
    return "".join(out)


def spent() -> float:
    """Seconds this process spent in `shared`/`folder` (building or waiting)."""
    return _spent[0]


@contextlib.contextmanager
def counted() -> Iterator[None]:
    """Count the time of the block in `spent()` (a build outside `shared`, e.g. the
    OpenVINO default built by the engine into a `folder`)."""
    started = time.monotonic()
    try:
        yield
    finally:
        _spent[0] += time.monotonic() - started


def _hold(parent: Path, key: str) -> None:
    marker = parent / f"{key}.inuse"
    if marker in _held or fcntl is None:
        return
    handle = open(marker, "ab")  # noqa: SIM115 - held open until the process exits
    fcntl.flock(handle.fileno(), fcntl.LOCK_SH)
    os.utime(marker)  # the last use, for `_prune`
    _held[marker] = handle


def _prune(parent: Path, keep: str) -> None:
    """Remove staging leftovers and the other keys no process holds (called under the
    parent's lock, so no build is under way)."""
    for entry in parent.iterdir():
        if not entry.is_dir() or entry.name == keep:
            continue
        if entry.name.startswith("."):  # a staging folder a crashed build left
            shutil.rmtree(entry, ignore_errors=True)
            continue
        if fcntl is None:
            continue
        marker = parent / f"{entry.name}.inuse"
        with open(marker, "ab") as handle:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # in use by a running process
            if time.time() - max(marker.stat().st_mtime, entry.stat().st_mtime) < KEEP_UNUSED_S:
                continue  # used lately (perhaps by a process that holds no marker)
            shutil.rmtree(entry, ignore_errors=True)
            marker.unlink(missing_ok=True)


def shared(parent: Path, key: str, build: Callable[[Path], object],
           timeout: float = 1800) -> Path:
    """`parent/key`, built once by `build(staging_folder)` (see the module docstring)."""
    from filelock import FileLock

    parent.mkdir(parents=True, exist_ok=True)
    final = parent / key
    with counted(), FileLock(str(parent / LOCK), timeout=timeout):
        _hold(parent, key)  # before the check: a pruner needs this lock
        if not final.is_dir():
            _prune(parent, keep=key)
            work = Path(tempfile.mkdtemp(prefix=".building-", dir=parent))
            try:
                build(work)
                work.chmod(0o755)  # mkdtemp made it private
                work.rename(final)
            except BaseException:
                shutil.rmtree(work, ignore_errors=True)
                raise
    return final


def folder(parent: Path, key: str) -> Path:
    """`parent/key`, created if missing and held in use; what fills it locks itself."""
    from filelock import FileLock

    parent.mkdir(parents=True, exist_ok=True)
    final = parent / key
    with FileLock(str(parent / LOCK), timeout=60):
        _hold(parent, key)
        if not final.is_dir():
            _prune(parent, keep=key)
            final.mkdir()
    return final
