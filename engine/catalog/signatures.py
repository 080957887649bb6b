"""Adapter signatures with OpenSSF `model-signing`: keys, the trust list, the policy.

What is signed is an adapter's folder in the store, restricted to the files the app
reads: its weights (`adapter.gguf`, or `adapter_model.safetensors` with
`adapter_config.json`) and its provenance record (`provenance.json`) when it has
one. The signature (`signature.sig`, a Sigstore bundle whose DSSE envelope holds an
in-toto statement listing each signed file's sha256) sits beside them. Verification
needs every signed file present and unchanged, and refuses a signature that leaves out
a file the app reads (a `provenance.json` added after signing is not trusted). The
catalog's own copy of the provenance record must equal the signed file.

A signature arrives with an import as `signature.sig` in the adapter's own folder
(beside the GGUF file, or inside the PEFT folder), with the signed `provenance.json`
beside it: exactly the layout of a store folder, so a signed store folder can be
handed to someone else as it is. Keys are ECDSA P-256 (the library has no Ed25519);
a key is named, in the trust list, by its fingerprint: the sha256 of its PEM
SubjectPublicKeyInfo, which is also the key hint model-signing writes into a
signature. The shipped release key (resources/keys/release.pub) is always trusted,
and it is the only key a curated entry may be signed with.

The engine re-verifies at session open from what the SessionSpec carries
(`AdapterSigning`, the trusted keys as PEM): see `engine.runtime.signing`.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.catalog import digest
from engine.catalog.store import Catalog, now_iso
from engine.errors import InspectionError, RefusedError, UnknownNameError, UsageError
from engine.formats.safeio import open_regular, printable
from engine.state import paths
from engine.state.statefile import StateFile, add_notice

SIGNATURE_FILE = "signature.sig"
PROVENANCE_FILE = "provenance.json"
# Every file of a store folder the app reads; all that are present must be signed.
READ_FILES = ("adapter.gguf", "adapter_model.safetensors", "adapter_config.json",
              PROVENANCE_FILE)
POLICIES = ("off", "warn", "require")
DEFAULT_POLICY = "off"
RELEASE_KEY = "release"
CURVES = ("secp256r1", "secp384r1", "secp521r1")  # what model-signing accepts
MAX_SIGNATURE = 1 << 20  # a bundle is a few KiB; anything larger is refused unread
MAX_PROVENANCE = 8 << 20
MAX_KEY_FILE = 64 << 10


def release_key_path() -> Path:
    """The shipped release public key (resources/keys/release.pub in the source tree)."""
    return Path(__file__).resolve().parents[2] / "resources" / "keys" / "release.pub"


def keys_dir(create: bool = False) -> Path:
    """`<data>/keys/`: the user's own key pairs (private keys 0600, the folder 0700)."""
    path = paths.data_dir(create) / "keys"
    if create:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def trust_dir(create: bool = False) -> Path:
    """`<data>/trusted/`: the trust list, one normalised PEM public key per name."""
    path = paths.data_dir(create) / "trusted"
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


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
class Derivation:
    """The served file is this signed file converted for another backend
    (`imports.convert_adapter`); the engine converts the signed file again and
    compares digests, so the conversion is covered by the source's signature."""

    source: str  # the signed weights file
    sha256: str
    n_head: int
    n_head_kv: int
    architecture: str
    rebase: tuple[str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "sha256": self.sha256, "n_head": self.n_head,
                "n_head_kv": self.n_head_kv, "architecture": self.architecture,
                "rebase": list(self.rebase) if self.rebase else None}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Derivation:
        rebase = data.get("rebase")
        return Derivation(str(data["source"]), str(data["sha256"]), int(data["n_head"]),
                          int(data["n_head_kv"]), str(data["architecture"]),
                          (str(rebase[0]), str(rebase[1])) if rebase else None)


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


# --------------------------------------------------------------------------- keys


