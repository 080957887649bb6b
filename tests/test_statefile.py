"""Atomic state files: corrupt files are set aside, updates are read-modify-write."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.state import statefile
from engine.state.statefile import StateFile


def test_missing_file_gives_default(tmp_path: Path) -> None:
    assert StateFile(tmp_path / "s.json", dict).load() == {}


def test_update_writes_and_leaves_no_temp_files(tmp_path: Path) -> None:
    state = StateFile(tmp_path / "s.json", dict)
    state.update(lambda d: {**d, "a": 1})
    state.update(lambda d: {**d, "b": 2})
    assert json.loads((tmp_path / "s.json").read_text()) == {"a": 1, "b": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json", "s.json.lock"]


def test_failed_update_changes_nothing(tmp_path: Path) -> None:
    state = StateFile(tmp_path / "s.json", dict)
    state.update(lambda d: {"a": 1})
    before = (tmp_path / "s.json").read_bytes()

    def boom(_: dict) -> dict:
        raise RuntimeError("no")

    with pytest.raises(RuntimeError, match="no"):
        state.update(boom)
    assert (tmp_path / "s.json").read_bytes() == before


def test_corrupt_file_is_set_aside_with_a_notice(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text('{"half": ')
    assert StateFile(path, dict).load() == {}
    aside = [p for p in tmp_path.iterdir() if ".corrupt-" in p.name]
    assert len(aside) == 1 and aside[0].read_text() == '{"half": '
    assert not path.exists()
    assert any("set aside" in n and aside[0].name in n for n in statefile.notices())


def test_wrong_top_level_type_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text("[1, 2]")
    assert StateFile(path, dict).load() == {}
    assert any(".corrupt-" in p.name for p in tmp_path.iterdir())
