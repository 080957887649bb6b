"""What a verdict means for loading: the catalog's signature policy (`off`, `warn`,
`require`) and the gate rules built on it.

A curated entry needs a valid signature by the shipped release key, whatever the
policy; under `require` any adapter needs one by a trusted key; under `warn` an
unsigned or invalid one is loaded with a warning. Applied at import here
(`check_import`) and again by the engine before a session opens, from what
`AdapterSigning` tells it (`engine.runtime.signing`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.catalog.store import Catalog
from engine.catalog.trust.derived import Derivation
from engine.catalog.trust.trust_list import trusted_keys
from engine.catalog.trust.verify import (
    SIGNATURE_FILE,
    TrustedKey,
    Verdict,
    canonical_sha256,
    check_recorded,
    verify_folder,
)
from engine.errors import RefusedError, UsageError

POLICIES = ("off", "warn", "require")
DEFAULT_POLICY = "off"


def policy(catalog: Catalog) -> str:
    value = catalog.data().get("signatures", {}).get("policy", DEFAULT_POLICY)
    return value if value in POLICIES else "require"  # an unknown value fails closed


def set_policy(catalog: Catalog, value: str) -> None:
    if value not in POLICIES:
        raise UsageError(f"unknown policy {value!r} (off, warn or require)")

    def change(data: dict) -> dict:
        data.setdefault("signatures", {})["policy"] = value
        return data

    catalog.state.update(change)


def keys_for(record: dict[str, Any], keys: Sequence[TrustedKey]) -> list[TrustedKey]:
    """The keys that may sign `record`: only the shipped key for a curated entry."""
    if record.get("curated"):
        return [k for k in keys if k.shipped]
    return list(keys)


@dataclass(frozen=True)
class AdapterSigning:
    """What the engine needs to check one adapter's signature at session open."""

    folder: str  # the signed folder (holding signature.sig)
    required: bool  # refuse unless valid (policy require, or a curated entry)
    keys: tuple[str, ...]  # fingerprints of the keys that may sign it
    provenance_sha256: str | None = None  # the catalog's record, canonical JSON
    derived: Derivation | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"folder": self.folder, "required": self.required, "keys": list(self.keys),
                "provenance_sha256": self.provenance_sha256,
                "derived": self.derived.to_dict() if self.derived else None}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> AdapterSigning:
        derived = data.get("derived")
        return AdapterSigning(str(data["folder"]), bool(data["required"]),
                              tuple(str(k) for k in data.get("keys") or ()),
                              data.get("provenance_sha256"),
                              Derivation.from_dict(derived) if derived else None)


# --------------------------------------------------------------------------- imports


def check_import(catalog: Catalog, name: str, folder: Path, *, curated: bool,
                 provenance: dict[str, Any] | None, expect: dict[str, str]
                 ) -> Verdict | None:
    """Apply the catalog's policy to an adapter being imported (its staged folder).

    A curated entry needs a valid signature by the shipped release key, whatever the
    policy; under `require` any adapter needs one by a trusted key (refused with the
    reason otherwise); under `warn` the verdict is returned for a warning. None when
    nothing was checked (policy off, no signature arrived)."""
    value = policy(catalog)
    arrived = (folder / SIGNATURE_FILE).exists()
    if value == "off" and not curated and not arrived:
        return None
    record = {"curated": curated}
    verdict = verify_folder(folder, keys_for(record, trusted_keys()),
                            canonical_sha256(provenance) if provenance is not None else None)
    verdict = check_recorded(verdict, folder, expect)
    if verdict.ok:
        return verdict
    if curated:
        raise RefusedError(f"curated adapter {name}: {verdict.reason}; curated entries need "
                           "a valid signature by the shipped release key")
    if value == "require":
        raise RefusedError(f"adapter {name} refused by the signature policy (require): "
                           f"{verdict.reason}")
    return verdict


def import_check_row(verdict: Verdict, policy_value: str) -> dict[str, str]:
    """The import's `signature` check (shown with the other checks at import)."""
    status = "pass" if verdict.ok else "warn"
    where = "" if verdict.ok or policy_value == "off" else f" (policy {policy_value})"
    return {"name": "signature", "status": status, "detail": verdict.reason + where}


# --------------------------------------------------------------------------- show


def check_row(verdict: Verdict, required: bool, policy_value: str) -> dict[str, str] | None:
    """A `signature` row for `show`'s checks: none for an unsigned adapter under `off`."""
    if verdict.ok:
        return {"name": "signature", "status": "pass", "detail": verdict.reason}
    if verdict.status == "unsigned" and policy_value == "off" and not required:
        return None
    failing = required or verdict.status == "invalid"
    return {"name": "signature", "status": "fail" if failing else "warn",
            "detail": verdict.reason + (f" (policy {policy_value})"
                                        if policy_value != "off" else "")}
