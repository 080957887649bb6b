"""Guard rail at run time: every `engine` module imports with Qt blocked (and with
PyTorch blocked, except the training worker's torch modules,
`engine.training.TORCH_MODULES`, which are imported last with torch allowed), and so do
the GUI's UI-free parts (`GUI_WITHOUT_QT`: the chat and Compare controllers and the
renderer, which are tested without a window).

The static layering (which room may import which, gui never importing a native
runtime) is held by import-linter's contracts in pyproject.toml; this script checks
what a static reading cannot: that importing really succeeds without those packages.
Run by ./test.sh.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import pkgutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QT = ("PySide6", "shiboken6", "qasync", "PyQt5", "PyQt6")
OPTIONAL = ("torch",)
GUI_WITHOUT_QT = ("gui.controllers.chat", "gui.controllers.compare",
                  "gui.controllers.engine_port", "gui.render")


class _Block(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.blocked = QT + OPTIONAL

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001
        if name.split(".")[0] in self.blocked:
            raise ImportError(f"{name.split('.')[0]} is blocked for the engine layer: {name}")
        return None


def main() -> int:
    problems = []
    block = _Block()
    sys.meta_path.insert(0, block)
    sys.path.insert(0, str(ROOT))
    import engine
    from engine.training import TORCH_MODULES

    count = 0
    for module in pkgutil.walk_packages(engine.__path__, "engine."):
        if module.name in TORCH_MODULES or module.name.endswith(".__main__"):
            continue
        try:
            importlib.import_module(module.name)
            count += 1
        except ImportError as exc:
            problems.append(f"{module.name} does not import without Qt and torch: {exc}")
    for name in GUI_WITHOUT_QT:
        try:
            importlib.import_module(name)
            count += 1
        except ImportError as exc:
            problems.append(f"{name} does not import without Qt and torch: {exc}")
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
        print(f"layering ok: {count} engine and UI-free gui modules import with Qt and "
              "torch blocked, "
              f"{torch_count} training modules with Qt blocked")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
