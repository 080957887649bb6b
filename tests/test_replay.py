"""Replay: every answer records what regenerates it (generate --json, the local server,
the chat), and replaying a greedy answer is identical; after the adapter behind its
identity changed (another scale, other bytes under the same name, the variant removed)
the verdict says so, and a token changed under the same identity is found where it is.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from engine import cli
from engine.catalog import imports, resolve
from engine.catalog.store import AdapterSpec, Catalog
from engine.curated import demo, setup
from engine.curated.embedded import DEFAULT_MODEL_NAME as BASE
from engine.errors import RefusedError
from engine.runtime import messages, replay
from engine.runtime.client import EngineClient
from engine.state import conversations
from tests import factories as f

VARIANT, ADAPTER = demo.VARIANT_NAME, demo.ADAPTER_NAME
QUESTION = "Set a timer for 12 minutes."
TIMEOUT = 600
GREEDY = {"temperature": 0.0, "repeat_penalty": 1.0, "max_tokens": 32}
# generate --json had these keys before replay records existed; they stay as they were.
GENERATE_KEYS = {"text", "token_ids", "identity", "tokens_per_second", "logprobs",
                 "finish_reason", "name", "backend", "prompt_tokens"}


def demo_catalog() -> Catalog:
    catalog = Catalog()
    setup.first_run(catalog, with_demo=True)
    return catalog


def replayed(client: EngineClient, catalog: Catalog, record: dict[str, Any]
             ) -> dict[str, Any]:
    """What `variant-studio replay` does, through an engine client of the test's."""
    plan = replay.plan(catalog, replay.ReplayRecord.from_dict(record))
    result = client.call(plan.request, TIMEOUT) if plan.request is not None else None
    return replay.verdict(plan, result)


def test_malformed_replay_files_are_refused(studio_home: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture) -> None:
    demo_catalog()
    cases = {
        "not-json.json": b"{not json",
        "no-record.json": b'{"text": "an answer without its record"}',
        "other-format.json": b'{"format": "something-else/1", "token_ids": []}',
    }
    for name, body in cases.items():
        (tmp_path / name).write_bytes(body)
        assert cli.main(["replay", str(tmp_path / name)]) == 3
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1
    # A record whose identity key does not match its parts is refused, not replayed.
    spec = resolve.resolve(Catalog(), VARIANT)
    record = replay.record(spec, messages.Prompt(QUESTION, chat=True),
                           resolve.sampling(Catalog(), VARIANT), [1, 2], [3], ["x"], "x", "eos")
    record["identity"]["key"] = "0" * 64
    with pytest.raises(RefusedError, match="identity key does not match"):
        replay.ReplayRecord.from_dict(record)
    record["identity"]["key"] = spec.identity.key
    record["token_texts"] = ["x", "y"]
    with pytest.raises(RefusedError, match="one text per token id"):
        replay.ReplayRecord.from_dict(record)


