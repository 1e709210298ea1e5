#!/usr/bin/env bash
# scripts/test.sh: build everything and run every test: GoogleTest + CLI tests through
# CTest, the install/find_package tests, then `pip install .` and pytest. GPU tests skip
# when no CUDA device is present.
#
# Without a GPU (CI), the CUDA backend is still compiled, for sm_90 only (the device code
# of every format for four architectures takes most of a CPU-only run and nothing could
# execute it), and the Python extension is built without it (its CUDA paths cannot run
# here). On a GPU machine every configured architecture is built and tested.
#
# The Python package goes into a virtual environment, .venv (made with the system site
# packages visible, so NumPy, pytest and a present torch are not installed twice), never
# into the system Python; PYTHON=/path/to/python uses that interpreter instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
if [ -n "${PYTHON:-}" ]; then
  PY=$PYTHON
else
  if [ ! -x .venv/bin/python ]; then
    python3 -m venv --system-site-packages .venv ||
      { echo "scripts/test.sh: python3 -m venv failed (Debian: apt install python3-venv)" >&2; exit 1; }
  fi
  PY=$PWD/.venv/bin/python
  echo "scripts/test.sh: the Python package is installed into .venv ($PY)"
fi
export PIP_BREAK_SYSTEM_PACKAGES=1  # as scripts/deps.sh: Debian 12's externally managed Python
extra=()
if ! nvidia-smi -L >/dev/null 2>&1; then
  extra+=(-DMEGAMOE_CUDA_ARCHITECTURES=90)
  export MEGAMOE_ENABLE_CUDA=${MEGAMOE_ENABLE_CUDA:-OFF}  # read by pyproject.toml for pip
  echo "scripts/test.sh: no GPU: device code for sm_90 only; the Python extension without CUDA"
fi
cmake --preset default "${extra[@]}"
cmake --build --preset default
ctest --preset default
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} $PY -m pip install -q .
# tests/multigpu: megamoe.buffers and the symmetric-memory script at world size 1 (its
# two-GPU test skips without two devices).
(cd tests/python && $PY -m pytest -q -p no:cacheprovider . ../multigpu)
