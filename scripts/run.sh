#!/usr/bin/env bash
# scripts/run.sh: the main job. Installs dependencies, builds, and runs the megamoe-stage
# CLI on synthetic DeepSeek-V4 shapes (T=4096, H=7168, K=8; CUDA when a GPU is present,
# else the CPU backend). Extra arguments go to megamoe-stage (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
# Only what runs here: the CPU library and the CLI without a GPU (a few minutes on two
# cores), the present cards' architectures with one ("auto"; scripts/test.sh, which shares
# the build directory, sets its own list).
cmake --preset default -DMEGAMOE_CUDA_ARCHITECTURES=auto >/dev/null
cmake --build --preset default --target megamoe-stage
exec ./build/tools/megamoe-stage "$@"
