#!/usr/bin/env bash
# scripts/device.sh: the batched GPU session for the lent H200, as steps chosen by argument.
#
#   bash scripts/device.sh STEP...        e.g. bash scripts/device.sh call1
#   bash scripts/device.sh --list STEP... the plan (steps and time boxes) without running it
#
# Steps (each time-boxed; each writes $WORK/<step>.log and, where it measures, <step>.jsonl):
#   info           GPU, driver, nvcc, torch/triton versions, the commit (gpu.txt)
#   build          deps, then the CUDA build into build-dev (BUILD_TARGETS, default all); with
#                  AB_BASE set, the base tree's Python extension is built beside it, in the
#                  background, for the `ab` step
#   sanitize       compute-sanitizer memcheck, racecheck, initcheck, synccheck over both GPU test
#                  binaries, the 8 runs in parallel in the background; then the slow tests in a
#                  second time box (collected by sanitize-wait, or at the end)
#   suite          megamoe_cuda_tests, megamoe_router_cuda_tests, megamoe_plan_tests (plain), side
#                  by side in the background (collected by suite-wait, or at the end)
#   ctest-cpu      the CPU tests through ctest
#   pytest         tests/python on the GPU (PYTEST_FILES, default test_gpu.py test_gpu_consumer.py)
#   sanitize-wait  wait for the sanitizer runs and summarize them
#   bench-formats  bench/bench_formats.py parts formats, full_buffer (#10, #11); BENCH_FORMATS_ARGS, when
#                  set, replaces "--parts formats,full_buffer" (and QUICK's --quick): e.g.
#                  "--parts online" (NVFP4 online against FlashInfer's three-launch design, #47)
#   nonfinite      bench/bench_formats.py part nonfinite: counter on/off A/B (#15)
#   bench-router   bench/bench_router.py (C++ fallback build-dev/megamoe_bench_router) (#12)
#   bench-op       bench/bench_op_overhead.py (#16)
#   bench-norm     bench/bench_norm.py $BENCH_NORM_ARGS (default --quick): rms_norm then staging
#                  against rmsnorm_and_stage with and without y, staging alone and the same-run
#                  copies of the fused call's bytes (#46); rows in bench-norm.jsonl, the table
#                  in bench-norm.log
#   ab             bench/bench_stage.py --only megamoe: this build, base, this, base; then
#                  bench/ab_compare.py (#10). Needs AB_BASE (a .tar/.tar.gz of the base tree
#                  from scripts/ab_prepare.sh, or a commit when git works here)
#   ab-router      build-dev/megamoe_bench_router against the base's (AB_BASE, built with
#                  AB_TARGETS=megamoe_bench_router): this, base, this, base ($ROUTER_ARGS), then
#                  per row the fused and route times of both (ab_router.jsonl) (#12)
#   ab-routing     dev/ab_routing.py with this build's extension and the base's (AB_BASE, AB_TARGETS=_C):
#                  this, base, this, base; per (T, full_buffer) the best of each and the ratio
#   ab-formats     bench/bench_formats.py --parts formats $AB_FORMATS_ARGS (e.g. "--formats
#                  nvfp4_static --T 1,16384") with this build's extension and the base's (AB_BASE,
#                  AB_TARGETS=_C), and each extra build's of AB_MORE ("name:tarball ...",
#                  scripts/ab_prepare.sh BRANCH NAME makes them): every build once, then again;
#                  medians and ratios to the base (bench/ab_formats_merge.py, ab_formats.jsonl)
#   bench-kernel   build-dev/megamoe_bench_kernel $BENCH_ARGS;  ncu: ncu on one staging size;
#   ncu-ab         ncu of one format's staging kernel in this build and in the base (AB_BASE,
#                  AB_TARGETS including megamoe_bench_kernel): instructions, issue-slot and DRAM
#                  use, warp stall reasons, for each "T H" of $NCU_AB_SIZES (default
#                  "16384 7168") and scheme $NCU_AB_SCHEME (nvfp4_per_token), kernels
#                  matching $NCU_KERNELS (rowwise) (ncu_ab.txt)
#   sass           bench/sass_mix.py over the built CUDA objects: opcode histograms of the kernels
#                  matching $SASS_MATCH (default stage_fast_kernel) into sass.txt
#   pybench        the full side-by-side bench/bench_stage.py
#   trace          the decode kernels' clock64 phase trace (a build of the instrumented copy
#                  dev/trace/tree.sh makes in build-trace/src; TRACE_CONFIGS, TRACE_CALLS,
#                  TRACE_ROUTER_ARGS; dev/trace/), trace.jsonl
#   multigpu       tests/multigpu/stage_symmetric.py under torchrun, one process per GPU
#                  (NVLink multicast off), --timing; and pytest of tests/multigpu (#14; on a
#                  machine of two or more GPUs; not in call1/call2)
# Earlier names: test = suite ctest-cpu, bench = bench-kernel, python = pytest of all tests/python.
# Groups: call1 = info build sanitize suite pytest suite-wait sanitize-wait
#         call2 = info build bench-formats nonfinite bench-router ab bench-op
#         call3 = info build bench-formats bench-router bench-op
#         call4 = info build bench-op sanitize sanitize-wait (the op-overhead benchmark on an
#           idle GPU, then megamoe_cuda_tests under the sanitizers: the main pass and each
#           slow test, a process per tool, side by side)
#         call5 = info build suite pytest suite-wait bench-formats (the FP4 paired paths:
#           CudaNumerics.Fp4Pairs*, the chunk forms, CudaStage.*, test_gpu.py, the figures)
#           (BUILD_TARGETS defaults to "_C megamoe_bench_router" there; bench-op, which
#           times the host, runs after the base build of `ab` has ended)
#
# Everything lands in $WORK (default /tmp/megamoe-run); after every step $WORK is packed into
# $OUT/results.tgz and the step table into $OUT/summary.txt (two files: the device returns at
# most 8). The whole run stops itself DEADLINE_S seconds after its start (default 570), so
# the last pack happens inside a 600 s call; each step's box is cut to the time left.
# Env: MEGAMOE_COMMIT, ARCHS (90), JOBS (nproc), BUILD_TARGETS, AB_BASE, AB_MORE, AB_JOBS (6), AB_TARGETS (_C), AB_FORMATS_BOX (200 s), ROUTER_ARGS,
# GPU_BINS (both GPU test binaries), SUITE_FILTER (*), SUITE_SHARDS (4: gtest shards per GPU binary), SANITIZE_PASSES (main slow), SANITIZE_TOOLS, SANITIZE_FILTER, SANITIZE_TIMEOUT (300), SANITIZE_SLOW_TIMEOUT (150),
# SANITIZE_SPLIT_SLOW (1: the main pass and each slow test their own sanitizer process, all
# side by side),
# PYTEST_FILES, BENCH_ARGS, BENCH_FORMATS_ARGS (--parts formats,full_buffer), BENCH_NORM_ARGS (--quick), NCU_ARGS, NCU_SECTIONS, NCU_KERNELS, NCU_COUNT, NCU_BIN (a build-dev binary, default
# megamoe_bench_kernel; e.g. megamoe_bench_router), NCU_EXTRA (more ncu arguments, e.g. --page
# source --print-source sass for stall samples by instruction), SASS_MATCH, QUICK (1: the benchmarks' --quick grids),
# BENCH_REP_SCALE (0.5: the Python benchmarks' replay time, see bench/benchutil.py),
# CMAKE_EXTRA (more cmake -D arguments for the build, e.g. -DCMAKE_CUDA_FLAGS=...).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
T0=$(date +%s)
OUT=${OUT:-/tmp/megamoe-out}
WORK=${WORK:-/tmp/megamoe-run}
DEPS=/tmp/deps
DEADLINE_S=${DEADLINE_S:-570}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$DEPS/py${PYTHONPATH:+:$PYTHONPATH}"
# Half the default replay time of every Python benchmark: the medians of 10 replays of
# >= 20 ms of calls each still resolve 1%, and the two calls fit the session.
export BENCH_REP_SCALE=${BENCH_REP_SCALE:-0.5}
QUICK_FLAG=""
[ "${QUICK:-0}" = 1 ] && QUICK_FLAG="--quick"

