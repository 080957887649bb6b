"""What the exact build (`build.py`) and the compressed profiles (`compress.py`) share.

Its own module so that neither imports the other for it: `build` asks `compress` for
the profiles, and `compress` names its cache folders after the exact build's recipe
and reads the same weight constants, without an import circle.
"""

from __future__ import annotations

import re
from typing import Any

# v2: every family GenAI's reader knows, the rotary table replaced by llama.cpp's in f32
# (v1 kept the reader's f16 table, blind to rope_freqs and linear scaling).
RECIPE = "f16-structural-v2"


def version_token(version: str, length: int) -> str:
    """A version string as it may stand in a cache folder's name."""
    return re.sub(r"[^0-9A-Za-z.]", "_", version)[:length]


def weight_constant(node: Any) -> Any | None:
    """The Constant behind a MatMul's weight input (through decompression Converts)."""
    for _ in range(4):
        kind = node.get_type_name()
        if kind == "Constant":
            return node
        if kind != "Convert":
            return None
        node = node.input_value(0).get_node()
    return None
