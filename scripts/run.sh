#!/usr/bin/env bash
# scripts/run.sh: the main job. Installs dependencies, builds, and runs the megamoe-stage
# CLI on synthetic DeepSeek-V4 shapes (T=4096, H=7168, K=8; CUDA when a GPU is present,
# else the CPU backend). Extra arguments go to megamoe-stage (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake --preset default >/dev/null
cmake --build --preset default --target megamoe-stage
exec ./build/tools/megamoe-stage "$@"
