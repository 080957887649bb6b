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
# Compiled modules (and pytest's rewritten test modules) go to .tmp/, so the hundreds of
# engine, worker and CLI processes the tests start compile the project once, not each
# (an environment may set PYTHONDONTWRITEBYTECODE to keep the tree clean: this keeps it
# clean too).
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX="$PWD/.tmp/pycache"
# On every core (at most 4), each test file whole on one worker: the files that share one
# engine process between their tests keep sharing it. `-n 0` runs them in one process.
QT_QPA_PLATFORM=offscreen exec .venv/bin/python -m pytest -n auto --maxprocesses 4 \
    --dist loadfile "$@"
