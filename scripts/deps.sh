#!/usr/bin/env bash
# scripts/deps.sh: install what building and testing megamoe needs, from Debian packages
# and PyPI, skipping anything already present. Safe to run repeatedly.
set -euo pipefail
# Debian 12's own Python is "externally managed" (PEP 668): pip installs into it only when
# told so (older pips ignore the variable). scripts/test.sh sets it too, for `pip install .`.
export PIP_BREAK_SYSTEM_PACKAGES=1
PY=${PYTHON:-python3}
need=()
for pkg in cmake ninja-build g++ pkg-config libgtest-dev libcli11-dev nlohmann-json3-dev libdlpack-dev libhwy-dev python3; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
# pip and the Python headers (the extension's build) for the system python3, where missing.
if [ "$PY" = python3 ]; then
  python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
  # scripts/test.sh installs the package into a virtual environment (.venv).
  python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)
  python3 -c 'import os, sysconfig; assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' \
    >/dev/null 2>&1 || need+=(python3-dev)
fi
# A pip-installed ninja/cmake on PATH is as good as Debian's.
if [[ " ${need[*]-} " == *" ninja-build "* ]] && command -v ninja >/dev/null; then
  need=("${need[@]/ninja-build/}")
fi
if [[ " ${need[*]-} " == *" cmake "* ]] && command -v cmake >/dev/null; then
  need=("${need[@]/cmake/}")
fi
pkgs=$(echo "${need[@]-}" | xargs)
if [ -n "$pkgs" ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $pkgs >/dev/null
fi
missing=()
for mod in numpy pytest nanobind scikit_build_core; do
  $PY -c "import $mod" >/dev/null 2>&1 || missing+=("${mod//_/-}")
done
if [ ${#missing[@]} -gt 0 ]; then
  $PY -m pip install -q "${missing[@]}"
fi
