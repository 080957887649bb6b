"""The catalog's records: base models, adapters and variants in `catalog.json`.

Adapters are installed artifacts (copied into the store by `engine.catalog.imports`);
base models stay where they are and are re-verified by digest; variants are selectable
models: a base plus ordered adapters with scales plus a profile. This module reads and
looks up records, composes and removes them; every write goes through the state file's
lock, and nothing that fails a check is written.

Reading goes through a `Snapshot`: the catalog as one parse of its file, with what else
shapes how a name is served (the context size a plain base runs with, from Settings).
An operation (resolving a name, assembling a request, listing what the server offers)
takes one snapshot and looks everything up in it, so it costs one parse, and every
lookup of it sees the same catalog. A `Catalog` keeps its last snapshot and reads the
file again only when the file's stamp changed (`StateFile.stamp`), so a long-lived
process (the window, the server) parses it once per change, not once per lookup.
Snapshot records are shared: read them, copy before changing anything.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.catalog import digest, validation
from engine.catalog.profiles import DEFAULT_PROFILE, check_profile
from engine.errors import RefusedError, StateError, UnknownNameError, UsageError
from engine.formats import artifacts
from engine.formats.artifacts import AdapterInfo, BaseModelInfo
from engine.formats.safeio import printable
from engine.state import paths, settings
from engine.state.statefile import Stamp, StateFile

KINDS = ("models", "adapters", "variants")
BACKENDS = ("llama", "openvino")
SCHEMA_VERSION = 1


def empty() -> dict[str, Any]:
    return {"version": SCHEMA_VERSION, "models": {}, "adapters": {}, "variants": {}}


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass(frozen=True)
class AdapterSpec:
    """One adapter in a variant, as given on the command line (`NAME[:SCALE]`)."""

    name: str
    scale: float = 1.0

    @staticmethod
    def parse(text: str) -> AdapterSpec:
        name, sep, scale_text = text.rpartition(":") if ":" in text else (text, "", "")
        if not sep:
            return AdapterSpec(text, 1.0)
        try:
            scale = float(scale_text)
        except ValueError:
            raise UsageError(f"invalid scale {scale_text!r} for adapter {name!r}") from None
        return AdapterSpec(name, scale)


@dataclass(frozen=True)
class BaseStatus:
    name: str
    ok: bool
    detail: str
    sha256: str | None = None


# Inspections of stored files per (path, sha256), for the whole process: the same bytes
# inspect the same. Reading a GGUF header (its vocabulary) takes about 0.1 s, which every
# new Catalog (one per thread, task and command) used to pay again for every base. The
# values are frozen, so threads may share them; the lock keeps the dict whole.
_INSPECTED: dict[tuple[str, str], BaseModelInfo | AdapterInfo] = {}
_INSPECTED_LOCK = threading.Lock()
_INSPECTED_MAX = 256


@dataclass(frozen=True, eq=False)
class Snapshot:
    """The catalog as one read of its file (see the module doc): the lookups of a
    `Catalog`, answered from memory. Read-only: its records are shared."""

    raw: dict[str, Any]
    path: Path
    # The context size a plain base model is served with (Settings, "Context size (base
    # models)"): a base has no profile of its own, and its identity includes it.
    base_n_ctx: int = DEFAULT_PROFILE["n_ctx"]
    # Names the first run will add (a preview, before it: see `Catalog.later`).
    later: tuple[str, ...] = ()

    def snapshot(self) -> Snapshot:
        return self

    def data(self) -> dict[str, Any]:
        return self.raw

    def find(self, name: str) -> tuple[str, dict[str, Any]]:
        """(kind, record) for `name`, kind being 'model', 'adapter' or 'variant'."""
        data = self.raw
        for kind in KINDS:
            if name in data[kind]:
                return kind[:-1], data[kind][name]
        if name in self.later:
            raise UnknownNameError(f"{printable(name)!r} is set up at the first run, which "
                                   "has not happened yet (the app, or any command that "
                                   "writes, such as `generate`, runs it)")
        raise UnknownNameError(f"no model, adapter or variant named {printable(name)!r}"
                               + _did_you_mean(name, [*(n for k in KINDS for n in data[k]),
                                                      *self.later]))

    def model(self, name: str) -> dict[str, Any]:
        kind, record = self.find(name)
        if kind != "model":
            raise UnknownNameError(f"{name!r} is a {kind}, not a base model")
        return record

    def adapter(self, name: str) -> dict[str, Any]:
        kind, record = self.find(name)
        if kind != "adapter":
            raise UnknownNameError(f"{name!r} is a {kind}, not an adapter")
        return record

    def variant(self, name: str) -> dict[str, Any]:
        kind, record = self.find(name)
        if kind != "variant":
            raise UnknownNameError(f"{name!r} is a {kind}, not a variant")
        return record

    def adapter_file(self, name: str, backend: str) -> dict[str, Any]:
        """The record of adapter `name`'s file for `backend` (path, sha256, base...)."""
        record = self.adapter(name)
        if record["backend"] == backend:
            return record
        files = record.get("files", {})
        if backend not in files:
            raise RefusedError(f"adapter {name} has no {backend} file (add one with "
                               f"`variant-studio adapter convert {name}`)")
        return files[backend]


