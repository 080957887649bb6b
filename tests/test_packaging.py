"""The installed app: the console script opens the window, and the desktop packaging
(entry, icon, AppStream metadata, the per-user install script) is complete and true."""

from __future__ import annotations

import configparser
import json
import os
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from engine.curated.embedded import DEFAULT_MODEL_NAME
from engine.training import demo

ROOT = Path(__file__).resolve().parents[1]
PACKAGING = ROOT / "packaging"
CONSOLE_SCRIPT = Path(sys.executable).parent / "variant-studio"


def _desktop_entry(path: Path) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str  # keys are case-sensitive in desktop entries
    parser.read(path, encoding="utf-8")
    return parser["Desktop Entry"]


@pytest.mark.slow
def test_the_console_script_opens_the_window_on_the_embedded_model(studio_home: Path
                                                                   ) -> None:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    out = subprocess.run([str(CONSOLE_SCRIPT), "gui", "--check"], capture_output=True,
                         text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout.strip().splitlines()[-1])
    assert shown["title"] == "Variant Studio" and shown["visible"] and shown["icon"]
    # The window's desktop file name is the packaged entry's, so the desktop matches
    # the running window to its menu entry and icon.
    entry = _desktop_entry(PACKAGING / "variant-studio.desktop")
    assert shown["desktop_file"] == entry["StartupWMClass"] == "variant-studio"
    assert DEFAULT_MODEL_NAME in shown["models"]
    assert demo.ADAPTER_NAME in shown["adapters"] and demo.VARIANT_NAME in shown["variants"]
    # A first run opens on something to chat with: the demo variant.
    assert shown["selected"] == demo.VARIANT_NAME and shown["importing"] is None


@pytest.mark.slow
def test_the_console_script_opens_the_import_wizard_on_a_file(studio_home: Path,
                                                              tmp_path: Path) -> None:
    """`variant-studio gui FILE` (the desktop entry's "open with") starts an import."""
    adapter = tmp_path / "style.gguf"
    adapter.write_bytes(b"not yet inspected")
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    out = subprocess.run([str(CONSOLE_SCRIPT), "gui", str(adapter), "--check"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout.strip().splitlines()[-1])
    assert shown["importing"] == str(adapter)


def test_desktop_entry_icon_and_metadata_agree() -> None:
    entry = _desktop_entry(PACKAGING / "variant-studio.desktop")
    assert entry["Type"] == "Application" and entry["Name"] == "Variant Studio"
    assert shlex.split(entry["Exec"]) == ["variant-studio", "gui"]
    assert (ROOT / "resources" / "icons" / f"{entry['Icon']}.svg").is_file()
    meta = ET.parse(PACKAGING / "io.github.variant_studio.VariantStudio.metainfo.xml")
    root = meta.getroot()
    assert root.get("type") == "desktop-application"
    assert root.findtext("id") == "io.github.variant_studio.VariantStudio"
    assert root.find("launchable").text == "variant-studio.desktop"
    assert root.find("provides/binary").text == "variant-studio"
    images = list(root.iter("image"))
    assert images and all((ROOT / image.text).is_file() for image in images)


def test_install_script_points_the_menu_at_this_checkout(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path)}
    script = PACKAGING / "install-desktop-entry.sh"
    subprocess.run([str(script)], check=True, env=env, capture_output=True, timeout=60)
    installed = tmp_path / "applications" / "variant-studio.desktop"
    exe, *args = shlex.split(_desktop_entry(installed)["Exec"])
    assert Path(exe) == CONSOLE_SCRIPT and os.access(exe, os.X_OK) and args == ["gui"]
    icon = tmp_path / "icons" / "hicolor" / "scalable" / "apps" / "variant-studio.svg"
    assert icon.read_bytes() == (ROOT / "resources" / "icons" / "variant-studio.svg"
                                 ).read_bytes()
    assert (tmp_path / "metainfo" / "io.github.variant_studio.VariantStudio.metainfo.xml"
            ).is_file()
    subprocess.run([str(script), "--uninstall"], check=True, env=env, capture_output=True,
                   timeout=60)
    assert not installed.exists() and not icon.exists()


def test_the_environment_holds_everything_the_project_installs() -> None:
    """Every dependency and the [test] and [train] extras (what scripts/setup.sh
    installs: PyTorch, OpenVINO, NNCF, ...) are installed. A test needing one never skips
    without it (tests/conftest.py turns such a skip into a failure): a CI that lacks one
    fails here, by name, instead of going green."""
    import importlib.metadata
    import re
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["test"],
              *project["optional-dependencies"]["train"]]
    missing = []
    for requirement in wanted:
        name = re.split(r"[\s\[=<>!~;]", requirement, maxsplit=1)[0]
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    assert "torch" in str(wanted) and "openvino-genai" in str(wanted)
    assert missing == [], f"not installed: {missing} (run scripts/setup.sh)"
