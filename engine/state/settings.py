"""Settings the app owns, in the data directory's settings.json (atomic, locked).

Window geometry and the data directory location itself are Qt's business (QSettings
in the GUI): they must be known before the data directory is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from engine.errors import UsageError
from engine.state import paths
from engine.state.statefile import StateFile


@dataclass(frozen=True)
class Settings:
    default_model: str | None = None  # a base or variant name
    threads: int = 0  # 0: one per CPU core
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


def load() -> Settings:
    state = _state()
    data = state.load()
    known = {f.name for f in fields(Settings)}
    try:
        return Settings(**{k: v for k, v in data.items() if k in known}).validated()
    except (TypeError, UsageError):
        state.reject()  # set aside with a notice rather than overwritten unseen
        return Settings()


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
