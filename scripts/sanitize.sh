#!/usr/bin/env bash
# scripts/sanitize.sh: the C++ CPU suite under sanitizers, then a bounded fuzzing run.
#   (a) build-asan: ASan + UBSan build of the library, GoogleTest suites and CLI; ctest
#       without the install test (it rebuilds the library from scratch) and cli.hostile
#       (it asks for 2^48 bytes to see std::bad_alloc handled: ASan's operator new reports
#       out-of-memory and exits instead of throwing, whatever allocator_may_return_null says);
#   (b) build-tsan: TSan build of the GoogleTest suites; ctest (the CPU backend starts
#       worker threads for T * (H + K) >= 2^18 on a machine with two or more cores: the
#       T = 434, H = 7168 cases of Matrix/RandomStage do) without the two exhaustive
#       numerics sweeps (CoreVsReference: every fp32 bit pattern, a dense scale sample),
#       whose threads are the test's own and which outlast ctest's timeout under TSan; they
#       run under (a);
#   (c) build-fuzz: the libFuzzer target tests/fuzz (clang, CPU only), run for
#       MEGAMOE_FUZZ_SECONDS (default 180) over a copy of tests/fuzz/corpus.
# Every step runs even when an earlier one fails; any sanitizer report, failing test or
# fuzzer finding then fails the script (a finding's reproducer path is printed). Called by
# .ci/run after scripts/test.sh.
# Knobs: MEGAMOE_SANITIZE_JOBS (default 2: the machine is shared), MEGAMOE_FUZZ_SECONDS,
# MEGAMOE_SANITIZE_STEPS (default "asan tsan fuzz": a subset runs only those steps).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
JOBS=${MEGAMOE_SANITIZE_JOBS:-2}
FUZZ_SECONDS=${MEGAMOE_FUZZ_SECONDS:-180}
STEPS=${MEGAMOE_SANITIZE_STEPS:-asan tsan fuzz}
T0=$SECONDS
export CMAKE_BUILD_PARALLEL_LEVEL=$JOBS CTEST_PARALLEL_LEVEL=$JOBS

log() { printf '\n=== sanitize: %s (%ds)\n' "$*" "$((SECONDS - T0))"; }
step() { [[ " $STEPS " == *" $1 "* ]]; }
failed=()
fail() { failed+=("$1"); echo "sanitize: FAILED: $1" >&2; }

# --- Tools: clang++ with the sanitizer and libFuzzer runtimes (Debian 12: clang 14). -------
# Installed the way scripts/deps.sh installs its packages (sudo unless root), only if a
# trial link of each runtime fails.
probe_dir=$(mktemp -d)
trap 'rm -rf "$probe_dir"' EXIT
probe() {  # probe <sanitizer flags>: can clang++ build and link a program with them?
  printf '%s\n' '#include <cstddef>' '#include <cstdint>' \
    'extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }' \
    > "$probe_dir/p.cpp"
  if [[ "$1" != *fuzzer* ]]; then echo 'int main() { return 0; }' >> "$probe_dir/p.cpp"; fi
  clang++ "$1" "$probe_dir/p.cpp" -o "$probe_dir/p" >/dev/null 2>&1
}
have_tools() {
  command -v clang++ >/dev/null && probe -fsanitize=address,undefined && probe -fsanitize=thread &&
    probe -fsanitize=fuzzer,address,undefined
}
if ! have_tools; then
  log "installing clang and its runtimes (clang, libclang-rt-14-dev)"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang libclang-rt-14-dev >/dev/null
  have_tools || { echo "sanitize: clang++ cannot link the ASan/UBSan/TSan/libFuzzer runtimes" >&2; exit 1; }
fi
CXX=$(command -v clang++)
echo "sanitize: $($CXX --version | head -1); $(nproc) cores, -j$JOBS"

# Sanitizers abort on the first report (also while gtest_discover_tests lists the tests
# at build time), with stacks; leaks count.
export ASAN_OPTIONS=halt_on_error=1:detect_leaks=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1

