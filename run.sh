#!/usr/bin/env bash
# Set everything up (first time only) and launch Variant Studio on the embedded default model.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
scripts/setup.sh
# Qt's xcb platform plugin links against system libraries no Python wheel brings
# (libxcb-icccm4, libxcb-keysyms1, ...): find what is missing (ldd on the plugin) and
# install it when we can (root with apt-get), or stop with the exact command to run.
if [[ "$(uname -s)" == Linux && "${QT_QPA_PLATFORM:-xcb}" == xcb* ]]; then
    missing=$(.venv/bin/python -c "import sys; from engine.cli import qt_platform
sys.exit(qt_platform.main(['--packages']))" || true)
    if [[ -n "$missing" ]]; then
        if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
            echo "run.sh: installing the libraries Qt's platform plugin needs: $missing"
            apt-get update -qq
            # shellcheck disable=SC2086 # one word per package
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing
        else
            echo "run.sh: Qt's platform plugin needs system libraries that are missing." >&2
            echo "Install them, then run ./run.sh again:" >&2
            echo "    sudo apt-get install -y $missing" >&2
            exit 1
        fi
    fi
fi
exec .venv/bin/variant-studio gui "$@"
