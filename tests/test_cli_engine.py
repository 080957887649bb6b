"""`generate`, `compare` and `status` through the CLI, on the real model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine import cli
from engine.catalog import resolve
from engine.catalog.store import Catalog
from tests.engine_helpers import BASE, populate


@pytest.mark.slow
def test_generate_compare_and_status_json(studio_home: Path, tmp_path: Path, base_info,
                                          capsys: pytest.CaptureFixture) -> None:
    populate(Catalog(), tmp_path, base_info)
    flags = ["--prompt", "Write a short poem about the sea.", "--chat", "--temperature", "0",
             "--max-tokens", "12", "--json"]
    assert cli.main(["generate", BASE, *flags]) == 0
    gen = json.loads(capsys.readouterr().out)
    assert {"text", "token_ids", "identity", "tokens_per_second"} <= set(gen)
    assert len(gen["token_ids"]) == 12
    assert gen["identity"] == resolve.identity(Catalog(), BASE).key

    assert cli.main(["compare", "va", *flags]) == 0
    cmp_ = json.loads(capsys.readouterr().out)
    assert set(cmp_) == {"base", "variant", "first_divergence", "adapter_effect"}
    assert cmp_["base"]["token_ids"] == gen["token_ids"]
    assert cmp_["variant"]["identity"] == resolve.identity(Catalog(), "va").key
    assert cmp_["adapter_effect"] > 0

    assert cli.main(["generate", BASE, "--prompt", "Hi", "--max-tokens", "3"]) == 0
    out = capsys.readouterr()
    assert out.out.strip() and BASE in out.err

    # Each command ran an engine of its own, stopped when it ended; status starts none
    # to describe it (issue 14: it used to start one and report that as running).
    assert cli.main(["status", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["engine"]["state"] == "none" and status["engine"]["front_ends"] == []


def test_generate_refuses_bad_sampling_and_compare_needs_a_variant(
        studio_home: Path, capsys: pytest.CaptureFixture) -> None:
    code = cli.main(["generate", BASE, "--prompt", "x", "--temperature", "nan"])
    assert code == 2 and "temperature" in capsys.readouterr().err
    code = cli.main(["compare", BASE, "--prompt", "x", "--max-tokens", "2"])
    assert code == 3 and "compare needs a variant" in capsys.readouterr().err


@pytest.mark.slow
def test_sampling_and_system_flags_reach_the_engine(studio_home: Path,
                                                   capsys: pytest.CaptureFixture) -> None:
    def gen(*flags: str) -> dict:
        assert cli.main(["generate", BASE, "--prompt", "Name a colour.", "--chat",
                         "--max-tokens", "10", "--json", *flags]) == 0
        return json.loads(capsys.readouterr().out)

    sampled = ["--temperature", "1.2", "--top-p", "0.95", "--top-k", "40"]
    first = gen(*sampled, "--seed", "11")
    assert gen(*sampled, "--seed", "11")["token_ids"] == first["token_ids"]
    seeds = {tuple(gen(*sampled, "--seed", str(s))["token_ids"]) for s in (1, 2, 3)}
    assert len(seeds | {tuple(first["token_ids"])}) > 1, "the seed changed nothing"
    # top-k 1 is greedy whatever the temperature and seed.
    greedy = gen("--temperature", "0")
    assert gen("--temperature", "1.5", "--top-k", "1", "--seed", "5")["token_ids"] == \
        greedy["token_ids"]
    # The system prompt reaches the rendered prompt (and changes the answer).
    pirate = gen("--temperature", "0", "--system", "You are a pirate. Always say Arr.")
    assert pirate["prompt_tokens"] != greedy["prompt_tokens"]
    assert pirate["token_ids"] != greedy["token_ids"]
