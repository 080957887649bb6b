"""Digests: cached by stat, recomputed on change, with progress and cancellation."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from engine.catalog import digest
from engine.errors import Cancelled


def test_digest_matches_hashlib_and_is_cached(studio_home: Path, tmp_path: Path) -> None:
    file = tmp_path / "f.bin"
    file.write_bytes(os.urandom(3 * digest.CHUNK + 5))
    expected = hashlib.sha256(file.read_bytes()).hexdigest()
    seen: list[tuple[int, int]] = []
    assert digest.sha256_file(file, lambda d, t: seen.append((d, t))) == expected
    assert seen[-1] == (file.stat().st_size, file.stat().st_size) and len(seen) == 4
    assert digest.cached_digest(file) == expected


def test_changed_file_is_hashed_again(studio_home: Path, tmp_path: Path) -> None:
    file = tmp_path / "f.bin"
    file.write_bytes(b"one")
    first = digest.sha256_file(file)
    file.write_bytes(b"two!")
    assert digest.cached_digest(file) is None
    assert digest.sha256_file(file) == hashlib.sha256(b"two!").hexdigest() != first


def test_cancel_stops_hashing_and_caches_nothing(studio_home: Path, tmp_path: Path) -> None:
    file = tmp_path / "f.bin"
    file.write_bytes(b"x" * (3 * digest.CHUNK))
    calls = []

    def progress(done: int, total: int) -> None:
        calls.append(done)

    with pytest.raises(Cancelled):
        digest.sha256_file(file, progress, cancelled=lambda: len(calls) >= 1)
    assert calls == [digest.CHUNK]
    assert digest.cached_digest(file) is None
