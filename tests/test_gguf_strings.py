"""The GGUF reader walks string arrays (a tokenizer's vocabulary) a block at a time; the
result and every refusal must be what reading them one string at a time gives."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from engine.formats import gguf_file
from engine.formats.artifacts import InspectionError
from tests import gguf_bytes as gb


def string_array(key: str, items: list[bytes]) -> bytes:
    return gb.string(key) + gb.string_array(items)


def vocabulary(count: int) -> list[bytes]:
    # Mixed lengths and non-ASCII text, one string longer than a whole block.
    words = [f"tok{i}-é{'x' * (i % 37)}".encode() for i in range(count)]
    words[count // 2] = b"y" * (gguf_file.STRING_BLOCK + 123)
    return words


def parse_both(tmp_path: Path, data: bytes, monkeypatch: pytest.MonkeyPatch):
    """(block walk, one string at a time): each the header or the refusal's message."""
    path = tmp_path / "strings.gguf"
    path.write_bytes(data)
    results = []
    for block in (gguf_file.STRING_BLOCK, 1):  # a 1-byte block never fits a string
        monkeypatch.setattr(gguf_file, "STRING_BLOCK", block)
        try:
            header = gguf_file.read_header(path)
            results.append({k: repr(v) for k, v in header.metadata.items()})
        except InspectionError as exc:
            results.append(exc.message)
    return results


def test_a_vocabulary_reads_as_one_string_at_a_time_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = gb.raw([string_array("tokenizer.ggml.tokens", vocabulary(5000)),
                     string_array("short", [b"a", "é".encode(), b""]),
                     gb.kv_u32("after", 7)])
    walked, single = parse_both(tmp_path, data, monkeypatch)
    assert walked == single
    assert walked["after"] == "7"  # the position after the arrays is right
    assert "('a', 'é', '')" in walked["short"]
    assert "5000" in walked["tokenizer.ggml.tokens"]


@pytest.mark.parametrize("damage, message", [
    ("utf8", "item 3001 of tokenizer.ggml.tokens is not valid UTF-8"),
    ("truncated", "truncated GGUF"),
    ("huge", "item 3001 of tokenizer.ggml.tokens claims a length of"),
])
def test_a_damaged_vocabulary_is_refused_as_one_string_at_a_time_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str, message: str) -> None:
    items = vocabulary(5000)
    data = gb.raw([string_array("tokenizer.ggml.tokens", items), gb.kv_u32("after", 7)])
    at = len(gb.raw([string_array("tokenizer.ggml.tokens", items[:3001])], alignment=1))
    if damage == "utf8":
        data = data[:at + 8] + b"\xff" + data[at + 9:]
    elif damage == "truncated":
        data = data[:at + 4]
    else:
        data = data[:at] + struct.pack("<Q", gguf_file.MAX_STRING_LEN + 1) + data[at + 8:]
    walked, single = parse_both(tmp_path, data, monkeypatch)
    assert walked == single
    assert isinstance(walked, str) and message in walked, walked
