"""Where Variant Studio keeps its per-user state.

The data directory follows the platform convention (platformdirs) unless
VARIANT_STUDIO_HOME names another one. Nothing here builds a path from artifact
metadata: store paths are made only from validated catalog names.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Collection
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


def is_valid_name(name: str) -> bool:
    return isinstance(name, str) and bool(_NAME_RE.match(name)) and ".." not in name


def check_name(name: str, what: str = "name") -> str:
    """Validate a catalog name; names become directory names in the store."""
    if not is_valid_name(name):
        raise UsageError(
            f"invalid {what} {name!r}: use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def suggest_name(stem: str, taken: Collection[str] = (), fallback: str = "adapter") -> str:
    """A valid catalog name (see `check_name`) made from a file's stem, not in `taken`.

    ASCII only, because names become directory names in the store: accents are
    dropped ("modèle" -> "modele"), anything else outside letters, digits, '.', '_'
    and '-' becomes '-'; runs of separators collapse (no ".." can appear), the ends
    are trimmed, the first character is a letter or digit, and a taken name gets
    "-2", "-3", ... The one rule shared by the import wizard and "Add base model".
    """
    # NFKD splits "è" into "e" and a combining accent, which is dropped.
    letters = (ch for ch in unicodedata.normalize("NFKD", stem) if not unicodedata.combining(ch))
    cleaned = "".join(ch if (ch.isascii() and ch.isalnum()) or ch in "._-" else "-"
                      for ch in letters)
    cleaned = re.sub(r"\.{2,}", ".", re.sub(r"-{2,}", "-", cleaned)).strip(".-_")
    base = (cleaned or fallback)[:56].rstrip(".-_") or fallback
    if not base[0].isalnum():
        base = "a" + base
    name, n = base, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    return check_name(name)


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


def model_store(name: str) -> Path:
    """The directory holding a downloaded base model's file (other models stay where
    they are)."""
    return data_dir() / "models" / check_name(name, "model name")


def cache_dir(create: bool = True) -> Path:
    path = data_dir(create) / "cache"
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path