LIST=0
if [ "${1:-}" = "--list" ]; then LIST=1; shift; fi
ARGS=("$@")
[ ${#ARGS[@]} -gt 0 ] || { sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2; }
STEPS=()
for a in "${ARGS[@]}"; do
  case "$a" in
    call1) STEPS+=(info build sanitize suite pytest suite-wait sanitize-wait) ;;
    call2)
      STEPS+=(info build bench-formats nonfinite bench-router ab bench-op)
      BUILD_TARGETS=${BUILD_TARGETS:-_C megamoe_bench_router}
      ;;
    call3)
      # What the 2026-12-01 session's device time did not cover, part 1: the benchmarks of the
      # router, FP4 and full-buffer changes and of the Library-registered op.
      STEPS+=(info build bench-formats bench-router bench-op)
      BUILD_TARGETS=${BUILD_TARGETS:-_C megamoe_bench_router}
      ;;
    call4)
      # Part 2: megamoe_cuda_tests under the four sanitizers, its main pass and each of its
      # five slow tests (2^32 sweeps, LargeT, > 2^31 elements) a process per tool, all side
      # by side with the rest of the call's time; the op-overhead benchmark (#16) first, on
      # an idle GPU.
      STEPS+=(info build bench-op sanitize sanitize-wait)
      BUILD_TARGETS=${BUILD_TARGETS:-_C megamoe_cuda_tests}
      GPU_BINS=${GPU_BINS:-megamoe_cuda_tests}
      SANITIZE_PASSES=${SANITIZE_PASSES:-main slow}
      SANITIZE_SPLIT_SLOW=${SANITIZE_SPLIT_SLOW:-1}
      ;;
    call5)
      # The FP4 paired paths (core/e2m1_pairs.h, not yet run on a GPU): their device checks
      # and the staging tests of every format, test_gpu.py, then the formats benchmark.
      STEPS+=(info build suite pytest suite-wait bench-formats)
      BUILD_TARGETS=${BUILD_TARGETS:-_C megamoe_cuda_tests}
      GPU_BINS=${GPU_BINS:-megamoe_cuda_tests}
      SUITE_FILTER=${SUITE_FILTER:-CudaNumerics.Fp4Pairs*:CudaNumerics.ChunkVector*:CudaStage.*-CudaStage.MoreThan2Pow31Elements}
      PYTEST_FILES=${PYTEST_FILES:-test_gpu.py}
      ;;
    # the step names of earlier sessions' commands (docs quote them)
    test) STEPS+=(suite ctest-cpu) ;;
    bench) STEPS+=(bench-kernel) ;;
    python) STEPS+=(pytest); PYTEST_FILES=${PYTEST_FILES:-.} ;;
    info | build | sanitize | suite | suite-wait | ctest-cpu | pytest | sanitize-wait | bench-formats | nonfinite | bench-router | \
      bench-op | bench-norm | ab | ab-router | ab-routing | ab-formats | bench-kernel | ncu | ncu-ab | sass | pybench | multigpu | trace) STEPS+=("$a") ;;
    *) echo "device.sh: unknown step '$a'" >&2; exit 2 ;;
  esac
done

# Time box of each step in seconds (cut to what is left of DEADLINE_S when it starts).
box() {
  case "$1" in
    info) echo 30 ;; build) echo 420 ;; sanitize) echo 10 ;; suite) echo 300 ;; suite-wait) echo 300 ;;
    ctest-cpu) echo 120 ;;
    pytest) echo 240 ;; sanitize-wait) echo 480 ;; bench-formats) echo 150 ;; nonfinite) echo 75 ;;
    bench-router) echo 150 ;; bench-op) echo 40 ;; bench-norm) echo 240 ;; ab) echo 160 ;; bench-kernel) echo 120 ;; ncu) echo 120 ;; ncu-ab) echo 120 ;;
    pybench) echo 200 ;; ab-router) echo 200 ;; ab-routing) echo 120 ;; ab-formats) echo "${AB_FORMATS_BOX:-200}" ;; multigpu) echo 300 ;; trace) echo 330 ;; *) echo 60 ;;
  esac
}

