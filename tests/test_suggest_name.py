"""The one name-suggestion rule (engine.state.paths.suggest_name) that the import wizard
and the window's "Add base model" share: any file stem gives a valid, free, ASCII name."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.state import paths


@pytest.mark.parametrize(("stem", "expected"), [
    ("modèle", "modele"),  # the accent is dropped, not the letter
    ("my model (v2)", "my-model-v2"),
    ("a..b", "a.b"),  # ".." is refused by check_name
    ("_x_", "x"),
    ("évolution—v1", "evolution-v1"),
    ("модель", "model"),  # nothing usable: the fallback
    ("...", "model"),
    ("\u202eevil\x1b[0m", "evil-0m"),
])
def test_suggestions_are_ascii_and_valid(stem: str, expected: str) -> None:
    name = paths.suggest_name(stem, set(), fallback="model")
    assert name == expected
    assert paths.check_name(name) == name and name.isascii()


def test_a_taken_name_gets_a_number() -> None:
    assert paths.suggest_name("modèle", {"modele"}) == "modele-2"
    assert paths.suggest_name("modèle", {"modele", "modele-2"}) == "modele-3"
    assert paths.suggest_name("", {"adapter"}) == "adapter-2"


def test_long_stems_leave_room_for_a_number() -> None:
    name = paths.suggest_name("x" * 200, {"x" * 56})
    assert name == "x" * 56 + "-2" and len(name) <= 64


@given(st.text(max_size=120), st.sets(st.text(max_size=10), max_size=5))
def test_any_stem_gives_a_valid_free_name(stem: str, taken: set[str]) -> None:
    name = paths.suggest_name(stem, taken)
    assert paths.check_name(name) == name and name not in taken and name.isascii()
