"""The one checker for values that cross a process boundary as JSON.

Engine requests, their results and events are frozen dataclasses; this module turns
them into JSON values (`encode`) and back (`decode`), checking every field against its
type hint on the way in: `str`, `int` (never a bool), `float` (an int is taken),
`bool`, `None`, unions, `Literal`, `tuple[X, ...]` and fixed tuples (JSON arrays),
`dict[str, X]`, `Any`, and nested dataclasses. Limits are written into the hint with
`Annotated` (`Range`, `Size`), so a field's type and its bounds are read in one place
and hold for a value built in-process too (`check`, from `__post_init__`). A value with
a format of its own (the catalog's `SessionSpec`, `Identity`, `Sampling`: they are
stored and hashed as they are) is read and written through its own `from_dict` and
`to_dict`.

A value that does not fit raises `WireError` naming the field (`items.3.target: a
string, not int`); nothing is half-built. The local server validates its OpenAI bodies
with pydantic at its own edge (`engine/serve/schemas.py`), then builds these values:
there is one checker for what travels between our processes.

No room of the engine is imported here: every room may use it (as `engine.errors`).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

from engine.errors import RefusedError, StudioError

T = TypeVar("T")
# Field metadata: leave the field out of the JSON object while it is None (fields that
# only some results carry, such as a generation's top log-probabilities).
OMIT_NONE = {"omit_none": True}


class WireError(RefusedError):
    """A JSON value that is not the value it claims to be (refused, never half-read)."""


@dataclass(frozen=True)
class Range:
    """A number's bounds (either may be None)."""

    low: float | None = None
    high: float | None = None

    def check(self, value: Any, where: str) -> None:
        if (self.low is not None and value < self.low) or (
                self.high is not None and value > self.high) or (
                isinstance(value, float) and not math.isfinite(value)):
            raise WireError(f"{where}{value!r} is out of range ({_span(self.low, self.high)})")


@dataclass(frozen=True)
class Size:
    """Bounds of a text's length or a sequence's count (either may be None)."""

    low: int | None = None
    high: int | None = None

    def check(self, value: Any, where: str) -> None:
        n = len(value)
        if (self.low is not None and n < self.low) or (self.high is not None
                                                       and n > self.high):
            what = "characters" if isinstance(value, str) else "items"
            raise WireError(f"{where}{n} {what}, not {_span(self.low, self.high)}")


def _span(low: float | None, high: float | None) -> str:
    if high is None:
        return f"at least {low:g}"
    if low is None:
        return f"at most {high:g}"
    return f"{low:g} to {high:g}"


# --------------------------------------------------------------------------- hints

_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = typing.get_type_hints(cls, include_extras=True)
        _HINTS[cls] = hints
    return hints


def _fields(cls: type) -> tuple[dataclasses.Field, ...]:
    return tuple(f for f in dataclasses.fields(cls) if f.init)


def _own_format(cls: type) -> bool:
    """Does `cls` read its own JSON (a `from_dict` that is not `Wire`'s)?"""
    reader = getattr(cls, "from_dict", None)
    return reader is not None and not getattr(reader, "__wire__", False)


# --------------------------------------------------------------------------- decoding


def decode(cls: type[T], data: Any, where: str = "", extra: bool = False) -> T:
    """An instance of dataclass `cls` from its JSON object, every field checked.

    A field missing from `data` takes its default (none: refused); a key `cls` does not
    have is refused unless `extra` (events from a newer engine may carry more)."""
    prefix = f"{where}." if where else ""
    if not isinstance(data, Mapping):
        raise WireError(f"{where or 'the value'}: an object, not {_kind(data)}")
    hints = _hints(cls)
    values: dict[str, Any] = {}
    known = set()
    for f in _fields(cls):
        known.add(f.name)
        if f.name in data:
            values[f.name] = _convert(data[f.name], hints[f.name], prefix + f.name)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise WireError(f"{prefix}{f.name}: missing")
    if not extra:
        unknown = [str(k) for k in data if k not in known]
        if unknown:
            raise WireError(f"{prefix}{unknown[0]}: not a field of {cls.__name__}")
    try:
        return cls(**values)
    except WireError:
        raise
    except StudioError as exc:  # the value's own check (`__post_init__`)
        raise WireError(f"{where + ': ' if where else ''}{exc.message}") from None