if [ $LIST = 1 ]; then
  total=0
  for s in "${STEPS[@]}"; do echo "$s $(box "$s")"; total=$((total + $(box "$s"))); done
  echo "deadline ${DEADLINE_S} (boxes sum to $total; a step gets min(box, time left))"
  exit 0
fi

mkdir -p "$OUT" "$WORK"
SUMMARY="$WORK/summary.txt"
: >"$SUMMARY"
left() { echo $((DEADLINE_S - ($(date +%s) - T0))); }
limit() {  # the step's box, or the time left less a reserve for packing, whichever is less
  local b l
  b=$(box "$1")
  l=$(($(left) - 15))
  [ "$l" -lt "$b" ] && b=$l
  [ "$b" -lt 1 ] && b=1
  echo "$b"
}
note() { echo "$*" | tee -a "$SUMMARY"; }
pack() {
  # Logs over 4 MB keep their first and last MB (sanitizer reports can be long).
  find "$WORK" -type f -size +4M -name '*.log' | while read -r f; do
    { head -c 1000000 "$f"; printf '\n[... cut by device.sh ...]\n'; tail -c 1000000 "$f"; } >"$f.cut" && mv "$f.cut" "$f"
  done
  cp "$SUMMARY" "$OUT/summary.txt"
  tar czf "$OUT/results.tgz.tmp" -C "$WORK" . 2>/dev/null && mv "$OUT/results.tgz.tmp" "$OUT/results.tgz"
}
trap pack EXIT

PYPKG=/tmp/pypkg
pypkg() {  # the package sources plus build-dev's _C module (no second nvcc build through pip)
  [ -f "$PYPKG/.ready" ] && return 0
  rm -rf "$PYPKG" && mkdir -p "$PYPKG" && cp -r python/megamoe "$PYPKG/" &&
    cp build-dev/python/_C*.so "$PYPKG/megamoe/" || return 1
  if [ -x build-dev/tools/megamoe-stage ]; then
    mkdir -p "$PYPKG/megamoe/bin" && cp build-dev/tools/megamoe-stage "$PYPKG/megamoe/bin/"
  fi
  touch "$PYPKG/.ready"
}
with_pkg() { PYTHONPATH="$PYPKG${PYTHONPATH:+:$PYTHONPATH}" "$@"; }

# gtest JSON -> one summary row; a run cut by its time box has no JSON: count its log's lines.
gtest_row() {  # name binary rc json log seconds
  python3 - "$@" <<'EOF'
import json, os, re, sys
name, binary, rc, js, log, secs = sys.argv[1:]
row = dict(step=name, binary=binary, rc=int(rc), seconds=int(secs), timed_out=int(rc) in (124, 137))
if os.path.exists(js):
    d = json.load(open(js))
    row.update(tests=d.get("tests"), failures=d.get("failures"), disabled=d.get("disabled"))
    row["skipped"] = sum(1 for s in d.get("testsuites", []) for t in s.get("testsuite", [])
                         if t.get("result") == "SKIPPED")
    row["failed_tests"] = [s["name"] + "." + t["name"] for s in d.get("testsuites", []) for t in s.get("testsuite", [])
                           if t.get("failures")]
if os.path.exists(log):
    text = open(log, errors="replace").read()
    row["ok_lines"] = len(re.findall(r"^\[       OK \]", text, re.M))
    row["failed_lines"] = len(re.findall(r"^\[  FAILED  \] \S+\.\S+ \(", text, re.M))
    m = re.findall(r"(?:ERROR|RACECHECK) SUMMARY: .*", text)
    if m:
        row["sanitizer_summary"] = m[-1]
print(json.dumps(row))
EOF
}

step_info() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$WORK/gpu.txt"
  nvcc --version | tail -1 | tee -a "$WORK/gpu.txt"
  compute-sanitizer --version 2>/dev/null | tail -1 | tee -a "$WORK/gpu.txt"
  # The device's copy of the tree has no trustworthy git history: pass the commit in.
  echo "commit ${MEGAMOE_COMMIT:-unknown (set MEGAMOE_COMMIT)}" | tee -a "$WORK/gpu.txt"
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a "$WORK/gpu.txt"
  nproc | sed 's/^/cpus /' | tee -a "$WORK/gpu.txt"
}

