"""The capability matrix the acceptance tests check: docs/models.md's table, read back.

The model-families acceptance tests (tests/test_matrix_*.py) run every feature of
`engine.formats.capabilities.NAMES` on the fixture families of tests/families.py in the
types F16, Q8_0 and Q4_K_M (`CASES`). What each cell must do comes from the table in
docs/models.md (between `scripts/models_table.py`'s markers): ✓, the feature works on
that file; ✗ (n), it is refused up front with reason n. `expected` reads the doc's row
and holds it to `capabilities.for_header` on the same file, so the doc, the code's
answer and the behaviour the tests check are one table (the doc's whole table equals
`models_table.generated()`: tests/test_matrix_serving.py).

Also here: the one-type-per-family `rotation` of the features that cost seconds per file
(`VARIANT_STUDIO_FULL_MATRIX=1` gives every type), running a command in-process
(`run_cli`), and `assert_refused`: a refused command exits 3 with the table's reason,
changes nothing (`DataSnapshot`) and calls none of the work it would have started (the
worker, the builder). This module holds no tests.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from engine import cli
from engine.formats import capabilities, gguf_file
from engine.state import paths
from tests import families

ROOT = Path(__file__).resolve().parents[1]
TYPES: tuple[str, ...] = ("F16", "Q8_0", "Q4_K_M")
CASES: tuple[tuple[str, str], ...] = tuple((v, t) for v in families.VARIANTS for t in TYPES)
IDS: tuple[str, ...] = tuple(f"{v}-{t}" for v, t in CASES)
# The features that cost seconds per file (a merge, an OpenVINO build) run on one type
# per family, rotating through TYPES so that every type runs on every third family;
# VARIANT_STUDIO_FULL_MATRIX=1 runs them on every type (see each module's docstring).
FULL = os.environ.get("VARIANT_STUDIO_FULL_MATRIX") == "1"


def rotation(offset: int = 0) -> tuple[tuple[str, str], ...]:
    """(variant, type) with one type per family, family i on TYPES[(i + offset) % 3];
    every case with VARIANT_STUDIO_FULL_MATRIX=1."""
    if FULL:
        return CASES
    return tuple((v, TYPES[(i + offset) % len(TYPES)])
                 for i, v in enumerate(families.VARIANTS))


def ids(cases: tuple[tuple[str, str], ...]) -> list[str]:
    return [f"{v}-{t}" for v, t in cases]
REFUSED_EXIT = 3  # RefusedError's exit code (docs/cli.md)


@dataclass(frozen=True)
class Cell:
    """One cell of the doc's table: the feature works (ok), or is refused with `reason`."""

    ok: bool
    reason: str = ""


@cache
def models_table() -> ModuleType:
    """scripts/models_table.py (a script, not a package), imported by path."""
    spec = importlib.util.spec_from_file_location("models_table",
                                                  ROOT / "scripts" / "models_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def doc_table_text() -> str:
    """The table docs/models.md holds between the markers."""
    table = models_table()
    return table.in_doc(table.DOC.read_text(encoding="utf-8"))


@cache
def doc_table() -> dict[tuple[str, str], dict[str, Cell]]:
    """docs/models.md's table: (variant, type) -> feature name -> Cell."""
    short = {v: k for k, v in models_table().SHORT.items()}
    lines = doc_table_text().splitlines()
    reasons = {int(m.group(1)): m.group(2) for m in
               (re.match(r"^(\d+)\. (.+)$", line) for line in lines) if m}
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in lines if line.startswith("|")]
    header, body = rows[0], rows[2:]
    assert header[:2] == ["family", "type"], header
    features = [short[c] for c in header[2:]]
    assert tuple(features) == capabilities.NAMES, features
    out: dict[tuple[str, str], dict[str, Cell]] = {}
    for row in body:
        cells: dict[str, Cell] = {}
        for feature, text in zip(features, row[2:], strict=True):
            if text == "✓":
                cells[feature] = Cell(True)
            else:
                found = re.fullmatch(r"✗ \((\d+)\)", text)
                assert found, f"cell {text!r} of {row[:2]} is neither ✓ nor ✗ (n)"
                cells[feature] = Cell(False, reasons[int(found.group(1))])
        out[(row[0], row[1])] = cells
    return out


