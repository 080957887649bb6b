"""Can Qt's xcb platform plugin load here? The system libraries the desktop app needs.

PySide6's wheels bring Qt but not the X11/xcb libraries its `libqxcb.so` platform plugin
links against; on a stock Debian machine some are missing (libxcb-icccm4,
libxcb-keysyms1, ...) and Qt's own message names the wrong one. This module finds the
plugin without importing Qt (the engine never imports Qt: `importlib.util.find_spec`
only locates the package), runs `ldd` on it, and names what is missing, with the Debian
package that provides each library. `doctor` shows the result (`check`); `./run.sh`
asks `qt_platform.main(["--packages"])` what to install.

The list is Qt 6.11's xcb plugin's direct needs, from `ldd` on
`PySide6/Qt/plugins/platforms/libqxcb.so` (transitive ones come with these packages).
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from engine.catalog import validation

# soname -> Debian package (bookworm; the same names on Ubuntu 22.04+).
PACKAGES = {
    "libxcb-cursor.so.0": "libxcb-cursor0",
    "libxcb-icccm.so.4": "libxcb-icccm4",
    "libxcb-keysyms.so.1": "libxcb-keysyms1",
    "libxcb-image.so.0": "libxcb-image0",
    "libxcb-util.so.1": "libxcb-util1",
    "libxcb-randr.so.0": "libxcb-randr0",
    "libxcb-render-util.so.0": "libxcb-render-util0",
    "libxcb-render.so.0": "libxcb-render0",
    "libxcb-shape.so.0": "libxcb-shape0",
    "libxcb-shm.so.0": "libxcb-shm0",
    "libxcb-sync.so.1": "libxcb-sync1",
    "libxcb-xfixes.so.0": "libxcb-xfixes0",
    "libxcb-xkb.so.1": "libxcb-xkb1",
    "libxcb.so.1": "libxcb1",
    "libxkbcommon.so.0": "libxkbcommon0",
    "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
    "libX11-xcb.so.1": "libx11-xcb1",
    "libX11.so.6": "libx11-6",
    "libGL.so.1": "libgl1",
    "libEGL.so.1": "libegl1",
    "libfontconfig.so.1": "libfontconfig1",
    "libfreetype.so.6": "libfreetype6",
    "libglib-2.0.so.0": "libglib2.0-0",
    "libgthread-2.0.so.0": "libglib2.0-0",
    "libdbus-1.so.3": "libdbus-1-3",
}
_NOT_FOUND = re.compile(r"^\s*(\S+)\s+=>\s+not found\s*$")


def missing_libraries(ldd_output: str) -> list[str]:
    """The libraries `ldd` could not find, in order, each once."""
    seen: list[str] = []
    for line in ldd_output.splitlines():
        match = _NOT_FOUND.match(line)
        if match and match.group(1) not in seen:
            seen.append(match.group(1))
    return seen


def packages_for(libraries: list[str]) -> tuple[list[str], list[str]]:
    """(Debian packages to install, libraries no known package provides)."""
    packages: list[str] = []
    unknown: list[str] = []
    for library in libraries:
        package = PACKAGES.get(library)
        if package is None:
            unknown.append(library)
        elif package not in packages:
            packages.append(package)
    return packages, unknown


def plugin_path() -> Path | None:
    """PySide6's xcb platform plugin, located without importing Qt."""
    spec = importlib.util.find_spec("PySide6")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        plugin = Path(location) / "Qt" / "plugins" / "platforms" / "libqxcb.so"
        if plugin.exists():
            return plugin
    return None


Runner = Callable[[list[str]], str]


def _ldd(args: list[str]) -> str:
    return subprocess.run(args, capture_output=True, text=True, timeout=60,
                          check=False).stdout


def check(plugin: Path | None = None, run: Runner | None = None,
          have_ldd: bool | None = None) -> validation.Check:
    """Doctor's check: a warning (the CLI and the server work without it) naming what
    is missing and the command that installs it."""
    name = "desktop platform plugin"
    if not sys.platform.startswith("linux"):
        return validation.Check(name, "pass", "not needed here (Linux only)")
    plugin = plugin if plugin is not None else plugin_path()
    if plugin is None:
        return validation.Check(name, "warn", "PySide6's xcb plugin (libqxcb.so) not found: "
                                "the desktop app cannot start (run ./run.sh)")
    if have_ldd is None:
        have_ldd = shutil.which("ldd") is not None
    if not have_ldd:
        return validation.Check(name, "warn", "ldd is not available: cannot check the "
                                "libraries of Qt's xcb plugin")
    missing = missing_libraries((run or _ldd)(["ldd", str(plugin)]))
    if not missing:
        return validation.Check(name, "pass", "Qt's xcb plugin finds every library it needs")
    packages, unknown = packages_for(missing)
    detail = (f"Qt's xcb platform plugin cannot load: {', '.join(missing)} "
              f"{'is' if len(missing) == 1 else 'are'} missing, so the desktop app cannot "
              "start")
    if packages:
        detail += f" (install: sudo apt-get install -y {' '.join(packages)})"
    if unknown:
        detail += f"; no known package for {', '.join(unknown)}"
    return validation.Check(name, "warn", detail)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m engine.cli.qt_platform",
        description="Check the system libraries of Qt's xcb platform plugin.")
    parser.add_argument("--packages", action="store_true",
                        help="print the Debian packages to install (nothing when none is "
                             "missing); exit 1 if a library is missing")
    args = parser.parse_args(argv)
    plugin = plugin_path()
    if plugin is None or shutil.which("ldd") is None:
        return 0  # nothing to check here: the app reports it itself
    missing = missing_libraries(_ldd(["ldd", str(plugin)]))
    if args.packages:
        packages, unknown = packages_for(missing)
        print(" ".join(packages))
        for library in unknown:
            print(f"qt_platform: no known package provides {library}", file=sys.stderr)
    else:
        print(check(plugin).detail)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
