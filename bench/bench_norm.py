#!/usr/bin/env python3
"""RMSNorm + staging benchmark (issue #46) on one GPU, in one run (per call, CUDA-graph replays,
the median of several timings; bench/benchutil.py's timer).

For H in {4096, 7168}, T in {1, 16, 64, 256, 1024, 4096, 16384, 65536} and the schemes MXFP8
(fp8 e4m3, packed UE8M0 scales, G = 32) and fp8 with fp32 scales, G = 128, with and without a
residual, it times in the same run:
  unfused_us   torch.nn.functional.rms_norm(x, (H,), weight, eps) (with a residual: of x + r)
               then megamoe.prepare_megamoe_inputs of its rows: the unfused pair
  fused_y_us   megamoe.rmsnorm_and_stage writing y (and residual_out with a residual)
  fused_us     megamoe.rmsnorm_and_stage without y
  stage_us     megamoe.prepare_megamoe_inputs alone on a bf16 [T, H]
  copy_y_us    a device copy (torch copy_) moving the bytes fused_y moves: per element read 2
               (x), write 2 (y), write 1 (x_fp8), with a residual also read 2 and write 2; plus
               the scales, the top-k repack and the padding mask
  copy_us      the same for fused_us (no y)
and the ratios the issue's targets read: unfused / fused_y, unfused / fused, copy_y / fused_y,
copy / fused, fused_y - stage, fused - stage. Each case first checks that the fused call's staged
bytes equal prepare_megamoe_inputs of its own y (with or without y written) and, with a residual,
that residual_out is torch's x + r, and reports how many
of its y equal torch's rms_norm bitwise (the contract fixes its own rounding: docs/CONTRACT.md
"RMSNorm and stage").

    python3 bench/bench_norm.py --out DIR_OR_FILE.jsonl [--quick] [--T 1,64] [--H 7168]
                                [--schemes mxfp8,fp8_fp32_g128] [--residual off|on|both]
    python3 bench/bench_norm.py --dry-run           # the configurations (no torch needed)
    python3 bench/bench_norm.py --table ROWS.jsonl  # the markdown table of a run's rows
Writes one JSON row per case (card, torch version and megamoe commit in each: MEGAMOE_COMMIT,
else `git rev-parse HEAD`) to --out (a .jsonl file, or a directory that gets norm.jsonl) and
prints the markdown table at the end. Without torch, a CUDA device or megamoe's CUDA backend it
says so and exits 0, measuring nothing.
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchutil import Rows, copy_len, dry_run, header, timer  # noqa: E402

K = 8
EPS = 1e-6
TS = (1, 16, 64, 256, 1024, 4096, 16384, 65536)
QUICK_TS = (1, 64, 4096, 16384)
HS = (4096, 7168)
# The schemes: the name in the rows -> the megamoe attribute (python/megamoe/__init__.py).
SCHEMES = {"mxfp8": "MXFP8", "fp8_fp32_g128": "FP8_FP32_G128"}
RESIDUAL = {"off": (False,), "on": (True,), "both": (False, True)}
# Set by main(): torch and megamoe are imported only for a real run.
torch = megamoe = None
_bench = None


def ints(text):
    return [int(v) for v in text.split(",")]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".", help="a .jsonl file, or a directory that gets norm.jsonl (default .)")
    ap.add_argument("--quick", action="store_true", help=f"T in {{{', '.join(map(str, QUICK_TS))}}}")
    ap.add_argument("--T", type=ints, default=None, help="token counts, comma-separated (default: the grid)")
    ap.add_argument("--H", type=ints, default=None, help="hidden sizes, comma-separated (default 4096,7168)")
    ap.add_argument("--schemes", default=",".join(SCHEMES), help=f"comma-separated, of {', '.join(SCHEMES)}")
    ap.add_argument("--residual", choices=sorted(RESIDUAL), default="both",
                    help="without a residual, with one (fused_add_rms_norm), or both (default)")
    ap.add_argument("--dry-run", action="store_true", help="list the configurations and exit (no torch)")
    ap.add_argument("--table", metavar="ROWS.jsonl", help="print the markdown table of a run's rows and exit")
    args = ap.parse_args(argv)
    if args.T is not None and (not args.T or min(args.T) < 1):
        ap.error("--T: positive token counts")
    if args.H is not None and (not args.H or any(h < 128 or h % 128 for h in args.H)):
        ap.error("--H: positive multiples of 128")
    args.schemes = args.schemes.split(",")
    for s in args.schemes:
        if s not in SCHEMES:
            ap.error(f"--schemes: {s!r} is none of {sorted(SCHEMES)}")
    if args.T is None:
        args.T = list(QUICK_TS if args.quick else TS)
    if args.H is None:
        args.H = list(HS)
    return args


def out_path(out):
    """--out: a .jsonl file as given, else the directory's norm.jsonl."""
    return out if out.endswith(".jsonl") else os.path.join(out, "norm.jsonl")


