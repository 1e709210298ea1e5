#!/usr/bin/env bash
# scripts/test.sh: build everything and run every test: GoogleTest + CLI tests through
# CTest, the install/find_package test, then `pip install .` and pytest. GPU tests skip
# when no CUDA device is present.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
PY=${PYTHON:-python3}
cmake --preset default
cmake --build --preset default
ctest --preset default
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} $PY -m pip install -q .
(cd tests/python && $PY -m pytest -q -p no:cacheprovider .)
