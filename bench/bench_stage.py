#!/usr/bin/env python3
"""Side-by-side staging benchmark on one GPU, in one run (per call, CUDA-graph replays):
megamoe, the Triton kernel in the reference design (bench/triton_reference.py), the eager
PyTorch composition, and a device memcpy of the same byte count (the roofline); plus an
empty kernel and Python host overhead. Writes bench.json, bench.md and bench.png to --out
(tables and plot by bench/perfdoc.py, which also rebuilds them from a saved bench.json).

    python3 bench/bench_stage.py --out /tmp/out [--quick] [--update-doc docs/PERFORMANCE.md]
    python3 bench/bench_stage.py --out DIR --only megamoe --json NAME.json   # megamoe rows
        only (the A/B of two builds, bench/ab_compare.py); no plot, no tables
    python3 bench/bench_stage.py --dry-run | --cpu-check   # configurations / checks on the CPU
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchutil import copy_len, dry_run, timer  # noqa: E402
from perfdoc import markdown, plot, update_doc  # noqa: E402

K = 8
SCHEME_NAMES = {"mxfp8": (32, True, "MXFP8"), "fp32-g128": (128, False, "FP8_FP32_G128")}
# Set by main(): torch, triton and megamoe are imported only for a real or CPU-check run.
torch = triton = megamoe = stage_triton = None
SCHEMES = {}
DEV = "cuda"
_bench = None
_empty_kernel = None


def _define_empty_kernel():
    global _empty_kernel

    @triton.jit
    def _empty(x):
        pass

    _empty_kernel = _empty


def eager_stage(hs, w, ids, pad, xq, sf, io, wo, group_k, ue8m0):
    """Eager PyTorch composition: DeepGEMM-style per_token_cast_to_fp8 + top-k copies."""
    T, H = hs.shape
    x = hs.float().view(T, H // group_k, group_k)
    s = x.abs().amax(dim=2).clamp(min=1e-4) * (1.0 / 448.0)
    if ue8m0:
        b = s.view(torch.int32)
        e = (((b >> 23) & 0xFF) + ((b & 0x7FFFFF) != 0).int()).clamp(1, 254)
        scale = (e << 23).view(torch.float32)
        shifts = torch.arange(0, 32, 8, device=hs.device, dtype=torch.int64)
        sf.copy_((e.view(T, -1, 4).long() << shifts).sum(-1).to(torch.int32))
    else:
        scale = s
        sf.copy_(s)
    xq.copy_((x * (1.0 / scale)[..., None]).to(torch.float8_e4m3fn).view(T, H).view(torch.uint8))
    io.copy_(torch.where(pad[:, None], -1, ids.long()))
    wo.copy_(torch.where(pad[:, None], 0.0, w))


def make(T, H, scheme, dev=None):
    dev = dev or DEV
    g, ue, _ = SCHEMES[scheme]
    gen = torch.Generator(device=dev).manual_seed(T * 7 + H)
    hs = (torch.randn(T, H, device=dev, generator=gen) * 17).bfloat16()
    ids = torch.randint(0, 256, (T, K), device=dev, dtype=torch.int32, generator=gen)
    w = torch.rand(T, K, device=dev, generator=gen)
    pad = torch.arange(T, device=dev) % 5 == 4
    sfc = H // (4 * g) if ue else H // g

    def outs():
        return (torch.empty(T, H, device=dev, dtype=torch.uint8),
                torch.empty(T, sfc, device=dev, dtype=torch.int32 if ue else torch.float32),
                torch.empty(T, K, device=dev, dtype=torch.int64),
                torch.empty(T, K, device=dev, dtype=torch.float32))
    return hs, w, ids, pad, outs


def nbytes(T, H, scheme):
    g, ue, _ = SCHEMES[scheme]
    sf = T * (H // (4 * g) if ue else H // g) * 4
    return T * H * 2 + T * H + sf + T * K * (4 + 4 + 8 + 4) + T


def bench(fn, T):
    return _bench(fn, 200 if T >= 16384 else 60)


def grid(args):
    Ts = [1, 8, 64, 256, 1024, 2048, 4096, 16384, 65536]
    if args.quick:
        Ts = [1, 64, 1024, 16384]
    Hs = (7168, 4096)
    if args.cpu_check:
        Ts, Hs = [1, 5, 64], (256,)
    return Ts, Hs


def run(args):
    dev = torch.cuda.get_device_name() if DEV == "cuda" else "cpu"
    rows = []
    megamoe_only = args.only == "megamoe"
    with_triton = not megamoe_only and stage_triton is not None
    empty_us = None
    if with_triton and DEV == "cuda":
        empty_buf = torch.empty(1, device=DEV)
        empty_us = bench(lambda: _empty_kernel[(1,)](empty_buf), 1)
    Ts, Hs = grid(args)
    for H in Hs:
        for scheme in SCHEMES:
            g, ue, hq = SCHEMES[scheme]
            for T in Ts:
                hs, w, ids, pad, outs = make(T, H, scheme)
                om, ot, oe = outs(), outs(), outs()
                f_m = lambda: megamoe.prepare_megamoe_inputs(hs, w, ids, *om, is_padding=pad, hidden_quant=hq)
                f_t = lambda: stage_triton(hs, w, ids, *ot, is_padding=pad, group_k=g, ue8m0=ue)
                f_e = lambda: eager_stage(hs, w, ids, pad, *oe, g, ue)
                f_m()
                if not megamoe_only:
                    f_e()
                if with_triton:
                    f_t()
                sync()
                match_eager = None if megamoe_only else all(torch.equal(a, b) for a, b in zip(om, oe))
                match_triton = all(torch.equal(a, b) for a, b in zip(om, ot)) if with_triton else None
                nb = nbytes(T, H, scheme)
                src = torch.empty(copy_len(nb), device=DEV, dtype=torch.uint8)
                dst = torch.empty_like(src)
                timing = not args.cpu_check
                r = dict(H=H, scheme=scheme, T=T, bytes=nb, label=args.label,
                         megamoe_us=bench(f_m, T) if timing else None,
                         triton_us=bench(f_t, T) if timing and with_triton else None,
                         eager_us=bench(f_e, T) if timing and not megamoe_only and (T <= 16384 or not args.quick)
                         else None,
                         memcpy_us=bench(lambda: dst.copy_(src), T) if timing and not megamoe_only else None,
                         match_eager=match_eager, match_triton=match_triton)
                if args.cpu_check and with_triton:
                    # Triton's interpreter converts fp32 to e4m3 off by one code on some
                    # inputs; only the compiled kernel's comparison is a check.
                    r["match_triton_interpreter"] = r.pop("match_triton")
                if timing:
                    r["megamoe_TBps"] = nb / r["megamoe_us"] * 1e-6
                if r["memcpy_us"] is not None:
                    r["memcpy_TBps"] = nb / r["memcpy_us"] * 1e-6
                    r["frac_memcpy"] = r["memcpy_us"] / r["megamoe_us"]
                    if r["triton_us"] is not None:
                        r["speedup_vs_triton"] = r["triton_us"] / r["megamoe_us"]
                rows.append(r)
                print(json.dumps(r), flush=True)
                if not args.cpu_check:
                    with open(os.path.join(args.out, args.rows_file), "a") as f:
                        f.write(json.dumps(r) + "\n")
                del hs, w, ids, pad, om, ot, oe, src, dst
                if DEV == "cuda":
                    torch.cuda.empty_cache()
    host = host_overhead(n=3000 if not args.cpu_check else 20) if not megamoe_only else {}
    return dict(device=dev, torch=torch.__version__, triton=getattr(triton, "__version__", None),
                megamoe=megamoe.__version__, megamoe_file=megamoe.__file__, label=args.label,
                commit=os.environ.get("MEGAMOE_COMMIT"), empty_kernel_us=empty_us, rows=rows,
                host_overhead_us=host)


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def host_overhead(n=3000):
    """Python-side microseconds per call (no graph, T = 1, H = 7168): wall time of n calls."""
    hs, w, ids, pad, outs = make(1, 7168, "mxfp8")
    o = outs()
    fns = {
        "megamoe.prepare_megamoe_inputs": lambda: megamoe.prepare_megamoe_inputs(hs, w, ids, *o, is_padding=pad),
    }
    if stage_triton is not None:
        fns["triton launch (reference design)"] = lambda: stage_triton(hs, w, ids, *o, is_padding=pad)
    op = getattr(getattr(torch.ops, "megamoe", None), "prepare_inputs", None)
    if op is not None:
        from megamoe._signature import PREPARE
        from megamoe._torch import _op_scheme_args

        # The op's arguments from the one argument table (its schema grows with the API).
        given = dict(zip(("hidden_states", "topk_weights", "topk_ids", "x_fp8", "x_sf", "topk_idx_out",
                          "topk_weights_out", "is_padding"), (hs, w, ids, *o, pad)))
        given["hidden_quant"] = megamoe.MXFP8
        op_args = PREPARE.op_values([given.get(p.name, p.default) for p in PREPARE.params], _op_scheme_args)
        fns["torch.ops.megamoe.prepare_inputs (custom op)"] = lambda: op(*op_args)
    res = {}
    for name, f in fns.items():
        for _ in range(min(200, n)):
            f()
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        t1 = time.perf_counter()
        sync()
        res[name] = (t1 - t0) / n * 1e6
    return res


def main(argv=None):
    global torch, triton, megamoe, stage_triton, SCHEMES, DEV, _bench
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--update-doc", metavar="MD", help="also splice the tables into MD (e.g. docs/PERFORMANCE.md) "
                    "between its bench_stage markers")
    ap.add_argument("--only", choices=("all", "megamoe"), default="all",
                    help="megamoe: megamoe rows only (the A/B of two builds)")
    ap.add_argument("--json", default="bench.json", help="name of the results file in --out")
    ap.add_argument("--rows-file", default="bench_rows.jsonl", help="name of the per-row JSON lines in --out")
    ap.add_argument("--label", default=None, help="recorded in every row (e.g. 'this' / 'base' in an A/B)")
    ap.add_argument("--dry-run", action="store_true", help="list the configurations and exit (no torch)")
    ap.add_argument("--cpu-check", action="store_true",
                    help="the bit-exactness checks on the CPU backend at small sizes (no figures)")
    args = ap.parse_args(argv)
    if args.dry_run:
        Ts, Hs = grid(args)
        return dry_run((dict(H=H, scheme=sc, T=Ts, only=args.only) for H in Hs for sc in SCHEME_NAMES),
                       os.path.join(args.out, args.json))
    import torch as _torch

    import megamoe as _megamoe
    torch, megamoe = _torch, _megamoe
    DEV = "cpu" if args.cpu_check else "cuda"
    SCHEMES = {k: (g, ue, getattr(megamoe, attr)) for k, (g, ue, attr) in SCHEME_NAMES.items()}
    try:
        import triton as _triton
        triton = _triton
        if args.only != "megamoe" and (DEV == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"):
            from triton_reference import stage_triton as _st
            stage_triton = _st
            _define_empty_kernel()
    except ImportError:
        if DEV == "cuda" and args.only != "megamoe":
            raise
    _bench = timer(DEV)
    os.makedirs(args.out, exist_ok=True)
    res = run(args)
    if args.cpu_check:
        bad = [r for r in res["rows"] if r["match_eager"] is False or r.get("match_triton") is False]
        print(json.dumps(dict(kind="summary", rows=len(res["rows"]), rows_failing_checks=len(bad))))
        return 1 if bad else 0
    with open(os.path.join(args.out, args.json), "w") as f:
        json.dump(res, f, indent=1)
    if args.only == "megamoe":
        return 0
    md = markdown(res)
    with open(os.path.join(args.out, "bench.md"), "w") as f:
        f.write(md)
    plot(res, os.path.join(args.out, "bench.png"))
    if args.update_doc:
        update_doc(args.update_doc, md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
