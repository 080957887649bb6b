"""The pure verifier: a folder's files, its `signature.sig` and the keys allowed to
sign it, to a `Verdict`.

It reads only the files it is given and the keys it is handed: no catalog record, no
trust list, no policy (the catalog glue in `records` and the engine's gate in
`engine.runtime.signing` bring those). Of the rest of the catalog it uses content
digests (`engine.catalog.digest`) alone; tests/test_code_rules.py holds this.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.catalog import digest
from engine.catalog.trust.files import read_small
from engine.errors import InspectionError, RefusedError
from engine.formats.safeio import printable

SIGNATURE_FILE = "signature.sig"
PROVENANCE_FILE = "provenance.json"
# Every file of a store folder the app reads; all that are present must be signed.
READ_FILES = ("adapter.gguf", "adapter_model.safetensors", "adapter_config.json",
              PROVENANCE_FILE)
MAX_SIGNATURE = 1 << 20  # a bundle is a few KiB; anything larger is refused unread
MAX_PROVENANCE = 8 << 20


# --------------------------------------------------------------------------- values


@dataclass(frozen=True)
class TrustedKey:
    """A public key the user trusts, as it travels to the engine."""

    name: str
    fingerprint: str  # sha256 of `pem` (model-signing's key hint)
    pem: str
    shipped: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "fingerprint": self.fingerprint, "pem": self.pem,
                "shipped": self.shipped}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> TrustedKey:
        return TrustedKey(str(data["name"]), str(data["fingerprint"]), str(data["pem"]),
                          bool(data.get("shipped", False)))


@dataclass(frozen=True)
class Verdict:
    """The outcome of checking one signature: valid, unsigned or invalid."""

    status: str  # "valid" | "unsigned" | "invalid"
    reason: str  # one line
    signer: str | None = None  # the trusted key's name
    fingerprint: str | None = None  # of the key the signature names
    files: tuple[str, ...] = ()  # the files the signature covers
    derived: bool = False  # valid through re-deriving a converted file

    @property
    def ok(self) -> bool:
        return self.status == "valid"

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "reason": self.reason, "signer": self.signer,
                "fingerprint": self.fingerprint, "files": list(self.files),
                "derived": self.derived}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Verdict:
        return Verdict(str(data["status"]), str(data["reason"]), data.get("signer"),
                       data.get("fingerprint"), tuple(data.get("files") or ()),
                       bool(data.get("derived", False)))

    def label(self) -> str:
        """Short text for a badge or a table cell."""
        if self.ok:
            return f"signed · {self.signer}"
        return "unsigned" if self.status == "unsigned" else "signature invalid"


def unsigned() -> Verdict:
    return Verdict("unsigned", f"no {SIGNATURE_FILE}: the adapter is not signed")


# --------------------------------------------------------------------------- the files


def canonical_sha256(value: Any) -> str:
    """sha256 of a JSON value in canonical form (sorted keys, no spaces)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def read_provenance(folder: Path) -> Any:
    """The provenance.json of a folder, parsed (bounded); None when there is none."""
    path = folder / PROVENANCE_FILE
    if not path.exists():
        return None
    try:
        return json.loads(read_small(path, MAX_PROVENANCE, PROVENANCE_FILE))
    except (ValueError, RecursionError):
        raise RefusedError(f"{PROVENANCE_FILE} is not valid JSON") from None


def read_files(folder: Path) -> list[str]:
    """The files of `folder` the app reads (a dangling link counts: it must be signed)."""
    return [name for name in READ_FILES if (folder / name).exists()
            or (folder / name).is_symlink()]


def hashing_config(ignore: Iterable[str]) -> Any:
    """model-signing's hashing as both signing and verifying use it."""
    from model_signing import hashing

    return (hashing.Config()
            .use_file_serialization(hashing_algorithm="sha256", allow_symlinks=False)
            .set_ignored_paths(paths=sorted(set(ignore)), ignore_git_paths=False))


# --------------------------------------------------------------------------- verify


@dataclass(frozen=True)
class _Bundle:
    """What a signature file claims, read before (and to explain) verification."""

    raw: bytes
    hint: str | None
    files: dict[str, str] = field(default_factory=dict)  # name -> sha256 hex


def _parse_bundle(raw: bytes) -> _Bundle:
    """The key hint and the signed files of a bundle: a claim until verified."""
    try:
        bundle = json.loads(raw)
        hint = bundle["verificationMaterial"]["publicKey"].get("hint")
        payload = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"],
                                              validate=True))
        files = {str(r["name"]): str(r["digest"]) for r in payload["predicate"]["resources"]}
    except (ValueError, RecursionError, KeyError, TypeError, AttributeError, binascii.Error):
        raise RefusedError("the signature file is malformed") from None
    return _Bundle(raw, hint if isinstance(hint, str) and hint else None, files)