@pytest.mark.slow
def test_a_greedy_answer_from_generate_json_replays_identical(
        studio_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    demo_catalog()
    assert cli.main(["generate", VARIANT, "--prompt", QUESTION, "--chat", "--json"]) == 0
    output = capsys.readouterr().out
    answer = json.loads(output)
    assert set(answer) == GENERATE_KEYS | {"replay"}
    record = answer["replay"]
    assert record["format"] == replay.FORMAT and record["token_ids"] == answer["token_ids"]
    assert record["identity"]["key"] == answer["identity"]
    assert record["seed"] == record["sampling"]["seed"]
    # The system prompt it was answered with is pinned (a profile edit must not change
    # what a replay renders).
    assert record["prompt"]["system"] == demo.SYSTEM_PROMPT
    assert "".join(record["token_texts"]) == answer["text"]
    path = tmp_path / "answer.json"
    path.write_text(output)
    assert cli.main(["replay", str(path), "--json"]) == 0
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["verdict"] == "identical" and verdict["identical"] is True
    assert verdict["same_identity"] and verdict["identity_changes"] == []
    assert verdict["expected_tokens"] == verdict["got_tokens"] == len(answer["token_ids"])
    # The record on its own replays as well; the text verdict is one line.
    bare = tmp_path / "record.json"
    bare.write_text(json.dumps(record))
    assert cli.main(["replay", str(bare)]) == 0
    assert capsys.readouterr().out.strip().endswith("regenerated bit for bit")


@pytest.mark.slow
def test_replay_after_the_adapter_behind_the_identity_changed_says_so(
        studio_home: Path, tmp_path: Path, base_info: Any, capsys: pytest.CaptureFixture
        ) -> None:
    catalog = demo_catalog()
    # A variant of our own over a copy of the demo adapter, so it can be re-imported.
    copy = tmp_path / "probe.gguf"
    shutil.copyfile(demo.resources_dir() / demo.SHIPPED_ADAPTER, copy)
    imports.add_adapter(catalog, "probe-lora", BASE, copy)
    catalog.add_variant("probe", BASE, [AdapterSpec("probe-lora", 1.0)],
                        {**demo.DEMO_PROFILE, **GREEDY})
    client = EngineClient()
    try:
        spec = resolve.resolve(catalog, "probe")
        answer = client.call(messages.Generate(spec, messages.Prompt(QUESTION, chat=True),
                                               resolve.sampling(catalog, "probe")), TIMEOUT)
        record = answer["replay"]
        assert answer["text"].startswith('{"tool": "set_timer"')
        assert replayed(client, catalog, record)["identical"]

        # A token changed under the same identity is found where it is.
        tampered = json.loads(json.dumps(record))
        tampered["token_ids"][3] += 1
        found = replayed(client, catalog, tampered)
        assert found["verdict"] == "diverged" and found["first_divergence"]["index"] == 3
        assert found["first_divergence"]["got"]["id"] == record["token_ids"][3]
        assert found["reason"] == "the tokens differ under the same identity"

        # Another scale: the identity differs and the verdict names the change.
        catalog.add_variant("probe", BASE, [AdapterSpec("probe-lora", 0.0)],
                            {**demo.DEMO_PROFILE, **GREEDY}, replace=True)
        found = replayed(client, catalog, record)
        assert found["verdict"] == "diverged" and not found["same_identity"]
        assert found["identity_changes"] == ["adapter probe-lora's scale changed: 1 → 0"]
        assert found["reason"] == "the identity differs: adapter probe-lora's scale " \
                                  "changed: 1 → 0"
        assert found["first_divergence"]["expected"]["id"] == record["token_ids"][
            found["first_divergence"]["index"]]

        # Other bytes under the same name: the adapter's digest changed.
        catalog.remove("probe")
        catalog.remove("probe-lora")
        other = f.write_gguf_lora(tmp_path / "other.gguf", base_info, seed=3, strength=0.1)
        imports.add_adapter(catalog, "probe-lora", BASE, other)
        catalog.add_variant("probe", BASE, [AdapterSpec("probe-lora", 1.0)],
                            {**demo.DEMO_PROFILE, **GREEDY})
        found = replayed(client, catalog, record)
        assert not found["identical"]
        assert len(found["identity_changes"]) == 1
        assert found["identity_changes"][0].startswith("adapter probe-lora's digest changed: "
                                                       f"sha256 {spec.adapters[0].sha256[:12]}")
        assert "digest changed" in found["reason"]
    finally:
        client.close()

    # Gone: nothing to regenerate, and the CLI says why (exit 1, like cmp).
    catalog.remove("probe")
    path = tmp_path / "answer.json"
    path.write_text(json.dumps({"replay": record}))
    assert cli.main(["replay", str(path), "--json"]) == 1
    found = json.loads(capsys.readouterr().out)
    assert found["verdict"] == "unavailable" and found["got_tokens"] is None
    assert found["reason"].startswith("the identity no longer exists: no model, adapter or "
                                      "variant named 'probe'")


@pytest.mark.slow
def test_the_local_server_returns_the_replay_record(studio_home: Path, tmp_path: Path
                                                    ) -> None:
    import openai

    from engine.serve.config import ServeConfig
    from engine.serve.server import ServerThread

    catalog = demo_catalog()
    server = ServerThread(ServeConfig(port=0, max_sessions=2), catalog).start()
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0,
                               timeout=TIMEOUT)
        response = client.chat.completions.create(
            model=VARIANT, messages=[{"role": "user", "content": QUESTION}], temperature=0,
            max_tokens=32)
        body = response.model_dump()
    finally:
        server.stop()
    # The official client keeps the unknown field.
    record = body["variant_studio"]["replay"]
    assert record["text"] == body["choices"][0]["message"]["content"]
    assert len(record["token_ids"]) == body["usage"]["completion_tokens"]
    path = tmp_path / "response.json"
    path.write_text(json.dumps(body))
    loaded = replay.load(path)
    assert loaded.identity.key == record["identity"]["key"]
    engine = EngineClient()
    try:
        assert replayed(engine, catalog, record)["identical"]
    finally:
        engine.close()


@pytest.mark.slow
def test_a_chat_answer_replays_identical_and_old_answers_still_load(window: Any, qtbot: Any
                                                                   ) -> None:
    from PySide6.QtCore import QUrl

    from gui.chat import message_html
    from tests.gui_helpers import LONG

    chat = window.chat
    window.open_chat(VARIANT)
    chat.input.setPlainText(QUESTION)
    with qtbot.waitSignal(chat.answered, timeout=LONG):
        chat.send()
    answer = chat.conversation.messages[-1]
    assert answer.replay is not None and answer.replay["text"] == answer.content
    # Kept with the conversation, and offered as an action on the answer.
    assert conversations.load(chat.conversation.id).messages[-1].replay == answer.replay
    assert "replay:1" in message_html(answer, 1)
    with qtbot.waitSignal(chat.replayed, timeout=LONG) as got:
        chat.transcript.anchorClicked.emit(QUrl("replay:1"))
    assert got.args[0]["verdict"] == "identical"
    assert chat.status.text().startswith("replay: identical")

    # A conversation written before replay records existed loads, without the action.
    old = {"id": "0" * 32, "model": VARIANT, "title": "old", "messages": [
        {"role": "user", "content": "hi", "created_at": 1.0},
        {"role": "assistant", "content": "hello", "model": VARIANT, "identity": "ab" * 32,
         "tokens_per_second": 9.0, "created_at": 2.0, "backend": "llama", "error": None}]}
    conversations.StateFile(conversations._file(old["id"]), dict).save(old)
    loaded = conversations.load(old["id"])
    assert loaded is not None and loaded.messages[1].replay is None
    assert "replay:" not in message_html(loaded.messages[1], 1)
