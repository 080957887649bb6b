"""The catalog glue: an adapter's record to what is verified or signed (its store
folder, the digests the catalog recorded, the provenance record, how a backend file
was converted), and what an import brings and keeps of a signature."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.catalog import digest
from engine.catalog.store import Catalog, now_iso
from engine.catalog.trust.derived import Derivation, verify_derived
from engine.catalog.trust.files import read_small
from engine.catalog.trust.keys import private_key_path, public_fingerprint
from engine.catalog.trust.policy import AdapterSigning, keys_for
from engine.catalog.trust.sign import sign_folder
from engine.catalog.trust.trust_list import trusted_keys
from engine.catalog.trust.verify import (
    MAX_PROVENANCE,
    MAX_SIGNATURE,
    PROVENANCE_FILE,
    SIGNATURE_FILE,
    TrustedKey,
    Verdict,
    canonical_sha256,
    check_recorded,
    read_provenance,
    verify_folder,
)
from engine.errors import InspectionError, RefusedError, UnknownNameError


def adapter_folder(record: dict[str, Any]) -> Path:
    """The store folder of an adapter's primary file (what `sign` signs)."""
    return Path(record["path"]).parent


def provenance_digest(record: dict[str, Any]) -> str | None:
    return canonical_sha256(record["provenance"]) if "provenance" in record else None


def expected(record: dict[str, Any]) -> dict[str, str]:
    """The catalog's digests of the signed files: a valid signature over other bytes
    (another signed adapter swapped in) is not this adapter's signature."""
    out = {Path(record["path"]).name: record["sha256"]}
    if record.get("config_sha256"):
        out["adapter_config.json"] = record["config_sha256"]
    return out


def verify_adapter(catalog: Catalog, name: str,
                   keys: Sequence[TrustedKey] | None = None) -> Verdict:
    """A fresh verification of adapter `name`'s primary folder (no cache)."""
    record = catalog.adapter(name)
    folder = adapter_folder(record)
    keys = trusted_keys() if keys is None else keys
    verdict = verify_folder(folder, keys_for(record, keys), provenance_digest(record))
    return check_recorded(verdict, folder, expected(record))


def derivation_of(record: dict[str, Any], entry: dict[str, Any]) -> Derivation | None:
    """How `entry` (one of `record`'s backend files) was converted from the primary
    file, if it was (`converted_from`, recorded by `imports.convert_adapter`)."""
    made = entry.get("converted_from")
    if not isinstance(made, dict) or made.get("sha256") != record["sha256"]:
        return None
    rebase = made.get("rebase")
    return Derivation(record["path"], record["sha256"], int(made["n_head"]),
                      int(made["n_head_kv"]), str(made["architecture"]),
                      (str(rebase[0]), str(rebase[1])) if rebase else None)


def verify_backend_file(catalog: Catalog, name: str, backend: str,
                        keys: Sequence[TrustedKey] | None = None,
                        primary: Verdict | None = None) -> Verdict:
    """The signature status of adapter `name`'s file for `backend`: the primary's, a
    conversion's (re-derived), or the file's own signature in its folder."""
    record = catalog.adapter(name)
    keys = trusted_keys() if keys is None else keys
    if record["backend"] == backend:
        return primary or verify_adapter(catalog, name, keys)
    entry = catalog.adapter_file(name, backend)
    derivation = derivation_of(record, entry)
    if derivation is None:
        folder = Path(entry["path"]).parent
        verdict = verify_folder(folder, keys_for(record, keys))
        return check_recorded(verdict, folder, expected(entry))
    source = primary or verify_adapter(catalog, name, keys)
    return verify_derived(Path(entry["path"]), entry["sha256"], entry.get("config_sha256"),
                          derivation, source)