common=(-G Ninja -DCMAKE_CXX_COMPILER="$CXX" -DMEGAMOE_ENABLE_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
        -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only")
# -O1, asserts kept (no -DNDEBUG), line tables only: enough for file:line in every report,
# and the Highway SIMD sources build ~15% faster than with full -g.

# --- (a) ASan + UBSan: GoogleTest suites and CLI tests. -----------------------------------
if step asan; then
  log "ASan+UBSan build (build-asan)"
  if cmake -S . -B build-asan "${common[@]}" -DMEGAMOE_BUILD_TESTS=ON -DMEGAMOE_BUILD_TOOLS=ON \
       -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" >/dev/null &&
     cmake --build build-asan; then
    log "ASan+UBSan ctest"
    ctest --test-dir build-asan --output-on-failure -LE install -E '^cli\.hostile$' || fail "ASan+UBSan ctest"
  else
    fail "ASan+UBSan build"
  fi
fi

# --- (b) TSan: GoogleTest suites. ----------------------------------------------------------
if step tsan; then
  log "TSan build (build-tsan)"
  if [ "$(nproc)" -lt 2 ]; then
    echo "sanitize: WARNING: one core: the CPU backend starts no worker threads, TSan sees none" >&2
  fi
  if cmake -S . -B build-tsan "${common[@]}" -DMEGAMOE_BUILD_TESTS=ON -DMEGAMOE_BUILD_TOOLS=OFF \
       -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" >/dev/null &&
     cmake --build build-tsan; then
    log "TSan ctest"
    ctest --test-dir build-tsan --output-on-failure -L cpu -LE install \
      -E '^CoreVsReference\.(Fp8AllFloatBitPatterns|GroupScaleDenseSample)$' || fail "TSan ctest"
  else
    fail "TSan build"
  fi
fi

# --- (c) libFuzzer: bounded run over a copy of the seed corpus. ----------------------------
if step fuzz; then
  log "fuzzer build (build-fuzz)"
  if ! { cmake -S . -B build-fuzz "${common[@]}" -DMEGAMOE_BUILD_FUZZER=ON -DMEGAMOE_BUILD_TESTS=OFF \
           -DMEGAMOE_BUILD_TOOLS=OFF >/dev/null &&
         cmake --build build-fuzz --target megamoe_fuzz_stage; }; then
    fail "fuzzer build"
    STEPS=${STEPS/fuzz/}
  fi
fi
if step fuzz; then
  fuzzer=build-fuzz/tests/fuzz/megamoe_fuzz_stage
  run=build-fuzz/fuzz-run
  rm -rf "$run"
  mkdir -p "$run/corpus" "$run/artifacts"
  # One line naming a finding: the harness' account or the sanitizer's first report, with
  # addresses and indices blanked so that one bug gives one signature.
  signature() {
    "$fuzzer" "$1" 2>&1 | grep -E -m1 -A1 '=== megamoe fuzz finding ===|runtime error:|ERROR: (Address|Leak)Sanitizer|ERROR: libFuzzer' |
      grep -v '=== megamoe fuzz finding ===' | head -n 1 | sed -E 's/0x[0-9a-f]+/0x_/g; s/^==[0-9]+==//; s/(index|size|offset) [0-9]+/\1 N/g' | cut -c1-200
  }
  # 1. Every checked-in seed, replayed alone: a reproducer of an open finding fails here
  #    by name. The seeds then go to the fuzzing corpus (a copy: the tree stays clean).
  log "replaying $(ls tests/fuzz/corpus | wc -l) seeds"
  for seed in tests/fuzz/corpus/*; do
    if ! "$fuzzer" "$seed" >"$run/replay.log" 2>&1; then
      echo "sanitize: seed $seed reproduces a finding: $(signature "$seed")" >&2
      fail "seed $(basename "$seed")"
    fi
  done
  cp tests/fuzz/corpus/* "$run/corpus/"
  # 2. Fuzz for the whole budget: -fork=1 -ignore_crashes=1 keeps going after a crash (each
  #    one saved under artifacts/), so known findings cannot hide new ones.
  log "fuzzing ${FUZZ_SECONDS}s (libFuzzer -fork=1)"
  rc=0
  "$fuzzer" "$run/corpus" -fork=1 -ignore_crashes=1 -max_total_time="$FUZZ_SECONDS" -timeout=60 \
    -rss_limit_mb=4096 -max_len=4096 -print_final_stats=1 -artifact_prefix="$ROOT/$run/artifacts/" \
    > "$run/fuzz.log" 2>&1 || rc=$?
  # libFuzzer's closing lines: "#<executions>: cov ... corp ... time: <seconds>", exit.
  grep -E '^#[0-9]+: cov' "$run/fuzz.log" | tail -n 1 || true
  grep -E '^INFO: (fuzzed for|exiting)' "$run/fuzz.log" || true
  shopt -s nullglob
  found=("$ROOT/$run"/artifacts/{crash,leak,timeout,oom,slow-unit}-*)
  if [ "$rc" -ne 0 ] || [ ${#found[@]} -gt 0 ]; then
    echo "sanitize: FUZZER FINDINGS: ${#found[@]} reproducer(s), libFuzzer exit $rc; log: $ROOT/$run/fuzz.log" >&2
    sigs=$(for f in "${found[@]}"; do echo "$(signature "$f")"$'\t'"$f"; done | sort)
    awk -F'\t' '
      $1 != last { if (n) printf "  %d x %s\n     e.g. %s\n", n, last, ex; last = $1; ex = $2; n = 0 }
      { n++ } END { if (n) printf "  %d x %s\n     e.g. %s\n", n, last, ex }' <<<"$sigs" >&2
    # CI keeps only its log: for the first reproducer of each signature, the harness' own
    # account (bytes and the decoded call) or the sanitizer's report, and the input as
    # base64 (at most -max_len = 4096 bytes), so that the log alone replays it.
    sort -t$'\t' -k1,1 -u <<<"$sigs" | cut -f2 |
      while read -r f; do
        echo "--- $(basename "$f"): the harness' account" >&2
        MEGAMOE_FUZZ_VERBOSE=1 "$fuzzer" "$f" 2>&1 | grep -E -m1 -A40 '=== megamoe fuzz finding ===|runtime error:|ERROR: (Address|Leak)Sanitizer' >&2
        echo "--- $(basename "$f"): recreate with: base64 -d > repro <<'EOF' ... EOF" >&2
        base64 "$f" >&2
      done
    echo "sanitize: replay one with: $fuzzer <reproducer>  (MEGAMOE_FUZZ_VERBOSE=1 prints the decoded call)" >&2
    fail "fuzzer findings"
  fi
fi

if [ ${#failed[@]} -gt 0 ]; then
  log "FAILED: ${failed[*]}"
  exit 1
fi
log "all sanitizer steps passed"
