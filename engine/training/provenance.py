"""Provenance records: where an adapter came from, written beside every adapter.

A record names the base, data and adapter files by sha256, the seed and the full
configuration, the adapter a run started from, the versions of everything that does
arithmetic, the platform and CPU, the steps, the time taken and the loss curve. It is
what makes "same inputs, same bytes" checkable, and what `show` displays.
"""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from typing import Any

FORMAT = "variant-studio-provenance/1"
CURVE_POINTS = 50


def versions() -> dict[str, str]:
    from engine import __version__

    out = {"variant-studio": __version__, "python": platform.python_version()}
    for package in ("torch", "gguf", "llama-cpp-python", "numpy", "safetensors"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = "missing"
    return out


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def platform_info() -> dict[str, Any]:
    return {"system": platform.system(), "release": platform.release(),
            "machine": platform.machine(), "cpu": cpu_model(), "cpu_count": os.cpu_count(),
            "platform": platform.platform(), "byteorder": sys.byteorder}


def loss_summary(losses: list[float]) -> dict[str, Any]:
    """First/last/min and a downsampled curve of (step, loss) points."""
    if not losses:
        return {"steps": 0}
    n = len(losses)
    head, tail = losses[:10], losses[-10:]
    picks = sorted({round(i * (n - 1) / max(CURVE_POINTS - 1, 1)) for i in range(CURVE_POINTS)}
                   if n > CURVE_POINTS else range(n))
    return {
        "steps": n,
        "first": losses[0],
        "last": losses[-1],
        "min": min(losses),
        "mean_first_10": sum(head) / len(head),
        "mean_last_10": sum(tail) / len(tail),
        "curve": [[i + 1, losses[i]] for i in picks],
    }
