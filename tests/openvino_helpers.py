"""Shared set-up for the OpenVINO tests: one build of the OpenVINO default per session.

The build cache is `<pytest basetemp>/openvino-cache` for the session (so the default
is built at most once per test session, by the first test that needs it, through the
real engine process and its progress events). Set VARIANT_STUDIO_OPENVINO_CACHE to
reuse a cache across sessions while developing. This module holds no tests.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from engine.runtime.openvino import build as openvino_build
from engine.curated import openvino_default
from engine.catalog.store import Catalog
from engine.runtime.client import EngineClient
from engine.curated import setup

_FIRST_BUILD: dict[str, Any] = {}


def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's build cache, exported to every engine process through the env."""
    if "cache" not in _FIRST_BUILD:
        external = os.environ.get(openvino_build.CACHE_ENV)
        path = Path(external) if external else tmp_path_factory.getbasetemp() / "openvino-cache"
        os.environ[openvino_build.CACHE_ENV] = str(path)
        _FIRST_BUILD["cache"] = path
        _FIRST_BUILD["external"] = bool(external)
    return _FIRST_BUILD["cache"]


def first_build(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The session's first build of the default (through the engine), with its events."""
    if "result" not in _FIRST_BUILD:
        cache_dir(tmp_path_factory)
        events: list[dict[str, Any]] = []
        client = EngineClient()
        try:
            handle = client.submit("build_openvino_default", {}, events.append)
            _FIRST_BUILD["result"] = handle.wait(1200)
        finally:
            client.close()
        _FIRST_BUILD["events"] = events
    return _FIRST_BUILD


def register_default(catalog: Catalog, tmp_path_factory: pytest.TempPathFactory
                     ) -> dict[str, Any]:
    """Add the OpenVINO default to `catalog` (from the session's build cache)."""
    first_build(tmp_path_factory)
    setup.first_run(catalog)

    def no_build(progress: Any) -> dict[str, Any]:
        raise AssertionError("the OpenVINO default was built twice in one session")

    return openvino_default.ensure_default(catalog, builder=no_build)


class Home:
    """Point VARIANT_STUDIO_HOME at a folder for a module-scoped fixture."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.old = os.environ.get("VARIANT_STUDIO_HOME")
        os.environ["VARIANT_STUDIO_HOME"] = str(path)

    def restore(self) -> None:
        if self.old is None:
            os.environ.pop("VARIANT_STUDIO_HOME", None)
        else:
            os.environ["VARIANT_STUDIO_HOME"] = self.old