deps() {
  if [ -d .deps/googletest-src ] && [ ! -d "$DEPS/lib/cmake/GTest" ]; then
    cmake -S .deps/googletest-src -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_INSTALL_PREFIX="$DEPS" >/dev/null && cmake --build /tmp/gtest-build -j"$JOBS" >/dev/null &&
      cmake --install /tmp/gtest-build >/dev/null
  fi
  for d in .deps/*.deb; do [ -f "$d" ] && dpkg -x "$d" "$DEPS"; done
  # Pure-Python wheels the image may lack (nanobind for the extension's build).
  for w in .deps/*.whl; do
    [ -f "$w" ] && python3 -m pip install -q --no-index --no-deps --no-compile --target "$DEPS/py" "$w" >/dev/null
  done
  return 0
}

cmake_build() {  # src build_dir jobs seconds [targets...]
  local src=$1 dir=$2 jobs=$3 secs=$4
  shift 4
  local tgt=()
  [ $# -gt 0 ] && tgt=(--target "$@")
  # shellcheck disable=SC2086  # CMAKE_EXTRA is a list of arguments
  cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEGAMOE_ENABLE_CUDA=ON \
    -DMEGAMOE_CUDA_ARCHITECTURES="${ARCHS:-90}" -DMEGAMOE_BUILD_BENCH=ON -DMEGAMOE_BUILD_TESTS=ON \
    -DMEGAMOE_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)" \
    -DCMAKE_PREFIX_PATH="$DEPS;$DEPS/usr" ${CMAKE_EXTRA:-} &&
    timeout -k 5 "$secs" cmake --build "$dir" -j"$jobs" "${tgt[@]}"
}

AB_DIR=/tmp/ab-base
ab_source() {  # [tarball-or-commit dir]: a tree (default: the base, AB_BASE) into dir/src
  local src=${1:-$AB_BASE} dir=${2:-$AB_DIR}
  rm -rf "$dir/src" && mkdir -p "$dir/src"
  # An archive keeps its commit's file times, older than a previous base's objects: a new
  # base gets a fresh build directory, or ninja would see nothing to rebuild.
  local id
  if [ -f "$src" ]; then id=$(sha256sum "$src" | cut -d' ' -f1); else id=$(git rev-parse "$src"); fi
  [ "$(cat "$dir/base.id" 2>/dev/null)" = "$id" ] || rm -rf "$dir/build"
  echo "$id" >"$dir/base.id"
  if [ -f "$src" ]; then
    tar xf "$src" -C "$dir/src"
  else
    git archive "$src" | tar x -C "$dir/src"
  fi
  # an archive may hold the tree under one top folder
  local inner
  inner=$(find "$dir/src" -mindepth 1 -maxdepth 2 -name CMakeLists.txt -printf '%h\n' | sort | head -1)
  [ -n "$inner" ] && [ "$inner" != "$dir/src" ] && mv "$inner" "$dir/tree" && rm -rf "$dir/src" &&
    mv "$dir/tree" "$dir/src"
  [ -f "$dir/src/CMakeLists.txt" ] && [ -d "$dir/src/python/megamoe" ]
}

# AB_MORE: extra builds for ab-formats beside this and the base, "name:tarball ..." (name:
# lower-case letters, digits and _, not ending in a digit, which numbers the runs; tarball
# as AB_BASE's), each built into /tmp/ab-<name>.
ab_more() {  # prints "name tarball" lines; fails on a malformed entry
  local v
  for v in ${AB_MORE:-}; do
    [[ "$v" =~ ^([a-z]([a-z0-9_]*[a-z_])?):(.+)$ ]] || { echo "AB_MORE: '$v' is not name:tarball" >&2; return 1; }
    case "${BASH_REMATCH[1]}" in this | base) echo "AB_MORE: '${BASH_REMATCH[1]}' is taken" >&2; return 1 ;; esac
    echo "${BASH_REMATCH[1]} ${BASH_REMATCH[3]}"
  done
}

ab_build_one() {  # tarball-or-commit dir [label]: that tree's AB_TARGETS built in dir/build
  # shellcheck disable=SC2086
  ab_source "$1" "$2" && cmake_build "$2/src" "$2/build" "${AB_JOBS:-6}" $(($(left) - 90)) ${AB_TARGETS:-_C}
  echo "ab-build${3:-} rc=$?"
}

step_build() {
  deps
  if [ -n "${AB_BASE:-}" ]; then
    # The base's extension only (its library and _C), beside the main build, and side by
    # side with it each AB_MORE build's, all in one background job (ab_wait waits for it).
    local more
    more=$(ab_more) || return 2
    (ab_build_one "$AB_BASE" "$AB_DIR" &
      while read -r name tb; do
        [ -n "$name" ] || continue
        ab_build_one "$tb" "/tmp/ab-$name" " $name" >"$WORK/ab_build_$name.log" 2>&1 &
      done <<<"$more"
      wait) >"$WORK/ab_build.log" 2>&1 &
    echo $! >"$WORK/ab_build.pid"
  fi
  [ -f tests/CMakeLists.txt ] || printf 'find_package(GTest REQUIRED)\ninclude(GoogleTest)\nadd_subdirectory(cuda)\n' >tests/CMakeLists.txt
  # shellcheck disable=SC2086
  cmake_build . build-dev "$JOBS" "$(limit build)" ${BUILD_TARGETS:-}
}

GPU_BINS=${GPU_BINS:-megamoe_cuda_tests megamoe_router_cuda_tests}
bin_path() { echo "build-dev/tests/cuda/$1"; }

suite_one() {  # binary box [shard count]: with a count, gtest shard $4 of $3, logs named _<shard>
  local b=$1 rc t n=${3:-1} i=${4:-0} tag=$1
  [ "$n" -gt 1 ] && tag="${b}_$i"
  t=$(date +%s)
  GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i timeout -k 5 "$2" "$(bin_path "$b")" --gtest_filter="${SUITE_FILTER:-*}" \
    --gtest_output=json:"$WORK/suite_$tag.json" >"$WORK/suite_$tag.log" 2>&1
  rc=$?
  gtest_row suite "$tag" "$rc" "$WORK/suite_$tag.json" "$WORK/suite_$tag.log" $(($(date +%s) - t)) >>"$WORK/suite.jsonl"
}

# The binaries run side by side in the background, each GPU binary as SUITE_SHARDS gtest
# shards (default 4: megamoe_cuda_tests alone took over 300 s on 2026-12-05, its cases
# checked under two poisons); suite-wait collects them.
step_suite() {
  local b box i n=${SUITE_SHARDS:-4} runs=0
  box=$(limit suite)
  : >"$WORK/suite.pids"
  # a warm machine keeps $WORK: no rows or logs of an earlier call's suite
  : >"$WORK/suite.jsonl"
  rm -f "$WORK"/suite_*.json "$WORK"/suite_*.log
  for b in $GPU_BINS; do
    for ((i = 0; i < n; i++)); do
      suite_one "$b" "$box" "$n" "$i" &
      echo $! >>"$WORK/suite.pids"
      runs=$((runs + 1))
    done
  done
  # the plan tests (no GPU needed) once more only when GPU_BINS does not hold them, and built
  if [[ " $GPU_BINS " != *" megamoe_plan_tests "* ]]; then
    if [ -x "$(bin_path megamoe_plan_tests)" ]; then
      suite_one megamoe_plan_tests "$box" &
      echo $! >>"$WORK/suite.pids"
      runs=$((runs + 1))
    else
      echo "suite: megamoe_plan_tests not built (BUILD_TARGETS), not run"
    fi
  fi
  echo "suite: $runs runs started (box ${box}s)"
}

step_suite_wait() {
  [ -f "$WORK/suite.pids" ] || { echo "no suite runs started"; return 0; }
  local p
  while read -r p; do wait "$p" 2>/dev/null; done <"$WORK/suite.pids"
  rm -f "$WORK/suite.pids"
  tee -a "$SUMMARY" <"$WORK/suite.jsonl"
  grep -h -E '^\[  FAILED  \]' "$WORK"/suite_*.log | head -20
  ! grep -q '"rc": [1-9]' "$WORK/suite.jsonl"
}

step_ctest_cpu() {
  (cd build-dev && timeout -k 5 "$(limit ctest-cpu)" ctest --output-on-failure -j4 -LE gpu) >"$WORK/ctest_cpu.log" 2>&1
  local rc=$?
  tail -3 "$WORK/ctest_cpu.log"
  return $rc
}

# Not sanitized, by name: the tests that fault or fail on purpose (CudaErrorsDeathTest.*, in
# child processes; CudaErrors.MissingDeviceIsACudaError, an API error the sanitizer reports);
# they run in `suite`. The slow ones (exhaustive 2^32 sweeps, prefill sizes, the router's
# layout sweep) run in a second, separately boxed pass, so a slow tool still reports the rest.
SLOW_CUDA='CudaNumerics.PackedAmaxMatchesScalarRuleBF16:CudaNumerics.PackedAmaxMatchesScalarRuleF16:CudaNumerics.Fp8HardwareMatchesSoftwareOnAllFloats:CudaStage.LargeT:CudaStage.MoreThan2Pow31Elements'
SLOW_ROUTER='RouterCuda.KernelShapesAndLayouts'
ON_PURPOSE='CudaErrorsDeathTest.*:CudaErrors.MissingDeviceIsACudaError'
sanitize_run() {  # tool binary tag filter box extra...: one compute-sanitizer process, one row
  local tool=$1 b=$2 tag=$3 filter=$4 box=$5 t rc
  shift 5
  t=$(date +%s)
  timeout -k 10 "$box" compute-sanitizer --tool "$tool" "$@" --print-limit 200 --error-exitcode 9 \
    "$(bin_path "$b")" --gtest_filter="$filter" --gtest_output=json:"$WORK/sanitize_${tool}_${b}_$tag.json" \
    >"$WORK/sanitize_${tool}_${b}_$tag.log" 2>&1
  rc=$?
  gtest_row "sanitize-$tool-$tag" "$b" "$rc" "$WORK/sanitize_${tool}_${b}_$tag.json" \
    "$WORK/sanitize_${tool}_${b}_$tag.log" $(($(date +%s) - t)) >>"$WORK/sanitize.jsonl"
}

sanitize_one() {  # tool binary main_box slow_box
  local tool=$1 b=$2 slow extra=() pass test
  [ "$b" = megamoe_cuda_tests ] && slow=$SLOW_CUDA || slow=$SLOW_ROUTER
  [ "$tool" = memcheck ] && extra=(--leak-check full)
  # With SANITIZE_SPLIT_SLOW=1 every pass and every slow test is its own process, all side
  # by side, so one slow test cannot hide the others.
  run() { if [ "${SANITIZE_SPLIT_SLOW:-0}" = 1 ]; then sanitize_run "$@" & else sanitize_run "$@"; fi; }
  for pass in ${SANITIZE_PASSES:-main slow}; do
    if [ "$pass" = main ]; then
      run "$tool" "$b" main "${SANITIZE_FILTER:-*}-$slow:$ON_PURPOSE" "$3" "${extra[@]}"
    elif [ "${SANITIZE_SPLIT_SLOW:-0}" = 1 ]; then
      for test in ${slow//:/ }; do run "$tool" "$b" "slow_${test//./_}" "$test" "$4" "${extra[@]}"; done
    else
      run "$tool" "$b" slow "$slow" "$4" "${extra[@]}"
    fi
  done
  wait
}

step_sanitize() {
  local tool b main_box slow_box
  main_box=${SANITIZE_TIMEOUT:-300}
  slow_box=${SANITIZE_SLOW_TIMEOUT:-150}
  # Both passes must end inside the deadline.
  local l=$(($(left) - 30))
  if [ "${SANITIZE_PASSES:-main slow}" = slow ] || [ "${SANITIZE_SPLIT_SLOW:-0}" = 1 ]; then
    main_box=$l; slow_box=$l  # one pass, or all side by side: each gets what is left
  elif [ $((main_box + slow_box)) -gt "$l" ]; then
    main_box=$((l * 2 / 3)); slow_box=$((l - main_box))
  fi
  : >"$WORK/sanitize.pids"
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck initcheck synccheck}; do
    for b in $GPU_BINS; do
      sanitize_one "$tool" "$b" "$main_box" "$slow_box" &
      echo $! >>"$WORK/sanitize.pids"
    done
  done
  echo "sanitize: $(wc -l <"$WORK/sanitize.pids") runs started (main pass ${main_box}s, slow pass ${slow_box}s)"
}

step_sanitize_wait() {
  [ -f "$WORK/sanitize.pids" ] || { echo "no sanitizer runs started"; return 0; }
  local p
  while read -r p; do wait "$p" 2>/dev/null; done <"$WORK/sanitize.pids"
  rm -f "$WORK/sanitize.pids"
  python3 - "$WORK/sanitize.jsonl" <<'EOF' | tee -a "$SUMMARY"
import json, sys
bad = 0
for line in open(sys.argv[1]):
    r = json.loads(line)
    bad += r["rc"] != 0
    print(f"{r['step']:<26} {r['binary']:<26} rc={r['rc']:<3} {r['seconds']:>4}s tests={r.get('tests')} "
          f"ok={r.get('ok_lines')} failed={r.get('failed_lines')} timed_out={r['timed_out']} | {r.get('sanitizer_summary')}")
sys.exit(1 if bad else 0)
EOF
}

step_pytest() {
  pypkg || { echo "no build-dev/python/_C*.so"; return 1; }
  with_pkg python3 -c 'import megamoe; print("megamoe", megamoe.__version__, "cuda", megamoe.has_cuda_backend())'
  # shellcheck disable=SC2086
  (cd tests/python && with_pkg timeout -k 5 "$(limit pytest)" python3 -m pytest -q -p no:cacheprovider --durations=15 \
    ${PYTEST_FILES:-test_gpu.py test_gpu_consumer.py} --junitxml="$WORK/pytest.xml") >"$WORK/pytest.log" 2>&1
  local rc=$?
  tail -15 "$WORK/pytest.log"
  return $rc
}

pybench() {  # step script args...: the script's rows into $WORK/<step>/, joined into <step>.jsonl
  local step=$1 script=$2
  shift 2
  pypkg || { echo "no build-dev/python/_C*.so"; return 1; }
  mkdir -p "$WORK/$step"
  with_pkg timeout -k 5 "$(limit "$step")" python3 "$script" --out "$WORK/$step" "$@"
  local rc=$?
  cat "$WORK/$step"/*.jsonl >"$WORK/$step.jsonl" 2>/dev/null
  return $rc
}

# shellcheck disable=SC2086  # BENCH_FORMATS_ARGS is a list of arguments, replacing the default ones
step_bench_formats() {
  pybench bench-formats bench/bench_formats.py ${BENCH_FORMATS_ARGS---parts formats,full_buffer $QUICK_FLAG}
}
step_nonfinite() { pybench nonfinite bench/bench_formats.py --parts nonfinite $QUICK_FLAG; }
step_bench_router() { pybench bench-router bench/bench_router.py --cpp-bin build-dev/megamoe_bench_router $QUICK_FLAG; }
step_bench_op() { pybench bench-op bench/bench_op_overhead.py; }
# shellcheck disable=SC2086  # BENCH_NORM_ARGS is a list of arguments ("" for the full grid)
step_bench_norm() { pybench bench-norm bench/bench_norm.py ${BENCH_NORM_ARGS---quick}; }

ab_wait() {  # the base build started by `build`, while time is left
  [ -f "$WORK/ab_build.pid" ] || return 0
  local p
  p=$(cat "$WORK/ab_build.pid")
  while kill -0 "$p" 2>/dev/null && [ "$(left)" -gt 60 ]; do sleep 2; done
  tail -3 "$WORK/ab_build.log"
}

# The base build's Python package (its sources and extension) in /tmp/pypkg-base, or with
# a name that of the AB_MORE build in /tmp/pypkg-<name>; prints the path.
base_pkg() {
  local name=${1:-base} dir=$AB_DIR
  [ -n "${1:-}" ] && dir=/tmp/ab-$1
  local d=/tmp/pypkg-$name
  rm -rf "$d" && mkdir -p "$d" && cp -r "$dir/src/python/megamoe" "$d/" &&
    cp "$dir"/build/python/_C*.so "$d/megamoe/" && echo "$d"
}

step_ab() {
  [ -n "${AB_BASE:-}" ] || { echo "ab: set AB_BASE (scripts/ab_prepare.sh COMMIT makes the tarball)"; return 2; }
  pypkg || return 1
  ab_wait
  local base_pkg
  base_pkg=$(base_pkg) || { echo "ab: no base extension"; return 1; }
  mkdir -p "$WORK/ab"
  local i lab pkg rc=0 each
  # Four runs share the box; this tree's bench_stage.py times both builds.
  each=$(($(limit ab) / 4))
  for i in 1 2; do
    for lab in this base; do
      [ $lab = this ] && pkg=$PYPKG || pkg=$base_pkg
      PYTHONPATH="$pkg" timeout -k 5 "$each" python3 bench/bench_stage.py --only megamoe --out "$WORK/ab" \
        --json "$lab$i.json" --rows-file "${lab}_rows.jsonl" --label "$lab$i" $QUICK_FLAG >"$WORK/ab/$lab$i.log" 2>&1 ||
        { rc=$?; echo "ab: $lab run $i rc=$rc"; }
    done
  done
  if ! ls "$WORK"/ab/this*.json >/dev/null 2>&1 || ! ls "$WORK"/ab/base*.json >/dev/null 2>&1; then
    echo "ab: a build has no completed run (logs: ab/*.log)"
    return 1
  fi
  python3 bench/ab_compare.py --this "$WORK"/ab/this*.json --base "$WORK"/ab/base*.json --out "$WORK/ab.jsonl"
}

# dev/ab_routing.py (routing-only staging, plain and full-buffer) with this build's extension
# and the base's (AB_BASE, AB_TARGETS=_C): this, base, this, base; then per (T, full_buffer)
# the best of each build's runs and their ratio (ab_routing.txt).
step_ab_routing() {
  [ -n "${AB_BASE:-}" ] || { echo "ab-routing: set AB_BASE"; return 2; }
  pypkg || return 1
  ab_wait
  local base_pkg i lab pkg each
  base_pkg=$(base_pkg) || { echo "ab-routing: no base extension"; return 1; }
  each=$(($(limit ab-routing) / 4))
  : >"$WORK/ab_routing.jsonl"
  for i in 1 2; do
    for lab in this base; do
      [ $lab = this ] && pkg=$PYPKG || pkg=$base_pkg
      PYTHONPATH="$pkg" timeout -k 5 "$each" python3 dev/ab_routing.py --label "$lab" >>"$WORK/ab_routing.jsonl" 2>"$WORK/ab_routing_$lab$i.log" ||
        echo "ab-routing: $lab run $i rc=$?"
    done
  done
  python3 - "$WORK/ab_routing.jsonl" <<'PY' | tee "$WORK/ab_routing.txt"
import json, sys
best = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    k = (r["T"], r["full_buffer"])
    best.setdefault(k, {}).setdefault(r["label"], []).append(r["us"])
print("T full_buffer this_us base_us this/base")
for k in sorted(best):
    d = best[k]
    if "this" in d and "base" in d:
        t, b = min(d["this"]), min(d["base"])
        print(k[0], k[1], f"{t:.2f}", f"{b:.2f}", f"{t / b:.3f}")
PY
}

# bench/bench_formats.py --parts formats $AB_FORMATS_ARGS with this build's and the base's
# extension (AB_BASE; the base built with the default AB_TARGETS=_C): this, base, this, base;
# then per (format, H, T) both medians and their ratio (ab_formats.jsonl).
step_ab_formats() {
  [ -n "${AB_BASE:-}" ] || { echo "ab-formats: set AB_BASE"; return 2; }
  pypkg || return 1
  ab_wait
  local i lab each names more
  declare -A pkgs=([this]=$PYPKG)
  pkgs[base]=$(base_pkg) || { echo "ab-formats: no base extension"; return 1; }
  names=(this base)
  more=$(ab_more) || return 2
  while read -r name _; do
    [ -n "$name" ] || continue
    pkgs[$name]=$(base_pkg "$name") || { echo "ab-formats: no extension of $name"; continue; }
    names+=("$name")
  done <<<"$more"
  each=$(($(limit ab-formats) / (2 * ${#names[@]})))
  for i in 1 2; do
    for lab in "${names[@]}"; do
      # shellcheck disable=SC2086
      PYTHONPATH="${pkgs[$lab]}" timeout -k 5 "$each" python3 bench/bench_formats.py --parts formats ${AB_FORMATS_ARGS:-} \
        --out "$WORK/ab-formats/$lab$i" >"$WORK/ab-formats-$lab$i.log" 2>&1 || echo "ab-formats: $lab run $i rc=$?"
    done
  done
  python3 bench/ab_formats_merge.py "$WORK/ab-formats" "$WORK/ab_formats.jsonl"
}

step_ab_router() {
  [ -n "${AB_BASE:-}" ] || { echo "ab-router: set AB_BASE"; return 2; }
  ab_wait
  [ -x "$AB_DIR/build/megamoe_bench_router" ] || { echo "ab-router: no base megamoe_bench_router"; return 1; }
  local i lab bin each
  each=$(($(limit ab-router) / 4))
  mkdir -p "$WORK/ab-router"
  for i in 1 2; do
    for lab in this base; do
      [ $lab = this ] && bin=build-dev/megamoe_bench_router || bin=$AB_DIR/build/megamoe_bench_router
      # shellcheck disable=SC2086
      timeout -k 5 "$each" "$bin" ${ROUTER_ARGS:-} >"$WORK/ab-router/$lab$i.jsonl" 2>"$WORK/ab-router/$lab$i.err" ||
        echo "ab-router: $lab run $i rc=$?"
    done
  done
  python3 - "$WORK/ab-router" "$WORK/ab_router.jsonl" <<'PYEOF'
import glob, json, os, statistics, sys
d, out = sys.argv[1:]
rows = {}
for f in sorted(glob.glob(os.path.join(d, "*.jsonl"))):
    lab = os.path.basename(f)[:4]
    for line in open(f):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("kind") != "router":
            continue
        k = (r["E"], r["K"], r["H"], r["T"], r["eplb"])
        rows.setdefault(k, {}).setdefault(lab, []).append(r)
with open(out, "w") as o:
    for k, v in sorted(rows.items()):
        row = dict(E=k[0], K=k[1], H=k[2], T=k[3], eplb=k[4])
        for lab, rs in v.items():
            for m in ("fused_us", "route_then_stage_us", "route_us", "stage_us", "copy_us"):
                row[f"{lab}_{m}"] = round(statistics.median(r[m] for r in rs), 3)
            row[f"{lab}_exact"] = all(r["fused_equals_two_step"] for r in rs)
        if "this" in v and "base" in v:
            row["fused_ratio"] = round(row["this_fused_us"] / row["base_fused_us"], 3)
            row["route_ratio"] = round(row["this_route_us"] / row["base_route_us"], 3)
        print(json.dumps(row))
        o.write(json.dumps(row) + "\n")
PYEOF
}

step_bench_kernel() {
  # shellcheck disable=SC2086
  timeout -k 5 "$(limit bench-kernel)" ./build-dev/megamoe_bench_kernel ${BENCH_ARGS:-} | tee "$WORK/bench-kernel.jsonl"
}

# The decode kernels' phase trace: megamoe_bench_kernel and megamoe_bench_router built from
# the instrumented copy of the tree (dev/trace/tree.sh: build-trace/src, built in
# build-trace/build; the product's kernels carry no trace points, and build-dev must not time
# a trace build), then each "SCHEME T H" of TRACE_CONFIGS
# ("a;b;..."), TRACE_CALLS calls replayed as one CUDA graph (as the benchmarks time them) and
# again with a sync after each call, and megamoe_bench_router $TRACE_ROUTER_ARGS (its graph
# replays overflow the device's printf buffer between syncs: the lines that fit; its "fast"
# lines mix the fused kernel's quantizing blocks and the staging kernel's);
# bench/trace_summary.py's medians into trace.jsonl, the lines under trace/.
step_trace() {
  deps
  mkdir -p "$WORK/trace"
  { bash dev/trace/tree.sh build-trace/src &&
    cmake_build build-trace/src build-trace/build "$JOBS" $(($(limit trace) - 45)) \
      megamoe_bench_kernel megamoe_bench_router; } >"$WORK/trace/build.log" 2>&1 || { tail -5 "$WORK/trace/build.log"; return 1; }
  local cfg mode cfgs
  IFS=';' read -ra cfgs <<<"${TRACE_CONFIGS:-mxfp8 1 7168;mxfp4 1 7168;nvfp4_static 1 7168;nvfp4_per_token 1 7168;nvfp4_per_token 64 7168}"
  for cfg in "${cfgs[@]}"; do
    for mode in graph sync; do
      # shellcheck disable=SC2086  # cfg is "SCHEME T H"
      timeout -k 5 20 ./build-trace/build/megamoe_bench_kernel --one-format $cfg "${TRACE_CALLS:-200}" $mode \
        >"$WORK/trace/${cfg// /_}_$mode.txt" 2>&1 || echo "trace: $cfg $mode rc=$?"
    done
  done
  # shellcheck disable=SC2086
  timeout -k 5 60 ./build-trace/build/megamoe_bench_router ${TRACE_ROUTER_ARGS:---T 1 --layers 256:6:4096,384:6:7168 --eplb 0,1} \
    >"$WORK/trace/router.txt" 2>&1 || echo "trace: router rc=$?"
  python3 bench/trace_summary.py "$WORK"/trace/*_graph.txt "$WORK"/trace/*_sync.txt "$WORK/trace/router.txt" |
    tee "$WORK/trace.jsonl"
}

step_ncu() {
  # shellcheck disable=SC2086
  timeout -k 5 "$(limit ncu)" ncu --clock-control none ${NCU_SECTIONS:---section SpeedOfLight --section MemoryWorkloadAnalysis --metrics dram__bytes_read.sum,dram__bytes_write.sum} \
    -k regex:"${NCU_KERNELS:-stage_fast}" -c "${NCU_COUNT:-2}" ${NCU_EXTRA:-} \
    "./build-dev/${NCU_BIN:-megamoe_bench_kernel}" ${NCU_ARGS:---one 16384 4096} >"$WORK/ncu.txt" 2>&1
  local rc=$?
  grep -E "dram__bytes|DRAM Throughput|Memory Throughput|Duration|L2 Hit|Mem Busy" "$WORK/ncu.txt" | head -40
  return $rc
}

step_ncu_ab() {
  [ -n "${AB_BASE:-}" ] || { echo "ncu-ab: set AB_BASE (with AB_TARGETS including megamoe_bench_kernel)"; return 2; }
  ab_wait
  local m b s each sizes
  m=smsp__inst_executed.sum,gpu__time_duration.sum,smsp__issue_active.avg.pct_of_peak_sustained_active
  m=$m,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active
  m=$m,launch__registers_per_thread,launch__grid_size,launch__block_size
  sizes=${NCU_AB_SIZES:-16384 7168}
  each=$(($(limit ncu-ab) / (2 * $(echo "$sizes" | tr ',' '\n' | wc -l))))
  for b in "this:./build-dev" "base:$AB_DIR/build"; do
    [ -x "${b#*:}/megamoe_bench_kernel" ] || { echo "ncu-ab: no ${b#*:}/megamoe_bench_kernel"; return 1; }
    while IFS= read -r s; do
      echo "== ${b%%:*} ${NCU_AB_SCHEME:-nvfp4_per_token} $s"
      # shellcheck disable=SC2086
      timeout -k 5 "$each" ncu --clock-control none --metrics "$m" --section WarpStateStats \
        -k regex:"${NCU_KERNELS:-rowwise}" -c 1 "${b#*:}/megamoe_bench_kernel" --one-format \
        "${NCU_AB_SCHEME:-nvfp4_per_token}" $s 2>&1
    done < <(echo "$sizes" | tr ',' '\n')
  done >"$WORK/ncu_ab.txt" 2>&1
  grep -E "^== |inst_executed|duration|issue_active|dram__|Stall|Warp Cycles" "$WORK/ncu_ab.txt" | head -60
}

step_sass() {
  local o rc=0
  for o in build-dev/CMakeFiles/megamoe.dir/src/cuda/*/*.o; do
    [ -f "$o" ] || continue
    echo "== $o"
    timeout -k 5 "$(limit sass)" python3 bench/sass_mix.py "$o" --match "${SASS_MATCH:-stage_fast_kernel}" || rc=$?
  done >"$WORK/sass.txt" 2>&1
  grep -c "instructions$" "$WORK/sass.txt"
  return $rc
}

