"""The check that Qt's xcb platform plugin can load (doctor, ./run.sh), without Qt:
`ldd` output parsed, packages named, the verdict, the run.sh entry point, and that the
check imports no Qt."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from engine.cli import qt_platform
from engine.cli.qt_platform import check, missing_libraries, packages_for

# ldd on Qt 6.11's libqxcb.so on a stock Debian 12 machine (abridged, real lines).
LDD_DEBIAN = """\
\tlinux-vdso.so.1 (0x00007f4a06444000)
\tlibQt6XcbQpa.so.6 => /venv/PySide6/Qt/plugins/platforms/../../lib/libQt6XcbQpa.so.6 (0x1)
\tlibGL.so.1 => /lib/x86_64-linux-gnu/libGL.so.1 (0x00007f4a05779000)
\tlibxkbcommon-x11.so.0 => /lib/x86_64-linux-gnu/libxkbcommon-x11.so.0 (0x2)
\tlibxcb-cursor.so.0 => /lib/x86_64-linux-gnu/libxcb-cursor.so.0 (0x00007f4a06313000)
\tlibxcb-icccm.so.4 => not found
\tlibxcb-util.so.1 => /lib/x86_64-linux-gnu/libxcb-util.so.1 (0x00007f4a05771000)
\tlibxcb-keysyms.so.1 => not found
\tlibxcb-randr.so.0 => /lib/x86_64-linux-gnu/libxcb-randr.so.0 (0x00007f4a0575e000)
\tlibxcb-icccm.so.4 => not found
\tlibxcb-keysyms.so.1 => not found
\t/lib64/ld-linux-x86-64.so.2 (0x00007f4a06446000)
"""
LDD_ALL_FOUND = "\n".join(line for line in LDD_DEBIAN.splitlines() if "not found" not in line)


def test_ldd_output_names_each_missing_library_once_with_its_package() -> None:
    assert missing_libraries(LDD_DEBIAN) == ["libxcb-icccm.so.4", "libxcb-keysyms.so.1"]
    assert missing_libraries(LDD_ALL_FOUND) == []
    assert missing_libraries("") == []
    assert packages_for(["libxcb-icccm.so.4", "libxcb-keysyms.so.1", "libxcb-cursor.so.0"]) \
        == (["libxcb-icccm4", "libxcb-keysyms1", "libxcb-cursor0"], [])
    assert packages_for(["libglib-2.0.so.0", "libgthread-2.0.so.0", "libweird.so.9"]) == \
        (["libglib2.0-0"], ["libweird.so.9"])


def test_the_verdict_names_the_library_and_the_command(tmp_path: Path) -> None:
    plugin = tmp_path / "libqxcb.so"
    plugin.write_bytes(b"")
    asked: list[list[str]] = []

    def ldd(args: list[str]) -> str:
        asked.append(args)
        return LDD_DEBIAN

    found = check(plugin, ldd, have_ldd=True)
    assert asked == [["ldd", str(plugin)]]
    assert found.status == "warn" and found.name == "desktop platform plugin"
    assert "libxcb-icccm.so.4, libxcb-keysyms.so.1 are missing" in found.detail
    assert "sudo apt-get install -y libxcb-icccm4 libxcb-keysyms1" in found.detail
    assert check(plugin, lambda _a: LDD_ALL_FOUND, have_ldd=True).status == "pass"
    assert check(plugin, ldd, have_ldd=False).status == "warn"
    unknown = check(plugin, lambda _a: "\tlibodd.so.1 => not found\n", have_ldd=True)
    assert "no known package for libodd.so.1" in unknown.detail


def test_run_sh_asks_the_module_and_nothing_imports_qt() -> None:
    script = (Path(__file__).resolve().parents[1] / "run.sh").read_text(encoding="utf-8")
    assert "qt_platform.main(['--packages'])" in script
    assert "sudo apt-get install -y $missing" in script and "apt-get install -y" in script
    out = subprocess.run(
        [sys.executable, "-c", "import sys, engine.cli.qt_platform as q, engine.cli.health_cmds;"
         "q.check(); print(any(m.startswith(('PySide6', 'shiboken6')) for m in sys.modules))"],
        capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    assert qt_platform.plugin_path() is None or qt_platform.plugin_path().name == "libqxcb.so"
