"""Evaluation sets attached to adapters, and the latest score of each model on them.

An adapter may carry one evaluation set: a copy of a data file in the adapter's own
store folder under a fixed name (`evaluation.jsonl` or `evaluation.txt`, never a name
from the file), recorded in its catalog record as

    "evaluation": {"file", "format", "sha256", "rows", "kind", "source", "attached_at",
                   "scores": {MODEL: {BACKEND: {items, tokens, mean_nll, perplexity,
                                                exact_match, exact_matches, exact_items,
                                                identity, at}}}}

`scores` keeps the latest score of the adapter's base (and its counterpart on the other
backend) and of every variant that uses the adapter, per backend, each with the identity
it was scored under, so `show` can tell a score that no longer describes what is served.
A score is recorded only when the scored data's sha256 is the attached set's.

Checking the file's lines belongs to the training data's parser, which sits above the
catalog: `attach` takes the check as a function (`engine.training.score_sets` passes
it) and runs it on the *copied* bytes, so what was checked is what is kept. A refusal
changes nothing (the copy is removed, an earlier set stays).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from engine.catalog import digest, resolve
from engine.catalog.store import Catalog, now_iso
from engine.errors import RefusedError, StudioError, UnknownNameError
from engine.formats.safeio import open_regular

FILES = {"jsonl": "evaluation.jsonl", "text": "evaluation.txt"}
MAX_SET_BYTES = 1 << 30
SCORE_KEYS = ("items", "tokens", "mean_nll", "perplexity", "exact_match", "exact_matches",
              "exact_items")
TOOL_CALL_KEYS = ("tool_call_exact", "tool_call_matches", "tool_call_items")


@dataclass(frozen=True)
class SetSummary:
    """What a check of an evaluation set found (recorded with it)."""

    format: str  # "jsonl" or "text"
    sha256: str
    rows: int
    kind: str  # "lines" for a text file, else the JSONL kinds joined by "+"


def store_folder(record: dict[str, Any]) -> Path:
    """The adapter's own folder in the store (`adapters/NAME/` or `shipped/NAME/`)."""
    return Path(record["path"]).parent


def set_path(catalog: Catalog, adapter: str) -> Path | None:
    """The stored evaluation set of `adapter`, or None when it has none."""
    record = catalog.adapter(adapter)
    entry = record.get("evaluation")
    if not entry:
        return None
    return store_folder(record) / FILES[entry["format"]]


def format_of(path: Path) -> str:
    """JSONL for .jsonl and .json files; anything else is text, one item per line."""
    return "jsonl" if Path(path).suffix.lower() in (".jsonl", ".json") else "text"


def attach(catalog: Catalog, adapter: str, source: Path,
           check: Callable[[Path, str], SetSummary]) -> dict[str, Any]:
    """Keep a copy of `source` as `adapter`'s evaluation set, checked by `check(copy,
    format)` (which raises, with line numbers, on a malformed file)."""
    record = catalog.adapter(adapter)
    source = Path(source).expanduser().absolute()
    fmt = format_of(source)
    folder = store_folder(record)
    final = folder / FILES[fmt]
    staged = folder / f".evaluation-{uuid.uuid4().hex}.staged"
    handle, st = open_regular(source)
    with handle:
        if st.size > MAX_SET_BYTES:
            raise RefusedError(f"{source.name}: {st.size} bytes is more than the "
                               f"{MAX_SET_BYTES >> 20} MiB limit")
        data = handle.read(MAX_SET_BYTES + 1)
    try:
        staged.write_bytes(data)
        summary = check(staged, fmt)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    return _install(catalog, adapter, staged, final, summary, str(source))


def attach_trusted(catalog: Catalog, adapter: str, source: Path, summary: SetSummary,
                   origin: str) -> dict[str, Any]:
    """Attach a file the app ships (its rows and kind known, its digest checked here)."""
    record = catalog.adapter(adapter)
    folder = store_folder(record)
    staged = folder / f".evaluation-{uuid.uuid4().hex}.staged"
    try:
        staged.write_bytes(Path(source).read_bytes())
        if digest.hash_uncached(staged)[0] != summary.sha256:
            raise RefusedError(f"{Path(source).name} is not the file it was described as")
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    return _install(catalog, adapter, staged, folder / FILES[summary.format], summary, origin)


def _install(catalog: Catalog, adapter: str, staged: Path, final: Path, summary: SetSummary,
             origin: str) -> dict[str, Any]:
    """Move the checked copy into place and record it; on failure restore what was."""
    entry: dict[str, Any] = {"file": final.name, "format": summary.format,
                             "sha256": summary.sha256, "rows": summary.rows,
                             "kind": summary.kind, "source": origin,
                             "attached_at": now_iso(), "scores": {}}
    backup = final.with_name(f".evaluation-{uuid.uuid4().hex}.previous")
    had = final.exists()
    try:
        if had:
            os.replace(final, backup)
        os.replace(staged, final)

        def mutate(data: dict) -> dict:
            record = data["adapters"].get(adapter)
            if record is None:
                raise UnknownNameError(f"adapter {adapter} was removed meanwhile")
            before = record.get("evaluation") or {}
            # The same bytes again: their scores still hold.
            entry["scores"] = (before.get("scores") or {}) if before.get(
                "sha256") == summary.sha256 else {}
            record["evaluation"] = entry
            return data

        catalog.state.update(mutate)
    except BaseException:
        staged.unlink(missing_ok=True)
        if had and backup.exists():
            os.replace(backup, final)
        elif not had:
            final.unlink(missing_ok=True)
        raise
    backup.unlink(missing_ok=True)
    for other in FILES.values():  # a set of the other format is superseded
        if other != final.name:
            (final.parent / other).unlink(missing_ok=True)
    return entry


