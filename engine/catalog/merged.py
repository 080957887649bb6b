"""A merged model's record, read back: what `show`, `list` and `doctor` say of it.

A merge (`engine.runtime.merge`, which writes the record: `runtime.merge.records`) folds
a variant's adapters into a standalone GGUF, added as a base model whose record carries
`merged_from`: the variant, its base (name, sha256), each adapter (name, sha256, scale,
rank, alpha), the output type, the variant's profile (its system prompt is part of its
behaviour, and no plain base knows it), the survival figures and `erased` (True when it
was kept below the survival threshold with --allow-erased).

This reading side stays in the catalog because the catalog's own reports read it
(`entries`, `health`), and the catalog sits below the room that writes it.
"""

from __future__ import annotations

from typing import Any

from engine.catalog import validation


def summary(record_from: dict[str, Any]) -> str:
    """One line: what this model is (for `show`, `doctor` and the library)."""
    adapters = ", ".join(f"{a['name']}@{a['scale']:g}" for a in record_from.get("adapters", []))
    survival = record_from.get("survival")
    shown = "not measurable" if survival is None else f"{survival:.2f}"
    text = (f"a merge, not a dynamic variant: variant {record_from.get('variant')} "
            f"({record_from.get('base')} + {adapters}) folded into one standalone GGUF "
            f"({record_from.get('type')}); behaviour survival {shown} (threshold "
            f"{record_from.get('threshold')})")
    if record_from.get("erased"):
        text += ("; labelled ERASED: below the threshold, the fine-tune did not survive "
                 "the output's grid intact (kept with --allow-erased)")
    return text


def badge(record_from: dict[str, Any]) -> dict[str, Any]:
    """The few fields `list` gives per merged model (a library badge needs no more)."""
    return {"variant": record_from.get("variant"), "type": record_from.get("type"),
            "survival": record_from.get("survival"), "erased": bool(record_from.get("erased"))}


def check(record: dict[str, Any]) -> validation.Check:
    """The `merge` check of a merged model: pass, or warn when it is labelled erased."""
    found = record["merged_from"]
    return validation.Check("merge", validation.WARN if found.get("erased") else
                            validation.PASS, summary(found))
