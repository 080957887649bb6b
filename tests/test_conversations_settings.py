"""Conversations and settings persist atomically in the data directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import UsageError
from engine.state import conversations, settings
from engine.state.conversations import ChatMessage


def test_conversation_round_trip_and_title(studio_home: Path) -> None:
    conv = conversations.new("va")
    conv = conv.with_messages((ChatMessage("user", "What is a LoRA?\nsecond line"),
                               ChatMessage("assistant", "A low-rank adapter.", model="va",
                                           identity="k" * 64, tokens_per_second=50.0)))
    conversations.save(conv)
    loaded = conversations.load(conv.id)
    assert loaded == conv and loaded.title == "What is a LoRA?"
    other = conversations.new("vb")
    conversations.save(other)
    assert [c.id for c in conversations.list_all("va")] == [conv.id]
    conversations.delete(conv.id)
    assert conversations.load(conv.id) is None


def test_conversation_ids_cannot_escape_the_directory(studio_home: Path) -> None:
    with pytest.raises(UsageError):
        conversations.load("../../catalog")


def test_settings_persist_and_validate(studio_home: Path) -> None:
    assert settings.load().context_size == 4096
    settings.update(default_model="va", threads=2)
    assert settings.load().default_model == "va" and settings.load().threads == 2
    with pytest.raises(UsageError):
        settings.update(context_size=10)
    assert settings.load().context_size == 4096


def test_nonsense_conversation_and_settings_are_set_aside_with_a_notice(
        studio_home: Path) -> None:
    from engine.state import paths, statefile

    statefile.take_notices()
    conv = conversations.new("va")
    path = paths.conversations_dir() / f"{conv.id}.json"
    path.write_text('{"messages": "not a list"}')
    assert conversations.load(conv.id) is None
    assert not path.exists() and list(path.parent.glob(f"{conv.id}.json.corrupt-*"))
    paths.settings_file().write_text('{"threads": 100000}')
    assert settings.load().threads == 0
    notes = statefile.take_notices()
    assert any(conv.id in n for n in notes) and any("settings.json" in n for n in notes)


def test_delete_keeps_the_lock_file(studio_home: Path) -> None:
    conv = conversations.new("va").with_messages((ChatMessage("user", "hi"),))
    conversations.save(conv)
    conversations.delete(conv.id)
    assert conversations.load(conv.id) is None
    from engine.state import paths

    assert (paths.conversations_dir() / f"{conv.id}.json.lock").exists()