@dataclass
class Catalog:
    """Operations over the catalog file. Cheap to create; holds no open resources.

    Not shared across threads: a worker thread makes its own `Catalog(state)` (its
    last snapshot is its own too).
    """

    state: StateFile = field(default_factory=lambda: StateFile(paths.catalog_file(), empty))
    # Names the first run will add, while this is a preview of a catalog not set up yet
    # (`curated.setup.preview`): an unknown name close to one of them is suggested as
    # the CLI would suggest it once they exist.
    later: tuple[str, ...] = ()
    _last: tuple[Stamp, Snapshot] | None = field(default=None, init=False, repr=False,
                                                  compare=False)

    # ------------------------------------------------------------------ reading

    def exists(self) -> bool:
        return self.state.path.exists()

    def snapshot(self) -> Snapshot:
        """The catalog as it is now, read once (again only if the file changed since)."""
        stamp = self.state.stamp()
        context = settings.load().context_size
        last = self._last
        if stamp is not None and last is not None and last[0] == stamp:
            if last[1].base_n_ctx == context:
                return last[1]
            snapshot = Snapshot(last[1].raw, last[1].path, context, self.later)
        else:
            data = self.state.load()
            if data.get("version") != SCHEMA_VERSION or not all(
                isinstance(data.get(k), dict) for k in KINDS
            ):
                raise StateError(f"{self.state.path} has an unknown layout (version "
                                 f"{printable(str(data.get('version')))})")
            snapshot = Snapshot(data, self.state.path, context, self.later)
        if stamp is not None:
            self._last = (stamp, snapshot)
        return snapshot

    def data(self) -> dict[str, Any]:
        """The whole catalog (shared with the current snapshot: read, do not change)."""
        return self.snapshot().raw

    def find(self, name: str) -> tuple[str, dict[str, Any]]:
        """(kind, record) for `name`, kind being 'model', 'adapter' or 'variant'."""
        return self.snapshot().find(name)

    def model(self, name: str) -> dict[str, Any]:
        return self.snapshot().model(name)

    def adapter(self, name: str) -> dict[str, Any]:
        return self.snapshot().adapter(name)

    def variant(self, name: str) -> dict[str, Any]:
        return self.snapshot().variant(name)

    def adapter_file(self, name: str, backend: str) -> dict[str, Any]:
        """The record of adapter `name`'s file for `backend` (path, sha256, base...)."""
        return self.snapshot().adapter_file(name, backend)

    # ------------------------------------------------------------------ inspection

    def base_info(self, record: dict[str, Any]) -> BaseModelInfo:
        """Inspect a base model's file (memoised per path and digest)."""
        info = self._inspect(record)
        if not isinstance(info, BaseModelInfo):
            raise RefusedError(f"{record['name']}: {record['path']} is no longer a base model")
        return info

    def adapter_info(self, record: dict[str, Any]) -> AdapterInfo:
        """Inspect a stored adapter file (memoised per path and digest, like
        `base_info`: call it once the file's digest was checked against the record)."""
        info = self._inspect(record)
        if not isinstance(info, AdapterInfo):
            raise RefusedError(f"adapter {record['name']}: stored file is not an adapter")
        return info

    def _inspect(self, record: dict[str, Any]) -> BaseModelInfo | AdapterInfo:
        """`artifacts.inspect_path` of a record's file, memoised per path and digest
        (callers check the digest against the record first)."""
        key = (record["path"], record["sha256"])
        with _INSPECTED_LOCK:
            info = _INSPECTED.get(key)
        if info is None:
            info = artifacts.inspect_path(Path(record["path"]))
            with _INSPECTED_LOCK:
                if len(_INSPECTED) >= _INSPECTED_MAX:
                    del _INSPECTED[next(iter(_INSPECTED))]  # the oldest
                _INSPECTED[key] = info
        return info

    def verify_base(self, name: str, progress: digest.Progress | None = None,
                    cancelled: digest.CancelCheck | None = None) -> BaseStatus:
        """Is the base file still the one we recorded? (Instant when unchanged.)"""
        record = self.model(name)
        try:
            current = digest.content_digest(Path(record["path"]), progress, cancelled)
        except artifacts.InspectionError as exc:
            return BaseStatus(name, False, f"file unavailable: {exc.message}")
        if current != record["sha256"]:
            return BaseStatus(name, False, f"file changed on disk: sha256 is now "
                              f"{current[:16]}…, recorded {record['sha256'][:16]}…", current)
        return BaseStatus(name, True, "digest matches the recorded sha256", current)

    # ------------------------------------------------------------------ writing

    def insert(self, kind: str, record: dict[str, Any], *, replace: bool = False,
               check: Any = None) -> None:
        """Add `record` under `kind` ("models", "adapters", "variants"), under the lock.

        `check()` runs under the lock first (a cancelled import raises there, so it is
        never recorded); the name must be free unless `replace`.
        """
        def change(data: dict) -> dict:
            if check is not None:
                check()
            if not replace or record["name"] not in data[kind]:
                self.check_free(record["name"], data)
            data[kind][record["name"]] = record
            return data

        self.state.update(change)

    def check_free(self, name: str, data: dict | None = None) -> None:
        data = data if data is not None else self.data()
        for kind in KINDS:
            if name in data[kind]:
                noun = {"models": "a model", "adapters": "an adapter"}.get(kind, "a variant")
                raise UsageError(f"the name {name!r} is already used by {noun}")

    def check_store_free(self, name: str) -> None:
        """A new model kept in the model store (a download, a merge): its name must be
        valid and free, and its folder `<data>/models/NAME` must not exist (a folder
        without a record is someone's: it is named, never removed)."""
        paths.check_name(name, "model name")
        self.check_free(name)
        folder = paths.model_store(name)
        if folder.exists() or folder.is_symlink():
            raise RefusedError(f"{printable(str(folder))} already exists without a catalog "
                               "record; remove it or choose another name")

    # ------------------------------------------------------------------ variants

    def add_variant(
        self,
        name: str,
        base: str,
        adapters: list[AdapterSpec],
        profile: dict[str, Any] | None = None,
        curated: bool = False,
        replace: bool = False,
    ) -> dict[str, Any]:
        paths.check_name(name, "variant name")
        if not replace:
            self.check_free(name)
        record = self.make_variant_record(name, base, adapters, profile, curated)
        self.insert("variants", record, replace=replace)
        return record

    def make_variant_record(self, name: str, base: str, adapters: list[AdapterSpec],
                            profile: dict[str, Any] | None = None,
                            curated: bool = False) -> dict[str, Any]:
        """Check a variant's parts and build its record (nothing is written)."""
        base_record = self.model(base)
        if not adapters:
            raise UsageError("a variant needs at least one --adapter")
        seen = set()
        entries = []
        for spec in adapters:
            validation.require_scale(spec.scale, f"adapter {spec.name}")
            if spec.name in seen:
                raise RefusedError(f"adapter {spec.name} is listed twice")
            seen.add(spec.name)
            adapter = self.adapter(spec.name)
            if adapter["backend"] != base_record["backend"]:
                if base_record["backend"] not in adapter.get("files", {}):
                    raise RefusedError(f"adapter {spec.name} is for {adapter['backend']}, base "
                                       f"{base} runs on {base_record['backend']}")
                adapter = adapter["files"][base_record["backend"]]
            if adapter["base"] != base and adapter["base_sha256"] != base_record["sha256"]:
                raise RefusedError(f"adapter {spec.name} was validated for base "
                                   f"{adapter['base']}, not {base}")
            entries.append({"name": spec.name, "scale": float(spec.scale) + 0.0})
        merged = dict(DEFAULT_PROFILE)
        merged.update(check_profile(profile or {}))
        return {
            "name": name,
            "kind": "variant",
            "backend": base_record["backend"],
            "base": base,
            "adapters": entries,
            "profile": merged,
            "curated": curated,
            "created_at": now_iso(),
        }

    # ------------------------------------------------------------------ removal

    def remove(self, name: str) -> str:
        kind, record = self.find(name)
        users = self.dependents(name)
        if users:
            raise RefusedError(f"{name} is used by {', '.join(sorted(users))}; remove "
                               "those first")

        def drop(data: dict) -> dict:
            data[kind + "s"].pop(name, None)
            return data

        self.state.update(drop)
        if kind == "model" and Path(record["path"]).parent == paths.model_store(name):
            # A downloaded model lives in the store (other models stay where they are).
            shutil.rmtree(paths.model_store(name), ignore_errors=True)
        if kind == "adapter":
            shutil.rmtree(paths.adapter_store(name), ignore_errors=True)
            shipped = paths.data_dir() / "shipped" / name
            if Path(record["path"]).parent == shipped:
                shutil.rmtree(shipped, ignore_errors=True)
        return kind

    def dependents(self, name: str) -> list[str]:
        data = self.data()
        users = [a for a, r in data["adapters"].items() if r.get("base") == name
                 or any(f.get("base") == name for f in r.get("files", {}).values())]
        for v, r in data["variants"].items():
            if r.get("base") == name or any(a["name"] == name for a in r["adapters"]):
                users.append(v)
        return users

    # ------------------------------------------------------------------ findings

    def record_cross_check(self, adapters: Sequence[tuple[str, str]], backend: str,
                           summary: dict[str, Any]) -> list[str]:
        """Keep a parity run's findings on the `backend` file of each adapter it ran.

        `adapters` are (name, sha256) of the files that ran. Only a file whose digest
        is still the one that ran gets the summary (as `cross_check`), so a record
        never describes other bytes. Returns the names of the adapters recorded.
        """
        recorded: list[str] = []

        def note(data: dict) -> dict:
            recorded.clear()  # in case the update is applied more than once
            for name, sha256 in adapters:
                record = data["adapters"].get(name)
                if record is None:
                    continue
                entry = (record if record["backend"] == backend
                         else record.get("files", {}).get(backend))
                if entry is not None and entry.get("sha256") == sha256:
                    entry["cross_check"] = summary
                    recorded.append(name)
            return data

        if adapters:
            self.state.update(note)
        return recorded


# Whatever lookups read: a `Catalog` (a snapshot taken per call) or one `Snapshot`.
Reader = Catalog | Snapshot


def _did_you_mean(name: str, known: list[str]) -> str:
    """"; did you mean 'x'?" for a near miss, else nothing."""
    import difflib

    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
