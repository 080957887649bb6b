#!/usr/bin/env bash
# Set everything up (first time only) and launch Variant Studio on the embedded default model.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
scripts/setup.sh
exec .venv/bin/variant-studio gui "$@"
