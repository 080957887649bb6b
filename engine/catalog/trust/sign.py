"""Signing: the files of a folder the app reads, signed with a private key into the
folder's `signature.sig` (what `verify.verify_folder` checks)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from engine.catalog.trust.verify import SIGNATURE_FILE, hashing_config, read_files
from engine.errors import RefusedError
from engine.formats.safeio import printable


def sign_folder(folder: Path, private_key: Path) -> tuple[str, ...]:
    """Sign the files of `folder` the app reads into `folder/signature.sig`.

    Everything else in the folder (a backend subfolder, an earlier signature) is left
    out and named as ignored in the signed statement. The signature is written
    beside the folder first and renamed into it. Returns the signed file names."""
    from model_signing import signing

    folder = Path(folder)
    signed = read_files(folder)
    for name in signed:
        if (folder / name).is_symlink() or not (folder / name).is_file():
            raise RefusedError(f"{name} in {printable(str(folder))} is not a regular file")
    if not any(n in signed for n in ("adapter.gguf", "adapter_model.safetensors")):
        raise RefusedError(f"{printable(str(folder))} holds no adapter weights to sign")
    ignore = [p.name for p in folder.iterdir() if p.name not in signed]
    config = hashing_config([*ignore, SIGNATURE_FILE])
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
