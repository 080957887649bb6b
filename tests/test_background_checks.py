"""The engine side of "no freeze" and of the thread setting, without Qt.

What the window leaves on the GUI thread must not read whole files; what it moves to
a worker must report progress and stop when cancelled, adding nothing; and every
engine process started by a client gets the environment of that moment.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from engine.catalog import digest, health, imports, validation
from engine.catalog.store import AdapterSpec, Catalog
from engine.catalog.wizard import ImportWizard
from engine.curated import setup
from engine.curated.embedded import DEFAULT_MODEL_NAME
from engine.errors import Cancelled
from engine.runtime import messages
from engine.runtime.client import EngineClient
from engine.state import paths, settings
from tests import factories as f


@pytest.fixture
def catalog(studio_home: Path, tmp_path: Path, base_info) -> Catalog:
    catalog = Catalog()
    setup.first_run(catalog)
    imports.add_adapter(catalog, "a", DEFAULT_MODEL_NAME,
                        f.write_gguf_lora(tmp_path / "a.gguf", base_info, seed=1))
    catalog.add_variant("va", DEFAULT_MODEL_NAME, [AdapterSpec("a", 1.0)])
    return catalog


def count_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every whole-file read: an uncached hash or a value scan."""
    reads: list[str] = []
    real_hash, real_values = digest.hash_uncached, validation._values

    def hashed(path, progress=None, cancelled=None):
        reads.append(f"hash {Path(path).name}")
        return real_hash(path, progress, cancelled)

    def scanned(adapter, progress=None, cancelled=None):
        reads.append(f"scan {Path(adapter.path).name}")
        return real_values(adapter, progress, cancelled)

    monkeypatch.setattr(digest, "hash_uncached", hashed)
    monkeypatch.setattr(validation, "_values", scanned)
    return reads


def test_checking_unchanged_files_reads_none_of_them(catalog: Catalog,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # The stored copy's digest survives the rename from staging into the store.
    assert digest.cached_digest(Path(catalog.adapter("a")["path"])) is not None
    reads = count_reads(monkeypatch)
    assert health.unchecked(catalog) == set()
    assert health.status_of_records(catalog) == {}
    report = health.recheck_adapter(Catalog(), "a")  # a fresh Catalog: no memo either
    assert report.ok and [c.status for c in report.checks if c.name == "values"] == ["pass"]
    assert reads == []


def test_a_changed_file_is_unchecked_until_check_files_reads_it(
        catalog: Catalog, tmp_path: Path, embedded_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / "other.gguf"
    shutil.copyfile(embedded_path, copy)
    imports.add_model(catalog, "other", copy)
    other = catalog.base_info(catalog.model("other"))
    imports.add_adapter(catalog, "b", "other", f.write_gguf_lora(tmp_path / "b.gguf", other,
                                                                 seed=2))
    catalog.add_variant("vb", "other", [AdapterSpec("b", 1.0)])
    assert health.unchecked(catalog) == set()
    with copy.open("ab") as handle:
        handle.write(b"\0" * 16)
    reads = count_reads(monkeypatch)
    # The base and everything that uses it; nothing read to find out.
    assert health.unchecked(catalog) == {"other", "b", "vb"}
    assert health.status_of_records(catalog, skip={"other", "b", "vb"}) == {}
    assert reads == []
    # A cancel stops the hash part-way and caches nothing.
    seen: list[int] = []
    with pytest.raises(Cancelled):
        health.check_files(catalog, lambda done, total: seen.append(done),
                           cancelled=lambda: len(seen) >= 1)
    assert digest.cached_digest(copy) is None
    assert health.unchecked(catalog) == {"other", "b", "vb"}
    progress: list[tuple[int, int]] = []
    health.check_files(catalog, lambda done, total: progress.append((done, total)))
    assert progress[-1][0] == progress[-1][1] == copy.stat().st_size
    assert reads == ["hash other.gguf"] * 2
    assert health.unchecked(catalog) == set()
    problems = health.status_of_records(catalog)
    assert "file changed on disk" in problems["other"][0] and "base" in problems["b"][0]


def test_a_cancelled_import_adds_nothing_even_at_the_last_moment(
        catalog: Catalog, tmp_path: Path, base_info, embedded_path: Path) -> None:
    before = catalog.state.path.read_bytes()
    source = f.write_gguf_lora(tmp_path / "late.gguf", base_info, rank=64, seed=5)
    # Cancel once the hash of the stored copy (the last pass) has started.
    hashing = {"started": False}

    def progress(done: int, total: int) -> None:
        hashing["started"] = done > 2 * total // 3

    with pytest.raises(Cancelled):
        imports.add_adapter(catalog, "late", DEFAULT_MODEL_NAME, source, progress=progress,
                            cancelled=lambda: hashing["started"])
    # A cancel that only comes after every pass: still refused, under the lock.
    def after_all_reads() -> bool:
        return catalog.state._lock.is_locked  # true only inside the catalog write

    with pytest.raises(Cancelled):
        imports.add_adapter(catalog, "late", DEFAULT_MODEL_NAME, source,
                            cancelled=after_all_reads)
    copy = tmp_path / "base.gguf"
    shutil.copyfile(embedded_path, copy)
    with pytest.raises(Cancelled):
        imports.add_model(catalog, "late-base", copy, cancelled=after_all_reads)
    assert catalog.state.path.read_bytes() == before
    assert sorted(p.name for p in (paths.data_dir() / "adapters").iterdir()) == ["a"]


def test_wizard_steps_compute_off_the_state_then_apply(catalog: Catalog, tmp_path: Path,
                                                       base_info) -> None:
    wizard = ImportWizard(catalog)
    source = f.write_gguf_lora(tmp_path / "w.gguf", base_info, rank=16, seed=9)
    found = wizard.inspect(source)
    assert wizard.path is None and wizard.info is None  # nothing changed yet
    assert found.info is not None and found.name == "w" and found.choices[0].compatible
    wizard.apply_inspection(found)
    assert wizard.info == found.info and wizard.choices == list(found.choices)
    steps: list[int] = []
    report = wizard.validate(DEFAULT_MODEL_NAME, lambda done, total: steps.append(done))
    assert wizard.report is None and report.ok
    assert steps and steps[-1] == len(found.info.pairs) * 2  # every tensor scanned
    with pytest.raises(Cancelled):
        wizard.validate(DEFAULT_MODEL_NAME, cancelled=lambda: True)
    wizard.apply_report(DEFAULT_MODEL_NAME, report)
    assert wizard.base == DEFAULT_MODEL_NAME and wizard.report is report


def test_each_engine_start_takes_the_environment_of_that_moment(studio_home: Path) -> None:
    import os

    def env() -> dict[str, str]:
        starts.append(settings.load().threads)
        return {**os.environ, "VARIANT_STUDIO_THREADS": str(settings.load().threads)}

    starts: list[int] = []
    states: list[tuple[str, str]] = []
    stopped = threading.Event()

    def on_state(state: str, detail: str) -> None:
        states.append((state, detail))
        if state != "running":
            stopped.set()

    settings.update(threads=2)
    client = EngineClient(env=env, on_state=on_state)
    try:
        first = client.call(messages.Describe(), timeout=120)
        assert first["n_threads"] == 2
        settings.update(threads=3)
        client.kill(expected=True)
        assert stopped.wait(60)
        assert states[-1] == ("stopped", "restarted")  # a restart, not a crash
        second = client.call(messages.Describe(), timeout=120)
        assert second["pid"] != first["pid"] and second["n_threads"] == 3
        assert starts == [2, 3]
    finally:
        client.close()
