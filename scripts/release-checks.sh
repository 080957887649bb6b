#!/usr/bin/env bash
# The release checks: the tests marked `release` (the demo retrain reproducing its sha256,
# 15+ minutes), which the CI run (./test.sh) leaves out. Run before a release and before
# any change to the training numerics.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec ./test.sh --release -m release "$@"
