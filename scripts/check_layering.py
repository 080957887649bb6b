"""Guard rail: `engine` must import with no Qt available, and `gui` must never import a
native runtime directly (the engine process owns llama.cpp and OpenVINO).

PyTorch is an optional extra: every engine module must also import without it, except
the training worker's torch modules (`engine.training.TORCH_MODULES`), which are
imported last, with torch allowed. `gui` never imports torch.

Run by ./test.sh; the same contract as napari's import-linter rule for its core.
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.util
import pkgutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QT = ("PySide6", "shiboken6", "qasync", "PyQt5", "PyQt6")
NATIVE = ("llama_cpp", "openvino", "openvino_genai", "openvino_tokenizers", "torch")
OPTIONAL = ("torch",)


class _Block(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.blocked = QT + OPTIONAL

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001
        if name.split(".")[0] in self.blocked:
            raise ImportError(f"{name.split('.')[0]} is blocked for the engine layer: {name}")
        return None


def imported_roots(folder: Path) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for file in folder.rglob("*.py"):
        tree = ast.parse(file.read_text(), str(file))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(str(file.relative_to(ROOT)))
    return found


def main() -> int:
    problems = []
    for root, files in imported_roots(ROOT / "engine").items():
        if root in QT:
            problems.append(f"engine imports {root}: {sorted(files)}")
    for root, files in imported_roots(ROOT / "gui").items():
        if root in NATIVE:
            problems.append(f"gui imports {root} (only the engine may): {sorted(files)}")
    block = _Block()
    sys.meta_path.insert(0, block)
    sys.path.insert(0, str(ROOT))
    import engine
    from engine.training import TORCH_MODULES

    count = 0
    for module in pkgutil.walk_packages(engine.__path__, "engine."):
        if module.name in TORCH_MODULES:
            continue
        try:
            importlib.import_module(module.name)
            count += 1
        except ImportError as exc:
            problems.append(f"{module.name} does not import without Qt and torch: {exc}")
    block.blocked = QT  # the torch modules: Qt still blocked, torch allowed
    torch_count = 0
    if importlib.util.find_spec("torch") is not None:
        for name in sorted(TORCH_MODULES):
            try:
                importlib.import_module(name)
                torch_count += 1
            except ImportError as exc:
                problems.append(f"{name} does not import: {exc}")
    for problem in problems:
        print(f"layering: {problem}", file=sys.stderr)
    if not problems:
        print(f"layering ok: {count} engine modules import with Qt and torch blocked, "
              f"{torch_count} training modules with Qt blocked")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