def expected(files: families.FamilyFiles, kind: str) -> dict[str, Cell]:
    """The doc's row for this fixture file, checked against `capabilities.for_header` on
    the file itself (a doc that says other than the code fails here, per case)."""
    row = doc_table()[(files.variant, kind)]
    answered = capabilities.for_header(gguf_file.read_header(files.base(kind)))
    assert {c.name: Cell(c.ok, "" if c.ok else c.reason) for c in answered} == row, (
        f"docs/models.md's row for {files.variant} {kind} is not what "
        "capabilities.for_header answers: run scripts/models_table.py --write")
    return row


def name(prefix: str, variant: str, kind: str) -> str:
    """A catalog name for one case ("b-llama3-Q4_K_M")."""
    return f"{prefix}-{variant}-{kind}"


def add_gguf_variant(catalog: Any, files: families.FamilyFiles, kind: str
                     ) -> tuple[str, str, str]:
    """The case's base, its GGUF adapter and a variant of it at scale 1, added to
    `catalog` as `model add`, `adapter add` and `variant add` add them: their names."""
    from engine.catalog import imports
    from engine.catalog.store import AdapterSpec

    base, adapter, var = (name(p, files.variant, kind) for p in ("b", "a", "v"))
    imports.add_model(catalog, base, files.base(kind))
    imports.add_adapter(catalog, adapter, base, files.gguf_adapter)
    catalog.add_variant(var, base, [AdapterSpec(adapter, 1.0)])
    return base, adapter, var


def run_cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    """`variant-studio ARGV` in this process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


class DataSnapshot:
    """The catalog's bytes and every path under the data directory (the OpenVINO build
    cache and `extra` paths included), to show that a refused command changed nothing."""

    def __init__(self, extra: Sequence[Path] = ()) -> None:
        self.extra = tuple(extra)
        self.before = self.take()

    def take(self) -> tuple[bytes, tuple[str, ...], tuple[bool, ...]]:
        root = paths.data_dir()
        catalog = paths.catalog_file()
        listing = tuple(sorted(p.relative_to(root).as_posix() for p in root.rglob("*")))
        return (catalog.read_bytes() if catalog.exists() else b"", listing,
                tuple(p.exists() for p in self.extra))

    def assert_unchanged(self) -> None:
        after = self.take()
        assert after[0] == self.before[0], "the catalog changed"
        assert after[1] == self.before[1], (
            f"the data directory changed: {sorted(set(after[1]) ^ set(self.before[1]))}")
        assert after[2] == self.before[2], f"created: {self.extra}"


def assert_refused(capsys: pytest.CaptureFixture, argv: Sequence[str], reason: str,
                   extra: Sequence[Path] = (), forbid: Sequence[tuple[Any, str]] = ()
                   ) -> str:
    """The command exits 3 with `reason` in its one error line and changes nothing (no
    catalog record, nothing written in the data directory, none of `extra` created),
    and refuses up front: none of the `forbid` callables (`(owner, attribute)`: the
    worker, the builder) is called; returns the error line."""
    snapshot = DataSnapshot(extra)
    with pytest.MonkeyPatch.context() as patch:
        for owner, attribute in forbid:
            patch.setattr(owner, attribute, _forbidden(f"{getattr(owner, '__name__', owner)}."
                                                       f"{attribute}"))
        code, _, err = run_cli(capsys, *argv)
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == REFUSED_EXIT, (argv, code, err[-2000:])
    assert len(lines) == 1 and reason in lines[0], (reason, err[-2000:])
    snapshot.assert_unchanged()
    return lines[0]


def _forbidden(what: str) -> Any:
    def called(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"{what} was called: the command must refuse before it")

    return called
