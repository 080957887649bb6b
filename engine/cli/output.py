"""What the `variant-studio` command prints: JSON, check icons and progress lines."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

ICONS = {"pass": "✓", "warn": "!", "fail": "✗"}


def emit_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, sort_keys=True, ensure_ascii=False)
    sys.stdout.write("\n")


def progress(label: str) -> Callable[[int, int], None] | None:
    """A stderr progress line for long hashing, only on a terminal."""
    if not sys.stderr.isatty():
        return None

    def report(done: int, total: int) -> None:
        if total >= 64 << 20:
            end = "\n" if done >= total else "\r"
            print(f"{label}: {done * 100 // max(total, 1)}%", end=end, file=sys.stderr)

    return report


def build_progress() -> Callable[[str, float], None]:
    """Stage lines on stderr while the OpenVINO default is built (the first time)."""
    last = {"stage": "", "percent": -1}
    tty = sys.stderr.isatty()

    def report(stage: str, fraction: float) -> None:
        percent = int(fraction * 100)
        if stage != last["stage"]:
            if tty and last["stage"]:
                print(file=sys.stderr)
            print(f"building the OpenVINO default: {stage}", end="" if tty else "\n",
                  file=sys.stderr, flush=True)
            last.update(stage=stage, percent=-1)
        if tty and percent != last["percent"]:
            print(f"\rbuilding the OpenVINO default: {stage} {percent}%", end="",
                  file=sys.stderr, flush=True)
            last["percent"] = percent

    return report