def public_key_pem(data: bytes, what: str) -> tuple[str, str]:
    """(normalised PEM, fingerprint) of an ECDSA P-256/384/521 public key in PEM.

    Anything else (not PEM, a private key, an RSA or Ed25519 key, another curve) is a
    `RefusedError` that names what it is, never the key material."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    if b"PRIVATE KEY" in data:
        raise RefusedError(f"{what} holds a private key; give the public key (never share "
                           "a private key)")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise RefusedError(f"{what} is not a PEM public key") from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        kind = type(key).__name__.removesuffix("PublicKey").lstrip("_") or "non-EC"
        raise RefusedError(f"{what} is an {kind} key; model-signing verifies ECDSA keys "
                           "(P-256, P-384, P-521)")
    if key.curve.name not in CURVES:
        raise RefusedError(f"{what} is an EC key on {key.curve.name}; model-signing takes "
                           "P-256, P-384 or P-521")
    pem = key.public_bytes(serialization.Encoding.PEM,
                           serialization.PublicFormat.SubjectPublicKeyInfo)
    return pem.decode("ascii"), hashlib.sha256(pem).hexdigest()


def _read_small(path: Path, limit: int, what: str) -> bytes:
    """A regular file of at most `limit` bytes (FIFOs, devices and loops refused)."""
    handle, st = open_regular(path)
    with handle:
        if st.size > limit:
            raise RefusedError(f"{what} is {st.size} bytes, more than the {limit} allowed")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise RefusedError(f"{what} grew past {limit} bytes while it was read")
    return data


@dataclass(frozen=True)
class KeyInfo:
    name: str
    fingerprint: str
    private_key: str  # path
    public_key: str  # path
    mode: str  # the private key file's permissions, e.g. "0600"
    trusted: bool

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _key_paths(name: str) -> tuple[Path, Path]:
    paths.check_name(name, "key name")
    folder = keys_dir()
    return folder / f"{name}.key", folder / f"{name}.pub"


def create_key(name: str) -> KeyInfo:
    """A new ECDSA P-256 key pair `<data>/keys/NAME.key` (0600) and `NAME.pub`, the
    public key also trusted under NAME. Refuses to overwrite anything."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    private, public = _key_paths(name)
    if private.exists() or public.exists():
        raise UsageError(f"a key named {name!r} already exists; not overwriting it")
    if name == RELEASE_KEY or (trust_dir() / f"{name}.pub").exists():
        raise UsageError(f"a trusted key is already named {name!r}; pick another name")
    key = ec.generate_private_key(ec.SECP256R1())
    secret = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                               serialization.NoEncryption())
    pem, fingerprint = public_key_pem(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo), name)
    keys_dir(create=True)
    # O_EXCL: never replace a key; 0600 from the first byte (fchmod too, whatever the umask).
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(secret)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            private.unlink()
        raise
    _write_text_new(public, pem)
    _write_text_new(trust_dir(create=True) / f"{name}.pub", pem)
    return _key_info(name)


def _write_text_new(path: Path, text: str) -> None:
    """Write `text` to `path`, which must not exist yet (rename of a temp file)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.link(tmp, path)  # fails if `path` appeared meanwhile: nothing is replaced
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _key_info(name: str) -> KeyInfo:
    private, public = _key_paths(name)
    pem, fingerprint = public_key_pem(_read_small(public, MAX_KEY_FILE, f"{name}.pub"), name)
    trusted = any(k.fingerprint == fingerprint for k in trusted_keys())
    return KeyInfo(name, fingerprint, str(private), str(public),
                   f"{private.stat().st_mode & 0o777:04o}", trusted)


def list_keys() -> list[KeyInfo]:
    folder = keys_dir()
    if not folder.is_dir():
        return []
    # A stray file whose name is not a key name (`my key.key`) is not one of ours.
    return [_key_info(p.stem) for p in sorted(folder.glob("*.key"))
            if paths.is_valid_name(p.stem)]


def export_key(name: str, out: Path) -> KeyInfo:
    """Write key NAME's public key to `out` (a new file). The private key never leaves."""
    private, public = _key_paths(name)
    if not private.exists():
        raise UnknownNameError(f"no key named {name!r} (`variant-studio key list`)")
    out = Path(out).expanduser()
    if out.exists() or out.is_symlink():
        raise UsageError(f"{printable(str(out))} already exists; not overwriting it")
    pem, _ = public_key_pem(_read_small(public, MAX_KEY_FILE, f"{name}.pub"), name)
    _write_text_new(out.absolute(), pem)
    return _key_info(name)