def plan(args):
    for H in args.H:
        for scheme in args.schemes:
            for residual in RESIDUAL[args.residual]:
                for T in args.T:
                    yield dict(H=H, scheme=scheme, residual=residual, T=T)


def elem_bytes(residual, with_y):
    """Bytes per element the fused call moves: x read (2), x_fp8 written (1), y written (2)
    with y; a residual adds its read (2) and residual_out's write (2)."""
    return 2 + 1 + (2 if with_y else 0) + (4 if residual else 0)


def fused_bytes(T, H, scheme, residual, with_y):
    """Bytes one fused call moves: elem_bytes per element, the weight (bf16), the scales
    (MXFP8: a byte per 32 elements; fp32 G=128: 4 bytes per 128), the top-k repack (ids and
    weights in, 4 + 4 bytes; out, 8 + 4) and the padding mask (a byte a token)."""
    sf = T * H // 32 if scheme == "mxfp8" else T * (H // 128) * 4
    return T * H * elem_bytes(residual, with_y) + H * 2 + sf + T * K * (4 + 4 + 8 + 4) + T


def commit():
    """MEGAMOE_COMMIT, else the tree's `git rev-parse HEAD`, else None (a device copy of the
    tree has no trustworthy history: scripts/device.sh passes the commit in)."""
    if os.environ.get("MEGAMOE_COMMIT"):
        return os.environ["MEGAMOE_COMMIT"]
    try:
        p = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                           cwd=os.path.dirname(os.path.abspath(__file__)))
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip() if p.returncode == 0 and p.stdout.strip() else None


COLUMNS = [  # (heading, row key, format)
    ("H", "H", "{}"), ("scheme", "scheme", "{}"), ("residual", "residual", "{}"), ("T", "T", "{}"),
    ("unfused us", "unfused_us", "{:.2f}"), ("fused+y us", "fused_y_us", "{:.2f}"), ("fused us", "fused_us", "{:.2f}"),
    ("stage us", "stage_us", "{:.2f}"), ("copy+y us", "copy_y_us", "{:.2f}"), ("copy us", "copy_us", "{:.2f}"),
    ("unfused / fused+y", "unfused_over_fused_y", "{:.2f}x"), ("unfused / fused", "unfused_over_fused", "{:.2f}x"),
    ("copy+y / fused+y", "copy_y_over_fused_y", "{:.0%}"), ("copy / fused", "copy_over_fused", "{:.0%}"),
    ("fused+y - stage us", "fused_y_minus_stage_us", "{:+.2f}"),
    ("fused - stage us", "fused_minus_stage_us", "{:+.2f}"),
    ("bytes equal", "staged_equal", "{}"),
]


def cell(row, key, form):
    v = row.get(key)
    if v is None:
        return "-"
    if isinstance(v, bool):  # a failed check in capitals
        return "yes" if v else "no" if key == "residual" else "NO"
    return form.format(v)


def markdown(rows):
    """The markdown table of the case rows (kind "norm") of @p rows, in their order; the card,
    torch and commit of the first above it."""
    rows = [r for r in rows if r.get("kind") == "norm"]
    if not rows:
        return "(no rows)"
    r0 = rows[0]
    out = [f"{r0.get('card')}, torch {r0.get('torch')}, megamoe {r0.get('commit') or 'commit unknown'}", "",
           "| " + " | ".join(c[0] for c in COLUMNS) + " |",
           "|" + "|".join("---" if c[1] in ("scheme", "residual") else "---:" for c in COLUMNS) + "|"]
    for r in rows:
        out.append("| " + " | ".join(cell(r, key, form) for _, key, form in COLUMNS) + " |")
    return "\n".join(out)


def finish(r):
    """The ratios and rates of a row of times."""
    r["unfused_over_fused_y"] = r["unfused_us"] / r["fused_y_us"]
    r["unfused_over_fused"] = r["unfused_us"] / r["fused_us"]
    r["copy_y_over_fused_y"] = r["copy_y_us"] / r["fused_y_us"]
    r["copy_over_fused"] = r["copy_us"] / r["fused_us"]
    r["fused_y_minus_stage_us"] = r["fused_y_us"] - r["stage_us"]
    r["fused_minus_stage_us"] = r["fused_us"] - r["stage_us"]
    r["fused_y_TBps"] = r["bytes_y"] / r["fused_y_us"] * 1e-6
    r["fused_TBps"] = r["bytes"] / r["fused_us"] * 1e-6
    return r


def no_cuda_reason():
    """Why nothing can be measured here (None when a run can go ahead); imports torch and
    megamoe into the module's globals."""
    global torch, megamoe
    try:
        import torch as _torch
    except ImportError:
        return "torch is not installed"
    torch = _torch
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    try:
        import megamoe as _megamoe
    except ImportError as e:
        return f"megamoe is not importable ({e})"
    megamoe = _megamoe
    if not megamoe.has_cuda_backend():
        return "this megamoe build has no CUDA backend"
    if not hasattr(megamoe, "rmsnorm_and_stage"):
        return "this megamoe build has no rmsnorm_and_stage"
    return None


def bench(fn, T):
    return _bench(fn, 100 if T >= 16384 else 40)


