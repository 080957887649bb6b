"""From a catalog name to what the engine serves: the serving base on a backend, the
identity, and the fully resolved session specification.

The client resolves a name into paths, digests, scales and an identity; the engine
process re-verifies every file against these digests before anything native touches
it, so the identity always describes the bytes actually served. Sampling is not part
of a spec: it travels once, in the request (`Sampling.of_profile` gives a profile's).

Every function takes a `Catalog` or a `Snapshot` and reads one snapshot of it, so
resolving a name parses the catalog at most once (a `Catalog` whose file has not
changed since its last snapshot not at all). A plain base model has no profile: it is
served with the context size from Settings (`Snapshot.base_n_ctx`) wherever it is
asked for, so a name and the settings give one identity in every front end; a
variant's own profile says its context size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.catalog.identity import (
    DEFAULT_OPENVINO_PROFILE,
    OPENVINO_PROFILES,
    AdapterRef,
    ComputeProfile,
    ContextConfig,
    Identity,
    runtime_version,
)
from engine.catalog.profiles import DEFAULT_PROFILE, Sampling
from engine.catalog.store import BACKENDS, AdapterSpec, Reader
from engine.catalog.trust.policy import AdapterSigning
from engine.catalog.trust.policy import policy as signature_policy
from engine.catalog.trust.records import session_signing
from engine.catalog.trust.trust_list import trusted_keys
from engine.catalog.trust.verify import TrustedKey
from engine.errors import RefusedError, StudioError, UsageError


@dataclass(frozen=True)
class AdapterFile:
    name: str
    path: str
    sha256: str
    scale: float
    config_sha256: str | None = None
    # What the engine checks of its signature before serving it (None: nothing).
    signing: AdapterSigning | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "path": self.path, "sha256": self.sha256,
                               "scale": self.scale, "config_sha256": self.config_sha256}
        if self.signing is not None:
            out["signing"] = self.signing.to_dict()
        return out

    @staticmethod
    def from_dict(data: dict[str, Any]) -> AdapterFile:
        fields = dict(data)
        signing = fields.pop("signing", None)
        return AdapterFile(**fields, signing=AdapterSigning.from_dict(signing)
                           if signing is not None else None)


@dataclass(frozen=True)
class SessionSpec:
    name: str  # the variant or model name, for labels
    kind: str  # "model" or "variant"
    identity: Identity
    base_name: str
    base_path: str
    adapters: tuple[AdapterFile, ...]
    system_prompt: str
    # The catalog's signature policy and the public keys the engine verifies with
    # (only sent when an adapter's signature is to be checked).
    policy: str = "off"
    trusted: tuple[TrustedKey, ...] = ()
    # The tool-call format the profile declares (None: the base's template decides).
    tool_format: str | None = None

    @property
    def backend(self) -> str:
        return self.identity.backend

    def base_spec(self) -> SessionSpec:
        """The same base with no adapters (for side-by-side comparison)."""
        return SessionSpec(self.base_name, "model", self.identity.base_only(), self.base_name,
                           self.base_path, (), self.system_prompt,
                           tool_format=self.tool_format)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "kind": self.kind, "identity": self.identity.to_dict(),
            "base_name": self.base_name, "base_path": self.base_path,
            "adapters": [a.to_dict() for a in self.adapters],
            "system_prompt": self.system_prompt, "policy": self.policy,
            "trusted": [k.to_dict() for k in self.trusted],
            "tool_format": self.tool_format,
        }

    @staticmethod
    def from_dict(data: dict[str, Any]) -> SessionSpec:
        ident = dict(data["identity"])
        ident.pop("key", None)
        return SessionSpec(
            name=data["name"], kind=data["kind"], identity=Identity.from_dict(ident),
            base_name=data["base_name"], base_path=data["base_path"],
            adapters=tuple(AdapterFile.from_dict(a) for a in data["adapters"]),
            system_prompt=data["system_prompt"], policy=str(data.get("policy", "off")),
            trusted=tuple(TrustedKey.from_dict(k) for k in data.get("trusted") or ()),
            tool_format=data.get("tool_format"),
        )


def resolve(catalog: Reader, name: str, n_ctx: int | None = None,
            backend: str | None = None, ov_profile: str | None = None) -> SessionSpec:
    """Resolve a model or variant name into what the engine needs to serve it.

    `backend` serves it on another backend than its base's: the base's counterpart
    there and each adapter's file for that backend (`serving_base`). `ov_profile`
    names the OpenVINO profile (`compute_profile`); a llama.cpp base ignores it.
    `n_ctx` replaces the context size (a replay's, recorded); None: the profile's, or
    for a plain base the Settings' (see the module doc).
    """
    catalog = catalog.snapshot()
    kind, record = catalog.find(name)
    ident = identity(catalog, name, n_ctx, backend, ov_profile)
    base = catalog.model(serving_base(catalog, name, backend))
    # A profile serves its own IR folder (int4, int8 or the F16 build).
    base_path = base["path"] if ident.compute is None else base["profiles"][
        ident.compute.name]["path"]
    adapters: tuple[AdapterFile, ...] = ()
    policy = signature_policy(catalog)
    trusted: tuple[TrustedKey, ...] = ()
    if kind == "variant":
        records = [catalog.adapter(a["name"]) for a in record["adapters"]]
        if policy != "off" or any(r.get("curated") for r in records):
            trusted = tuple(trusted_keys())
        adapters = tuple(
            AdapterFile(a["name"], stored["path"], stored["sha256"], a["scale"],
                        stored.get("config_sha256"),
                        session_signing(own, base["backend"], policy, trusted))
            for a, own in zip(record["adapters"], records, strict=True)
            for stored in (catalog.adapter_file(a["name"], base["backend"]),)
        )
        if not any(a.signing for a in adapters):
            trusted = ()
    settings = profile(catalog, name)
    return SessionSpec(name, kind, ident, base["name"], base_path, adapters,
                       settings.get("system_prompt", ""), policy, trusted,
                       settings.get("tool_format"))


def profile(catalog: Reader, name: str) -> dict[str, Any]:
    """The runtime profile of a variant; a plain base model has the defaults."""
    kind, record = catalog.find(name)
    return dict(record["profile"]) if kind == "variant" else dict(DEFAULT_PROFILE)


def sampling(catalog: Reader, name: str, **overrides: Any) -> Sampling:
    """The sampling a request for `name` uses: its profile's, with `overrides` on top.

    A plain base model has no profile of its own and samples with the defaults."""
    kind, record = catalog.find(name)
    return Sampling.of_profile(record["profile"] if kind == "variant" else {}, **overrides)


def identity(catalog: Reader, name: str, n_ctx: int | None = None,
             backend: str | None = None, ov_profile: str | None = None) -> Identity:
    """The identity of a base model or variant as it would be served now.

    `backend` serves a variant on another backend: its base's counterpart there,
    and each adapter's file for that backend (see `serving_base`). `ov_profile`: the
    OpenVINO profile (see `compute_profile`). `n_ctx`: see `resolve`.
    """
    catalog = catalog.snapshot()
    kind, record = catalog.find(name)
    if kind == "adapter":
        raise UsageError(f"{name!r} is an adapter; serve it through a variant")
    if kind == "model":
        base = serving_base(catalog, name, backend)
        return identity_of_parts(catalog, base, [], n_ctx or catalog.base_n_ctx, ov_profile)
    specs = [AdapterSpec(a["name"], a["scale"]) for a in record["adapters"]]
    return identity_of_parts(catalog, serving_base(catalog, name, backend), specs,
                             n_ctx or int(record["profile"].get("n_ctx", 4096)), ov_profile)


def compute_profile(base: dict[str, Any], ov_profile: str | None = None
                    ) -> ComputeProfile | None:
    """The OpenVINO profile a base is served with: `ov_profile`, else its default.

    A base record with `profiles` (the curated OpenVINO default: int4 `fast`, its
    serving default; int8 `fast-int8`; the F16 IR at f32 `exact`, for parity) serves
    the named profile's IR folder. Other bases have no profiles (None): they compute as
    `exact` does, and asking them for a compressed profile is refused.
    """
    if ov_profile is not None and ov_profile not in OPENVINO_PROFILES:
        raise UsageError(f"unknown OpenVINO profile {ov_profile!r} "
                         f"({', '.join(OPENVINO_PROFILES)})")
    profiles = base.get("profiles")
    if base.get("backend") != "openvino":
        return None
    if not profiles:
        if ov_profile not in (None, "exact"):
            raise RefusedError(f"{base['name']} has no {ov_profile} profile (only the "
                               "OpenVINO default is built with compressed weights)")
        return None
    name = ov_profile or base.get("default_profile") or DEFAULT_OPENVINO_PROFILE
    if name not in profiles:
        raise RefusedError(f"{base['name']} has no {name} profile; run `variant-studio "
                           "model openvino-default` to build it")
    entry = profiles[name]
    return ComputeProfile(name, entry["weights"], entry["precision"], entry["kv_cache"],
                          entry["sha256"], int(entry.get("dynamic_quantization", 0)))


def identity_of_parts(catalog: Reader, base_name: str, adapters: list[AdapterSpec],
                      n_ctx: int, ov_profile: str | None = None) -> Identity:
    """The identity a variant with these parts would have (nothing is saved)."""
    catalog = catalog.snapshot()
    base = catalog.model(base_name)
    refs = tuple(AdapterRef(a.name, catalog.adapter_file(a.name, base["backend"])["sha256"],
                            a.scale) for a in adapters)
    meta = base["metadata"]
    return Identity(
        backend=base["backend"],
        base_name=base["name"],
        base_sha256=base["sha256"],
        adapters=refs,
        chat_template_sha256=meta.get("chat_template_sha256"),
        bos_policy=f"add_bos={str(meta.get('add_bos')).lower()};"
                   f"bos={meta.get('bos_token_id')}",
        runtime=runtime_version(base["backend"]),
        context=ContextConfig(n_ctx=n_ctx),
        compute=compute_profile(base, ov_profile),
    )


def serving_base(catalog: Reader, name: str, backend: str | None = None) -> str:
    """The base model that serves model or variant `name` on `backend`."""
    catalog = catalog.snapshot()
    kind, record = catalog.find(name)
    base = name if kind == "model" else record["base"]
    if backend is None or catalog.model(base)["backend"] == backend:
        return base
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r} (llama or openvino)")
    other = counterpart(catalog, base, backend)
    if other is None:
        raise RefusedError(f"{base} has no counterpart on {backend}: no {backend} model "
                           f"in the catalog was built from it")
    if kind == "variant":
        for entry in record["adapters"]:
            catalog.adapter_file(entry["name"], backend)  # refuses a missing file
    return other


def backends_for(catalog: Reader, name: str) -> list[tuple[str, str | None]]:
    """Each backend with None if it can serve `name`, else the reason it cannot.

    The base's own backend comes first.
    """
    catalog = catalog.snapshot()
    own = catalog.model(serving_base(catalog, name))["backend"]
    out: list[tuple[str, str | None]] = []
    for backend in (own, *(b for b in BACKENDS if b != own)):
        try:
            serving_base(catalog, name, backend)
            out.append((backend, None))
        except StudioError as exc:
            out.append((backend, exc.message))
    return out


def counterpart(catalog: Reader, base: str, backend: str) -> str | None:
    """The model with the same weights as `base` on `backend`, if the catalog has one.

    Known pairs are models built from another (`built_from.sha256`), in either
    direction: the curated OpenVINO default mirrors the llama.cpp default this way.
    """
    catalog = catalog.snapshot()
    record = catalog.model(base)
    if record["backend"] == backend:
        return base
    for other in catalog.data()["models"].values():
        if other.get("backend") != backend:
            continue
        if (other.get("built_from", {}).get("sha256") == record["sha256"]
                or record.get("built_from", {}).get("sha256") == other.get("sha256")):
            return other["name"]
    return None
