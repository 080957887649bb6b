#!/usr/bin/env bash
# The release checks, which the CI run (./test.sh) leaves out: the tests marked `release`
# (the demo retrain reproducing its sha256, about 10 minutes; the demo variant on all 60
# held-out requests on both backends), then a long fuzzing run (tests/test_fuzz.py with
# VARIANT_STUDIO_FUZZ_EXAMPLES examples per property, 2000 unless set). Run before a
# release and before any change to the training numerics.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
./test.sh --release -m release "$@"
VARIANT_STUDIO_FUZZ_EXAMPLES="${VARIANT_STUDIO_FUZZ_EXAMPLES:-2000}" \
    ./test.sh tests/test_fuzz.py --no-budgets
