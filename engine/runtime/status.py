"""What `status` reports: the version, the data directory, the catalog's counts and
which engines are running — all read, nothing started or asked.

Each CLI command that runs a model starts its own engine process and stops it when it
ends; only the desktop app and `variant-studio serve` keep one while they run. They say
so in `<data>/run/` (`engine.state.presence`), and that is what is reported here: an
engine is "running" when a live front end's engine process is up, "idle" when front ends
run but their engines have not started (or have stopped), and "none" otherwise.
"""

from __future__ import annotations

from typing import Any

from engine import __version__
from engine.catalog.store import KINDS, Catalog
from engine.state import paths, presence

NO_ENGINE = ("none running: each command starts its own engine and stops it when it "
             "ends (the app and `variant-studio serve` keep one while they run)")


def status_info(catalog: Catalog, pending: list[dict[str, Any]] | tuple = ()
                ) -> dict[str, Any]:
    """`pending` are the models `list` shows before they exist (the OpenVINO default,
    built on first use): counted apart, so the counts agree with `list`."""
    data = catalog.data()
    return {
        "version": __version__,
        "data_dir": str(paths.data_dir(create=False)),
        "catalog": {k: len(data[k]) for k in KINDS},
        "pending": {"models": len(pending), "names": [p["name"] for p in pending]},
        "engine": engine_description(),
    }


def engine_description() -> dict[str, Any]:
    """The engines of the front ends running on this data directory (read-only)."""
    live, stale = presence.running()
    if any(f["engine"].get("state") == "running" for f in live):
        state = "running"
    else:
        state = "idle" if live else "none"
    return {"state": state, "front_ends": live, "stale_records": len(stale),
            **({} if live else {"note": NO_ENGINE})}
