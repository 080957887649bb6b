"""Re-capture the README's screenshots (docs/screenshots/) from the layout check.

    .venv/bin/python scripts/screenshots.py

Runs tests/test_gui_layout_check.py at 1280×800 in both themes with
VARIANT_STUDIO_README_SHOTS=1: the states the check drives and checks are the ones the
README shows (details, chat and Compare in both themes; the Server panel, the Train
page, the import wizard's report and the composer in the light theme). In that mode
the chat and the comparison are real answers of the shipped model and demo variant
(the window's own engine); the Server panel's rows and the Train page's run are the
check's stand-ins. train-rl.png is not made here: it needs a real reinforcement run
(tests/test_gui_train_rl.py's settings), captured from the page alone.

Qt renders offscreen unless QT_QPA_PLATFORM says otherwise (under Xvfb, set it to xcb).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "screenshots"


def main() -> int:
    env = {**os.environ, "VARIANT_STUDIO_README_SHOTS": "1",
           "QT_QPA_PLATFORM": os.environ.get("QT_QPA_PLATFORM", "offscreen")}
    # One process (-n 0): the two themes' runs write different files, but one engine
    # at a time keeps a 2-core machine responsive. No time budgets: real answers.
    code = subprocess.call([sys.executable, "-m", "pytest", "-q", "-n", "0", "--no-budgets",
                            "tests/test_gui_layout_check.py", "-k", "1280"],
                           cwd=ROOT, env=env)
    if code == 0:
        print(f"screenshots written to {OUT}")
    return code


if __name__ == "__main__":
    sys.exit(main())
