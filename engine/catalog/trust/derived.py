"""Derived verification: a file converted from a signed one for another backend is
valid when the source's signature is, and converting the source again gives the
served bytes exactly; so the conversion is covered by the source's signature.

Pure like `verify`: it reads the files it is given (and converts in a temporary
folder), never a catalog record.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.catalog import digest
from engine.catalog.trust.verify import Verdict
from engine.errors import InspectionError, RefusedError
from engine.formats.safeio import printable


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
