"""What a client asks the engine to serve: a fully resolved session specification.

The client resolves a catalog name into paths, digests, scales and an identity; the
engine process re-verifies every file against these digests before anything native
touches it, so the identity always describes the bytes actually served.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.catalog import Catalog
from engine.identity import Identity
from engine.sampling import Sampling


@dataclass(frozen=True)
class AdapterFile:
    name: str
    path: str
    sha256: str
    scale: float
    config_sha256: str | None = None


@dataclass(frozen=True)
class SessionSpec:
    name: str  # the variant or model name, for labels
    kind: str  # "model" or "variant"
    identity: Identity
    base_name: str
    base_path: str
    adapters: tuple[AdapterFile, ...]
    system_prompt: str
    sampling: Sampling

    @property
    def backend(self) -> str:
        return self.identity.backend

    def base_spec(self) -> SessionSpec:
        """The same base with no adapters (for side-by-side comparison)."""
        return SessionSpec(self.base_name, "model", self.identity.base_only(), self.base_name,
                           self.base_path, (), self.system_prompt, self.sampling)

    def to_dict(self) -> dict:
        return {
            "name": self.name, "kind": self.kind, "identity": self.identity.to_dict(),
            "base_name": self.base_name, "base_path": self.base_path,
            "adapters": [a.__dict__ for a in self.adapters],
            "system_prompt": self.system_prompt, "sampling": self.sampling.to_dict(),
        }

    @staticmethod
    def from_dict(data: dict) -> SessionSpec:
        ident = dict(data["identity"])
        ident.pop("key", None)
        return SessionSpec(
            name=data["name"], kind=data["kind"], identity=Identity.from_dict(ident),
            base_name=data["base_name"], base_path=data["base_path"],
            adapters=tuple(AdapterFile(**a) for a in data["adapters"]),
            system_prompt=data["system_prompt"],
            sampling=Sampling.from_dict(data["sampling"]),
        )


def resolve(catalog: Catalog, name: str, n_ctx: int | None = None,
            backend: str | None = None) -> SessionSpec:
    """Resolve a model or variant name into what the engine needs to serve it.

    `backend` serves it on another backend than its base's: the base's counterpart
    there and each adapter's file for that backend (`Catalog.serving_base`).
    """
    kind, record = catalog.find(name)
    identity = catalog.identity(name, n_ctx, backend)
    base = catalog.model(catalog.serving_base(name, backend))
    if kind == "model":
        adapters, profile = (), {}
    else:
        profile = record["profile"]
        adapters = tuple(
            AdapterFile(a["name"], stored["path"], stored["sha256"], a["scale"],
                        stored.get("config_sha256"))
            for a in record["adapters"]
            for stored in (catalog.adapter_file(a["name"], base["backend"]),)
        )
    sampling = Sampling.from_dict({k: profile[k] for k in
                                   ("temperature", "top_p", "top_k", "repeat_penalty", "seed",
                                    "max_tokens") if k in profile})
    return SessionSpec(name, kind, identity, base["name"], base["path"], adapters,
                       profile.get("system_prompt", ""), sampling)
