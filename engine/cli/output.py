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


def build_progress(what: str = "the OpenVINO default") -> Callable[[str, float], None]:
    """Stage lines on stderr while an OpenVINO model (the default, the first time) is
    built."""
    last = {"stage": "", "percent": -1}
    tty = sys.stderr.isatty()

    def report(stage: str, fraction: float) -> None:
        percent = int(fraction * 100)
        if stage != last["stage"]:
            if tty and last["stage"]:
                print(file=sys.stderr)
            print(f"building {what}: {stage}", end="" if tty else "\n",
                  file=sys.stderr, flush=True)
            last.update(stage=stage, percent=-1)
        if tty and percent != last["percent"]:
            print(f"\rbuilding {what}: {stage} {percent}%", end="",
                  file=sys.stderr, flush=True)
            last["percent"] = percent

    return report




def transfer_progress(label: str) -> Callable[[int, int], None] | None:
    """A stderr progress line for a download (and the checks after it), on a terminal."""
    if not sys.stderr.isatty():
        return None
    last = {"percent": -1}

    def report(done: int, total: int) -> None:
        percent = done * 100 // max(total, 1)
        if percent != last["percent"]:
            last["percent"] = percent
            print(f"\r{label}: {percent}% of {total / 2**20:.1f} MiB", end="",
                  file=sys.stderr, flush=True)

    return report


def stage_line(label: str) -> Callable[[str], None]:
    """One stderr line per stage of a download ("downloading", "checking"), on a
    terminal (elsewhere stderr holds only warnings and the error line)."""
    tty = sys.stderr.isatty()

    def report(stage: str) -> None:
        if tty:
            print(f"{chr(10) if stage != 'downloading' else ''}{label}: {stage}…",
                  file=sys.stderr, flush=True)

    return report
