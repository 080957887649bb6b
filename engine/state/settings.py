"""Settings the app owns, in the data directory's settings.json (atomic, locked).

Window geometry and the data directory location itself are Qt's business (QSettings
in the GUI): they must be known before the data directory is.

`load` is called for every request a front end assembles (a plain base's context size
is part of its identity), so it keeps the last value read and parses the file again
only when its stamp changed (`StateFile.stamp`); `Settings` is frozen, so the value
is safe to share.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from engine.errors import UsageError
from engine.state import paths
from engine.state.statefile import Stamp, StateFile


@dataclass(frozen=True)
class Settings:
    default_model: str | None = None  # a base or variant name
    threads: int = 0  # 0: one per CPU core that other programs leave free (runtime.contention)
    context_size: int = 4096
    default_backend: str = "llama"

    def validated(self) -> Settings:
        if not 0 <= self.threads <= 256:
            raise UsageError("threads must be 0 (automatic) to 256")
        if not 256 <= self.context_size <= 131072:
            raise UsageError("context size must be 256 to 131072")
        if self.default_backend not in ("llama", "openvino"):
            raise UsageError("default backend must be llama or openvino")
        return self


def _state() -> StateFile:
    return StateFile(paths.settings_file(), dict)


# (path, stamp, value) of the last read: one tuple, replaced whole (threads share it).
_last: tuple[str, Stamp, Settings] | None = None


def load() -> Settings:
    global _last
    state = _state()
    stamp = state.stamp()
    last = _last
    if stamp is not None and last is not None and last[:2] == (str(state.path), stamp):
        return last[2]
    data = state.load()
    known = {f.name for f in fields(Settings)}
    try:
        value = Settings(**{k: v for k, v in data.items() if k in known}).validated()
    except (TypeError, UsageError):
        state.reject()  # set aside with a notice rather than overwritten unseen
        return Settings()
    if stamp is not None:
        _last = (str(state.path), stamp, value)
    return value


def update(**changes: Any) -> Settings:
    """Change some settings and persist them; returns the new settings."""
    result: list[Settings] = []

    def change(data: dict) -> dict:
        current = load()
        new = replace(current, **changes).validated()
        result.append(new)
        return {**data, **asdict(new)}

    _state().update(change)
    return result[0]