def private_key_path(name: str) -> Path:
    private, _ = _key_paths(name)
    if not private.is_file():
        raise UnknownNameError(f"no key named {name!r} (`variant-studio key list`)")
    return private


# --------------------------------------------------------------------------- trust list


def trusted_keys() -> list[TrustedKey]:
    """The shipped release key, then the user's trusted keys by name.

    Read without parsing (each was validated when it was added; its fingerprint is the
    sha256 of the stored PEM): resolving a spec stays cheap. A file that no longer
    holds a key simply fails every verification it takes part in."""
    out = []
    release = release_key_path()
    if release.is_file():
        pem = release.read_text(encoding="ascii", errors="replace")
        out.append(TrustedKey(RELEASE_KEY, _fingerprint(pem), pem, shipped=True))
    folder = trust_dir()
    if folder.is_dir():
        for path in sorted(folder.glob("*.pub")):
            try:
                pem = _read_small(path, MAX_KEY_FILE, path.name).decode("ascii")
            except (RefusedError, UnicodeDecodeError):
                add_notice(f"trusted key file {path.name} is unreadable; ignored")
                continue
            out.append(TrustedKey(path.stem, _fingerprint(pem), pem))
    return out


def _fingerprint(pem: str) -> str:
    return hashlib.sha256(pem.encode("ascii", errors="replace")).hexdigest()


def trust_add(file: Path, name: str | None = None) -> TrustedKey:
    """Trust the public key in `file` under `name` (default: from the file name).

    The key is validated first (PEM, ECDSA on a curve model-signing takes); a
    malformed or non-EC key, a private key, a taken name or a key already trusted
    changes nothing."""
    file = Path(file).expanduser()
    data = _read_small(file, MAX_KEY_FILE, printable(file.name))
    pem, fingerprint = public_key_pem(data, printable(file.name))
    known = trusted_keys()
    if name is None:
        name = paths.suggest_name(file.stem, {k.name for k in known}, "key")
    paths.check_name(name, "key name")
    for key in known:
        if key.name == name:
            raise UsageError(f"a trusted key is already named {name!r}")
        if key.fingerprint == fingerprint:
            raise UsageError(f"this key is already trusted as {key.name!r}")
    _write_text_new(trust_dir(create=True) / f"{name}.pub", pem)
    return TrustedKey(name, fingerprint, pem)


def trust_remove(name: str) -> None:
    if name == RELEASE_KEY:
        raise RefusedError("the shipped release key cannot be removed: curated entries "
                           "are verified with it")
    paths.check_name(name, "key name")
    path = trust_dir() / f"{name}.pub"
    if not path.is_file():
        raise UnknownNameError(f"no trusted key named {name!r} (`variant-studio trust list`)")
    path.unlink()


def key_file(key: TrustedKey, folder: Path) -> Path:
    path = folder / f"{key.fingerprint[:16]}.pub"
    path.write_text(key.pem, encoding="ascii")
    return path


# --------------------------------------------------------------------------- policy


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


# --------------------------------------------------------------------------- sign, verify


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
        return json.loads(_read_small(path, MAX_PROVENANCE, PROVENANCE_FILE))
    except (ValueError, RecursionError):
        raise RefusedError(f"{PROVENANCE_FILE} is not valid JSON") from None


def _read_files(folder: Path) -> list[str]:
    return [name for name in READ_FILES if (folder / name).exists()
            or (folder / name).is_symlink()]


def _hashing_config(ignore: Iterable[str]) -> Any:
    from model_signing import hashing

    return (hashing.Config()
            .use_file_serialization(hashing_algorithm="sha256", allow_symlinks=False)
            .set_ignored_paths(paths=sorted(set(ignore)), ignore_git_paths=False))


