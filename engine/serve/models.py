"""Which models the server offers: every base and variant of the catalog (or the ones
`--variants` names), in OpenAI's list shape plus what makes each one what it is, and
the engine request for one of them (`runtime.assembly`, as every front end builds it).

Each HTTP request reads one catalog snapshot (the `Catalog` here lives as long as the
server and parses its file again only when it changed)."""

from __future__ import annotations

import calendar
import time
from typing import Any

from engine.catalog import resolve
from engine.catalog.store import Catalog, Reader, Snapshot
from engine.errors import StudioError
from engine.formats.safeio import printable
from engine.runtime import assembly, messages
from engine.serve.errors import ApiError


class ServedModels:
    def __init__(self, catalog: Catalog, exposed: tuple[str, ...] | None) -> None:
        self.catalog = catalog
        self.exposed = exposed

    def names(self, catalog: Reader | None = None) -> list[str]:
        data = (catalog or self.catalog).data()
        names = [*data["models"], *data["variants"]]
        return [n for n in names if self.exposed is None or n in self.exposed]

    def offered(self, name: str) -> Snapshot:
        """The catalog now, when it offers `name`; 404 for a name the server does not."""
        snapshot = self.catalog.snapshot()
        if name not in self.names(snapshot):
            raise ApiError(404, f"the model {printable(name)!r} does not exist or is not "
                           "served here (GET /v1/models lists what is)", "model",
                           "model_not_found")
        return snapshot

    def spec(self, name: str, backend: str | None = None) -> resolve.SessionSpec:
        """What `name` is served as now; 404 for a name the server does not offer."""
        snapshot = self.offered(name)
        try:
            return assembly.spec(snapshot, name, backend=backend)
        except StudioError as exc:
            raise _unavailable(name, exc) from None

    def request(self, snapshot: Snapshot, name: str, prompt: messages.Prompt,
                top_logprobs: int, **sampling: object) -> messages.Generate:
        """The engine request for `name` (checked by `offered`) and `prompt`: 400
        naming the model when it cannot be served, or the setting that is wrong."""
        try:
            return assembly.request(snapshot, name, prompt, top_logprobs=top_logprobs,
                                    **sampling)
        except assembly.SettingError as exc:
            raise ApiError(400, exc.message, None, "invalid_value") from None
        except StudioError as exc:
            raise _unavailable(name, exc) from None

    def entry(self, name: str, catalog: Reader | None = None) -> dict[str, Any] | None:
        snapshot = (catalog or self.catalog).snapshot()
        try:
            spec = resolve.resolve(snapshot, name)
            _kind, record = snapshot.find(name)
        except StudioError:
            return None  # e.g. a variant whose adapter file is gone: not offered
        created = record.get("created_at") or record.get("installed_at")
        return {
            "id": name, "object": "model", "owned_by": "variant-studio",
            "created": _epoch(created),
            "kind": spec.kind, "base": spec.base_name, "backend": spec.backend,
            "adapters": [{"name": a.name, "sha256": a.sha256, "scale": a.scale}
                         for a in spec.adapters],
            "identity": spec.identity.key, "curated": bool(record.get("curated")),
        }

    def listing(self) -> dict[str, Any]:
        snapshot = self.catalog.snapshot()
        entries = [self.entry(name, snapshot) for name in self.names(snapshot)]
        return {"object": "list", "data": [e for e in entries if e is not None]}


def _unavailable(name: str, exc: StudioError) -> ApiError:
    return ApiError(400, f"{printable(name)} cannot be served now: {exc.message}", "model",
                    "model_unavailable")


def _epoch(stamp: str | None) -> int:
    if not stamp:
        return 0
    try:
        return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))  # UTC, no DST
    except ValueError:
        return 0
