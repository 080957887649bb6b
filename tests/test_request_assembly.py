"""One request assembly (`engine.runtime.assembly`) behind every front end: a name and
the settings give the same identity, context and sampling in the chat, Compare, the
CLI and the local server, including a plain base served with the Settings' context
size; and assembling a request reads the catalog once (again only after it changed).
No model runs: each front end's request is taken where it would go to the engine."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.catalog import resolve
from engine.catalog.store import AdapterSpec, Catalog
from engine.cli import run_cmds
from engine.cli.parser import build_parser
from engine.curated import demo, setup
from engine.curated.demo import VARIANT_NAME
from engine.curated.embedded import DEFAULT_MODEL_NAME as BASE
from engine.runtime import assembly, messages
from engine.serve.app import create_app
from engine.serve.config import ServeConfig
from engine.serve.errors import ApiError
from engine.state import settings
from engine.state.statefile import StateFile


class CapturingBridge:
    """The server's way to the engine, taking each request instead of running it."""

    def __init__(self) -> None:
        self.requests: list[messages.Request] = []
        self.in_flight = self.served = 0

    def check_capacity(self) -> None:
        pass

    def engine_running(self) -> bool:
        return True

    @contextlib.asynccontextmanager
    async def stream(self, request: messages.Request) -> AsyncIterator[Any]:
        self.requests.append(request)
        raise ApiError(503, "taken by the test", None, "captured")
        yield  # pragma: no cover


def served(catalog: Catalog, name: str) -> messages.Generate:
    """The request the local server builds for a chat completion of `name`."""
    from starlette.testclient import TestClient

    bridge = CapturingBridge()
    app = create_app(ServeConfig(), bridge, catalog)  # type: ignore[arg-type]
    with TestClient(app, base_url="http://127.0.0.1") as http:
        answer = http.post("/v1/chat/completions", json={
            "model": name, "messages": [{"role": "user", "content": "Hello"}]})
    assert answer.status_code == 503, answer.text
    (request,) = bridge.requests
    assert isinstance(request, messages.Generate)
    return request


def cli(catalog: Catalog, *argv: str) -> messages.Generate:
    """The request `variant-studio generate|compare ...` sends."""
    args = build_parser().parse_args(list(argv))
    kind = messages.Compare if args.command == "compare" else messages.Generate
    return run_cmds.request(kind, catalog, args)


def test_a_name_and_settings_give_one_identity_in_every_front_end(window, qtbot,
                                                                   monkeypatch) -> None:
    from gui.engine_client import Reply

    settings.update(context_size=2048)  # Settings: "Context size (base models)"
    taken: list[messages.Request] = []

    def submit(request: messages.Request) -> Reply:
        taken.append(request)
        return Reply(window.client, request)

    monkeypatch.setattr(window.client, "submit", submit)
    catalog = Catalog()

    # The chat: a plain base, then the variant.
    chat: dict[str, messages.Generate] = {}
    for name in (BASE, VARIANT_NAME):
        window.open_chat(name)
        window.chat.input.setPlainText("Hello")
        window.chat.send()
        chat[name] = taken.pop()
        assert window.chat._spec().identity == chat[name].spec.identity  # the header's
        window.chat.reply.stop()
        window.chat._abandon()
    # Compare: the variant.
    window.compare.select_variant(VARIANT_NAME)
    window.compare.prompt.setPlainText("Hello")
    window.compare.run()
    compared = taken.pop()
    assert isinstance(compared, messages.Compare)
    window.compare.stop()

    for name in (BASE, VARIANT_NAME):
        by_front_end = {"chat": chat[name], "cli": cli(catalog, "generate", name,
                                                         "--prompt", "Hello"),
                        "server": served(catalog, name)}
        if name == VARIANT_NAME:
            by_front_end["compare"] = compared
            by_front_end["cli compare"] = cli(catalog, "compare", name, "--prompt", "Hello")
        keys = {front: r.spec.identity.key for front, r in by_front_end.items()}
        assert len(set(keys.values())) == 1, keys
        assert keys["chat"] == resolve.identity(catalog, name).key  # `show` says the same
        # What the front ends leave to the profile is the profile's in each of them.
        assert chat[name].sampling == by_front_end["cli"].sampling == \
            by_front_end["server"].sampling
    base_spec = chat[BASE].spec
    assert base_spec.identity.context.n_ctx == 2048  # the Settings' size, everywhere
    variant = chat[VARIANT_NAME].spec.identity
    assert variant.context.n_ctx == catalog.variant(VARIANT_NAME)["profile"]["n_ctx"]
    # Compare's base side runs in the variant's context: another identity than the
    # base's own chat, by design (both sides of a comparison compute alike).
    assert compared.spec.base_spec().identity == variant.base_only()


