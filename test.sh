#!/usr/bin/env bash
# Set everything up (first time only) and run the whole test suite, with the guard rails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
scripts/setup.sh
echo "== ruff"
.venv/bin/ruff check .
echo "== layering contracts"
.venv/bin/lint-imports --no-cache
echo "== engine imports without Qt"
.venv/bin/python scripts/check_layering.py
echo "== pytest"
QT_QPA_PLATFORM=offscreen exec .venv/bin/python -m pytest "$@"
