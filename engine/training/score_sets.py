"""Score sets: a data file read into the engine's `ScoreItem`s, and scoring models on it.

Two kinds of file (`engine.catalog.evaluation.format_of` decides by the name):

- JSONL (`.jsonl`, `.json`) in the training formats, checked line by line by the
  training data's own parser (`engine.training.data.read_records`, so a malformed line is
  refused with its number exactly as training refuses it): `{"text": ...}` scores every
  token but the first; `{"prompt": ..., "completion": ...}` the completion only;
  `{"messages": [...]}` the last assistant turn only, after the messages before it
  rendered with the chat template as served, with the line's `tools` when it has them
  (rendered as a served request with those tools is). An assistant turn with
  `tool_calls` (OpenAI's shape) is a tool-call item: its target is the calls as the
  scored model writes them in the format it is served in (`engine.formats.tool_calls`),
  and exact match also judges the calls themselves. Weights and bookkeeping keys are
  ignored; preference lines and token lines (`{"tokens": [...]}`: a score is of text as
  served, and token ids have no text to serve) are refused, with their line numbers.
- Any other file is text: each non-empty line is one item, scored whole (its first token
  has nothing before it, so it is not scored). Lines, not the whole file, so a long file
  never overflows the context and each line gets its own figures.

`score_models` scores the base and any variants on one set in one engine process, one
`Score` request per model, and keeps each score on the adapters whose evaluation set the
data is (`engine.catalog.evaluation.record_score`).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.catalog import evaluation
from engine.catalog.evaluation import SetSummary
from engine.catalog.resolve import resolve
from engine.catalog.store import Catalog
from engine.errors import UsageError
from engine.formats.safeio import open_regular
from engine.formats.tool_calls import answer_text
from engine.runtime import messages
from engine.runtime.client import EngineClient
from engine.runtime.results import ScoreResult
from engine.training import data

ProgressCallback = Callable[[str, float], None]


@dataclass(frozen=True)
class ScoreSet:
    """A checked data file as score items."""

    path: str
    sha256: str
    format: str  # "jsonl" or "text"
    kinds: tuple[str, ...]
    items: tuple[messages.ScoreItem, ...]

    @property
    def rows(self) -> int:
        return len(self.items)

    @property
    def kind(self) -> str:
        return "lines" if self.format == "text" else "+".join(self.kinds)

    def summary(self) -> SetSummary:
        return SetSummary(self.format, self.sha256, self.rows, self.kind)


def read_set(path: Path, fmt: str | None = None) -> ScoreSet:
    """Read and check a data file (see the module docstring); DataError with the line
    numbers of every malformed line."""
    path = Path(path)
    fmt = fmt or evaluation.format_of(path)
    if fmt == "jsonl":
        records, sha = data.read_records(path, dpo=False)
        exact = [f"line {r.line}: token lines cannot be scored (a score set is text, "
                 "scored as served); use text, prompt/completion or messages"
                 for r in records if r.kind == "tokens"]
        if exact:
            more = len(exact) - data.MAX_REPORTED
            raise data.DataError(f"{path.name}: {len(exact)} line"
                                 f"{'s' if len(exact) != 1 else ''} cannot be scored: "
                                 + "; ".join(exact[:data.MAX_REPORTED])
                                 + (f"; and {more} more" if more > 0 else ""),
                                 details=tuple(exact))
        items = tuple(_item(r) for r in records)
        return ScoreSet(str(path), sha, fmt, tuple(sorted({r.kind for r in records})), items)
    return _read_lines(path)


def _item(record: data.Record) -> messages.ScoreItem:
    if record.kind == "text":
        assert record.text is not None
        return messages.ScoreItem("text", record.text, line=record.line)
    if record.kind == "pair":
        assert record.completion is not None
        return messages.ScoreItem("pair", record.completion,
                                  messages.Prompt(text=record.prompt or ""), record.line)
    last = max(i for i, m in enumerate(record.messages) if m.role == "assistant")
    answer = record.messages[last]
    # Expected calls: their generic-format text here; scoring writes them in the format
    # of the model it scores (`engine.runtime.scoring`). Judged as calls.
    target = answer_text(answer, "generic")
    return messages.ScoreItem("chat", target,
                              messages.Prompt(messages=record.messages[:last], chat=True,
                                              tools=record.tools),
                              record.line, answer.tool_calls)


def _read_lines(path: Path) -> ScoreSet:
    handle, st = open_regular(path)
    with handle:
        if st.size > data.MAX_DATA_BYTES:
            raise data.DataError(f"{path.name}: {st.size} bytes is more than the "
                                 f"{data.MAX_DATA_BYTES >> 20} MiB limit")
        raw = handle.read(data.MAX_DATA_BYTES + 1)
    items, problems = [], []
    for number, line in enumerate(raw.split(b"\n"), start=1):
        line = line.removesuffix(b"\r")
        if not line.strip():
            continue
        try:
            items.append(messages.ScoreItem("text", line.decode("utf-8"), line=number))
        except UnicodeDecodeError:
            problems.append(f"line {number}: not valid UTF-8")
    if problems:
        more = len(problems) - data.MAX_REPORTED
        shown = "; ".join(problems[:data.MAX_REPORTED]) + (
            f"; and {more} more" if more > 0 else "")
        raise data.DataError(f"{path.name}: {len(problems)} malformed line"
                             f"{'s' if len(problems) != 1 else ''}: {shown}",
                             details=tuple(problems))
    if not items:
        raise data.DataError(f"{path.name}: no lines to score (the file is empty)")
    return ScoreSet(str(path), hashlib.sha256(raw).hexdigest(), "text", ("text",),
                    tuple(items))


def attach(catalog: Catalog, adapter: str, path: Path) -> dict[str, Any]:
    """Attach `path` as `adapter`'s evaluation set (checked; a refusal changes nothing)."""

    def check(copy: Path, fmt: str) -> SetSummary:
        try:
            return read_set(copy, fmt).summary()
        except data.DataError as exc:  # name the file the user gave, not the copy
            raise data.DataError(exc.message.replace(copy.name, Path(path).name, 1),
                                 details=exc.details) from None

    return evaluation.attach(catalog, adapter, path, check)


