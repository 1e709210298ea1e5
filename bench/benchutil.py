"""Shared pieces of the Python GPU benchmarks: timing (CUDA-graph replays on a GPU, a plain
wall clock in the CPU check modes), JSON-lines output, and the run's header.

torch and triton are imported only by the functions that need them, so that every
benchmark's --dry-run works where neither is installed (CI).
"""
import json
import os
import statistics
import sys
import time


def rep_scale():
    """BENCH_REP_SCALE (default 1): multiplies every benchmark's replay time, so that a
    device session can trade repetitions for time (scripts/device.sh sets 0.5)."""
    return float(os.environ.get("BENCH_REP_SCALE", "1"))


def timer(device):
    """fn -> median microseconds per call. On CUDA: CUDA-graph replays
    (triton.testing.do_bench_cudagraph, median of 10 replays of a graph of about `rep_ms`
    of calls, times BENCH_REP_SCALE). On the CPU (the check modes): the median of a few
    wall-clock calls; those numbers only show that the code path runs, they are not
    benchmark figures."""
    if device == "cuda":
        from triton.testing import do_bench_cudagraph

        scale = rep_scale()

        def bench(fn, rep_ms=60):
            return do_bench_cudagraph(fn, rep=max(1, int(rep_ms * scale)), return_mode="median") * 1000.0
    else:

        def bench(fn, rep_ms=60):
            fn()
            ts = []
            for _ in range(3):
                t0 = time.perf_counter()
                fn()
                ts.append((time.perf_counter() - t0) * 1e6)
            return statistics.median(ts)
    return bench


def copy_len(nb):
    """Bytes the same-run copy baseline copies for a call that moves @p nb bytes: half of
    them (each byte is read and written), rounded up to a multiple of 16. torch's copy of a
    length that is not one ran at ~1.5 us instead of ~1.05 at T = 1 on the H200 (2026-12-05),
    a baseline slower than the copy it stands for."""
    return max((nb // 2 + 15) // 16 * 16, 16)


def header(**extra):
    """One JSON object naming the device and the versions (the first row of every output)."""
    import torch

    h = dict(kind="header", torch=torch.__version__)
    if torch.cuda.is_available():
        h["device"] = torch.cuda.get_device_name()
    else:
        h["device"] = "cpu"
    try:
        import triton

        h["triton"] = triton.__version__
    except ImportError:
        h["triton"] = None
    try:
        import megamoe

        h["megamoe"] = megamoe.__version__
        h["megamoe_file"] = megamoe.__file__
        h["megamoe_cuda"] = bool(megamoe.has_cuda_backend())
    except ImportError:
        h["megamoe"] = None
    h["commit"] = os.environ.get("MEGAMOE_COMMIT")
    h["rep_scale"] = rep_scale()
    h.update(extra)
    return h


class Rows:
    """Appends JSON rows to a file (flushed per row, so a run killed at its time limit keeps
    what it measured) and echoes each to stdout."""

    def __init__(self, path):
        self.path = path
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self.f = open(path, "a")
        else:
            self.f = None

    def write(self, row):
        line = json.dumps(row)
        print(line, flush=True)
        if self.f:
            self.f.write(line + "\n")
            self.f.flush()

    def close(self):
        if self.f:
            self.f.close()


def dry_run(plan, rows_path=None):
    """Print the configurations a run would measure (no torch, no GPU) and return 0."""
    n = 0
    for item in plan:
        print(json.dumps(dict(dry_run=True, **item)))
        n += 1
    print(json.dumps(dict(dry_run=True, configurations=n, out=rows_path)), file=sys.stderr)
    return 0