def sign_folder(folder: Path, private_key: Path) -> tuple[str, ...]:
    """Sign the files of `folder` the app reads into `folder/signature.sig`.

    Everything else in the folder (a backend subfolder, an earlier signature) is left
    out and named as ignored in the signed statement. The signature is written
    beside the folder first and renamed into it. Returns the signed file names."""
    from model_signing import signing

    folder = Path(folder)
    signed = _read_files(folder)
    for name in signed:
        if (folder / name).is_symlink() or not (folder / name).is_file():
            raise RefusedError(f"{name} in {printable(str(folder))} is not a regular file")
    if not any(n in signed for n in ("adapter.gguf", "adapter_model.safetensors")):
        raise RefusedError(f"{printable(str(folder))} holds no adapter weights to sign")
    ignore = [p.name for p in folder.iterdir() if p.name not in signed]
    config = _hashing_config([*ignore, SIGNATURE_FILE])
    fd, tmp = tempfile.mkstemp(prefix=".signature-", suffix=".tmp", dir=folder.parent)
    os.close(fd)
    try:
        try:
            signing.Config().use_elliptic_key_signer(private_key=private_key) \
                .set_hashing_config(config).sign(folder, tmp)
        except (ValueError, TypeError) as exc:
            raise RefusedError(f"signing failed: {_one_line(exc)}") from None
        os.replace(tmp, folder / SIGNATURE_FILE)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return tuple(signed)


def _one_line(exc: BaseException) -> str:
    return printable(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, 200)


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
        bundle = _parse_bundle(_read_small(path, MAX_SIGNATURE, SIGNATURE_FILE))
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
    uncovered = [n for n in _read_files(folder) if n not in bundle.files]
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
             .set_hashing_config(_hashing_config([SIGNATURE_FILE]))
             .set_ignore_unsigned_files(True)
             .verify(folder, sig))
        except Exception as exc:  # the library raises ValueError, KeyError, InvalidSignature...
            return (f"the signature does not verify with key {key.name} "
                    f"({type(exc).__name__})")
    return None


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
    uncovered = [n for n in _read_files(folder) if n not in bundle.files]
    if uncovered and parts:
        parts.append(f"{', '.join(uncovered)} not covered by the signature")
    return "; ".join(parts) or None


def verify_derived(served: Path, served_sha256: str, served_config_sha256: str | None,
                   derivation: Derivation, source: Verdict) -> Verdict:
    """A file converted from a signed one: valid when the source's signature is valid
    and converting the source again gives the served bytes exactly."""
    from engine.formats import lora_io

    if not source.ok:
        return Verdict(source.status if source.status == "unsigned" else "invalid",
                       f"converted from a file whose signature is {source.status}: "
                       f"{source.reason}", source.signer, source.fingerprint)
    named = {"signer": source.signer, "fingerprint": source.fingerprint,
             "files": source.files, "derived": True}
    with tempfile.TemporaryDirectory(prefix="variant-studio-derive-") as tmp:
        try:
            if digest.hash_uncached(Path(derivation.source))[0] != derivation.sha256:
                return Verdict("invalid", "the signed file it was converted from changed",
                               **named)
            gguf = Path(served).suffix == ".gguf"
            target = Path(tmp) / ("adapter.gguf" if gguf else "peft")
            lora_io.convert_file(Path(derivation.source), target,
                                 lora_io.Layout.of(derivation.architecture, derivation.n_head,
                                                   derivation.n_head_kv),
                                 rebase=derivation.rebase)
            weights = target if gguf else target / "adapter_model.safetensors"
            same = digest.hash_uncached(weights)[0] == served_sha256
            if same and served_config_sha256 and not gguf:
                same = digest.hash_uncached(target / "adapter_config.json")[0] == \
                    served_config_sha256
        except (RefusedError, InspectionError, OSError) as exc:
            reason = exc.message if isinstance(exc, RefusedError) else str(exc)
            return Verdict("invalid", f"could not convert the signed file again: "
                           f"{printable(reason)}", **named)
    if not same:
        return Verdict("invalid", "is not the conversion of the signed file (converting "
                       "it again gives other bytes)", **named)
    return Verdict("valid", f"converted from a file signed by {source.signer}; converting "
                   "it again gives these bytes", **named)


# --------------------------------------------------------------------------- the catalog


