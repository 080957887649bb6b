"""The catalog: base models, adapters and variants, as JSON records on disk.

Adapters are installed artifacts: an imported adapter is copied into the store and
validated there, so editing the source file later cannot change a variant. Base
models stay where they are (they are large) and are re-verified by digest whenever
their size or mtime changes; a changed base is reported, not served. Variants are
selectable models: a base plus ordered adapters with scales plus a profile.

Nothing that fails validation is added; the catalog file is only written once an
artifact has been accepted, under the state file's lock.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine import artifacts, defaults, digest, paths, validation
from engine.artifacts import AdapterInfo, BaseModelInfo
from engine.errors import RefusedError, StateError, StudioError, UnknownNameError, UsageError
from engine.identity import AdapterRef, ContextConfig, Identity, runtime_version
from engine.safeio import printable
from engine.statefile import StateFile

KINDS = ("models", "adapters", "variants")
BACKENDS = ("llama", "openvino")
SCHEMA_VERSION = 1
DEFAULT_PROFILE: dict[str, Any] = {
    "system_prompt": "",
    "n_ctx": 4096,
    "temperature": 0.7,
    "top_p": 0.95,
    "top_k": 40,
    "repeat_penalty": 1.1,
    "max_tokens": 256,
    "seed": 0,
}


def _empty() -> dict[str, Any]:
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


@dataclass
class Catalog:
    """Operations over the catalog file. Cheap to create; holds no open resources."""

    state: StateFile = field(default_factory=lambda: StateFile(paths.catalog_file(), _empty))
    # Inspections of stored files, per (path, sha256): the same bytes inspect the same.
    _inspected: dict[tuple[str, str], BaseModelInfo | AdapterInfo] = field(
        default_factory=dict)

    # ------------------------------------------------------------------ reading

    def data(self) -> dict[str, Any]:
        data = self.state.load()
        if data.get("version") != SCHEMA_VERSION or not all(
            isinstance(data.get(k), dict) for k in KINDS
        ):
            raise StateError(f"{self.state.path} has an unknown layout (version "
                             f"{printable(str(data.get('version')))})")
        return data

    def ensure_initialized(self, progress: digest.Progress | None = None,
                           demo: bool = False) -> None:
        """On first run, create the catalog with the embedded base as a curated entry.

        With `demo` (the CLI and the app's first run), a new catalog also gets the
        shipped demo: a trained adapter and its curated variant (engine.training.demo).

        A catalog that does not parse is set aside here (with a notice) and a fresh
        one is created in its place; its bytes are kept beside it.
        """
        if self.state.path.exists():
            self.state.load()
            if self.state.path.exists():
                return
        record = None
        model = defaults.embedded_model_path()
        if model is not None:
            record = self._model_record(defaults.DEFAULT_MODEL_NAME, model, "llama",
                                        defaults.DEFAULT_MODEL_SOURCE, True, progress, None)

        def seed(data: dict) -> dict:
            if record and not any(data[k] for k in KINDS):
                data["models"][record["name"]] = record
            return data

        created = False
        with self.state.locked():
            if not self.state.path.exists():
                from engine.statefile import write_json_atomic

                write_json_atomic(self.state.path, seed(_empty()))
                created = True
        if created and record and demo:
            # The shipped demo: a trained adapter and its curated variant (optional:
            # a missing or broken demo leaves a notice, never a broken catalog).
            from engine.training.demo import seed_catalog

            seed_catalog(self)

    def find(self, name: str) -> tuple[str, dict[str, Any]]:
        """(kind, record) for `name`, kind being 'model', 'adapter' or 'variant'."""
        data = self.data()
        for kind in KINDS:
            if name in data[kind]:
                return kind[:-1], data[kind][name]
        raise UnknownNameError(f"no model, adapter or variant named {printable(name)!r}")

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

    # ------------------------------------------------------------------ base models

    def base_info(self, record: dict[str, Any]) -> BaseModelInfo:
        """Inspect a base model's file (memoised per path and digest)."""
        info = self._inspect(record)
        if not isinstance(info, BaseModelInfo):
            raise RefusedError(f"{record['name']}: {record['path']} is no longer a base model")
        return info

    def _inspect(self, record: dict[str, Any]) -> BaseModelInfo | AdapterInfo:
        """`artifacts.inspect_path` of a record's file, memoised per path and digest
        (callers check the digest against the record first)."""
        key = (record["path"], record["sha256"])
        if key not in self._inspected:
            self._inspected[key] = artifacts.inspect_path(Path(record["path"]))
        return self._inspected[key]

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

    def add_model(
        self,
        name: str,
        file: Path,
        backend: str | None = None,
        source: str | None = None,
        curated: bool = False,
        progress: digest.Progress | None = None,
        cancelled: digest.CancelCheck | None = None,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        paths.check_name(name, "model name")
        self._check_free(name)
        file = Path(file).expanduser().absolute()
        record = self._model_record(name, file, backend, source or str(file), curated,
                                    progress, cancelled)
        record.update(extra or {})  # e.g. how a built model was made (built_from)

        def insert(data: dict) -> dict:
            _check_cancelled(cancelled, name)  # under the lock: cancelled means not added
            self._check_free(name, data)
            data["models"][name] = record
            return data

        self.state.update(insert)
        return record

    def _model_record(self, name: str, file: Path, backend: str | None, source: str,
                      curated: bool, progress: digest.Progress | None,
                      cancelled: digest.CancelCheck | None) -> dict[str, Any]:
        info = artifacts.inspect_path(file)
        if isinstance(info, AdapterInfo):
            raise RefusedError(f"{file.name} is a LoRA adapter, not a base model "
                               f"(use `adapter add`)")
        if backend is None:
            backend = "openvino" if info.format == "openvino" else "llama"
        if backend not in BACKENDS:
            raise UsageError(f"unknown backend {backend!r} (llama or openvino)")
        if backend == "llama" and info.format != "gguf":
            raise RefusedError(f"{file.name}: llama.cpp serves GGUF files, this is "
                               f"{info.format}")
        sha = digest.content_digest(file, progress, cancelled)
        return {
            "name": name,
            "kind": "model",
            "backend": backend,
            "format": info.format,
            "path": str(file),
            "sha256": sha,
            "size": _size(file),
            "source": source,
            "installed_at": now_iso(),
            "curated": curated,
            "metadata": info.summary(),
        }

    # ------------------------------------------------------------------ adapters

    def add_adapter(
        self,
        name: str,
        base: str,
        file: Path,
        source: str | None = None,
        strict: bool = False,
        curated: bool = False,
        default_scale: float = 1.0,
        progress: digest.Progress | None = None,
        cancelled: digest.CancelCheck | None = None,
        provenance: dict[str, Any] | None = None,
        shipped: bool = False,
    ) -> dict[str, Any]:
        """Copy, inspect and validate an adapter, then add it. Refusal changes nothing.

        A `provenance` record is stored in the catalog and as `provenance.json` beside
        the stored file. `shipped` adapters (the app's own demo) are stored under
        `<data>/shipped/` rather than `<data>/adapters/`.
        """
        paths.check_name(name, "adapter name")
        self._check_free(name)
        base_record = self.model(base)
        scale_check = validation.check_scale(default_scale)
        if scale_check.status == validation.FAIL:
            raise RefusedError(f"default scale: {scale_check.detail}")
        status = self.verify_base(base)
        if not status.ok:
            raise RefusedError(f"base {base}: {status.detail}")
        file = Path(file).expanduser().absolute()
        first = artifacts.inspect_path(file)  # fail fast, before copying anything
        if isinstance(first, BaseModelInfo):
            raise RefusedError(f"{file.name} is a base model ({first.architecture}, "
                               f"{first.block_count} layers), not an adapter")
        store_root = paths.data_dir() / ("shipped" if shipped else "adapters")
        store_root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".import-", dir=store_root))
        try:
            # Three passes over the bytes (copy, value scan, hash), one progress bar.
            stored = _copy_adapter(first, staging, _phase(progress, 0, 3), cancelled)
            if provenance is not None:
                from engine.statefile import write_json_atomic

                write_json_atomic(staging / "provenance.json", provenance)
            info = artifacts.inspect_path(stored)  # validate the bytes we will serve
            if not isinstance(info, AdapterInfo):
                raise RefusedError(f"{file.name} changed while it was imported")
            base_info = self.base_info(base_record)
            report = validation.check_adapter(info, base_info, base_record["backend"],
                                              base_record["sha256"], strict=strict or curated,
                                              progress=_phase(progress, 1, 3),
                                              cancelled=cancelled)
            if not report.ok:
                raise RefusedError(report.reason(), details=tuple(
                    f"{c.name}: {c.detail}" for c in report.failures()))
            sha = digest.sha256_file(Path(info.path), _phase(progress, 2, 3), cancelled)
            config_sha = (digest.sha256_file(Path(info.config_path), cancelled=cancelled)
                          if info.config_path else None)
            final = store_root / name
            if final.exists():
                shutil.rmtree(final)  # a leftover from an interrupted removal
            staging.rename(final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        _keep_digests(info, final)
        stored_path = final / Path(info.path).name
        record = {
            "name": name,
            "kind": "adapter",
            "backend": info.backend,
            "format": info.format,
            "path": str(stored_path),
            "sha256": sha,
            "config_sha256": config_sha,
            "size": _size(final),
            "source": source or str(file),
            "installed_at": now_iso(),
            "curated": curated,
            "base": base,
            "base_sha256": base_record["sha256"],
            "expected_base_sha256": info.base_sha256,
            "verified": info.base_sha256 == base_record["sha256"],
            "default_scale": float(default_scale),
            "metadata": info.summary(),
            "checks": report.to_list(),
        }
        if provenance is not None:
            record["provenance"] = provenance

        def insert(data: dict) -> dict:
            _check_cancelled(cancelled, name)  # under the lock: cancelled means not added
            self._check_free(name, data)
            data["adapters"][name] = record
            return data

        self._record_or_discard(insert, final)
        return record

    def _record_or_discard(self, mutate: Callable[[dict], dict], stored: Path) -> None:
        """Apply `mutate` to the catalog; if that fails, remove the copy stored for it,
        so a refused or interrupted import leaves no orphan files behind."""
        try:
            self.state.update(mutate)
        except BaseException:
            shutil.rmtree(stored, ignore_errors=True)
            raise

    def adapter_info(self, record: dict[str, Any]) -> AdapterInfo:
        """Inspect a stored adapter file (memoised per path and digest, like
        `base_info`: call it once the file's digest was checked against the record)."""
        info = self._inspect(record)
        if not isinstance(info, AdapterInfo):
            raise RefusedError(f"adapter {record['name']}: stored file is not an adapter")
        return info

    def recheck_adapter(self, name: str, base: str | None = None) -> validation.Report:
        """Re-verify a stored adapter: its bytes, then every compatibility check.

        With `base`, the adapter's file for that base's backend is checked (an adapter
        may carry one file per backend, see `add_adapter_file`).
        """
        record = self.adapter(name)
        if base is not None:
            try:
                record = {**self.adapter_file(name, self.model(base)["backend"]), "name": name,
                          "curated": record.get("curated")}
            except RefusedError as exc:
                return validation.Report((validation.Check("format", validation.FAIL,
                                                           exc.message),))
        checks: list[validation.Check] = []
        try:
            sha = digest.sha256_file(Path(record["path"]))
        except artifacts.InspectionError as exc:
            return validation.Report((validation.Check("digest", validation.FAIL,
                                                       exc.message),))
        if sha != record["sha256"]:
            return validation.Report((validation.Check(
                "digest", validation.FAIL,
                f"stored file changed after import: sha256 {sha[:16]}…, "
                f"recorded {record['sha256'][:16]}…"),))
        if record.get("config_sha256"):
            config = Path(record["path"]).with_name("adapter_config.json")
            try:
                ok = digest.sha256_file(config) == record["config_sha256"]
            except artifacts.InspectionError:
                ok = False
            if not ok:
                return validation.Report((validation.Check(
                    "digest", validation.FAIL,
                    "stored adapter_config.json changed after import"),))
        checks.append(validation.Check("digest", validation.PASS, "matches the recorded sha256"))
        base_record = self.model(base or record["base"])
        status = self.verify_base(base_record["name"])
        if not status.ok:
            checks.append(validation.Check("base", validation.FAIL, status.detail))
            return validation.Report(tuple(checks))
        try:
            info = self.adapter_info(record)
        except artifacts.InspectionError as exc:
            checks.append(validation.Check("structure", validation.FAIL, exc.message))
            return validation.Report(tuple(checks))
        # The digest matched, so these are the bytes scanned at import: their recorded
        # value scan stands (a full read of the weights on every library refresh
        # otherwise). The structural checks against the base are cheap and rerun.
        report = validation.check_adapter(info, self.base_info(base_record),
                                          base_record["backend"], base_record["sha256"],
                                          strict=bool(record.get("curated")),
                                          values=_recorded_check(record, "values"))
        return validation.Report(tuple(checks) + report.checks)

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
            self._check_free(name)
        record = self.make_variant_record(name, base, adapters, profile, curated)

        def insert(data: dict) -> dict:
            if not replace or name not in data["variants"]:
                self._check_free(name, data)
            data["variants"][name] = record
            return data

        self.state.update(insert)
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
            check = validation.check_scale(spec.scale)
            if check.status == validation.FAIL:
                raise RefusedError(f"adapter {spec.name}: {check.detail}")
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

    def identity(self, name: str, n_ctx: int | None = None,
                 backend: str | None = None) -> Identity:
        """The identity of a base model or variant as it would be served now.

        `backend` serves a variant on another backend: its base's counterpart there,
        and each adapter's file for that backend (see `serving_base`).
        """
        kind, record = self.find(name)
        if kind == "adapter":
            raise UsageError(f"{name!r} is an adapter; serve it through a variant")
        if kind == "model":
            base = self.serving_base(name, backend)
            return self.identity_of_parts(base, [], n_ctx or DEFAULT_PROFILE["n_ctx"])
        specs = [AdapterSpec(a["name"], a["scale"]) for a in record["adapters"]]
        return self.identity_of_parts(self.serving_base(name, backend), specs,
                                      n_ctx or int(record["profile"].get("n_ctx", 4096)))

    def serving_base(self, name: str, backend: str | None = None) -> str:
        """The base model that serves model or variant `name` on `backend`."""
        kind, record = self.find(name)
        base = name if kind == "model" else record["base"]
        if backend is None or self.model(base)["backend"] == backend:
            return base
        if backend not in BACKENDS:
            raise UsageError(f"unknown backend {backend!r} (llama or openvino)")
        other = self.counterpart(base, backend)
        if other is None:
            raise RefusedError(f"{base} has no counterpart on {backend}: no {backend} model "
                               f"in the catalog was built from it")
        if kind == "variant":
            for entry in record["adapters"]:
                self.adapter_file(entry["name"], backend)  # refuses a missing file
        return other

    def backends_for(self, name: str) -> list[tuple[str, str | None]]:
        """Each backend with None if it can serve `name`, else the reason it cannot.

        The base's own backend comes first.
        """
        own = self.model(self.serving_base(name))["backend"]
        out: list[tuple[str, str | None]] = []
        for backend in (own, *(b for b in BACKENDS if b != own)):
            try:
                self.serving_base(name, backend)
                out.append((backend, None))
            except StudioError as exc:
                out.append((backend, exc.message))
        return out

    def counterpart(self, base: str, backend: str) -> str | None:
        """The model with the same weights as `base` on `backend`, if the catalog has one.

        Known pairs are models built from another (`built_from.sha256`), in either
        direction: the curated OpenVINO default mirrors the llama.cpp default this way.
        """
        record = self.model(base)
        if record["backend"] == backend:
            return base
        for other in self.data()["models"].values():
            if other.get("backend") != backend:
                continue
            if (other.get("built_from", {}).get("sha256") == record["sha256"]
                    or record.get("built_from", {}).get("sha256") == other.get("sha256")):
                return other["name"]
        return None

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

    def add_adapter_file(self, name: str, base: str, file: Path, source: str | None = None,
                         progress: digest.Progress | None = None,
                         cancelled: digest.CancelCheck | None = None) -> dict[str, Any]:
        """Give adapter `name` a file for another backend, validated against `base`.

        The file is copied into `<store>/NAME/<backend>/`, checked there against `base`
        (which must be the counterpart of the adapter's own base), and recorded with its
        own digest under `files[backend]`. Refusal changes nothing.
        """
        record = self.adapter(name)
        base_record = self.model(base)
        backend = base_record["backend"]
        if backend == record["backend"]:
            raise UsageError(f"adapter {name} already is a {backend} adapter")
        if self.counterpart(record["base"], backend) != base:
            raise RefusedError(f"{base} does not serve the same weights as {record['base']}, "
                               f"the base adapter {name} was made for")
        status = self.verify_base(base)
        if not status.ok:
            raise RefusedError(f"base {base}: {status.detail}")
        file = Path(file).expanduser().absolute()
        first = artifacts.inspect_path(file)
        if isinstance(first, BaseModelInfo):
            raise RefusedError(f"{file.name} is a base model, not an adapter")
        folder = paths.adapter_store(name) / backend
        folder.parent.mkdir(parents=True, exist_ok=True)  # absent for shipped adapters
        staging = Path(tempfile.mkdtemp(prefix=".import-", dir=paths.adapter_store(name)))
        try:
            stored = _copy_adapter(first, staging, progress, cancelled)
            info = artifacts.inspect_path(stored)
            if not isinstance(info, AdapterInfo):
                raise RefusedError(f"{file.name} changed while it was imported")
            report = validation.check_adapter(info, self.base_info(base_record), backend,
                                              base_record["sha256"], cancelled=cancelled)
            if not report.ok:
                raise RefusedError(report.reason(), details=tuple(
                    f"{c.name}: {c.detail}" for c in report.failures()))
            sha = digest.sha256_file(Path(info.path), cancelled=cancelled)
            config_sha = (digest.sha256_file(Path(info.config_path), cancelled=cancelled)
                          if info.config_path else None)
            if folder.exists():
                shutil.rmtree(folder)
            staging.rename(folder)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        _keep_digests(info, folder)
        entry = {
            "backend": backend, "format": info.format,
            "path": str(folder / Path(info.path).name), "sha256": sha,
            "config_sha256": config_sha, "size": _size(folder),
            "source": source or str(file), "installed_at": now_iso(),
            "base": base, "base_sha256": base_record["sha256"],
            "metadata": info.summary(), "checks": report.to_list(),
        }

        def insert(data: dict) -> dict:
            if name not in data["adapters"]:
                raise UnknownNameError(f"adapter {name} was removed meanwhile")
            data["adapters"][name].setdefault("files", {})[backend] = entry
            return data

        self._record_or_discard(insert, folder)
        return entry

    def convert_adapter(self, name: str, backend: str, base: str | None = None,
                        progress: digest.Progress | None = None) -> dict[str, Any]:
        """Convert adapter `name`'s stored file to `backend`'s format and add it.

        GGUF <-> PEFT, with llama.cpp's q/k row permutation undone or applied on the B
        halves (see `engine.lora_io`); the head counts come from the adapter's base.
        """
        from engine import lora_io

        record = self.adapter(name)
        own_base = self.model(record["base"])
        target = base or self.counterpart(record["base"], backend)
        if target is None:
            raise RefusedError(f"{record['base']} has no counterpart on {backend}")
        meta = own_base["metadata"]
        paths.adapter_store(name).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".convert-",
                                         dir=paths.adapter_store(name)) as tmp:
            converted = lora_io.convert_file(
                Path(record["path"]), Path(tmp) / ("peft" if backend == "openvino"
                                                  else "adapter.gguf"),
                int(meta["head_count"]), int(meta["head_count_kv"]),
                str(meta.get("architecture") or "llama"),
                rebase=(own_base["sha256"], self.model(target)["sha256"]))
            return self.add_adapter_file(
                name, target, converted, f"converted from {name} ({record['format']}, "
                f"sha256 {record['sha256'][:16]}…)", progress)

    def identity_of_parts(self, base_name: str, adapters: list[AdapterSpec],
                          n_ctx: int) -> Identity:
        """The identity a variant with these parts would have (nothing is saved)."""
        base = self.model(base_name)
        refs = tuple(AdapterRef(a.name, self.adapter_file(a.name, base["backend"])["sha256"],
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
        )

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

    def _check_free(self, name: str, data: dict | None = None) -> None:
        data = data if data is not None else self.data()
        for kind in KINDS:
            if name in data[kind]:
                raise UsageError(f"the name {name!r} is already used by a {kind[:-1]}")


def check_profile(profile: dict[str, Any]) -> dict[str, Any]:
    """Range-check a variant profile; unknown keys are refused."""
    limits: dict[str, tuple[type, float, float]] = {
        "n_ctx": (int, 256, 131072),
        "temperature": (float, 0.0, 5.0),
        "top_p": (float, 0.0, 1.0),
        "top_k": (int, 0, 100000),
        "repeat_penalty": (float, 0.5, 5.0),
        "max_tokens": (int, 1, 32768),
        "seed": (int, 0, 2**32 - 1),
    }
    out: dict[str, Any] = {}
    for key, value in profile.items():
        if key == "system_prompt":
            if not isinstance(value, str) or len(value) > 100_000:
                raise UsageError("system_prompt must be text (at most 100000 characters)")
            out[key] = value
            continue
        if key not in limits:
            raise UsageError(f"unknown profile setting {key!r}")
        kind, low, high = limits[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise UsageError(f"{key} must be a number")
        if not math.isfinite(value) or not low <= value <= high:
            raise UsageError(f"{key} = {value} out of range ({low:g}..{high:g})")
        if kind is int and value != int(value):
            raise UsageError(f"{key} must be a whole number")
        out[key] = kind(value)
    return out


def _copy_adapter(info: AdapterInfo, staging: Path, progress: digest.Progress | None,
                  cancelled: digest.CancelCheck | None) -> Path:
    """Copy the adapter's files into `staging`; returns the stored weights path.

    Store names are fixed, never taken from the source file or its metadata.
    """
    source = Path(info.path)
    target = staging / ("adapter.gguf" if info.format == "gguf"
                        else "adapter_model.safetensors")
    _copy_file(source, target, progress, cancelled)
    if info.config_path:
        _copy_file(Path(info.config_path), staging / "adapter_config.json", None, cancelled)
    return target


def _copy_file(source: Path, target: Path, progress: digest.Progress | None,
               cancelled: digest.CancelCheck | None) -> None:
    from engine.errors import Cancelled
    from engine.safeio import open_regular

    handle, st = open_regular(source)
    done = 0
    with handle, open(target, "wb") as out:
        while chunk := handle.read(digest.CHUNK):
            if cancelled and cancelled():
                raise Cancelled(f"import of {source.name} was cancelled")
            out.write(chunk)
            done += len(chunk)
            if progress:
                progress(done, st.size)


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def status_of_records(catalog: Catalog, skip: frozenset[str] | set[str] = frozenset()
                      ) -> dict[str, list[str]]:
    """Problems per entry (changed bases, adapters that no longer validate).

    Cheap when `unchecked(catalog)` is empty; `skip` leaves out the entries it names.
    """
    problems: dict[str, list[str]] = {}
    data = catalog.data()
    for name in data["models"]:
        if name in skip:
            continue
        status = catalog.verify_base(name)
        if not status.ok:
            problems.setdefault(name, []).append(status.detail)
    for name in data["adapters"]:
        if name in skip:
            continue
        report = catalog.recheck_adapter(name)
        if not report.ok:
            problems.setdefault(name, []).append(report.reason())
    return problems


def _unread_files(catalog: Catalog) -> dict[str, list[Path]]:
    """Per entry, the files its check would have to read whole: a digest not cached
    (a new or changed file) or an adapter file without a recorded value scan."""
    out: dict[str, list[Path]] = {}
    data = catalog.data()

    def needs_hash(path: Path) -> bool:
        try:
            return digest.cached_content_digest(path) is None
        except artifacts.InspectionError:
            return False  # missing or not a file: reported at once, nothing to read

    for name, record in data["models"].items():
        if needs_hash(Path(record["path"])):
            out[name] = [Path(record["path"])]
    for name, record in data["adapters"].items():
        files = []
        for entry in (record, *record.get("files", {}).values()):
            path = Path(entry["path"])
            if needs_hash(path) or _recorded_check(entry, "values") is None:
                files.append(path)
            if entry.get("config_sha256") and needs_hash(path.with_name("adapter_config.json")):
                files.append(path.with_name("adapter_config.json"))
        if files:
            out[name] = files
    return out


def unchecked(catalog: Catalog) -> set[str]:
    """Entries whose problem check would read whole files (only stats and caches are
    read here): a base or adapter that is new or changed on disk, and everything that
    uses one. `check_files` does the reading; then `status_of_records` is cheap."""
    data = catalog.data()
    slow = set(_unread_files(catalog))
    for name, record in data["adapters"].items():
        bases = {record["base"], *(f.get("base") for f in record.get("files", {}).values())}
        if bases & slow:
            slow.add(name)
    for name, record in data["variants"].items():
        if {record["base"], *(a["name"] for a in record["adapters"])} & slow:
            slow.add(name)
    return slow


def check_files(catalog: Catalog, progress: digest.Progress | None = None,
                cancelled: digest.CancelCheck | None = None) -> None:
    """Read what `unchecked` found (hash new or changed files), with progress and
    cancellation, so that the checks that follow answer from the caches. Long: a
    changed multi-gigabyte base is hashed again."""
    files = list(dict.fromkeys(p for paths_ in _unread_files(catalog).values()
                               for p in paths_))

    def size(path: Path) -> int:
        try:
            return _size(path)
        except OSError:
            return 0

    sizes = [size(p) for p in files]
    total, done = sum(sizes), 0
    for path, length in zip(files, sizes, strict=True):
        def sub(d: int, _t: int, base: int = done) -> None:
            if progress:
                progress(base + d, total)

        try:
            digest.content_digest(path, sub, cancelled)
        except artifacts.InspectionError:
            pass  # the check itself reports an unreadable file
        done += length
        _check_cancelled(cancelled, path.name)


def _recorded_check(record: dict[str, Any], name: str) -> validation.Check | None:
    """The check `name` recorded for a stored file at import, if there is one."""
    for check in record.get("checks") or ():
        if isinstance(check, dict) and check.get("name") == name and \
                check.get("status") in (validation.PASS, validation.WARN, validation.FAIL):
            return validation.Check(name, check["status"], str(check.get("detail", "")))
    return None


def _check_cancelled(cancelled: digest.CancelCheck | None, what: str) -> None:
    from engine.errors import Cancelled

    if cancelled and cancelled():
        raise Cancelled(f"{what}: cancelled")


def _phase(progress: digest.Progress | None, index: int, count: int
           ) -> digest.Progress | None:
    """Progress of pass `index` of `count` equal passes over the same bytes."""
    if progress is None:
        return None
    return lambda done, total: progress(index * total + done, count * total)


def _keep_digests(info: AdapterInfo, folder: Path) -> None:
    """The staged files were renamed into `folder`: keep their cached digests, so the
    first check of the stored copy does not read it all again."""
    for staged in (info.path, info.config_path):
        if staged:
            try:
                digest.moved(Path(staged), folder / Path(staged).name)
            except StudioError:
                pass  # only costs one more read at the next check


Callback = Callable[[int, int], None]
