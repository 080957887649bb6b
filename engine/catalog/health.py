"""Is the catalog still sound? Re-checks of stored files, the entries whose check would
read whole files, and the installation checks `doctor` reports.

A library refresh asks `unchecked` (stats and caches only) which entries need a full
read; `check_files` does that reading in the background, after which
`status_of_records` answers from the caches.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

from engine.catalog import digest, merged, validation
from engine.catalog.resolve import identity
from engine.catalog.store import Catalog
from engine.errors import Cancelled, RefusedError, StudioError
from engine.formats import artifacts
from engine.state import paths


def recheck_adapter(catalog: Catalog, name: str, base: str | None = None) -> validation.Report:
    """Re-verify a stored adapter: its bytes, then every compatibility check.

    With `base`, the adapter's file for that base's backend is checked (an adapter
    may carry one file per backend, see `imports.add_adapter_file`).
    """
    record = catalog.adapter(name)
    if base is not None:
        try:
            record = {**catalog.adapter_file(name, catalog.model(base)["backend"]),
                      "name": name, "curated": record.get("curated")}
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
    base_record = catalog.model(base or record["base"])
    status = catalog.verify_base(base_record["name"])
    if not status.ok:
        checks.append(validation.Check("base", validation.FAIL, status.detail))
        return validation.Report(tuple(checks))
    try:
        info = catalog.adapter_info(record)
    except artifacts.InspectionError as exc:
        checks.append(validation.Check("structure", validation.FAIL, exc.message))
        return validation.Report(tuple(checks))
    # The digest matched, so these are the bytes scanned at import: their recorded
    # value scan stands (a full read of the weights on every library refresh
    # otherwise). The structural checks against the base are cheap and rerun.
    report = validation.check_adapter(info, catalog.base_info(base_record),
                                      base_record["backend"], base_record["sha256"],
                                      strict=bool(record.get("curated")),
                                      values=recorded_check(record, "values"))
    return validation.Report(tuple(checks) + report.checks)


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
        report = recheck_adapter(catalog, name)
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
            if needs_hash(path) or recorded_check(entry, "values") is None:
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
    files = list(dict.fromkeys(p for found in _unread_files(catalog).values() for p in found))

    def size(path: Path) -> int:
        try:
            return path.stat().st_size
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
        if cancelled and cancelled():
            raise Cancelled(f"{path.name}: cancelled")


def recorded_check(record: dict[str, Any], name: str) -> validation.Check | None:
    """The check `name` recorded for a stored file at import, if there is one."""
    for check in record.get("checks") or ():
        if isinstance(check, dict) and check.get("name") == name and \
                check.get("status") in (validation.PASS, validation.WARN, validation.FAIL):
            return validation.Check(name, check["status"], str(check.get("detail", "")))
    return None


# --------------------------------------------------------------------------- doctor

PACKAGES = ("llama-cpp-python", "openvino-genai", "PySide6", "gguf", "safetensors")


def doctor_checks(catalog: Catalog | None,
                  installation: Iterable[validation.Check] = ()) -> list[dict[str, str]]:
    """The installation (Python, packages, data directory, plus the front end's own
    `installation` checks) and every catalog entry, as check dicts. Reads only.

    `catalog` None: there is no catalog yet (nothing is created to check it)."""
    checks: list[validation.Check] = []
    add = checks.append
    py = platform.python_version()
    add(validation.Check("python", "pass" if py.startswith("3.11") else "warn", py))
    for package in PACKAGES:
        try:
            add(validation.Check(package, "pass", metadata.version(package)))
        except metadata.PackageNotFoundError:
            add(validation.Check(package, "fail", "not installed (run ./run.sh)"))
    try:
        metadata.version("torch")
        add(validation.Check("training", "pass", "PyTorch installed"))
    except metadata.PackageNotFoundError:
        add(validation.Check("training", "warn", "PyTorch missing: training is off "
                             "(pip install 'variant-studio[train]')"))
    home = paths.data_dir(create=False)
    usable = os.access(home, os.W_OK) if home.exists() else _creatable(home)
    add(validation.Check("data directory", "pass" if usable else "fail", str(home)))
    checks.extend(installation)
    if catalog is not None:
        checks.extend(catalog_checks(catalog))
    return [c.to_dict() for c in checks]


def catalog_checks(catalog: Catalog) -> list[validation.Check]:
    """One check per base model, adapter file and variant."""
    checks = []
    data = catalog.data()
    for name, record in data["models"].items():
        status = catalog.verify_base(name)
        if "merged_from" in record:
            # A merged model is served as a plain base: say what it is, and warn when it
            # was kept although its fine-tune did not survive.
            found = merged.check(record)
            checks.append(validation.Check(
                f"model {name}", "fail" if not status.ok else found.status,
                f"{status.detail}; {found.detail}"))
            continue
        checks.append(validation.Check(f"model {name}", "pass" if status.ok else "fail",
                                       status.detail))
    for name in data["adapters"]:
        report = recheck_adapter(catalog, name)
        checks.append(validation.Check(f"adapter {name}", report.status, report.reason()))
        for backend, entry in data["adapters"][name].get("files", {}).items():
            report = recheck_adapter(catalog, name, entry["base"])
            checks.append(validation.Check(f"adapter {name} ({backend} file)", report.status,
                                           report.reason()))
    for record in data["variants"].values():
        try:
            identity(catalog, record["name"])
            checks.append(validation.Check(f"variant {record['name']}", "pass", "resolves"))
        except StudioError as exc:
            checks.append(validation.Check(f"variant {record['name']}", "fail", exc.message))
    return checks


def _creatable(path: Path) -> bool:
    """Could `path` be created? (Its nearest existing parent is writable.)"""
    for parent in path.parents:
        if parent.exists():
            return os.access(parent, os.W_OK)
    return False
