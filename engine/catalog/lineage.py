"""Lineage: what a model, adapter or variant was made from, found by digest.

An adapter goes back through the adapter its training continued (the provenance
record's `init_adapter`, matched by sha256, never by name), the data digests of each
run, and its base (by the digest it was validated against). A variant goes to its base
and adapters; a merged base model (a record with `merged_from`) to the base and
adapters folded into it, with their scales; a built model (`built_from`, the OpenVINO
default) to the model it was built from. A digest no record has any more is shown as
such, "no longer in the catalog", with the name it was recorded under for reference;
it is never matched to whatever now carries that name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.catalog.store import Catalog
from engine.formats.safeio import printable

MAX_DEPTH = 32
GONE = "no longer in the catalog"


@dataclass(frozen=True)
class Node:
    """One step of a lineage tree (frozen: it crosses to the window's thread)."""

    kind: str  # "variant" | "model" | "adapter" | "data"
    role: str  # how it relates to its parent: "base", "adapter", "continued from", ...
    name: str | None  # the catalog name, when the catalog has it
    sha256: str | None
    present: bool  # the catalog has this digest (data files are not catalog entries)
    detail: str = ""
    children: tuple[Node, ...] = ()
    scale: float | None = None
    recorded_name: str | None = None  # the name a record gave it (for a gone digest)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "role": self.role, "name": self.name,
                "sha256": self.sha256, "present": self.present, "detail": self.detail,
                "scale": self.scale, "recorded_name": self.recorded_name,
                "children": [c.to_dict() for c in self.children]}

    def walk(self) -> list[Node]:
        """This node and every descendant, depth first."""
        out = [self]
        for child in self.children:
            out.extend(child.walk())
        return out


