"""The signature status shown to the user (library, detail pane, `show`), answered
from a verdict cache keyed by content (`<data>/cache/signatures.json`).

Enforcement (imports, the engine, `verify`) never reads this cache: it verifies.
"""

from __future__ import annotations

import contextlib
from typing import Any

from engine.catalog import digest
from engine.catalog.store import Catalog
from engine.catalog.trust.policy import keys_for, policy
from engine.catalog.trust.records import (
    adapter_folder,
    expected,
    provenance_digest,
    verify_adapter,
)
from engine.catalog.trust.trust_list import trusted_keys
from engine.catalog.trust.verify import SIGNATURE_FILE, Verdict, unsigned, verdict_key
from engine.errors import InspectionError, RefusedError
from engine.state import paths
from engine.state.statefile import StateFile

_memo: dict[str, Verdict] = {}
CACHE_ENTRIES = 512


def _cache() -> StateFile:
    return StateFile(paths.data_dir(create=False) / "cache" / "signatures.json", dict)


def status(catalog: Catalog, name: str, cached_only: bool = False) -> Verdict | None:
    """The signature status of adapter `name` for display (library, detail, `show`).

    Answered from a verdict cache keyed by content (see `verify.verdict_key`), so
    showing an unchanged adapter costs stats and a few small reads; enforcement
    (imports, the engine, `verify`) never reads this cache. `cached_only`: None rather
    than verify (which reads every signed file) when the cache has no verdict."""
    record = catalog.adapter(name)
    folder = adapter_folder(record)
    if not (folder / SIGNATURE_FILE).exists():
        return unsigned()
    keys = trusted_keys()
    try:
        key = verdict_key(folder, keys_for(record, keys), provenance_digest(record),
                          expected(record))
    except (RefusedError, InspectionError, OSError):
        key = None
    if key is not None:
        if key in _memo:
            return _memo[key]
        cached = _cache().load().get(key)
        if isinstance(cached, dict):
            with contextlib.suppress(KeyError, TypeError, ValueError):
                verdict = Verdict.from_dict(cached)
                _memo[key] = verdict
                return verdict
    if cached_only:
        return None
    verdict = verify_adapter(catalog, name, keys)
    if key is not None:
        _memo[key] = verdict
        if not digest.is_read_only():
            def remember(cache: dict) -> dict:
                cache[key] = verdict.to_dict()
                while len(cache) > CACHE_ENTRIES:
                    cache.pop(next(iter(cache)))
                return cache

            with contextlib.suppress(OSError):
                _cache().update(remember)
    return verdict


def entry(catalog: Catalog, name: str) -> dict[str, Any]:
    """The `signature` field of `show --json` for an adapter."""
    record = catalog.adapter(name)
    value = policy(catalog)
    verdict = status(catalog, name)
    assert verdict is not None
    out = {**verdict.to_dict(), "policy": value,
           "required": bool(record.get("curated")) or value == "require",
           "recorded": record.get("signature")}
    return out