def session_signing(record: dict[str, Any], backend: str, policy_value: str,
                    keys: Sequence[TrustedKey]) -> AdapterSigning | None:
    """What a SessionSpec carries for adapter `record`'s file for `backend`: None when
    nothing is to be checked (policy off, not curated)."""
    curated = bool(record.get("curated"))
    if policy_value == "off" and not curated:
        return None
    allowed = tuple(k.fingerprint for k in keys_for(record, keys))
    required = curated or policy_value == "require"
    if record["backend"] == backend:
        return AdapterSigning(str(adapter_folder(record)), required, allowed,
                              provenance_digest(record))
    entry = record.get("files", {}).get(backend)
    if entry is None:
        return None  # resolving refuses a missing file before this matters
    derived = derivation_of(record, entry)
    if derived is not None:
        return AdapterSigning(str(adapter_folder(record)), required, allowed,
                              provenance_digest(record), derived)
    return AdapterSigning(str(Path(entry["path"]).parent), required, allowed)


def sign_adapter(catalog: Catalog, name: str, key_name: str) -> Verdict:
    """Sign adapter `name`'s stored files with key `key_name` and record who signed.

    The files must still be the ones the catalog recorded (a changed file is never
    signed), and the catalog's provenance record must equal provenance.json."""
    record = catalog.adapter(name)
    if record.get("curated"):
        raise RefusedError(f"{name} is curated: curated entries are signed with the release "
                           "key, not a user key")
    private = private_key_path(key_name)
    folder = adapter_folder(record)
    for file_name, sha in expected(record).items():
        try:
            current = digest.sha256_file(folder / file_name)
        except InspectionError as exc:
            raise RefusedError(f"adapter {name}: {exc.message}") from None
        if current != sha:
            raise RefusedError(f"adapter {name}: {file_name} changed after import; "
                               "not signing it")
    if "provenance" in record:
        signed = read_provenance(folder)
        if signed is None or canonical_sha256(signed) != provenance_digest(record):
            raise RefusedError(f"adapter {name}: the catalog's provenance record differs "
                               f"from {PROVENANCE_FILE} in the store; not signing it")
    fingerprint = public_fingerprint(key_name)
    files = sign_folder(folder, private)
    entry = {"file": SIGNATURE_FILE, "key": key_name, "fingerprint": fingerprint,
             "signed_at": now_iso(), "files": list(files)}

    def note(data: dict) -> dict:
        if name not in data["adapters"]:
            raise UnknownNameError(f"adapter {name} was removed meanwhile")
        data["adapters"][name]["signature"] = entry
        return data

    catalog.state.update(note)
    return verify_adapter(catalog, name)


# --------------------------------------------------------------------------- imports


def take_signed_files(source: Path, staging: Path,
                      provenance: dict[str, Any] | None) -> dict[str, Any] | None:
    """Bring a signature that arrives with an import into the staging folder.

    `source` is the folder of the adapter being imported: when it holds
    signature.sig, that file and the provenance.json beside it are copied byte for
    byte (their bytes are what was signed). A `provenance` given by the caller must
    then equal that file. Returns the provenance that arrived (parsed), if any."""
    if not (source / SIGNATURE_FILE).exists():
        return None
    data = read_small(source / SIGNATURE_FILE, MAX_SIGNATURE, SIGNATURE_FILE)
    (staging / SIGNATURE_FILE).write_bytes(data)
    if not (source / PROVENANCE_FILE).exists():
        return None
    raw = read_small(source / PROVENANCE_FILE, MAX_PROVENANCE, PROVENANCE_FILE)
    try:
        arrived = json.loads(raw)
    except (ValueError, RecursionError):
        raise RefusedError(f"{PROVENANCE_FILE} beside the signature is not valid JSON") \
            from None
    if not isinstance(arrived, dict):
        raise RefusedError(f"{PROVENANCE_FILE} beside the signature is not a JSON object")
    if provenance is not None and canonical_sha256(arrived) != canonical_sha256(provenance):
        raise RefusedError(f"{PROVENANCE_FILE} beside the signature differs from the "
                           "provenance record given")
    (staging / PROVENANCE_FILE).write_bytes(raw)
    return arrived


def import_record(verdict: Verdict) -> dict[str, Any]:
    """What an adapter record keeps of the signature it arrived with."""
    return {"file": SIGNATURE_FILE, "key": verdict.signer, "fingerprint": verdict.fingerprint,
            "arrived": True, "status_at_import": verdict.status, "checked_at": now_iso(),
            "files": list(verdict.files)}