def outputs(T, H, scheme):
    """Staged outputs from the public shape rule (fp8 as uint8 bytes)."""
    o = megamoe.output_shapes(T, H, K, scheme)
    dt = dict(float8_e4m3fn=torch.uint8, int32=torch.int32, float32=torch.float32, int64=torch.int64)
    return [torch.empty(*spec.shape, device="cuda", dtype=dt[spec.dtype])
            for spec in (o.x_fp8, o.x_sf, o.topk_idx_out, o.topk_weights_out)]


def run_case(c, cfg):
    """Check, then time, one case; the row."""
    H, T, residual, name = cfg["H"], cfg["T"], cfg["residual"], cfg["scheme"]
    scheme = getattr(megamoe, SCHEMES[name])
    gen = torch.Generator(device="cuda").manual_seed(T * 31 + H + residual)
    x = (torch.randn(T, H, device="cuda", generator=gen) * 17).bfloat16()
    r = (torch.randn(T, H, device="cuda", generator=gen) * 17).bfloat16() if residual else None
    w = (torch.rand(H, device="cuda", generator=gen) + 0.5).bfloat16()
    ids = torch.randint(0, 256, (T, K), device="cuda", dtype=torch.int32, generator=gen)
    tw = torch.rand(T, K, device="cuda", generator=gen)
    pad = torch.arange(T, device="cuda") % 5 == 4
    y, ro, z = torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)
    o_fy, o_f, o_u, o_s, o_chk = (outputs(T, H, scheme) for _ in range(5))

    def stage(rows, o):
        megamoe.prepare_megamoe_inputs(rows, tw, ids, *o, is_padding=pad, hidden_quant=scheme)

    def unfused():
        if residual:
            torch.add(x, r, out=z)
            stage(torch.nn.functional.rms_norm(z, (H,), w, EPS), o_u)
        else:
            stage(torch.nn.functional.rms_norm(x, (H,), w, EPS), o_u)

    def fused(with_y, o):
        return lambda: megamoe.rmsnorm_and_stage(x, r, w, tw, ids, *o, is_padding=pad, hidden_quant=scheme, eps=EPS,
                                                 y=y if with_y else None, residual_out=ro if residual else None)

    fused_y, fused_no_y = fused(True, o_fy), fused(False, o_f)
    # Checks: the staged bytes of both fused forms equal prepare_megamoe_inputs of the fused y.
    fused_y()
    fused_no_y()
    stage(y, o_chk)
    torch.cuda.synchronize()
    equal = all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(o_fy, o_f, o_chk))
    ro_equal = None
    if residual:
        torch.add(x, r, out=z)
        ro_equal = torch.equal(ro, z)  # bf16(x + r), rounded once in both
    ref = torch.nn.functional.rms_norm(z if residual else x, (H,), w, EPS)
    y_torch_equal = (y.view(torch.int16) == ref.view(torch.int16)).float().mean().item()
    y_torch_max_abs_diff = (y.float() - ref.float()).abs().max().item()
    del ref
    nb_y = fused_bytes(T, H, name, residual, True)
    nb = fused_bytes(T, H, name, residual, False)
    copies = {}
    for key, n in (("copy_y_us", nb_y), ("copy_us", nb)):
        src = torch.empty(copy_len(n), device="cuda", dtype=torch.uint8)
        dst = torch.empty_like(src)
        copies[key] = bench(lambda dst=dst, src=src: dst.copy_(src), T)
        del src, dst
    row = dict(kind="norm", **cfg, eps=EPS, bytes_y=nb_y, bytes=nb, unfused_us=bench(unfused, T),
               fused_y_us=bench(fused_y, T), fused_us=bench(fused_no_y, T), stage_us=bench(lambda: stage(x, o_s), T),
               **copies, staged_equal=equal, residual_out_equal=ro_equal, y_torch_equal_share=y_torch_equal,
               y_torch_max_abs_diff=y_torch_max_abs_diff, **c)
    return finish(row)


def main(argv=None):
    global _bench
    args = parse_args(argv)
    if args.table:
        with open(args.table) as f:
            print(markdown([json.loads(line) for line in f if line.strip()]))
        return 0
    if args.dry_run:
        return dry_run(plan(args), out_path(args.out))
    why = no_cuda_reason()
    if why is not None:
        print(f"bench_norm.py: {why}; nothing measured (this benchmark runs on a CUDA GPU)", file=sys.stderr)
        return 0
    _bench = timer("cuda")
    card = dict(card=torch.cuda.get_device_name(), torch=torch.__version__, commit=commit())
    rows = Rows(out_path(args.out))
    rows.write(header(**card))
    done, bad = [], 0
    for cfg in plan(args):
        row = run_case(card, cfg)
        rows.write(row)
        done.append(row)
        bad += not row["staged_equal"] or row["residual_out_equal"] is False
        torch.cuda.empty_cache()
    rows.write(dict(kind="summary", rows=len(done), rows_failing_checks=bad))
    rows.close()
    print(markdown(done), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
