#!/usr/bin/env bash
# Adds Variant Studio to the desktop's application menu for this user: the desktop
# entry (pointing at this checkout's .venv/bin/variant-studio), the icon and the
# AppStream metadata, under $XDG_DATA_HOME (default ~/.local/share). Run ./run.sh once
# first. `--uninstall` removes the three files again.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
data=${XDG_DATA_HOME:-$HOME/.local/share}
entry=$data/applications/variant-studio.desktop
icon=$data/icons/hicolor/scalable/apps/variant-studio.svg
meta=$data/metainfo/io.github.variant_studio.VariantStudio.metainfo.xml

if [[ "${1:-}" == "--uninstall" ]]; then
    rm -f "$entry" "$icon" "$meta"
    echo "removed the Variant Studio desktop entry"
    exit 0
fi
exe=$root/.venv/bin/variant-studio
if [[ ! -x "$exe" ]]; then
    echo "error: $exe is missing; run ./run.sh first" >&2
    exit 1
fi
mkdir -p "$(dirname "$entry")" "$(dirname "$icon")" "$(dirname "$meta")"
# Quote the executable for the Exec key (desktop entry spec: double quotes, with
# backslash, quote, dollar and backtick escaped).
quoted=$(printf '%s' "$exe" | sed -e 's/[\\"`$]/\\&/g')
sed -e "s|^Exec=variant-studio gui\$|Exec=\"${quoted//|/\\|}\" gui|" \
    "$root/packaging/variant-studio.desktop" > "$entry.tmp"
mv "$entry.tmp" "$entry"
cp "$root/resources/icons/variant-studio.svg" "$icon"
cp "$root/packaging/io.github.variant_studio.VariantStudio.metainfo.xml" "$meta"
command -v update-desktop-database >/dev/null && update-desktop-database -q "$data/applications" || true
echo "installed $entry"
