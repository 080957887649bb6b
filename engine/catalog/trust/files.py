"""Bounded reads and never-replacing writes of this room's small files (key files,
signature bundles, provenance records)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from engine.errors import RefusedError
from engine.formats.safeio import open_regular


def read_small(path: Path, limit: int, what: str) -> bytes:
    """A regular file of at most `limit` bytes (FIFOs, devices and loops refused)."""
    handle, st = open_regular(path)
    with handle:
        if st.size > limit:
            raise RefusedError(f"{what} is {st.size} bytes, more than the {limit} allowed")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise RefusedError(f"{what} grew past {limit} bytes while it was read")
    return data


def write_text_new(path: Path, text: str) -> None:
    """Write `text` to `path`, which must not exist yet (rename of a temp file)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.link(tmp, path)  # fails if `path` appeared meanwhile: nothing is replaced
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
