"""Shared benchmark plumbing: a scratch catalog with test adapters, JSON output."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "out"


def scratch_home() -> Path:
    """A fresh data directory so benchmarks never touch the user's catalog."""
    home = Path(tempfile.mkdtemp(prefix="vs-bench-"))
    os.environ["VARIANT_STUDIO_HOME"] = str(home)
    sys.path.insert(0, str(ROOT))
    return home


def write(name: str, data: dict[str, Any]) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    data = {"benchmark": name, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                        "python": platform.python_version()}, **data}
    path = OUT / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(json.dumps(data, indent=2))
    print(f"wrote {path}")
    return path


def median(values: list[float]) -> float:
    return statistics.median(values)
