"""Typed errors shared by the engine, the CLI and the GUI.

Each error carries the CLI exit code it maps to, so every surface reports the same
problem the same way: 2 for usage, 3 for a refused artifact or failed validation,
4 for an unknown name.
"""

from __future__ import annotations


class StudioError(Exception):
    """Base class: a problem we can explain to a person in one line."""

    exit_code = 1

    def __init__(self, message: str, *, details: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def __str__(self) -> str:
        return self.message


class UsageError(StudioError):
    """The request itself is malformed (bad flag, bad name, bad number)."""

    exit_code = 2


class RefusedError(StudioError):
    """An artifact or a configuration was refused; nothing was changed."""

    exit_code = 3


class InspectionError(RefusedError):
    """A file could not be read as the artifact it claims to be."""


class ValidationError(RefusedError):
    """An artifact is well formed but does not fit (wrong base, bad alpha, ...)."""


class ContextOverflowError(RefusedError):
    """A prompt (or a request) does not fit the session's context."""


class UnknownNameError(StudioError):
    """No model, adapter or variant has that name."""

    exit_code = 4


class Cancelled(StudioError):
    """Long work was cancelled by the user."""

    exit_code = 130


class EngineError(StudioError):
    """The engine process failed a request or stopped."""

    exit_code = 5


class StateError(StudioError):
    """A state file could not be read or written."""

    exit_code = 6
