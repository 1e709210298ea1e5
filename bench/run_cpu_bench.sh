#!/usr/bin/env bash
# bench/run_cpu_bench.sh: the CPU benchmark. megamoe's CPU backend on 1 thread and on all
# threads, each next to a memcpy of the same byte count in the same run, and the NumPy
# rendering of the reference (bench/np_reference.py, checked byte-equal to megamoe first),
# for T in {1, 64, 1024, 4096, 16384}, H in {7168, 4096} and every format. Writes
# bench/results/cpu_<machine>_<commit>.json and prints a table.
#
#   bash bench/run_cpu_bench.sh [BUILD_DIR]        (default build-cpu-bench)
# Environment: T, H, FORMATS (comma lists), MIN_TIME (s per megamoe/memcpy point, 0.5),
# NP_MIN_TIME (s per NumPy point, 1), SCALAR=1 (also time the scalar path), NUMPY=0 (skip
# NumPy), OUT (the JSON path).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-cpu-bench}
T=${T:-1,64,1024,4096,16384}
H=${H:-7168,4096}
FORMATS=${FORMATS:-all}
MIN_TIME=${MIN_TIME:-0.5}
NP_MIN_TIME=${NP_MIN_TIME:-1}
PY=${PYTHON:-python3}

cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEGAMOE_ENABLE_CUDA=OFF -DMEGAMOE_BUILD_BENCH=ON \
  -DMEGAMOE_BUILD_TESTS=OFF -DMEGAMOE_BUILD_TOOLS=OFF >/dev/null
cmake --build "$BUILD" --target megamoe_bench_cpu -j 2 >/dev/null
BIN="$BUILD/megamoe_bench_cpu"

model=$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1)
machine=$(echo "$model" | tr 'A-Z' 'a-z' | sed 's/([^)]*)//g; s/[^a-z0-9]\+/_/g; s/^_//; s/_$//' | cut -c1-40)
commit=$(git rev-parse --short HEAD)
git diff --quiet HEAD -- src include bench CMakeLists.txt || commit="${commit}-dirty"
OUT=${OUT:-bench/results/cpu_${machine}_${commit}.json}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
echo "== NumPy rendering vs megamoe bytes"
mkdir -p "$tmp/dump"
"$BIN" --dump "$tmp/dump" >/dev/null
$PY bench/np_reference.py --check "$tmp/dump"
echo "== megamoe (vectorized) and memcpy"
"$BIN" --T "$T" --H "$H" --formats "$FORMATS" --threads 1,0 --min-time "$MIN_TIME" --json "$tmp/megamoe.jsonl"
if [ "${SCALAR:-0}" = 1 ]; then
  echo "== megamoe, scalar path"
  "$BIN" --scalar --T "$T" --H "$H" --formats "$FORMATS" --threads 1,0 --min-time "$MIN_TIME" --json "$tmp/scalar.jsonl"
fi
touch "$tmp/numpy.jsonl" "$tmp/scalar.jsonl"
if [ "${NUMPY:-1}" = 1 ]; then
  echo "== NumPy"
  $PY bench/np_reference.py --bench --T "$T" --H "$H" --formats "$FORMATS" --min-time "$NP_MIN_TIME" --json "$tmp/numpy.jsonl"
fi
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

mkdir -p "$(dirname "$OUT")"
MODEL="$model" COMMIT="$commit" LOAD_BEFORE="$load_before" LOAD_AFTER="$load_after" \
CMD="T=$T H=$H FORMATS=$FORMATS MIN_TIME=$MIN_TIME NP_MIN_TIME=$NP_MIN_TIME SCALAR=${SCALAR:-0} bash bench/run_cpu_bench.sh $BUILD" \
$PY - "$tmp" "$OUT" <<'EOF'
import datetime, json, os, platform, subprocess, sys

import numpy as np

tmp, out = sys.argv[1], sys.argv[2]
def rows(name):
    with open(os.path.join(tmp, name)) as f:
        return [json.loads(l) for l in f if l.strip()]
lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
field = lambda k: next((l.split(":", 1)[1].strip() for l in lscpu.splitlines() if l.startswith(k + ":")), "")
mm, sc, npr = rows("megamoe.jsonl"), rows("scalar.jsonl"), rows("numpy.jsonl")
doc = {
    "machine": {"model": os.environ["MODEL"], "cpus": os.cpu_count(), "threads_per_core": field("Thread(s) per core"),
                "flags": field("Flags"), "kernel": platform.release()},
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "commit": os.environ["COMMIT"], "command": os.environ["CMD"], "numpy": np.__version__,
    "loadavg_before": os.environ["LOAD_BEFORE"], "loadavg_after": os.environ["LOAD_AFTER"],
    "megamoe": mm, "scalar": sc, "numpy_rows": npr,
}
with open(out, "w") as f:
    json.dump(doc, f, indent=1)
key = lambda r: (r["format"], r["H"], r["T"])
by = {}
for r in mm:
    by.setdefault(key(r), {})["one" if r["threads"] == 1 else "all"] = r
for r in sc:
    by.setdefault(key(r), {})["scalar_" + ("one" if r["threads"] == 1 else "all")] = r
for r in npr:
    by.setdefault(key(r), {})["numpy"] = r
print(f"\nCPU: {doc['machine']['model']}, {doc['machine']['cpus']} CPUs; commit {doc['commit']}; "
      f"load {doc['loadavg_before']} -> {doc['loadavg_after']}")
hdr = ("format", "H", "T", "MB", "GB/s 1thr", "memcpy 1thr", "GB/s all", "memcpy all", "% memcpy", "numpy ms", "x numpy")
print("| " + " | ".join(hdr) + " |")
print("|" + "|".join(["---"] * len(hdr)) + "|")
for k in sorted(by, key=lambda k: (k[1] != 7168, k[0] != "mxfp8", k[0], k[2])):
    d = by[k]
    one, al, n = d.get("one"), d.get("all"), d.get("numpy")
    if one is None or al is None:
        continue
    speed = f"{n['numpy_us'] / al['megamoe_us']:.0f}x" if n else "-"
    print(f"| {k[0]} | {k[1]} | {k[2]} | {al['bytes'] / 1e6:.2f} | {one['megamoe_gbps']:.2f} | {one['memcpy_gbps']:.2f} | "
          f"{al['megamoe_gbps']:.2f} | {al['memcpy_gbps']:.2f} | {100 * al['memcpy_us'] / al['megamoe_us']:.0f}% | "
          f"{n['numpy_us'] / 1e3 if n else float('nan'):.1f} | {speed} |")
print(f"\nwrote {out}")
EOF
