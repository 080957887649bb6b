"""Conversation records: versions and branches, per-chat settings, rename, search and
exports, and that files written before these fields existed still load."""

from __future__ import annotations

import json
from pathlib import Path

from engine.state import conversations, paths
from engine.state.conversations import ChatMessage, Conversation


def user(text: str) -> ChatMessage:
    return ChatMessage("user", text)


def answer(text: str, seed: int = 0) -> ChatMessage:
    return ChatMessage("assistant", text, model="m", identity="abc" * 20, seed=seed)


def texts(conversation: Conversation) -> list[str]:
    return [m.content for m in conversation.messages]


def test_regenerate_and_edit_keep_every_version_and_switch_between_them(
        studio_home: Path) -> None:
    chat = conversations.new("m").with_messages((user("hi"), answer("one", 1)))
    # Regenerate: a second version of the answer, shown.
    chat = chat.branch(1, (answer("two", 2),))
    assert texts(chat) == ["hi", "two"]
    assert (chat.messages[1].version, chat.messages[1].versions()) == (1, 2)
    chat = chat.with_messages((*chat.messages, user("more"), answer("three")))
    # Edit the first message and send it again: a branch at 0; the old path is kept.
    chat = chat.branch(0, (user("hello"),))
    chat = chat.with_messages((*chat.messages, answer("fresh")))
    assert texts(chat) == ["hello", "fresh"]
    assert (chat.messages[0].version, chat.messages[0].versions()) == (1, 2)
    back = chat.switch(0, 0)
    assert texts(back) == ["hi", "two", "more", "three"]  # the whole old path
    assert texts(back.switch(1, 0))[:2] == ["hi", "one"]
    assert texts(back.switch(1, 0).switch(1, 1)) == ["hi", "two", "more", "three"]
    assert texts(back.switch(0, 1)) == ["hello", "fresh"]
    # Saved and loaded whole.
    conversations.save(back)
    loaded = conversations.load(back.id)
    assert loaded == back
    assert texts(loaded.switch(0, 1)) == ["hello", "fresh"]


def test_an_old_file_still_loads_and_unknown_fields_are_ignored(studio_home: Path) -> None:
    old = {"id": "0" * 32, "model": "m", "title": "Old chat", "created_at": 1.0,
           "updated_at": 2.0,
           "messages": [{"role": "user", "content": "hi", "model": None, "identity": None,
                         "tokens_per_second": None, "created_at": 1.0, "backend": None,
                         "error": None},
                        {"role": "assistant", "content": "hello", "model": "m",
                         "identity": "k", "tokens_per_second": 3.0, "created_at": 1.5,
                         "backend": "llama", "error": None, "from_the_future": 1}]}
    file = paths.conversations_dir() / f"{'0' * 32}.json"
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps(old), encoding="utf-8")
    loaded = conversations.load("0" * 32)
    assert loaded is not None and texts(loaded) == ["hi", "hello"]
    assert loaded.system_prompt is None and loaded.sampling is None
    assert loaded.messages[1].versions() == 1 and loaded.messages[1].seed is None


def test_settings_rename_search_and_exports(studio_home: Path) -> None:
    chat = conversations.new("m").with_messages((user("Tell me about **the sea**"),
                                                 answer("Waves.\n\n```py\nprint(1)\n```")))
    chat = chat.with_settings("Be brief.", {"temperature": 0.5})
    chat = chat.renamed("  The   sea  ")
    assert chat.title == "The sea"
    assert chat.matches("SEA waves") and not chat.matches("mountain")
    conversations.save(chat)
    loaded = conversations.load(chat.id)
    assert loaded.system_prompt == "Be brief." and loaded.sampling == {"temperature": 0.5}
    md = loaded.to_markdown()
    assert md.startswith("# The sea\n") and "- system prompt: Be brief." in md
    assert "## You\n\nTell me about **the sea**" in md and "```py\nprint(1)\n```" in md
    assert "seed 0" in md
    assert json.loads(loaded.to_json())["messages"][1]["content"].startswith("Waves.")
