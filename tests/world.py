"""The one test world: a catalog in the module's data directory and what the tests
drive it with, the engine process, the local server and the official `openai` client on
it, each started only when a test first asks for it and stopped once, at the end.

A module says what its world holds with a `Recipe` in `WORLD` (the `world` fixture in
tests/conftest.py reads it; the default is the bare first-run catalog):

    WORLD = Recipe(demo=True)                       # the shipped demo seeded
    WORLD = Recipe(adapters=True)                   # test adapters a, b and variants va..vab
    WORLD = Recipe(openvino=True, adapters=True)    # the same on the OpenVINO default
    WORLD = Recipe(furnish=my_function)             # anything else, on the ready world
    WORLDS = [pytest.param(Recipe(...), id=...), ...]  # each test in each world in turn

The tests then read `world.backend` and `world.base` (the backend and base model the
recipe serves on), `world.catalog`, `world.engine`, `world.server`, `world.openai`,
`world.out` (a scratch folder of the module's own) and `world.extra` (what `furnish`
added).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from engine.catalog.store import Catalog
from engine.curated import embedded, openvino_default, setup
from engine.formats.artifacts import BaseModelInfo
from engine.runtime.client import EngineClient
from engine.serve.config import ServeConfig
from engine.serve.server import ServerThread

TIMEOUT = 300  # the openai client's, per request: a hang bound only


@dataclass(frozen=True)
class Recipe:
    """What a module's world holds (see the module docstring)."""

    demo: bool = False  # the shipped demo adapter and variant
    adapters: bool = False  # tests.engine_helpers.populate (on OpenVINO with `openvino`)
    openvino: bool = False  # the OpenVINO default, from the run's shared build
    max_sessions: int = 4  # the local server's
    furnish: Callable[[World], None] | None = None


class World:
    """One module's catalog, with its engine, server and client started on first use."""

    def __init__(self, catalog: Catalog, out: Path, base_info: BaseModelInfo,
                 max_sessions: int, openvino: bool = False) -> None:
        self.backend = "openvino" if openvino else "llama"
        self.base = openvino_default.NAME if openvino else embedded.DEFAULT_MODEL_NAME
        self.catalog = catalog
        self.out = out
        self.base_info = base_info  # the embedded model's, for adapters made to fit it
        self.extra: dict[str, Any] = {}  # what a recipe's `furnish` added
        self._max_sessions = max_sessions
        self._engine: EngineClient | None = None
        self._server: ServerThread | None = None
        self._openai: openai.OpenAI | None = None

    @property
    def engine(self) -> EngineClient:
        if self._engine is None:
            self._engine = EngineClient()
        return self._engine

    @property
    def server(self) -> ServerThread:
        """The local server on a free loopback port (its own engine process)."""
        if self._server is None:
            self._server = ServerThread(ServeConfig(port=0, max_sessions=self._max_sessions),
                                        self.catalog).start()
        return self._server

    @property
    def openai(self) -> openai.OpenAI:
        if self._openai is None:
            self._openai = openai.OpenAI(base_url=f"{self.server.url}/v1", api_key="unused",
                                         max_retries=0, timeout=TIMEOUT)
        return self._openai

    def close(self) -> None:
        if self._server is not None:
            self._server.stop()
        if self._engine is not None:
            self._engine.close()


def build(recipe: Recipe, tmp_path_factory: pytest.TempPathFactory,
          base_info: BaseModelInfo) -> World:
    """The world of `recipe`, in the data directory the caller has set."""
    catalog = Catalog()
    setup.first_run(catalog, with_demo=recipe.demo)
    world = World(catalog, tmp_path_factory.mktemp("world"), base_info, recipe.max_sessions,
                  recipe.openvino)
    if recipe.openvino:
        from tests.openvino_helpers import openvino_variants, register_default

        register_default(catalog, tmp_path_factory)
        if recipe.adapters:
            openvino_variants(catalog, tmp_path_factory.mktemp("ov-adapters"), base_info)
    elif recipe.adapters:
        from tests.engine_helpers import populate

        populate(catalog, tmp_path_factory.mktemp("adapters"), base_info)
    if recipe.furnish is not None:
        recipe.furnish(world)
    return world
