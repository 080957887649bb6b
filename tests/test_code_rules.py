"""Rules of the code base that a linter does not hold for us.

- No module uses another module's private names: no `from x import _name` of our own
  modules, and no `obj._name` unless `_name` is defined in the same module (a class
  reaching into its own instances, or a module's functions into its own classes). A
  module that needs something of another asks for a public name, so each job keeps
  one owner (the sessions' registry, the adapter manager, the generation tasks...).
- No import circles among our modules (counting imports inside functions): each
  room, and each module in it, can be read from the bottom up.
- The signature verifier stays pure: `engine.catalog.trust.verify` and `.derived`
  reach nothing of the catalog but content digests, and the engine's signature gate
  imports them (or the policy), never the catalog glue.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "gui")
# Private names of other libraries we use on purpose (documented where they are used).
FOREIGN = {"sys._getframe", "llama_cpp._ggml"}
# The pure verifier (a folder, a signature and keys to a verdict) and what of the catalog
# it may reach: content digests and the room's bounded file reads.
PURE_VERIFIER = ("engine.catalog.trust.verify", "engine.catalog.trust.derived")
VERIFIER_MAY_USE = {*PURE_VERIFIER, "engine.catalog.digest", "engine.catalog.trust.files"}


def _modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def _own(tree: ast.AST) -> set[str]:
    """The private names a module defines: functions, classes, attributes it assigns
    (on `self` or anything else), class-level names and module globals."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return {n for n in names if n.startswith("_")}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_no_module_uses_another_modules_private_names() -> None:
    found = []
    for path in _modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        own = _own(tree)
        where = path.relative_to(ROOT)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGES):
                found += [f"{where}:{node.lineno}: from {node.module} import {a.name}"
                          for a in node.names if _private(a.name)]
            elif isinstance(node, ast.Attribute) and _private(node.attr):
                text = ast.unparse(node)
                if node.attr in own or text in FOREIGN:
                    continue
                found.append(f"{where}:{node.lineno}: {text}")
    assert not found, "private names used across modules:\n" + "\n".join(found)


def test_no_import_circles() -> None:
    import grimp

    graph = grimp.build_graph(*PACKAGES)
    circles = set()
    for importer in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(importer):
            if not imported.startswith(PACKAGES) or imported == importer:
                continue
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back:
                circles.add(" -> ".join((importer, *back)))
    assert not circles, "import circles:\n" + "\n".join(sorted(circles))


def test_the_signature_verifier_is_pure() -> None:
    import grimp

    graph = grimp.build_graph(*PACKAGES)
    reached = []
    for module in PURE_VERIFIER:
        for other in sorted(graph.find_upstream_modules(module)):
            if other.startswith("engine.catalog") and other not in VERIFIER_MAY_USE:
                chain = graph.find_shortest_chain(importer=module, imported=other)
                reached.append(" -> ".join(chain or (module, other)))
    assert not reached, "the pure verifier reaches the catalog:\n" + "\n".join(reached)
    gate = {m for m in graph.find_modules_directly_imported_by("engine.runtime.signing")
            if m.startswith("engine.catalog.trust")}
    assert gate <= {*PURE_VERIFIER, "engine.catalog.trust.policy"}, gate
