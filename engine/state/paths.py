"""Where Variant Studio keeps its per-user state.

The data directory follows the platform convention (platformdirs) unless
VARIANT_STUDIO_HOME names another one. Nothing here builds a path from artifact
metadata: store paths are made only from validated catalog names.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import platformdirs

from engine.errors import UsageError

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def data_dir(create: bool = True) -> Path:
    """The data directory (created if missing, unless `create` is False: a read-only
    command must leave a fresh machine as it found it)."""
    override = os.environ.get("VARIANT_STUDIO_HOME")
    path = Path(override) if override else Path(platformdirs.user_data_dir("variant-studio"))
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def check_name(name: str, what: str = "name") -> str:
    """Validate a catalog name; names become directory names in the store."""
    if not isinstance(name, str) or not _NAME_RE.match(name) or ".." in name:
        raise UsageError(
            f"invalid {what} {name!r}: use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def catalog_file() -> Path:
    return data_dir(create=False) / "catalog.json"


def settings_file() -> Path:
    return data_dir(create=False) / "settings.json"


def digest_cache_file() -> Path:
    return data_dir(create=False) / "digests.json"


def conversations_dir() -> Path:
    path = data_dir() / "conversations"
    path.mkdir(parents=True, exist_ok=True)
    return path


def adapter_store(name: str) -> Path:
    """The directory holding the stored copy of adapter `name`."""
    return data_dir() / "adapters" / check_name(name, "adapter name")


def cache_dir(create: bool = True) -> Path:
    path = data_dir(create) / "cache"
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path
