"""The import wizard's state machine, without Qt."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.catalog.store import Catalog
from engine.catalog.wizard import ImportWizard, Step
from engine.curated import setup
from engine.curated.embedded import DEFAULT_MODEL_NAME
from tests import factories as f


@pytest.fixture
def wizard(studio_home: Path) -> ImportWizard:
    catalog = Catalog()
    setup.first_run(catalog)
    return ImportWizard(catalog)


def test_happy_path_imports_adapter_and_variant(wizard: ImportWizard, tmp_path: Path,
                                                base_info) -> None:
    assert wizard.blockers() == ["choose an adapter file or folder"]
    wizard.set_path(f.write_gguf_lora(tmp_path / "my style.gguf", base_info))
    assert wizard.advance() == Step.SUMMARY
    assert wizard.info is not None and wizard.info.rank == 8 and wizard.name == "my-style"
    assert wizard.advance() == Step.BASE
    first = wizard.choices[0]
    assert first.name == DEFAULT_MODEL_NAME and first.compatible
    with pytest.raises(ValueError):
        wizard.advance()  # no base chosen yet
    wizard.choose_base(DEFAULT_MODEL_NAME)
    assert wizard.advance() == Step.REPORT
    assert wizard.blockers() == ["acknowledge the warnings to continue"]  # unverified base
    wizard.acknowledge_warnings()
    assert wizard.advance() == Step.DETAILS
    assert wizard.variant_name == f"{DEFAULT_MODEL_NAME}-my-style"
    wizard.set_details("my-style", "https://example.org", 0.75, True, "smol-style")
    progress: list[int] = []
    result = wizard.finish(lambda d, t: progress.append(d))
    assert result == {"adapter": "my-style", "variant": "smol-style"}
    variant = wizard.catalog.variant("smol-style")
    assert variant["adapters"] == [{"name": "my-style", "scale": 0.75}]
    assert progress and wizard.catalog.adapter("my-style")["source"] == "https://example.org"


def test_refusals_block_each_step(wizard: ImportWizard, tmp_path: Path, base_info,
                                  embedded_path: Path) -> None:
    (tmp_path / "junk.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 16)
    wizard.set_path(tmp_path / "junk.gguf")
    wizard.advance()
    assert "more than the file can hold" in wizard.blockers()[0]
    wizard.set_path(embedded_path)
    assert "is a base model" in wizard.blockers()[0]
    # The other backend's format: every base is incompatible, with the reason.
    wizard.set_path(f.write_peft_lora(tmp_path / "peft", base_info))
    wizard.advance()
    assert all(not c.compatible for c in wizard.choices)
    assert "PEFT" in wizard.choices[0].reason
    with pytest.raises(ValueError):
        wizard.choose_base(DEFAULT_MODEL_NAME)
    assert "no base model" in wizard.blockers()[0]


def test_details_are_checked(wizard: ImportWizard, tmp_path: Path, base_info) -> None:
    wizard.set_path(f.write_gguf_lora(tmp_path / "a.gguf", base_info))
    wizard.advance()
    wizard.advance()
    wizard.choose_base(DEFAULT_MODEL_NAME)
    wizard.advance()
    wizard.acknowledge_warnings()
    wizard.advance()
    wizard.set_details("../bad", "", float("nan"), True, DEFAULT_MODEL_NAME)
    problems = " | ".join(wizard.blockers())
    assert "invalid adapter name" in problems and "NaN" in problems
    assert "already used" in problems
    with pytest.raises(ValueError):
        wizard.finish()
    assert wizard.back() == Step.REPORT