step_pybench() { pybench pybench bench/bench_stage.py $QUICK_FLAG; }

step_multigpu() {
  pypkg || { echo "no build-dev/python/_C*.so"; return 1; }
  local box each
  box=$(limit multigpu)
  each=$((box / 2))
  mkdir -p "$WORK/multigpu"
  # shellcheck disable=SC2086
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 with_pkg timeout -k 5 "$each" \
    python3 -m torch.distributed.run --standalone --nproc-per-node "${NPROC:-$(nvidia-smi -L | wc -l)}" \
    tests/multigpu/stage_symmetric.py --timing --out "$WORK/multigpu" ${MULTIGPU_ARGS:-} >"$WORK/multigpu-run.log" 2>&1
  local rc=$?
  tail -40 "$WORK/multigpu-run.log"
  (cd tests/multigpu && NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 with_pkg timeout -k 5 "$each" \
    python3 -m pytest -q -p no:cacheprovider .) >"$WORK/multigpu-pytest.log" 2>&1 || rc=$((rc ? rc : $?))
  tail -5 "$WORK/multigpu-pytest.log"
  return $rc
}

for s in "${STEPS[@]}"; do
  if [ "$(left)" -lt 20 ] && [ "$s" != sanitize-wait ]; then
    note "$s SKIPPED (deadline: $(left)s left)"
    continue
  fi
  echo "== $s ($(date +%T), $(left)s left, box $(limit "$s")s)"
  t=$(date +%s)
  fn="step_${s//-/_}"
  if [ "$s" = build ]; then  # long output: the log keeps it, the reply its end
    $fn >"$WORK/$s.log" 2>&1
    rc=$?
    tail -4 "$WORK/$s.log"
  else
    $fn > >(tee "$WORK/$s.log") 2>&1
    rc=$?
  fi
  note "$s rc=$rc $(($(date +%s) - t))s"
  pack
done
# Runs still in the background (suite, sanitizers, the base build) are collected or cut
# before the last pack.
if [ -f "$WORK/suite.pids" ]; then
  echo "== suite-wait (at the end)"
  step_suite_wait | tee -a "$WORK/suite-wait.log"
fi
if [ -f "$WORK/sanitize.pids" ]; then
  echo "== sanitize-wait (at the end)"
  step_sanitize_wait | tee -a "$WORK/sanitize-wait.log"
fi
[ -f "$WORK/ab_build.pid" ] && kill "$(cat "$WORK/ab_build.pid")" 2>/dev/null
echo "== summary ($(($(date +%s) - T0))s)"
cat "$SUMMARY"
