"""What the app showed lately, kept across restarts: bounded lists in the data directory.

`recent/comparisons.json` holds the window's recent comparisons (each the request's
prompt and sampling, the result, the sides' titles and tokens), `recent/requests.json`
the local server's request log as the Server panel shows it. Each is one JSON list,
oldest first, cut to its limit at every write, through `StateFile` (atomic, locked; a
file that does not parse is set aside with a notice, as every state file is). An item
that is not an object is skipped when read; what an item holds is its user's business.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.state import paths
from engine.state.statefile import StateFile

COMPARISONS = 20  # as many as the Compare view's list holds
REQUESTS = 500  # as many as the Server panel's log holds


class RecentList:
    """A bounded list of JSON objects in one state file, oldest first."""

    def __init__(self, path: Path, limit: int) -> None:
        self.path = path
        self.limit = limit
        self._state = StateFile(path, list)

    def load(self) -> list[dict[str, Any]]:
        """The items kept, oldest first (at most `limit`)."""
        items = [item for item in self._state.load() if isinstance(item, dict)]
        return items[-self.limit:]

    def add(self, item: dict[str, Any]) -> None:
        self.extend([item])

    def extend(self, items: list[dict[str, Any]]) -> None:
        """Append `items` (oldest first); the oldest beyond the limit are dropped."""
        if items:
            self._state.update(lambda kept: (list(kept) + list(items))[-self.limit:])

    def clear(self) -> None:
        self._state.save([])


def folder() -> Path:
    return paths.data_dir(create=False) / "recent"


def comparisons() -> RecentList:
    return RecentList(folder() / "comparisons.json", COMPARISONS)


def requests() -> RecentList:
    return RecentList(folder() / "requests.json", REQUESTS)