def _convert(value: Any, hint: Any, where: str) -> Any:
    here = f"{where}: " if where else ""
    origin = get_origin(hint)
    if origin is Annotated:
        inner, *marks = get_args(hint)
        for mark in marks:  # a count first: a list far too long is not read at all
            if isinstance(mark, Size) and isinstance(value, list | tuple | str):
                mark.check(value, here)
        out = _convert(value, inner, where)
        for mark in marks:
            if isinstance(mark, Range):
                mark.check(out, here)
        return out
    if hint is Any:
        return value
    if hint is None or hint is type(None):
        if value is not None:
            raise WireError(f"{here}null, not {_kind(value)}")
        return None
    if origin is Union or origin is types.UnionType:
        options = get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _convert(value, option, where)
            except WireError as exc:
                errors.append(exc.message)
        raise WireError(errors[0] if len(errors) == 1 else
                        f"{here}none of the accepted kinds fits {_kind(value)}")
    if origin is Literal:
        if value not in get_args(hint) or isinstance(value, bool) != any(
                isinstance(a, bool) for a in get_args(hint)):
            allowed = ", ".join(repr(a) for a in get_args(hint))
            raise WireError(f"{here}{value!r} is not one of {allowed}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise WireError(f"{here}true or false, not {_kind(value)}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise WireError(f"{here}a whole number, not {_kind(value)}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise WireError(f"{here}a number, not {_kind(value)}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise WireError(f"{here}a string, not {_kind(value)}")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise WireError(f"{here}a list, not {_kind(value)}")
        args = get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(v, args[0], f"{where}.{i}") for i, v in enumerate(value))
        if len(args) != len(value):
            raise WireError(f"{here}{len(args)} items, not {len(value)}")
        return tuple(_convert(v, a, f"{where}.{i}")
                     for i, (v, a) in enumerate(zip(value, args, strict=True)))
    if origin is dict:
        if not isinstance(value, Mapping):
            raise WireError(f"{here}an object, not {_kind(value)}")
        key_hint, value_hint = get_args(hint)
        return {_convert(k, key_hint, where): _convert(v, value_hint, f"{where}.{k}")
                for k, v in value.items()}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if isinstance(value, hint):
            return value
        if _own_format(hint):
            if not isinstance(value, Mapping):
                raise WireError(f"{here}an object, not {_kind(value)}")
            try:
                return hint.from_dict(dict(value))  # type: ignore[attr-defined]
            except WireError:
                raise
            except StudioError as exc:
                raise WireError(f"{here}{exc.message}") from None
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise WireError(f"{here}{type(exc).__name__}: {exc}") from None
        return decode(hint, value, where)
    raise TypeError(f"engine.wire cannot read {hint!r} ({where})")  # a programming error


def _kind(value: Any) -> str:
    return {type(None): "null", bool: "a boolean", int: "a number", float: "a number",
            str: "a string", list: "a list", tuple: "a list", dict: "an object"}.get(
        type(value), type(value).__name__)


# --------------------------------------------------------------------------- checking


def check(value: Any) -> None:
    """Check an in-process dataclass value as `decode` checks one read from JSON (for
    `__post_init__`: a request built with a wrong value is refused where it is built)."""
    cls = type(value)
    hints = _hints(cls)
    for f in _fields(cls):
        _convert(getattr(value, f.name), hints[f.name], f.name)


# --------------------------------------------------------------------------- encoding


def encode(value: Any) -> Any:
    """A JSON value: dataclasses as objects (through their `to_dict`: their own format,
    or `Wire`'s), tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        writer = getattr(value, "to_dict", None)
        return writer() if writer is not None else encode_fields(value)
    if isinstance(value, list | tuple):
        return [encode(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): encode(v) for k, v in value.items()}
    return value


def encode_fields(value: Any) -> dict[str, Any]:
    """A dataclass's fields as a JSON object (see `OMIT_NONE`)."""
    out: dict[str, Any] = {}
    for f in _fields(type(value)):
        item = getattr(value, f.name)
        if item is None and f.metadata.get("omit_none"):
            continue
        out[f.name] = encode(item)
    return out


class Wire:
    """Base of the dataclasses that travel as JSON in this module's format: `to_dict`
    is `encode_fields`, `from_dict` is `decode` (a subclass with a format of its own
    overrides both)."""

    def to_dict(self) -> dict[str, Any]:
        return encode_fields(self)

    @classmethod
    def from_dict(cls: type[T], data: Any) -> T:  # type: ignore[misc]
        return decode(cls, data)


Wire.from_dict.__func__.__wire__ = True  # type: ignore[attr-defined]
