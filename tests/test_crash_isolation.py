"""Crash isolation at the engine level (the GUI half lives with the window's tests).

A native abort in the engine process (here the test-only `abort` request, which calls
os.abort() exactly as a failed GGML_ASSERT does) must not take anything else down: the
request fails with "engine stopped: ... SIGABRT" and the engine's last log lines, the
client reports the crash to whoever listens, the catalog, conversations and settings
on disk are untouched, and the next request starts a fresh engine that serves the same
output as before.

Contract tier (marker `contract`): on the tiny qwen2 model of tests/families.py with its
GGUF adapter, so a round trip costs a second, not the embedded model's load.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.catalog import imports
from engine.catalog.store import AdapterSpec, Catalog
from engine.errors import EngineError
from engine.runtime import messages
from engine.runtime.client import EngineClient
from engine.state import conversations, settings
from engine.state.conversations import ChatMessage
from tests import families
from tests.engine_helpers import request

pytestmark = pytest.mark.contract

TIMEOUT = 300
BASE = "fixture-qwen2"


def small(catalog: Catalog, name: str) -> messages.Generate:
    return request(catalog, name, n_ctx=512, max_tokens=8)  # a small context: quick to create


def state_bytes(home: Path) -> dict[str, bytes]:
    return {str(p.relative_to(home)): p.read_bytes() for p in sorted(home.rglob("*.json"))
            if p.name != "digests.json"}


def test_an_engine_abort_is_reported_and_nothing_is_lost(
        studio_home: Path, family_files: dict[str, families.FamilyFiles]) -> None:
    catalog = Catalog()
    files = family_files["qwen2"]
    imports.add_model(catalog, BASE, files.base("Q8_0"))
    imports.add_adapter(catalog, "a", BASE, files.gguf_adapter)
    catalog.add_variant("va", BASE, [AdapterSpec("a", 1.0)])
    chat = conversations.new("va").with_messages((
        ChatMessage("user", "Hello"), ChatMessage("assistant", "Hi!", model="va")))
    conversations.save(chat)
    settings.update(threads=2)

    states: list[tuple[str, str]] = []
    env = {**os.environ, "VARIANT_STUDIO_TEST_HOOKS": "1"}
    client = EngineClient(env=env, on_state=lambda state, detail: states.append((state, detail)))
    try:
        before = client.call(small(catalog, "va"), timeout=TIMEOUT)
        first_pid = client.pid
        saved = state_bytes(studio_home)
        assert {"catalog.json", "settings.json", f"conversations/{chat.id}.json"} <= set(saved)

        with pytest.raises(EngineError) as info:
            client.call(messages.Abort(), timeout=TIMEOUT)
        error = info.value
        assert error.message.startswith("engine stopped: ")
        assert "SIGABRT" in error.message
        assert any("test hook: aborting" in line for line in error.details), error.details
        assert client.state == "crashed"
        state, detail = states[-1]
        assert state == "crashed" and "SIGABRT" in detail and "last log" in detail

        # Nothing on disk changed, and everything still loads.
        assert state_bytes(studio_home) == saved
        assert Catalog().variant("va")["adapters"] == [{"name": "a", "scale": 1.0}]
        assert conversations.load(chat.id) == chat
        assert settings.load().threads == 2

        # The next request starts a new engine, which serves exactly what the old one did.
        after = client.call(small(catalog, "va"), timeout=TIMEOUT)
        assert after["token_ids"] == before["token_ids"]
        assert client.pid != first_pid and client.starts == 2 and client.state == "running"
        assert [s for s, _ in states] == ["running", "crashed", "running"]
    finally:
        client.close()


def test_the_abort_hook_is_off_unless_the_test_environment_enables_it(
        studio_home: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "VARIANT_STUDIO_TEST_HOOKS"}
    client = EngineClient(env=env)
    try:
        with pytest.raises(EngineError) as info:
            client.call(messages.Abort(), timeout=TIMEOUT)
        assert info.value.message == "unknown engine request 'abort'"
        assert client.call(messages.Ping(), timeout=TIMEOUT)["pid"] == client.pid
        assert client.starts == 1
    finally:
        client.close()
