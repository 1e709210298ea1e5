#!/usr/bin/env bash
# scripts/device.sh: one batched GPU session (build, test, sanitize, benchmark) for the
# lent H200. Usage: bash scripts/device.sh [steps...]   (default: all)
# Steps: info build test sanitize bench ncu python pybench multigpu (multigpu: not by default; after python,
# on a machine of two or more GPUs). Results and logs go to $OUT.
# Env: MEGAMOE_COMMIT (recorded in gpu.txt), ARCHS (default 90), BUILD_TARGETS (default all), BENCH_ARGS, NCU_ARGS (bench_kernel
# arguments profiled by ncu, default "--one 16384 4096"), NCU_SECTIONS, SKIP_PYTEST, SANITIZE_TOOLS (default
# memcheck racecheck initcheck synccheck), SANITIZE_FILTER (gtest positive filter, default *).
set -uo pipefail
OUT=${OUT:-/tmp/megamoe-out}
mkdir -p "$OUT"
DEPS=/tmp/deps
STEPS=${*:-info build test sanitize bench ncu python pybench}
JOBS=$(nproc)
# Debian packages carried in .deps (libhwy for the CPU backend, CLI11, nlohmann-json) are
# unpacked under $DEPS; their shared libraries are found there at run time.
export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1
has() { [[ " $STEPS " == *" $1 "* ]]; }
log() { echo "== $* ($(date +%T))"; }

if has info; then
  log info
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
  nvcc --version | tail -1 | tee -a "$OUT/gpu.txt"
  # The device's copy of the tree has no trustworthy git history: pass the commit in.
  echo "commit ${MEGAMOE_COMMIT:-unknown (set MEGAMOE_COMMIT)}" | tee -a "$OUT/gpu.txt"
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a "$OUT/gpu.txt"
fi

if has build; then
  log deps
  if [ -d .deps/googletest-src ] && [ ! -d "$DEPS/lib/cmake/GTest" ]; then
    cmake -S .deps/googletest-src -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_INSTALL_PREFIX="$DEPS" >/dev/null && cmake --build /tmp/gtest-build -j"$JOBS" >/dev/null &&
      cmake --install /tmp/gtest-build >/dev/null
  fi
  for d in .deps/*.deb; do [ -f "$d" ] && dpkg -x "$d" "$DEPS"; done
  [ -f tests/CMakeLists.txt ] || printf 'find_package(GTest REQUIRED)\ninclude(GoogleTest)\nadd_subdirectory(cuda)\n' >tests/CMakeLists.txt
  log build
  cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEGAMOE_ENABLE_CUDA=ON \
    -DMEGAMOE_CUDA_ARCHITECTURES="${ARCHS:-90}" -DMEGAMOE_BUILD_BENCH=ON -DMEGAMOE_BUILD_TESTS=ON \
    -DMEGAMOE_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)" \
    -DCMAKE_PREFIX_PATH="$DEPS;$DEPS/usr" >"$OUT/build.log" 2>&1 &&
    cmake --build build-dev -j"$JOBS" ${BUILD_TARGETS:+--target $BUILD_TARGETS} >>"$OUT/build.log" 2>&1
  echo "build rc=$?"; tail -5 "$OUT/build.log"
fi

if has test; then
  log test
  (cd build-dev && ctest --output-on-failure -j4 -LE gpu >"$OUT/ctest_cpu.log" 2>&1; echo "ctest(cpu) rc=$?"; tail -3 "$OUT/ctest_cpu.log")
  ./build-dev/tests/cuda/megamoe_cuda_tests --gtest_brief=1 --gtest_output=json:"$OUT/gpu_tests.json" >"$OUT/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?"; grep -E '^\[  (PASSED|FAILED|SKIPPED)|^\[==========\]|FAILED|Failure|differ' "$OUT/gpu_tests.log" | head -40
fi

if has sanitize; then
  log sanitize
  # The whole GPU suite under each tool, except (by name):
  #  - too slow under the sanitizer: the exhaustive 2^32-pattern numerics checks and the
  #    prefill-size staging tests (CudaStage.LargeT, CudaStage.MoreThan2Pow31Elements);
  #  - failing on purpose: the invalid device pointers of CudaErrorsDeathTest.* (in child
  #    processes) and the nonexistent device of CudaErrors.MissingDeviceIsACudaError (an API
  #    error the sanitizer reports as one).
  # Each tool runs the suite once (minutes): split the tools across device calls with
  # SANITIZE_TOOLS when a call's time limit is near.
  SLOW='CudaNumerics.PackedAmaxMatchesScalarRuleBF16:CudaNumerics.PackedAmaxMatchesScalarRuleF16'
  SLOW="$SLOW:CudaNumerics.Fp8HardwareMatchesSoftwareOnAllFloats:CudaStage.LargeT:CudaStage.MoreThan2Pow31Elements"
  FILTER="${SANITIZE_FILTER:-*}-$SLOW:CudaErrorsDeathTest.*:CudaErrors.MissingDeviceIsACudaError"
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck initcheck synccheck}; do
    extra=""
    [ "$tool" = memcheck ] && extra="--leak-check full"
    compute-sanitizer --tool "$tool" $extra --error-exitcode 9 ./build-dev/tests/cuda/megamoe_cuda_tests \
      --gtest_brief=1 --gtest_filter="$FILTER" >"$OUT/sanitize_$tool.log" 2>&1
    rc=$?
    summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_$tool.log" | tail -1 | sed 's/^=* *//')
    tests=$(grep -E '^\[  (PASSED|FAILED) +\]' "$OUT/sanitize_$tool.log" | tr '\n' ' ')
    echo "sanitize $tool: rc=$rc; ${summary:-no sanitizer summary}; ${tests:-no test summary}"
  done