# --------------------------------------------------------------------------- scores


def _scores_model(data: dict[str, Any], adapter: str, name: str) -> bool:
    """Is model or variant `name` one whose score an adapter's set keeps?"""
    record = data["adapters"][adapter]
    if name in data["variants"]:
        return any(a["name"] == adapter for a in data["variants"][name]["adapters"])
    bases = {record.get("base")} | {f.get("base") for f in record.get("files", {}).values()}
    return name in data["models"] and name in bases


class ScoreFigures(Protocol):
    """What this room reads of an engine score (`engine.runtime.results.ScoreResult`,
    a room above this one)."""

    name: str
    kind: str
    backend: str
    identity: str
    items: int
    tokens: int
    mean_nll: float | None
    perplexity: float | None
    exact_match: float | None
    exact_matches: int
    exact_items: int


def score_summary(result: ScoreFigures) -> dict[str, Any]:
    """What a set keeps of one engine `score` result."""
    summary = {**{k: getattr(result, k) for k in SCORE_KEYS}, "identity": result.identity,
               "kind": result.kind, "at": now_iso()}
    # The tool-call exact match, only when the set had tool-call items to judge.
    if getattr(result, "tool_call_exact", None) is not None:
        summary.update({k: getattr(result, k) for k in TOOL_CALL_KEYS})
    return summary


def record_score(catalog: Catalog, sha256: str, result: ScoreFigures) -> list[str]:
    """Keep `result` (an engine score of data with this sha256) on every adapter whose
    evaluation set it is and that the scored model uses; the names recorded on."""
    recorded: list[str] = []
    summary = score_summary(result)

    def note(data: dict) -> dict:
        recorded.clear()  # in case the update is applied more than once
        for name, record in data["adapters"].items():
            entry = record.get("evaluation")
            if not entry or entry.get("sha256") != sha256:
                continue
            if not _scores_model(data, name, result.name):
                continue
            entry.setdefault("scores", {}).setdefault(result.name, {})[
                result.backend] = summary
            recorded.append(name)
        return data

    catalog.state.update(note)
    return recorded


def adapter_sets(catalog: Catalog, sha256: str) -> list[str]:
    """The adapters whose evaluation set has this digest."""
    return [name for name, r in catalog.data()["adapters"].items()
            if (r.get("evaluation") or {}).get("sha256") == sha256]


# --------------------------------------------------------------------------- reports


def _current(catalog: Catalog, name: str, backend: str, identity: str) -> bool | None:
    """Does the score still describe what `name` serves on `backend`? None if gone."""
    try:
        return resolve.identity(catalog, name, backend=backend).key == identity
    except StudioError:
        return None


def report(catalog: Catalog, adapter: str, only: set[str] | None = None
           ) -> dict[str, Any] | None:
    """The adapter's evaluation set for `show`: every score with `current` (still the
    identity served) — only those of the models in `only`, when given."""
    try:
        entry = catalog.adapter(adapter).get("evaluation")
    except UnknownNameError:  # a broken variant's missing adapter: its checks say so
        return None
    if not entry:
        return None
    out = {k: v for k, v in entry.items() if k != "scores"}
    out["adapter"] = adapter
    out["scores"] = {
        name: {backend: {**score, "current": _current(catalog, name, backend,
                                                       score["identity"])}
               for backend, score in per_backend.items()}
        for name, per_backend in sorted((entry.get("scores") or {}).items())
        if only is None or name in only}
    return out


def score_line(name: str, backend: str, score: dict[str, Any]) -> str:
    """One readable line for a kept score."""
    exact = score.get("exact_match")
    exact_text = ("n/a" if exact is None else
                  f"{exact:.1%} ({score.get('exact_matches')}/{score.get('exact_items')})")
    calls = score.get("tool_call_exact")
    if calls is not None:
        exact_text += (f", tool-call exact match {calls:.1%} "
                       f"({score.get('tool_call_matches')}/{score.get('tool_call_items')})")
    mean, ppl = score.get("mean_nll"), score.get("perplexity")
    stale = {True: "", False: " (stale: the identity changed since)",
             None: " (no longer in the catalog)"}[score.get("current")]
    return (f"{name} on {backend}: mean NLL {_num(mean)}, perplexity {_num(ppl)}, "
            f"exact match {exact_text}, {score.get('items')} items, {score.get('tokens')} "
            f"tokens ({score.get('at')}){stale}")


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def first_json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object anywhere in an answer (code fences and chatter allowed):
    the lenient half of exact match, for the demo's score and the merge's check."""
    decoder = json.JSONDecoder()
    for start, char in enumerate(text):
        if char == "{":
            try:
                found = decoder.raw_decode(text[start:])[0]
            except ValueError:
                continue
            if isinstance(found, dict):
                return found
    return None