class _Index:
    """The catalog's records by digest."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.models: dict[str, dict[str, Any]] = {}
        self.adapters: dict[str, dict[str, Any]] = {}
        for record in data["models"].values():
            self.models.setdefault(record.get("sha256"), record)
        for record in data["adapters"].values():
            self.adapters.setdefault(record.get("sha256"), record)
            for entry in record.get("files", {}).values():
                self.adapters.setdefault(entry.get("sha256"), record)


def lineage(catalog: Catalog, name: str) -> Node:
    """The lineage tree of model, adapter or variant `name`."""
    data = catalog.data()
    kind, record = catalog.find(name)
    index = _Index(data)
    if kind == "variant":
        return _variant(record, data, index)
    if kind == "adapter":
        return _adapter(record, "adapter", index, frozenset(), 0)
    return _model(record, "model", index, frozenset(), 0)


def _variant(record: dict[str, Any], data: dict[str, Any], index: _Index) -> Node:
    children = []
    base = data["models"].get(record["base"])
    children.append(_model(base, "base", index, frozenset(), 1) if base else
                    _gone("model", "base", None, record["base"]))
    for part in record["adapters"]:
        adapter = data["adapters"].get(part["name"])
        node = (_adapter(adapter, "adapter", index, frozenset(), 1, part["scale"])
                if adapter else _gone("adapter", "adapter", None, part["name"], part["scale"]))
        children.append(node)
    return Node("variant", "variant", record["name"], None, True,
                f"{record.get('backend')} variant", tuple(children))


def _gone(kind: str, role: str, sha256: str | None, recorded: str | None,
          scale: float | None = None) -> Node:
    return Node(kind, role, None, sha256, False, GONE, (), scale,
                printable(str(recorded), 80) if recorded else None)


def _by_digest(kind: str, role: str, sha256: Any, recorded: Any, index: _Index,
               seen: frozenset[str], depth: int, scale: float | None = None) -> Node:
    sha = sha256 if isinstance(sha256, str) else None
    table = index.models if kind == "model" else index.adapters
    record = table.get(sha) if sha else None
    if record is None:
        return _gone(kind, role, sha, recorded if isinstance(recorded, str) else None, scale)
    if kind == "model":
        return _model(record, role, index, seen, depth)
    return _adapter(record, role, index, seen, depth, scale)


def _model(record: dict[str, Any], role: str, index: _Index, seen: frozenset[str],
           depth: int) -> Node:
    sha = record.get("sha256")
    detail = f"{record.get('backend')} base model, {record.get('format')}"
    children: list[Node] = []
    if sha in seen or depth >= MAX_DEPTH:
        return Node("model", role, record["name"], sha, True, detail + " (seen above)")
    seen = seen | {sha}
    merged = record.get("merged_from")
    if isinstance(merged, dict):
        # engine.catalog.merged: "base" (name) and "base_sha256", "adapters" with name,
        # sha256 and scale, "type", "variant", "erased"; a {"name", "sha256"} base too.
        said = [f"{k} {printable(str(merged[k]), 40)}" for k in ("variant", "type")
                if merged.get(k)]
        detail = "merged model" + (f": {', '.join(said)}" if said else "") + (
            " (labelled erased: the fine-tune did not survive)" if merged.get("erased") else "")
        base = merged.get("base")
        base_name, base_sha = ((base.get("name"), base.get("sha256")) if isinstance(base, dict)
                               else (base, merged.get("base_sha256")))
        children.append(_by_digest("model", "merged from base", base_sha, base_name, index,
                                   seen, depth + 1))
        for part in merged.get("adapters") or ():
            if isinstance(part, dict):
                children.append(_by_digest("adapter", "merged adapter", part.get("sha256"),
                                           part.get("name"), index, seen, depth + 1,
                                           _scale(part.get("scale"))))
    built = record.get("built_from")
    if isinstance(built, dict) and built.get("sha256"):
        children.append(_by_digest("model", "built from", built.get("sha256"),
                                   built.get("name") or built.get("path"), index, seen,
                                   depth + 1))
    return Node("model", role, record["name"], sha, True, detail, tuple(children))


def _scale(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _adapter(record: dict[str, Any], role: str, index: _Index, seen: frozenset[str],
             depth: int, scale: float | None = None) -> Node:
    sha = record.get("sha256")
    if sha in seen or depth >= MAX_DEPTH:
        return Node("adapter", role, record["name"], sha, True, "(seen above)", (), scale)
    seen = seen | {sha}
    children = [_by_digest("model", "base", record.get("base_sha256"), record.get("base"),
                           index, seen, depth + 1)]
    provenance = record.get("provenance")
    if not isinstance(provenance, dict):
        detail = f"imported ({printable(str(record.get('source')), 120)}); no training record"
        return Node("adapter", role, record["name"], sha, True, detail, tuple(children), scale)
    data = provenance.get("data") if isinstance(provenance.get("data"), dict) else {}
    children.append(_file_node(
        "data", data, provenance.get("data_sha256"), "training data",
        f"{data.get('examples', '?')} examples, {data.get('target_tokens', '?')} target "
        "tokens"))
    kl_text = provenance.get("kl_text")
    if isinstance(kl_text, dict):
        children.append(_file_node("kl text", kl_text, kl_text.get("sha256"), "KL text",
                                   f"{kl_text.get('passages', '?')} passages the KL "
                                   "penalty held to the base"))
    init = provenance.get("init_adapter")
    steps = f"{provenance.get('method', 'sft')}, {provenance.get('steps', '?')} steps, seed " \
            f"{provenance.get('seed', '?')}"
    if isinstance(init, dict):
        children.append(_by_digest("adapter", "continued from", init.get("sha256"),
                                   init.get("name"), index, seen, depth + 1))
        detail = f"trained ({steps}), continuing another adapter"
    else:
        detail = f"trained from scratch ({steps})"
    if provenance.get("adapter_sha256") not in (None, sha):
        detail += "; its record names another file"
    return Node("adapter", role, record["name"], sha, True, detail, tuple(children), scale)


def _file_node(role: str, summary: dict[str, Any], sha: Any, unnamed: str, what: str
               ) -> Node:
    """A file a run read (its data, its KL text), as its record describes it."""
    return Node("data", role, printable(str(summary.get("file") or unnamed), 80),
                sha if isinstance(sha, str) else None, False,
                f"{what}; recorded at {printable(str(summary.get('path')), 160)}")


def render(node: Node) -> list[str]:
    """The tree as text lines (box-drawing branches), for the CLI."""
    lines = [_line(node)]
    _render_children(node, "", lines)
    return lines


def _render_children(node: Node, prefix: str, lines: list[str]) -> None:
    for i, child in enumerate(node.children):
        last = i == len(node.children) - 1
        lines.append(prefix + ("└─ " if last else "├─ ") + _line(child))
        _render_children(child, prefix + ("   " if last else "│  "), lines)


def _line(node: Node) -> str:
    role = "" if node.role == node.kind else f"{node.role}: "
    if node.present or node.kind == "data":
        label = f"{node.kind} {node.name}"
    else:
        label = f"{node.kind} (recorded as {node.recorded_name})" if node.recorded_name \
            else node.kind
    sha = f"  sha256 {node.sha256[:16]}…" if node.sha256 else ""
    scale = f" @ {node.scale:g}" if node.scale is not None else ""
    detail = f"  ({node.detail})" if node.detail else ""
    return f"{role}{label}{scale}{sha}{detail}"