def adapter_folder(record: dict[str, Any]) -> Path:
    """The store folder of an adapter's primary file (what `sign` signs)."""
    return Path(record["path"]).parent


def provenance_digest(record: dict[str, Any]) -> str | None:
    return canonical_sha256(record["provenance"]) if "provenance" in record else None


def keys_for(record: dict[str, Any], keys: Sequence[TrustedKey]) -> list[TrustedKey]:
    """The keys that may sign `record`: only the shipped key for a curated entry."""
    if record.get("curated"):
        return [k for k in keys if k.shipped]
    return list(keys)


def _expected(record: dict[str, Any]) -> dict[str, str]:
    """The catalog's digests of the signed files: a valid signature over other bytes
    (another signed adapter swapped in) is not this adapter's signature."""
    out = {Path(record["path"]).name: record["sha256"]}
    if record.get("config_sha256"):
        out["adapter_config.json"] = record["config_sha256"]
    return out


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


def verify_adapter(catalog: Catalog, name: str,
                   keys: Sequence[TrustedKey] | None = None) -> Verdict:
    """A fresh verification of adapter `name`'s primary folder (no cache)."""
    record = catalog.adapter(name)
    folder = adapter_folder(record)
    keys = trusted_keys() if keys is None else keys
    verdict = verify_folder(folder, keys_for(record, keys), provenance_digest(record))
    return check_recorded(verdict, folder, _expected(record))


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
        return check_recorded(verdict, folder, _expected(entry))
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
    for file_name, sha in _expected(record).items():
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
    _, fingerprint = public_key_pem(
        _read_small(_key_paths(key_name)[1], MAX_KEY_FILE, f"{key_name}.pub"), key_name)
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
    data = _read_small(source / SIGNATURE_FILE, MAX_SIGNATURE, SIGNATURE_FILE)
    (staging / SIGNATURE_FILE).write_bytes(data)
    if not (source / PROVENANCE_FILE).exists():
        return None
    raw = _read_small(source / PROVENANCE_FILE, MAX_PROVENANCE, PROVENANCE_FILE)
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


def import_record(verdict: Verdict) -> dict[str, Any]:
    """What an adapter record keeps of the signature it arrived with."""
    return {"file": SIGNATURE_FILE, "key": verdict.signer, "fingerprint": verdict.fingerprint,
            "arrived": True, "status_at_import": verdict.status, "checked_at": now_iso(),
            "files": list(verdict.files)}


# --------------------------------------------------------------------------- status


_memo: dict[str, Verdict] = {}
CACHE_ENTRIES = 512


def _cache() -> StateFile:
    return StateFile(paths.data_dir(create=False) / "cache" / "signatures.json", dict)


def verdict_key(folder: Path, keys: Sequence[TrustedKey], provenance: str | None,
                expect: dict[str, str], extra: Any = None) -> str:
    """A key for a verdict: the signature's bytes, the content digest of every file the
    app reads (stat-keyed digest cache), the keys and the catalog's digests."""
    sig = hashlib.sha256(_read_small(folder / SIGNATURE_FILE, MAX_SIGNATURE,
                                     SIGNATURE_FILE)).hexdigest()
    files = [[n, digest.sha256_file(folder / n)] for n in _read_files(folder)]
    material = [str(folder), sig, files, sorted(k.fingerprint for k in keys), provenance,
                sorted(expect.items()), extra]
    return canonical_sha256(material)


def status(catalog: Catalog, name: str, cached_only: bool = False) -> Verdict | None:
    """The signature status of adapter `name` for display (library, detail, `show`).

    Answered from a verdict cache keyed by content (see `verdict_key`), so showing an
    unchanged adapter costs stats and a few small reads; enforcement (imports, the
    engine, `verify`) never reads this cache. `cached_only`: None rather than verify
    (which reads every signed file) when the cache has no verdict."""
    record = catalog.adapter(name)
    folder = adapter_folder(record)
    if not (folder / SIGNATURE_FILE).exists():
        return unsigned()
    keys = trusted_keys()
    try:
        key = verdict_key(folder, keys_for(record, keys), provenance_digest(record),
                          _expected(record))
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