def verify_folder(folder: Path, keys: Sequence[TrustedKey],
                  provenance_sha256: str | None = None) -> Verdict:
    """Check `folder/signature.sig` against `keys` (the ones allowed to sign it).

    Valid needs: a key among `keys` made it (found by the signature's key hint), every
    signed file present and unchanged, every file the app reads covered, and
    `provenance_sha256` (the catalog's record, when given) equal to the signed
    provenance.json. Nothing is cached here."""
    folder = Path(folder)
    path = folder / SIGNATURE_FILE
    if not path.exists() and not path.is_symlink():
        return unsigned()
    try:
        bundle = _parse_bundle(read_small(path, MAX_SIGNATURE, SIGNATURE_FILE))
    except (RefusedError, InspectionError) as exc:
        return Verdict("invalid", exc.message)
    if bundle.hint is None:
        return Verdict("invalid", "the signature names no key")
    key = next((k for k in keys if k.fingerprint == bundle.hint), None)
    if key is None:
        return Verdict("invalid", f"signed by a key that is not trusted here (fingerprint "
                       f"{bundle.hint[:16]}…)", fingerprint=bundle.hint)
    named = {"signer": key.name, "fingerprint": key.fingerprint}
    problem = _library_verify(folder, key, bundle)
    if problem is not None:
        return Verdict("invalid", _explain(folder, bundle) or problem, **named)
    uncovered = [n for n in read_files(folder) if n not in bundle.files]
    if uncovered:
        return Verdict("invalid", f"{', '.join(uncovered)} not covered by the signature "
                       "(added after signing?)", **named)
    if provenance_sha256 is not None:
        try:
            signed = read_provenance(folder)
        except (RefusedError, InspectionError) as exc:
            return Verdict("invalid", exc.message, **named)
        if signed is None or canonical_sha256(signed) != provenance_sha256:
            return Verdict("invalid", "the catalog's provenance record differs from the "
                           f"signed {PROVENANCE_FILE}", **named)
    files = tuple(sorted(bundle.files))
    return Verdict("valid", f"signed by {key.name}: {', '.join(files)} unchanged",
                   files=files, **named)


def _library_verify(folder: Path, key: TrustedKey, bundle: _Bundle) -> str | None:
    """model-signing's own verification of the bytes we parsed; None when it passes."""
    from model_signing import verifying

    with tempfile.TemporaryDirectory(prefix="variant-studio-verify-") as tmp:
        sig = Path(tmp) / SIGNATURE_FILE
        sig.write_bytes(bundle.raw)  # verify exactly the bytes that were parsed
        public = key_file(key, Path(tmp))
        try:
            (verifying.Config().use_elliptic_key_verifier(public_key=public)
             .set_hashing_config(hashing_config([SIGNATURE_FILE]))
             .set_ignore_unsigned_files(True)
             .verify(folder, sig))
        except Exception as exc:  # the library raises ValueError, KeyError, InvalidSignature...
            return (f"the signature does not verify with key {key.name} "
                    f"({type(exc).__name__})")
    return None


def key_file(key: TrustedKey, folder: Path) -> Path:
    path = folder / f"{key.fingerprint[:16]}.pub"
    path.write_text(key.pem, encoding="ascii")
    return path


def _explain(folder: Path, bundle: _Bundle) -> str | None:
    """Which files differ from what the signature lists (its claim, for the reason)."""
    changed, missing = [], []
    for name, expected in sorted(bundle.files.items()):
        if name not in READ_FILES:  # an unverified claim: never hash a path it names
            continue
        path = folder / name
        if not path.is_file():
            missing.append(name)
            continue
        try:
            actual = digest.hash_uncached(path)[0]
        except InspectionError:
            missing.append(name)
            continue
        if actual != expected:
            changed.append(name)
    parts = []
    if changed:
        were = "it was" if len(changed) == 1 else "they were"
        parts.append(f"{', '.join(changed)} changed since {were} signed")
    if missing:
        parts.append(f"{', '.join(missing)} missing")
    foreign = [printable(n, 80) for n in sorted(bundle.files) if n not in READ_FILES]
    if foreign:
        parts.append(f"it signs {', '.join(foreign[:4])}, which a stored adapter does not "
                     "have")
    uncovered = [n for n in read_files(folder) if n not in bundle.files]
    if uncovered and parts:
        parts.append(f"{', '.join(uncovered)} not covered by the signature")
    return "; ".join(parts) or None


# --------------------------------------------------------------------------- recorded files


def check_recorded(verdict: Verdict, folder: Path, expect: dict[str, str]) -> Verdict:
    """`verdict`, made invalid when a signed file is not the one the catalog recorded."""
    if not verdict.ok:
        return verdict
    for name, sha in expect.items():
        try:
            actual = digest.sha256_file(folder / name)
        except InspectionError:
            actual = None
        if actual != sha:
            return Verdict("invalid", f"the signed {name} is not the file the catalog "
                           "recorded", verdict.signer, verdict.fingerprint, verdict.files)
    return verdict


def verdict_key(folder: Path, keys: Sequence[TrustedKey], provenance: str | None,
                expect: dict[str, str], extra: Any = None) -> str:
    """A key for a verdict: the signature's bytes, the content digest of every file the
    app reads (stat-keyed digest cache), the keys and the catalog's digests."""
    sig = hashlib.sha256(read_small(folder / SIGNATURE_FILE, MAX_SIGNATURE,
                                    SIGNATURE_FILE)).hexdigest()
    files = [[n, digest.sha256_file(folder / n)] for n in read_files(folder)]
    material = [str(folder), sig, files, sorted(k.fingerprint for k in keys), provenance,
                sorted(expect.items()), extra]
    return canonical_sha256(material)
