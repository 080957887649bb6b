"""The trust list: the public keys whose signatures are trusted here, kept durably in
`<data>/trusted/` (one normalised PEM per name) after the shipped release key.

A key is checked before it is added (PEM, ECDSA on a curve model-signing takes) and
named by its fingerprint: the sha256 of its PEM SubjectPublicKeyInfo, which is also
the key hint model-signing writes into a signature.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from engine.catalog.trust.files import read_small, write_text_new
from engine.catalog.trust.verify import TrustedKey
from engine.errors import RefusedError, UnknownNameError, UsageError
from engine.formats.safeio import printable
from engine.state import paths
from engine.state.statefile import add_notice

RELEASE_KEY = "release"
CURVES = ("secp256r1", "secp384r1", "secp521r1")  # what model-signing accepts
MAX_KEY_FILE = 64 << 10


def release_key_path() -> Path:
    """The shipped release public key (resources/keys/release.pub in the source tree)."""
    return Path(__file__).resolve().parents[3] / "resources" / "keys" / "release.pub"


def trust_dir(create: bool = False) -> Path:
    """`<data>/trusted/`: the trust list, one normalised PEM public key per name."""
    path = paths.data_dir(create) / "trusted"
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


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
                pem = read_small(path, MAX_KEY_FILE, path.name).decode("ascii")
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
    data = read_small(file, MAX_KEY_FILE, printable(file.name))
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
    write_text_new(trust_dir(create=True) / f"{name}.pub", pem)
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