def count_reads(monkeypatch: pytest.MonkeyPatch, path: Path) -> list[int]:
    """A list that grows by one at every read of the state file at `path`."""
    reads: list[int] = []
    original = StateFile.load

    def load(self: StateFile) -> Any:
        if self.path == path:
            reads.append(1)
        return original(self)

    monkeypatch.setattr(StateFile, "load", load)
    return reads


@pytest.fixture
def catalog(studio_home: Path) -> Iterator[Catalog]:
    catalog = Catalog()
    setup.first_run(catalog, with_demo=True)
    catalog.add_variant("v", BASE, [AdapterSpec(demo.ADAPTER_NAME, 0.5)])
    yield catalog


def test_resolving_and_assembling_read_the_catalog_once(
        catalog: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    reads = count_reads(monkeypatch, catalog.state.path)
    fresh = Catalog()  # as a CLI command makes one
    resolve.resolve(fresh, "v")
    assert len(reads) == 1  # was 11 when every lookup parsed the file again
    assembly.request(Catalog(), "v", messages.Prompt("Hi"), max_tokens=4)
    assert len(reads) == 2  # a whole request: one more read, for its own Catalog
    # A long-lived Catalog (the window's, the server's) reads again only after a change.
    for _ in range(3):
        assembly.request(fresh, "v", messages.Prompt("Hi"))
        resolve.identity(fresh, BASE)
    assert len(reads) == 2
    fresh.add_variant("w", BASE, [AdapterSpec(demo.ADAPTER_NAME, 1.0)])
    before = len(reads)
    assert assembly.spec(fresh, "w").name == "w"
    assembly.spec(fresh, "v")
    assert len(reads) - before <= 2  # the write's own read, then one for the change


def test_a_change_made_elsewhere_is_seen_at_the_next_snapshot(catalog: Catalog) -> None:
    mine, theirs = Catalog(), Catalog()
    scale = resolve.identity(mine, "v").adapters[0].scale
    theirs.state.update(lambda data: {**data, "variants": {**data["variants"], "v": {
        **data["variants"]["v"], "adapters": [{"name": demo.ADAPTER_NAME,
                                               "scale": 0.25}]}}})
    assert scale == 0.5 and resolve.identity(mine, "v").adapters[0].scale == 0.25
    snapshot = mine.snapshot()
    assert snapshot.snapshot() is snapshot and mine.snapshot() is snapshot  # unchanged
    settings.update(context_size=1024)
    assert mine.snapshot().base_n_ctx == 1024  # a Settings change is a new snapshot too
    assert resolve.identity(mine, BASE).context.n_ctx == 1024


def test_a_wrong_setting_is_told_apart_from_a_name_that_cannot_be_served(
        catalog: Catalog) -> None:
    with pytest.raises(assembly.SettingError, match="temperature"):
        assembly.request(catalog, "v", messages.Prompt("Hi"), temperature=9.0)
    with pytest.raises(Exception) as raised:
        assembly.request(catalog, "nope", messages.Prompt("Hi"))
    assert not isinstance(raised.value, assembly.SettingError)