def stored_set(catalog: Catalog, adapter: str) -> ScoreSet:
    """The evaluation set attached to `adapter`, read back and checked against its
    recorded digest."""
    path = evaluation.set_path(catalog, adapter)
    if path is None:
        raise UsageError(f"adapter {adapter} has no evaluation set (attach one with "
                         f"`variant-studio eval attach {adapter} --data FILE`)")
    entry = catalog.adapter(adapter)["evaluation"]
    loaded = read_set(path, entry["format"])
    if loaded.sha256 != entry["sha256"]:
        raise data.DataError(f"the evaluation set of {adapter} changed on disk since it "
                             "was attached; attach it again")
    return loaded


def score_models(catalog: Catalog, names: list[str], score_set: ScoreSet,
                 backend: str | None = None, exact_match: bool = True,
                 per_token: bool = False, client: EngineClient | None = None,
                 progress: ProgressCallback | None = None,
                 record: bool = True, ov_profile: str | None = None) -> list[ScoreResult]:
    """Score each model or variant on `score_set`, in order, in one engine process.

    Every name is resolved first, so an unknown one is refused before any work. With
    `record`, each result is kept on the adapters whose evaluation set this is (the
    names it was kept on are in the result's `recorded_on`). `ov_profile` picks the
    OpenVINO default's profile (docs/formats.md, "Profiles")."""
    if not names:
        raise UsageError("name at least one model or variant to score")
    specs = [resolve(catalog, name, backend=backend, ov_profile=ov_profile)
             for name in names]
    own = client is None
    engine = client or EngineClient()

    def on_event(event: messages.Event) -> None:
        if progress is not None and isinstance(event, messages.Progress):
            progress(event.stage, event.fraction)

    results = []
    try:
        for spec in specs:
            request = messages.Score(spec, score_set.items, exact_match, per_token)
            handle = engine.submit(request, on_event)
            try:
                result = handle.wait()
            except KeyboardInterrupt:
                engine.cancel(handle)
                handle.done.wait(30)
                raise
            result = dataclasses.replace(result, recorded_on=tuple(
                evaluation.record_score(catalog, score_set.sha256, result) if record else ()))
            results.append(result)
    finally:
        if own:
            engine.close()
    return results
