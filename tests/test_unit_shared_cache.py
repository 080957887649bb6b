"""The tests' shared artifact cache (tests/shared_cache.py): an artifact is built once per
key and reused, a failed build leaves nothing behind, and a new key prunes old keys only
when no process holds them and they have not been used lately."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests import shared_cache

pytestmark = pytest.mark.unit


def test_an_artifact_is_built_once_per_key_and_reused(tmp_path: Path) -> None:
    builds: list[Path] = []

    def build(folder: Path) -> None:
        builds.append(folder)
        (folder / "out.txt").write_text("built")

    first = shared_cache.shared(tmp_path, "k1", build)
    again = shared_cache.shared(tmp_path, "k1", build)
    assert first == again == tmp_path / "k1" and len(builds) == 1
    assert (first / "out.txt").read_text() == "built"
    assert builds[0] != first  # built in a staging folder, published by a rename
    assert shared_cache.spent() > 0


def test_a_failed_build_leaves_nothing(tmp_path: Path) -> None:
    def broken(folder: Path) -> None:
        (folder / "half.txt").write_text("half")
        raise RuntimeError("the build broke")

    with pytest.raises(RuntimeError, match="the build broke"):
        shared_cache.shared(tmp_path, "k1", broken)
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == []


def test_old_keys_are_pruned_unless_held_or_used_lately(tmp_path: Path) -> None:
    def build(folder: Path) -> None:
        (folder / "x").write_text("x")

    old, recent = tmp_path / "old", tmp_path / "recent"
    for stale in (old, recent):
        stale.mkdir()
        (tmp_path / f"{stale.name}.inuse").touch()
    long_ago = time.time() - shared_cache.KEEP_UNUSED_S - 60
    for path in (old, tmp_path / "old.inuse"):
        os.utime(path, (long_ago, long_ago))
    (tmp_path / ".building-crashed").mkdir()  # a crashed build's staging folder

    shared_cache.shared(tmp_path, "new", build)  # this process now holds "new"
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["new", "recent"]
    # "new" is held by this process: a build of another key keeps it even once old.
    os.utime(tmp_path / "new", (long_ago, long_ago))
    os.utime(tmp_path / "new.inuse", (long_ago, long_ago))
    shared_cache.shared(tmp_path, "newer", build)
    assert (tmp_path / "new").is_dir()


def test_a_key_digests_its_sources(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "a.py").write_text("A = 1\n")
    before = shared_cache.digest(source, "v1")
    assert shared_cache.digest(source, "v1") == before
    (source / "a.py").write_text("A = 2\n")
    assert shared_cache.digest(source, "v1") != before
    assert shared_cache.digest(source, "v2") != shared_cache.digest(source, "v1")
