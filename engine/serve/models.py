"""Which models the server offers: every base and variant of the catalog (or the ones
`--variants` names), in OpenAI's list shape plus what makes each one what it is."""

from __future__ import annotations

import calendar
import time
from typing import Any

from engine.catalog import resolve
from engine.catalog.store import Catalog
from engine.errors import StudioError
from engine.formats.safeio import printable
from engine.serve.errors import ApiError


class ServedModels:
    def __init__(self, catalog: Catalog, exposed: tuple[str, ...] | None) -> None:
        self.catalog = catalog
        self.exposed = exposed

    def names(self) -> list[str]:
        data = self.catalog.data()
        names = [*data["models"], *data["variants"]]
        return [n for n in names if self.exposed is None or n in self.exposed]

    def spec(self, name: str, backend: str | None = None) -> resolve.SessionSpec:
        """What `name` is served as now; 404 for a name the server does not offer."""
        if name not in self.names():
            raise ApiError(404, f"the model {printable(name)!r} does not exist or is not "
                           "served here (GET /v1/models lists what is)", "model",
                           "model_not_found")
        try:
            return resolve.resolve(self.catalog, name, backend=backend)
        except StudioError as exc:
            raise ApiError(400, f"{printable(name)} cannot be served now: {exc.message}",
                           "model", "model_unavailable") from None

    def entry(self, name: str) -> dict[str, Any] | None:
        try:
            spec = resolve.resolve(self.catalog, name)
            _kind, record = self.catalog.find(name)
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
        entries = [self.entry(name) for name in self.names()]
        return {"object": "list", "data": [e for e in entries if e is not None]}


def _epoch(stamp: str | None) -> int:
    if not stamp:
        return 0
    try:
        return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))  # UTC, no DST
    except ValueError:
        return 0
