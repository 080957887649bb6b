"""The hostile-input table (`tests/hostile_cases.py`) through the real CLI.

Each case runs as `adapter add`, `model add` or `variant add` against one data
directory shared by the module; the expected outcome is the case's `cli` column.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from engine import cli
from engine.formats.artifacts import BaseModelInfo
from engine.state import statefile
from tests.hostile_cases import (
    ACCEPTED,
    BASE,
    CASE_IDS,
    CASE_SECONDS,
    CASES,
    OV_BASE,
    ROOT,
    Case,
    Workshop,
    build,
    deadline,
    mini_lora,
    ov_folder,
    peft_folder,
    printable_everywhere,
    tiny_base,
    tree,
)


@dataclass
class World:
    home: Path
    workshop: Workshop


@pytest.fixture(scope="module")
def world(module_home: Path, tmp_path_factory: pytest.TempPathFactory,
          base_info: BaseModelInfo, embedded_path: Path) -> Iterator[World]:
    inputs = tmp_path_factory.mktemp("hostile-inputs")
    w = Workshop(inputs, base_info, embedded_path)
    assert cli.main(["adapter", "add", "good", "--base", BASE, "--file",
                     str(w.put("good", mini_lora()))]) == 0
    assert cli.main(["model", "add", OV_BASE, "--backend", "openvino", "--file",
                     str(ov_folder(w, "ov-good"))]) == 0
    assert cli.main(["adapter", "add", "good-peft", "--base", OV_BASE, "--file",
                     str(peft_folder(w, "peft-good"))]) == 0
    statefile.take_notices()
    yield World(module_home, w)


def cli_argv(case: Case, target: Path | str) -> list[str]:
    if case.surface == "adapter":
        return ["adapter", "add", "bad", "--base", BASE, "--file", str(target)]
    if case.surface == "peft":
        return ["adapter", "add", "bad", "--base", OV_BASE, "--file", str(target)]
    if case.surface == "model":
        return ["model", "add", "bad", "--file", str(target)]
    assert case.surface == "variant"
    return ["variant", "add", "bad", "--base", BASE, "--adapter", f"good:{target}"]


def run_cli(argv: list[str], capsys: pytest.CaptureFixture, what: str) -> tuple[int, str, str]:
    with deadline(CASE_SECONDS, what):
        code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------------- tests


def test_the_controls_are_accepted(world: World, capsys: pytest.CaptureFixture) -> None:
    """The builders' baselines are valid: each case fails only because of its defect."""
    w = world.workshop
    shown = json.loads(run_cli(["show", "good", "--json"], capsys, "show")[1])
    assert shown["status"] == "warn" and shown["rank"] == 8 and shown["targets"] == ["attn_q"]
    shown = json.loads(run_cli(["show", "good-peft", "--json"], capsys, "show")[1])
    assert shown["status"] == "warn" and shown["rank"] == 8
    code, _, err = run_cli(["model", "add", "tiny", "--file", str(w.put("tiny-ok",
                                                                         tiny_base()))],
                           capsys, "tiny base")
    assert code == 0, err
    assert run_cli(["remove", "tiny"], capsys, "remove")[0] == 0


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_hostile_input_through_the_cli(case: Case, world: World,
                                       capsys: pytest.CaptureFixture) -> None:
    target = build(case, world.workshop)
    catalog = world.home / "catalog.json"
    before, home_before = catalog.read_bytes(), tree(world.home)
    inputs_before = tree(world.workshop.tmp)
    start = time.monotonic()
    code, out, err = run_cli(cli_argv(case, target), capsys, case.id)
    elapsed = time.monotonic() - start
    assert "Traceback" not in err and "internal error" not in err, err
    if case.cli == ACCEPTED:
        assert code == 0, err
        _check_harmless(case, world, capsys)
    else:
        reason = case.cli.removeprefix("refused: ")
        lines = err.strip().splitlines()
        assert code == 3, (code, err)
        assert len(lines) == 1 and lines[0].startswith("error: "), err
        assert reason in lines[0], lines[0]
        assert lines[0].isprintable(), f"control characters in {lines[0]!r}"
        assert catalog.read_bytes() == before, "a refused input changed the catalog"
        assert tree(world.home) - home_before <= {"digests.json"}, "left files behind"
    assert tree(world.workshop.tmp) == inputs_before, "created files next to the input"
    assert elapsed < CASE_SECONDS


def _check_harmless(case: Case, world: World, capsys: pytest.CaptureFixture) -> None:
    code, out, err = run_cli(["show", "bad", "--json"], capsys, "show")
    assert code == 0, err
    shown = json.loads(out)
    assert printable_everywhere(shown), "control characters reach what the app shows"
    if case.surface in ("adapter", "peft"):
        assert Path(shown["path"]).parent == world.home / "adapters" / "bad"
    listing = run_cli(["list"], capsys, "list")[1]
    assert all(line.isprintable() for line in listing.splitlines())
    assert run_cli(["remove", "bad"], capsys, "remove")[0] == 0


def test_the_table_is_mirrored_in_docs_security_md() -> None:
    """docs/security.md lists every case with the same expected outcomes."""
    text = (ROOT / "docs" / "security.md").read_text(encoding="utf-8")
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`") and cells[0].endswith("`"):
            rows[cells[0].strip("`")] = (cells[2], cells[3].replace("\\|", "|"),
                                         cells[4].replace("\\|", "|"))
    expected = {c.id: (c.surface, c.cli, c.engine_outcome) for c in CASES}
    assert rows == expected
