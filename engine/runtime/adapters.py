"""The one owner of an adapter's life in the engine: verify, gate, load, count, evict.

Runs only on the engine thread of the engine process, for both backends:

1. verify: before anything native reads an adapter file, its digest (and its
   adapter_config.json's) is checked against the spec, and the file is inspected and
   validated against the base in Python (`verify`);
2. the signature gate: the catalog's signature policy, checked on every request that
   opens or reuses a session (`gate`, `engine.runtime.signing`);
3. load: the backend reads the adapter when the first session that needs it is created
   (`ResidentModel.new_context`; once per digest and resident model);
4. count: every session holding an adapter is counted here (`hold`, `release`);
5. evict: when the last session using an adapter closes, the backend frees it
   (`ResidentModel.unload_adapter`: llama.cpp's native adapter, OpenVINO's arrays).

The backends keep no counts of their own: a context only borrows what this manager
holds for it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from engine.catalog import digest, validation
from engine.catalog.resolve import AdapterFile, SessionSpec
from engine.errors import RefusedError
from engine.formats import artifacts
from engine.formats.artifacts import AdapterInfo, BaseModelInfo
from engine.runtime.backend import AdapterSet, ResidentModel
from engine.runtime.signing import SignatureGate


class AdapterManager:
    def __init__(self) -> None:
        self.signatures = SignatureGate()
        # (resident key, adapter sha256) -> sessions using it now
        self._users: dict[tuple[str, str], int] = {}

    def gate(self, spec: SessionSpec) -> None:
        """Refuse `spec` if an adapter's required signature is not valid (every request,
        warm or not: a policy set to require, or a file changed on disk, takes effect at
        the next request)."""
        self.signatures.check(spec)

    def verify(self, spec: SessionSpec, base: BaseModelInfo) -> AdapterSet:
        """Digest re-check and full validation of every adapter, before a runtime sees it."""
        verified: list[tuple[AdapterFile, AdapterInfo]] = []
        for adapter in spec.adapters:
            validation.require_scale(adapter.scale, f"adapter {adapter.name}")
            try:
                sha = digest.sha256_file(Path(adapter.path))
            except artifacts.InspectionError as exc:
                raise RefusedError(f"adapter {adapter.name}: {exc.message}") from None
            if sha != adapter.sha256:
                raise RefusedError(f"adapter {adapter.name} changed on disk after import "
                                   f"(sha256 {sha[:16]}…, recorded {adapter.sha256[:16]}…); "
                                   "not serving it")
            config = Path(adapter.path).with_name("adapter_config.json")
            if adapter.config_sha256 and (not config.is_file() or digest.sha256_file(
                    config) != adapter.config_sha256):
                raise RefusedError(f"adapter {adapter.name}: adapter_config.json changed on "
                                   "disk after import; not serving it")
            info = artifacts.inspect_path(Path(adapter.path))
            if not isinstance(info, AdapterInfo):
                raise RefusedError(f"adapter {adapter.name}: stored file is not an adapter")
            report = validation.check_adapter(info, base, spec.backend,
                                              spec.identity.base_sha256)
            if not report.ok:
                raise RefusedError(f"adapter {adapter.name}: {report.reason()}")
            verified.append((adapter, info))
        return verified

    def hold(self, resident: str, shas: Iterable[str]) -> None:
        """A session on `resident` uses these adapters (loaded by its context)."""
        for sha in shas:
            self._users[(resident, sha)] = self._users.get((resident, sha), 0) + 1

    def release(self, resident: str, model: ResidentModel, shas: Iterable[str]) -> None:
        """A session on `resident` closed (its context first): an adapter no session
        uses any more is freed by its backend."""
        for sha in shas:
            key = (resident, sha)
            left = self._users.get(key, 0) - 1
            if left > 0:
                self._users[key] = left
                continue
            self._users.pop(key, None)
            model.unload_adapter(sha)

    def forget(self, resident: str) -> None:
        """`resident` is being closed (the model frees what it still holds)."""
        for key in [k for k in self._users if k[0] == resident]:
            del self._users[key]

    def users(self, resident: str, sha: str) -> int:
        """Sessions on `resident` using adapter `sha` now."""
        return self._users.get((resident, sha), 0)
