"""The user's own key pairs in `<data>/keys/`: generate one (its public key trusted
at once), list them, export a public key, find a private key to sign with.

Key material is never printed or returned: only names, fingerprints and paths.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.catalog.trust.files import read_small, write_text_new
from engine.catalog.trust.trust_list import (
    MAX_KEY_FILE,
    RELEASE_KEY,
    public_key_pem,
    trust_dir,
    trusted_keys,
)
from engine.errors import UnknownNameError, UsageError
from engine.formats.safeio import printable
from engine.state import paths


def keys_dir(create: bool = False) -> Path:
    """`<data>/keys/`: the user's own key pairs (private keys 0600, the folder 0700)."""
    path = paths.data_dir(create) / "keys"
    if create:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


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
    write_text_new(public, pem)
    write_text_new(trust_dir(create=True) / f"{name}.pub", pem)
    return _key_info(name)


def _key_info(name: str) -> KeyInfo:
    private, public = _key_paths(name)
    pem, fingerprint = public_key_pem(read_small(public, MAX_KEY_FILE, f"{name}.pub"), name)
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
    pem, _ = public_key_pem(read_small(public, MAX_KEY_FILE, f"{name}.pub"), name)
    write_text_new(out.absolute(), pem)
    return _key_info(name)


def private_key_path(name: str) -> Path:
    private, _ = _key_paths(name)
    if not private.is_file():
        raise UnknownNameError(f"no key named {name!r} (`variant-studio key list`)")
    return private


def public_fingerprint(name: str) -> str:
    """The fingerprint of key NAME's public key (what a signature made with it names)."""
    _, fingerprint = public_key_pem(
        read_small(_key_paths(name)[1], MAX_KEY_FILE, f"{name}.pub"), name)
    return fingerprint
