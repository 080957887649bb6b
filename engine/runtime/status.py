"""What `status` reports: the version, the data directory, the catalog's counts and the
engine's own description of itself."""

from __future__ import annotations

from typing import Any

from engine import __version__
from engine.catalog.store import KINDS, Catalog
from engine.errors import StudioError
from engine.runtime import messages
from engine.runtime.client import EngineClient
from engine.state import paths


def status_info(catalog: Catalog) -> dict[str, Any]:
    data = catalog.data()
    return {
        "version": __version__,
        "data_dir": str(paths.data_dir(create=False)),
        "catalog": {k: len(data[k]) for k in KINDS},
        "engine": engine_description(),
    }


def engine_description() -> dict[str, Any]:
    client = EngineClient()
    try:
        description = client.call(messages.Describe(), timeout=60)
        description["state"] = "running"
        return description
    except StudioError as exc:
        return {"state": "unavailable", "error": exc.message}
    finally:
        client.close()
