"""The adapter import wizard as a small state machine, with no Qt.

Steps: pick a file -> summary of what inspection found -> choose a base (compatible
bases first, incompatible ones disabled with the reason) -> validation report
(failures block; warnings need an explicit acknowledgement) -> name, source, default
scale and an optional variant -> finish. Navigation and every rule live here so they
are tested without a window (Electrum's wizard pattern); the Qt pages only show
state and forward input.

The long parts are split so a window can run them on a worker thread: `inspect` and
`validate` only read (files, the catalog) and return a value, with progress and
cancellation; `apply_inspection` and `apply_report` change the state, on the thread
that owns it. `set_path` and `choose_base` do both, for callers that can block.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.catalog import imports, validation
from engine.catalog.digest import CancelCheck, Progress
from engine.catalog.store import AdapterSpec, Catalog
from engine.errors import Cancelled, StudioError
from engine.formats import artifacts
from engine.formats.artifacts import AdapterInfo, BaseModelInfo
from engine.state import paths


class Step(enum.IntEnum):
    PICK = 0
    SUMMARY = 1
    BASE = 2
    REPORT = 3
    DETAILS = 4


@dataclass(frozen=True)
class BaseChoice:
    name: str
    backend: str
    compatible: bool
    reason: str


@dataclass(frozen=True)
class Inspection:
    """What `inspect` found for one path (a value: it crosses threads)."""

    path: Path
    info: AdapterInfo | None
    error: str | None
    name: str = ""
    source: str = ""
    choices: tuple[BaseChoice, ...] = ()
    base_model: bool = False  # the file is a base model (the window offers to add it)
    made_for: tuple[str, ...] = ()  # the catalog's bases the file says it was made for


@dataclass
class ImportWizard:
    catalog: Catalog
    step: Step = Step.PICK
    path: Path | None = None
    info: AdapterInfo | None = None
    error: str | None = None
    base_model: bool = False  # the chosen file is a base model, not an adapter
    choices: list[BaseChoice] = field(default_factory=list)
    # The catalog's names of the base the file declares (by digest, else by the base
    # file's own model name): the file's name for it ("Smollm2 135M 8k Lc100K Mix1
    # Ep2") is not what the library calls it.
    made_for: list[str] = field(default_factory=list)
    base: str | None = None
    report: validation.Report | None = None
    acknowledged: bool = False
    name: str = ""
    source: str = ""
    default_scale: float = 1.0
    create_variant: bool = True
    variant_name: str = ""

    # ------------------------------------------------------------------ input

    def set_path(self, path: Path | str) -> None:
        """Inspect the chosen file; the summary step shows the result or the error."""
        self.apply_inspection(self.inspect(path))

    def inspect(self, path: Path | str, progress: Progress | None = None,
                cancelled: CancelCheck | None = None) -> Inspection:
        """Inspect `path` and rank the catalog's bases for it; changes no state.

        Long when a base changed on disk (it is hashed again): run it off the GUI thread.
        """
        path = Path(path)
        try:
            found = artifacts.inspect_path(path)
        except StudioError as exc:
            return Inspection(path, None, exc.message)
        if isinstance(found, BaseModelInfo):
            return Inspection(path, None, f"{path.name} is a base model "
                              f"({found.architecture}), not an adapter; add it as a model "
                              "instead", base_model=True)
        stem = path.stem if path.is_file() else path.name
        choices = tuple(self._rank_bases(found, progress, cancelled))
        return Inspection(path, found, None, _suggest_name(stem, self.catalog), str(path),
                          choices, made_for=self._made_for(found))

    def apply_inspection(self, found: Inspection) -> None:
        """Make `found` the wizard's file (what `set_path` does after inspecting)."""
        self.path, self.info, self.error = found.path, found.info, found.error
        self.base_model = found.base_model
        self.base, self.report, self.acknowledged = None, None, False
        self.choices = list(found.choices)
        self.made_for = list(found.made_for)
        if found.info is not None:
            self.name, self.source = found.name, found.source

    def _rank_bases(self, info: AdapterInfo, progress: Progress | None,
                    cancelled: CancelCheck | None) -> list[BaseChoice]:
        choices = []
        for record in self.catalog.data()["models"].values():
            try:
                status = self.catalog.verify_base(record["name"], progress, cancelled)
                if not status.ok:
                    choices.append(BaseChoice(record["name"], record["backend"], False,
                                              status.detail))
                    continue
                report = validation.check_adapter(
                    info, self.catalog.base_info(record), record["backend"],
                    record["sha256"], scan_values=False)
                reason = "compatible" if report.ok else report.reason()
                if report.ok and report.warnings():
                    reason = f"compatible, with {len(report.warnings())} warning(s)"
                choices.append(BaseChoice(record["name"], record["backend"], report.ok,
                                          reason))
            except Cancelled:
                raise
            except StudioError as exc:
                choices.append(BaseChoice(record["name"], record["backend"], False,
                                          exc.message))
        return sorted(choices, key=lambda c: (not c.compatible, c.name))

    def _made_for(self, info: AdapterInfo) -> tuple[str, ...]:
        """The catalog's bases the adapter declares: those whose digest it names, else
        (no digest declared) those whose file carries the model name it names (read
        from the file's header, memoised: `_rank_bases` read them already)."""
        records = self.catalog.data()["models"].values()
        if info.base_sha256:
            return tuple(sorted(r["name"] for r in records
                                if r["sha256"] == info.base_sha256))
        if not info.base_name:
            return ()
        found = []
        for record in records:
            try:
                if self.catalog.base_info(record).name == info.base_name:
                    found.append(record["name"])
            except StudioError:  # a file gone or changed: `_rank_bases` says so
                continue
        return tuple(sorted(found))

    def choose_base(self, name: str) -> None:
        self.apply_report(name, self.validate(name))

    def validate(self, name: str, progress: Progress | None = None,
                 cancelled: CancelCheck | None = None) -> validation.Report:
        """The full report for base `name`, value scan included; changes no state.

        Long for a large adapter (every weight is read): run it off the GUI thread.
        """
        choice = next((c for c in self.choices if c.name == name), None)
        if choice is None or not choice.compatible:
            raise ValueError(f"base {name} cannot be chosen")
        record = self.catalog.model(name)
        assert self.info is not None
        return validation.check_adapter(self.info, self.catalog.base_info(record),
                                        record["backend"], record["sha256"],
                                        progress=progress, cancelled=cancelled)

    def apply_report(self, name: str, report: validation.Report) -> None:
        """Choose base `name`, whose report `validate` made."""
        self.base = name
        self.acknowledged = False
        self.report = report
        if not self.variant_name or self.variant_name.endswith(f"-{self.name}"):
            self.variant_name = f"{name}-{self.name}"[:64]

    def acknowledge_warnings(self, value: bool = True) -> None:
        self.acknowledged = value

    def set_details(self, name: str, source: str, default_scale: float,
                    create_variant: bool, variant_name: str = "") -> None:
        self.name, self.source = name.strip(), source.strip()
        self.default_scale = default_scale
        self.create_variant = create_variant
        self.variant_name = variant_name.strip()

    # ------------------------------------------------------------------ navigation

    def blockers(self) -> list[str]:
        """Why the wizard cannot leave the current step (empty: it can)."""
        if self.step == Step.PICK:
            return [] if self.path is not None else ["choose an adapter file or folder"]
        if self.step == Step.SUMMARY:
            return [self.error] if self.error else []
        if self.step == Step.BASE:
            if not any(c.compatible for c in self.choices):
                return ["no base model in the catalog is compatible with this adapter"]
            return [] if self.base else ["choose a base model"]
        if self.step == Step.REPORT:
            assert self.report is not None
            if not self.report.ok:
                return [f"{c.name}: {c.detail}" for c in self.report.failures()]
            if self.report.warnings() and not self.acknowledged:
                return ["acknowledge the warnings to continue"]
            return []
        return self._detail_problems()

    def _detail_problems(self) -> list[str]:
        problems = []
        try:
            paths.check_name(self.name, "adapter name")
        except StudioError as exc:
            problems.append(exc.message)
        names = self._taken_names()
        if self.name in names:
            problems.append(f"the name {self.name!r} is already used")
        check = validation.check_scale(self.default_scale)
        if check.status == validation.FAIL:
            problems.append(check.detail)
        if self.create_variant:
            try:
                paths.check_name(self.variant_name, "variant name")
            except StudioError as exc:
                problems.append(exc.message)
            if self.variant_name in names or self.variant_name == self.name:
                problems.append(f"the name {self.variant_name!r} is already used")
        return problems

    def _taken_names(self) -> set[str]:
        data = self.catalog.data()
        return {n for kind in ("models", "adapters", "variants") for n in data[kind]}

    def can_advance(self) -> bool:
        return not self.blockers()

    def advance(self) -> Step:
        if self.step == Step.DETAILS:
            raise ValueError("the last step finishes instead of advancing")
        problems = self.blockers()
        if problems:
            raise ValueError(problems[0])
        self.step = Step(self.step + 1)
        return self.step

    def back(self) -> Step:
        if self.step > Step.PICK:
            self.step = Step(self.step - 1)
        return self.step

    # ------------------------------------------------------------------ finish

    def finish(self, progress: Progress | None = None,
               cancelled: CancelCheck | None = None) -> dict[str, Any]:
        """Import the adapter (and the variant). Long: run it off the GUI thread."""
        if self.step != Step.DETAILS or self.blockers():
            raise ValueError("the wizard is not complete")
        assert self.path is not None and self.base is not None
        record = imports.add_adapter(self.catalog, self.name, self.base, self.path,
                                     self.source or None, default_scale=self.default_scale,
                                     progress=progress, cancelled=cancelled)
        result: dict[str, Any] = {"adapter": record["name"]}
        if self.create_variant:
            variant = self.catalog.add_variant(self.variant_name, self.base,
                                               [AdapterSpec(self.name, self.default_scale)])
            result["variant"] = variant["name"]
        return result

    def imported(self) -> dict[str, Any]:
        """What `finish` added, read back from the catalog ({} if nothing was).

        A cancel that arrives after the adapter was recorded comes too late to undo
        it; the window asks this to tell the user the truth either way.
        """
        data = self.catalog.data()
        record = data["adapters"].get(self.name)
        if record is None or record.get("base") != self.base:
            return {}
        result: dict[str, Any] = {"adapter": self.name}
        if self.create_variant and self.variant_name in data["variants"]:
            result["variant"] = self.variant_name
        return result


def _suggest_name(stem: str, catalog: Catalog) -> str:
    taken = {n for kind in ("models", "adapters", "variants") for n in catalog.data()[kind]}
    return paths.suggest_name(stem, taken, fallback="adapter")
