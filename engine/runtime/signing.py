"""The engine's own signature check, before anything native reads an adapter file.

The client resolves the catalog's policy into the SessionSpec (`AdapterSigning` per
adapter, the trusted public keys as PEM); the engine trusts no client's verdict and
verifies the signature itself with model-signing, on every request that opens or
reuses a session. A verdict is cached in this process under a key made of the
signature's bytes and the content digest of every file the app reads (the
stat-keyed digest cache answers those), the allowed keys and the catalog's digests:
so an unchanged adapter costs a few stats and small reads per request, and a file
changed on disk is verified again. A required signature that is not valid refuses
the request; under `warn` the engine logs one warning line per verdict and serves.
"""

from __future__ import annotations

import sys
from pathlib import Path

from engine.catalog.resolve import AdapterFile, SessionSpec
from engine.catalog.trust import verify
from engine.catalog.trust.derived import verify_derived
from engine.catalog.trust.verify import TrustedKey, Verdict
from engine.errors import InspectionError, RefusedError

MAX_VERDICTS = 256


class SignatureGate:
    """Verdicts per content key, for the engine process's lifetime."""

    def __init__(self) -> None:
        self._verdicts: dict[str, Verdict] = {}
        self._warned: set[tuple[str, str, str]] = set()
        self.verified = 0  # full verifications done (the rest came from the cache)

    def check(self, spec: SessionSpec) -> None:
        """Refuse `spec` if an adapter's required signature is not valid."""
        for adapter in spec.adapters:
            if adapter.signing is None:
                continue
            verdict = self._verdict(adapter, spec.trusted)
            if verdict.ok:
                continue
            if adapter.signing.required:
                raise RefusedError(f"adapter {adapter.name}: signature "
                                   f"{'required' if verdict.status == 'unsigned' else 'invalid'}"
                                   f": {verdict.reason}; not serving it")
            seen = (adapter.path, adapter.sha256, verdict.reason)
            if seen not in self._warned:  # once per file and verdict, not per request
                self._warned.add(seen)
                print(f"warning: adapter {adapter.name}: {verdict.reason} (signature policy "
                      f"{spec.policy}); serving it", file=sys.stderr, flush=True)

    def _verdict(self, adapter: AdapterFile, trusted: tuple[TrustedKey, ...]) -> Verdict:
        signing = adapter.signing
        assert signing is not None
        keys = [k for k in trusted if k.fingerprint in signing.keys]
        folder = Path(signing.folder)
        derived = signing.derived
        if derived is None:
            expect = {Path(adapter.path).name: adapter.sha256}
            if adapter.config_sha256:
                expect["adapter_config.json"] = adapter.config_sha256
            extra = None
        else:
            expect = {Path(derived.source).name: derived.sha256}
            extra = [adapter.path, adapter.sha256, adapter.config_sha256, derived.to_dict()]
        if not (folder / verify.SIGNATURE_FILE).exists():
            return verify.unsigned()
        try:
            key: str | None = verify.verdict_key(folder, keys, signing.provenance_sha256,
                                                 expect, extra)
        except (RefusedError, InspectionError, OSError):
            key = None  # unreadable: verify (and fail) without caching
        if key is not None and key in self._verdicts:
            return self._verdicts[key]
        verdict = verify.check_recorded(
            verify.verify_folder(folder, keys, signing.provenance_sha256), folder, expect)
        if derived is not None:
            verdict = verify_derived(Path(adapter.path), adapter.sha256,
                                     adapter.config_sha256, derived, verdict)
        self.verified += 1
        if key is not None:
            if len(self._verdicts) >= MAX_VERDICTS:
                self._verdicts.pop(next(iter(self._verdicts)))
            self._verdicts[key] = verdict
        return verdict
