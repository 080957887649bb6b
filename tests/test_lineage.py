"""`variant-studio lineage`: adapters back through the adapters they continued (by
digest), their data digests and bases; variants to their parts; merged and built models
to their sources. A digest the catalog no longer has is shown as gone, never matched
by name. One real run continues a trained adapter (`train --init-adapter`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine import cli
from engine.catalog import lineage
from engine.catalog.store import AdapterSpec, Catalog
from engine.curated import setup
from engine.curated.embedded import DEFAULT_MODEL_NAME as BASE
from tests.factories import sft_data

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--steps", "1", "--batch", "2", "--seq-len", "48", "--lr", "5e-3",
         "--targets", "q", "--rank", "2", "--alpha", "4", "--seed", "3"]


def sha(char: str) -> str:
    return char * 64


def adapter_record(name: str, digest: str, base: dict[str, Any], *,
                   init: tuple[str, str] | None = None, data: str | None = None
                   ) -> dict[str, Any]:
    """A minimal adapter record as lineage reads it (no file behind it)."""
    record: dict[str, Any] = {
        "name": name, "kind": "adapter", "backend": "llama", "format": "gguf",
        "path": f"/nowhere/{name}/adapter.gguf", "sha256": digest, "source": "test",
        "curated": False, "base": base["name"], "base_sha256": base["sha256"],
        "metadata": {}, "checks": []}
    if data is not None:
        record["provenance"] = {
            "format": "variant-studio-provenance/1", "adapter_sha256": digest,
            "data_sha256": data, "data": {"file": f"{name}.jsonl", "examples": 4,
                                          "target_tokens": 40, "path": f"/d/{name}.jsonl"},
            "base_sha256": base["sha256"], "seed": 1, "steps": 2, "method": "sft",
            "init_adapter": None if init is None else {"name": init[0], "sha256": init[1]}}
    return record


def nodes(tree: dict[str, Any]) -> list[dict[str, Any]]:
    out = [tree]
    for child in tree["children"]:
        out.extend(nodes(child))
    return out


def test_lineage_goes_by_digest_through_continued_adapters_data_merges_and_variants(
        studio_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    catalog = Catalog()
    setup.first_run(catalog)
    base = catalog.model(BASE)
    records = [
        adapter_record("a", sha("a"), base, data=sha("1")),
        adapter_record("b", sha("b"), base, init=("a", sha("a")), data=sha("2")),
        adapter_record("c", sha("c"), base, init=("b", sha("b")), data=sha("3")),
        # Continued from an adapter recorded as "a" whose digest no record has: the
        # present "a" (another file) must not be taken for it.
        adapter_record("d", sha("d"), base, init=("a", sha("9")), data=sha("4")),
        adapter_record("loop", sha("e"), base, init=("loop", sha("e")), data=sha("5")),
    ]
    for record in records:
        catalog.insert("adapters", record)
    merged = {**base, "name": "merged", "sha256": sha("m"), "path": "/nowhere/m.gguf",
              "curated": False,
              # As engine.runtime.merge.records records it.
              "merged_from": {"variant": "v", "base": BASE, "base_sha256": base["sha256"],
                              "adapters": [{"name": "c", "sha256": sha("c"), "scale": 0.5,
                                            "rank": 8, "alpha": 16.0},
                                           {"name": "gone", "sha256": sha("0"),
                                            "scale": 2.0, "rank": 8, "alpha": 16.0}],
                              "type": "q8_0", "erased": False}}
    catalog.insert("models", merged)
    catalog.add_variant("v", BASE, [AdapterSpec("c", 0.75)])

    code = cli.main(["lineage", "c", "--json"])
    tree = json.loads(capsys.readouterr().out)
    assert code == 0
    chain = [n for n in nodes(tree) if n["kind"] == "adapter"]
    assert [(n["name"], n["sha256"], n["role"]) for n in chain] == [
        ("c", sha("c"), "adapter"), ("b", sha("b"), "continued from"),
        ("a", sha("a"), "continued from")]
    assert [n["sha256"] for n in nodes(tree) if n["kind"] == "data"] == [
        sha("3"), sha("2"), sha("1")]
    bases = [n for n in nodes(tree) if n["role"] == "base"]
    assert {(n["name"], n["sha256"]) for n in bases} == {(BASE, base["sha256"])}

    gone = lineage.lineage(catalog, "d").children[-1]
    assert (gone.role, gone.present, gone.name, gone.sha256, gone.recorded_name,
            gone.detail) == ("continued from", False, None, sha("9"), "a",
                             "no longer in the catalog")
    code = cli.main(["lineage", "d"])
    text = capsys.readouterr().out
    assert "continued from: adapter (recorded as a)  sha256 9999999999999999…  (no longer " \
           "in the catalog)" in text

    looped = lineage.lineage(catalog, "loop")
    assert looped.children[-1].detail == "(seen above)" and not looped.children[-1].children

    parts = lineage.lineage(catalog, "merged")
    assert parts.detail == "merged model: variant v, type q8_0"
    assert [(c.role, c.name, c.sha256, c.scale, c.present) for c in parts.children] == [
        ("merged from base", BASE, base["sha256"], None, True),
        ("merged adapter", "c", sha("c"), 0.5, True),
        ("merged adapter", None, sha("0"), 2.0, False)]
    assert [n.name for n in parts.children[1].walk() if n.kind == "adapter"] == ["c", "b", "a"]

    variant = lineage.lineage(catalog, "v")
    assert [(c.role, c.name, c.scale) for c in variant.children] == [
        ("base", BASE, None), ("adapter", "c", 0.75)]
    lines = lineage.render(variant)
    assert lines[0] == "variant v  (llama variant)" and lines[2].startswith("└─ adapter c @ 0.75")


def run_cli(home: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VARIANT_STUDIO_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "engine.cli", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.slow
def test_lineage_of_an_adapter_continued_from_a_trained_one(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = sft_data(tmp_path / "first.jsonl")
    second = tmp_path / "second.jsonl"
    rows = [json.loads(line) for line in first.read_text(encoding="utf-8").splitlines()]
    second.write_text("".join(json.dumps({**row, "completion": row["completion"] + " Done."}
                                         if "completion" in row else row) + "\n"
                              for row in rows), encoding="utf-8")
    done = run_cli(home, "train", "t1", "--base", BASE, "--data", str(first), *SMALL,
                   "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    one = json.loads(done.stdout)
    done = run_cli(home, "train", "t2", "--base", BASE, "--data", str(second),
                   "--init-adapter", "t1", "--steps", "1", "--batch", "2", "--seq-len", "48",
                   "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    two = json.loads(done.stdout)
    done = run_cli(home, "lineage", "t2", "--json")
    assert done.returncode == 0, done.stderr
    tree = json.loads(done.stdout)
    adapters = [n for n in nodes(tree) if n["kind"] == "adapter"]
    assert [(n["name"], n["sha256"]) for n in adapters] == [
        ("t2", two["files"]["gguf"]["sha256"]), ("t1", one["files"]["gguf"]["sha256"])]
    data = [n["sha256"] for n in nodes(tree) if n["kind"] == "data"]
    assert data == [two["provenance"]["data_sha256"], one["provenance"]["data_sha256"]]
    assert len(set(data)) == 2
    base_sha = one["provenance"]["base_sha256"]
    assert {n["sha256"] for n in nodes(tree) if n["role"] == "base"} == {base_sha}
    text = run_cli(home, "lineage", "t2").stdout
    assert "continued from: adapter t1" in text and "data second.jsonl" in text
    # Once t1 is removed its digest is shown as gone, with the name it was recorded under.
    assert run_cli(home, "remove", "t1").returncode == 0
    gone = json.loads(run_cli(home, "lineage", "t2", "--json").stdout)["children"][-1]
    assert (gone["present"], gone["sha256"], gone["recorded_name"], gone["detail"]) == (
        False, one["files"]["gguf"]["sha256"], "t1", "no longer in the catalog")


def test_lineage_shows_the_kl_text_a_run_read(studio_home: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The shipped demo was trained with a KL text: the tree and `show` name it beside
    its data, with the sha256 its record holds."""
    from engine.curated import demo

    setup.first_run(Catalog(), with_demo=True)
    record = Catalog().adapter(demo.ADAPTER_NAME)["provenance"]
    assert cli.main(["lineage", demo.VARIANT_NAME, "--json"]) == 0
    tree = json.loads(capsys.readouterr().out)
    files = [(n["role"], n["name"], n["sha256"]) for n in nodes(tree) if n["kind"] == "data"]
    assert files == [("data", "train.jsonl", record["data_sha256"]),
                     ("kl text", demo.DEMO_KL_TEXT, record["kl_text"]["sha256"])]
    assert cli.main(["lineage", demo.VARIANT_NAME]) == 0
    assert f"kl text: data {demo.DEMO_KL_TEXT}" in capsys.readouterr().out
    # `show` has it among the record's digests.
    assert cli.main(["show", demo.ADAPTER_NAME]) == 0
    assert f"kl_text_sha256: {record['kl_text']['sha256']} ({demo.DEMO_KL_TEXT}, 20 " \
        "passages" in capsys.readouterr().out