fi

if has bench; then
  log bench
  ./build-dev/megamoe_bench_kernel ${BENCH_ARGS:-} | tee "$OUT/bench_kernel.jsonl"
fi

if has ncu; then
  log ncu
  ncu --clock-control none ${NCU_SECTIONS:---section SpeedOfLight --section MemoryWorkloadAnalysis --metrics dram__bytes_read.sum,dram__bytes_write.sum} \
    -k regex:"${NCU_KERNELS:-stage_fast}" -c ${NCU_COUNT:-2} \
    ./build-dev/megamoe_bench_kernel ${NCU_ARGS:---one 16384 4096} >"$OUT/ncu.txt" 2>&1
  echo "ncu rc=$?"; grep -E "dram__bytes|DRAM Throughput|Memory Throughput|Duration|L2 Hit|Mem Busy|Max Bandwidth|Stall|stall|Warp Cycles|Executed Instructions" "$OUT/ncu.txt" | head -60
fi

if has python; then
  log python
  # The extension built by the build step (no second nvcc build through pip): the package
  # sources plus build-dev's _C module, first on PYTHONPATH.
  rm -rf /tmp/pypkg && mkdir -p /tmp/pypkg && cp -r python/megamoe /tmp/pypkg/ &&
    cp build-dev/python/_C*.so /tmp/pypkg/megamoe/ && [ -x build-dev/tools/megamoe-stage ] &&
    mkdir -p /tmp/pypkg/megamoe/bin && cp build-dev/tools/megamoe-stage /tmp/pypkg/megamoe/bin/ 2>/dev/null
  export PYTHONPATH=/tmp/pypkg${PYTHONPATH:+:$PYTHONPATH}
  python3 -c 'import megamoe; print("megamoe", megamoe.__version__, "cuda", megamoe.has_cuda_backend())'
  echo "python package rc=$?"
  [ -n "${SKIP_PYTEST:-}" ] || (cd tests/python && timeout ${PYTEST_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider --durations=15 . ../multigpu >"$OUT/pytest.log" 2>&1)
  echo "pytest rc=$?"; tail -15 "$OUT/pytest.log"
fi

if has multigpu; then
  log multigpu
  # tests/multigpu/stage_symmetric.py under torchrun, one process per GPU, on the package the
  # python step laid out in /tmp/pypkg; NVLink multicast stays off.
  export PYTHONPATH=/tmp/pypkg${PYTHONPATH:+:$PYTHONPATH}
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 timeout ${MULTIGPU_TIMEOUT:-540} \
    python3 -m torch.distributed.run --standalone --nproc-per-node "${NPROC:-$(nvidia-smi -L | wc -l)}" \
    tests/multigpu/stage_symmetric.py --timing --out "$OUT/multigpu" ${MULTIGPU_ARGS:-} >"$OUT/multigpu.log" 2>&1
  echo "multigpu rc=$?"; tail -40 "$OUT/multigpu.log"
fi

if has pybench; then
  log pybench
  python3 bench/bench_stage.py --out "$OUT" 2>&1 | tail -60
fi
log done
