"""Content digests (sha256) with a stat-keyed cache, progress and cancellation.

Re-checking an unchanged multi-gigabyte base must be instant, so a digest is cached
by (path, size, mtime, inode); any change to those means the file is hashed again.
Hashing reports progress and stops promptly when cancelled.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from engine.errors import Cancelled, RefusedError
from engine.formats.safeio import FileStat, open_regular, stat_regular
from engine.state import paths
from engine.state.statefile import StateFile

CHUNK = 4 << 20
_read_only = contextvars.ContextVar("digest_read_only", default=False)
Progress = Callable[[int, int], None]
CancelCheck = Callable[[], bool]


# The digests this process computed, per file identity (path, size, mtime, inode,
# device: the on-disk cache's key and the device). The on-disk cache belongs to one data
# directory; this one lets a new data directory (a new profile, each test) record the
# ~100 MB embedded model without hashing it again. Single dict operations, safe across
# threads; a few entries per file ever hashed.
_hashed: dict[tuple[str, int, int, int, int], str] = {}


def _cache() -> StateFile:
    return StateFile(paths.digest_cache_file(), dict)


def _key(path: Path) -> str:
    return os.path.realpath(path)


def _matches(entry: dict, st: FileStat) -> bool:
    return (entry.get("size"), entry.get("mtime_ns"), entry.get("inode")) == (
        st.size, st.mtime_ns, st.inode)


def cached_digest(path: Path) -> str | None:
    """The cached digest if the file is unchanged since it was hashed, else None."""
    st = stat_regular(path)
    entry = _cache().load().get(_key(path))
    if isinstance(entry, dict) and _matches(entry, st):
        return entry.get("sha256")
    return None


def sha256_file(
    path: Path,
    progress: Progress | None = None,
    cancelled: CancelCheck | None = None,
) -> str:
    """sha256 of a file's content, from the cache when the file is unchanged."""
    path = Path(path)
    hit = cached_digest(path)
    if hit:
        if progress:
            st = stat_regular(path)
            progress(st.size, st.size)
        return hit
    st = stat_regular(path)
    known = _hashed.get((_key(path), st.size, st.mtime_ns, st.inode, st.device))
    if known:
        digest = known  # hashed by this process for another data directory
        if progress:
            progress(st.size, st.size)
    else:
        digest, st = hash_uncached(path, progress, cancelled)
        _hashed[(_key(path), st.size, st.mtime_ns, st.inode, st.device)] = digest
    entry = {"sha256": digest, "size": st.size, "mtime_ns": st.mtime_ns, "inode": st.inode}

    def remember(cache: dict) -> dict:
        cache[_key(path)] = entry
        return cache

    if not _read_only.get():
        _cache().update(remember)
    return digest


def require_unchanged(name: str, path: Path, sha256: str,
                      cancelled: CancelCheck | None = None) -> None:
    """Refuse an adapter whose stored file no longer has the digest recorded for it."""
    current = sha256_file(Path(path), None, cancelled)
    if current != sha256:
        raise RefusedError(f"adapter {name}: its stored file changed (sha256 "
                           f"{current[:16]}…, recorded {sha256[:16]}…)")


@contextlib.contextmanager
def read_only() -> Iterator[None]:
    """Within this block, digests are computed but never written to the cache (a
    read-only command on a fresh data directory leaves nothing behind)."""
    token = _read_only.set(True)
    try:
        yield
    finally:
        _read_only.reset(token)


def is_read_only() -> bool:
    """Inside `read_only()`: nothing may be written to the caches."""
    return _read_only.get()


def hash_uncached(
    path: Path,
    progress: Progress | None = None,
    cancelled: CancelCheck | None = None,
) -> tuple[str, FileStat]:
    handle, st = open_regular(path)
    hasher = hashlib.sha256()
    done = 0
    with handle:
        while True:
            if cancelled and cancelled():
                raise Cancelled(f"hashing {path.name} was cancelled")
            chunk = handle.read(CHUNK)
            if not chunk:
                break
            hasher.update(chunk)
            done += len(chunk)
            if progress:
                progress(done, st.size)
    return hasher.hexdigest(), st


def moved(old: Path, new: Path) -> None:
    """`old` was renamed to `new`: keep its cached digest if the file is unchanged.

    Imports hash a staged copy, then rename its folder into the store; without this
    the first check of the stored file would read all of it again.
    """
    st = stat_regular(new)

    def move(cache: dict) -> dict:
        entry = cache.pop(_key(old), None)
        if isinstance(entry, dict) and _matches(entry, st):
            cache[_key(new)] = entry
        return cache

    _cache().update(move)


# Files that define an OpenVINO model folder's behaviour, in digest order.
OPENVINO_FILES = (
    "openvino_model.xml", "openvino_model.bin",
    "openvino_tokenizer.xml", "openvino_tokenizer.bin",
    "openvino_detokenizer.xml", "openvino_detokenizer.bin",
    "config.json", "generation_config.json", "tokenizer_config.json",
)


def cached_content_digest(path: Path) -> str | None:
    """What `content_digest` would return, if it can say without reading (else None).

    Only stats and the cache: the window asks this to know which checks would read
    whole files, and runs those in the background.
    """
    path = Path(path)
    if not path.is_dir():
        return cached_digest(path)
    lines = []
    for file in (path / name for name in OPENVINO_FILES):
        if file.exists():
            hit = cached_digest(file)
            if hit is None:
                return None
            lines.append(f"{file.name} {hit}\n")
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def content_digest(
    path: Path,
    progress: Progress | None = None,
    cancelled: CancelCheck | None = None,
) -> str:
    """sha256 of a file, or of an OpenVINO folder (a digest over its defining files)."""
    path = Path(path)
    if not path.is_dir():
        return sha256_file(path, progress, cancelled)
    present = [path / name for name in OPENVINO_FILES if (path / name).exists()]
    total = sum(stat_regular(p).size for p in present)
    done = 0
    lines = []
    for file in present:
        size = stat_regular(file).size

        def sub(d: int, _t: int, base: int = done) -> None:
            if progress:
                progress(base + d, total)

        lines.append(f"{file.name} {sha256_file(file, sub, cancelled)}\n")
        done += size
    return hashlib.sha256("".join(lines).encode()).hexdigest()
