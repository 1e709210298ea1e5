#!/usr/bin/env python3
"""Side-by-side staging benchmark on one GPU, in one run (per call, CUDA-graph replays):
megamoe, the Triton kernel in the reference design (bench/triton_reference.py), the eager
PyTorch composition, and a device memcpy of the same byte count (the roofline); plus an
empty kernel and Python host overhead. Writes bench.json, bench.md and bench.png to --out
(tables and plot by bench/perfdoc.py, which also rebuilds them from a saved bench.json).

    python3 bench/bench_stage.py --out /tmp/out [--quick] [--update-doc docs/PERFORMANCE.md]
"""
import argparse
import json
import os
import sys
import time

import torch
import triton
from triton.testing import do_bench_cudagraph

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megamoe  # noqa: E402
from perfdoc import markdown, plot, update_doc  # noqa: E402
from triton_reference import stage_triton  # noqa: E402

K = 8
SCHEMES = {"mxfp8": (32, True, megamoe.MXFP8), "fp32-g128": (128, False, megamoe.FP8_FP32_G128)}


@triton.jit
def _empty_kernel(x):
    pass


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


def make(T, H, scheme, dev="cuda"):
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
    return do_bench_cudagraph(fn, rep=200 if T >= 16384 else 60, return_mode="median") * 1000.0


def run(args):
    dev = torch.cuda.get_device_name()
    rows = []
    empty_buf = torch.empty(1, device="cuda")
    empty_us = bench(lambda: _empty_kernel[(1,)](empty_buf), 1)
    Ts = [1, 8, 64, 256, 1024, 2048, 4096, 16384, 65536]
    if args.quick:
        Ts = [1, 64, 1024, 16384]
    for H in (7168, 4096):
        for scheme in SCHEMES:
            g, ue, hq = SCHEMES[scheme]
            for T in Ts:
                hs, w, ids, pad, outs = make(T, H, scheme)
                om, ot, oe = outs(), outs(), outs()
                f_m = lambda: megamoe.prepare_megamoe_inputs(hs, w, ids, *om, is_padding=pad, hidden_quant=hq)
                f_t = lambda: stage_triton(hs, w, ids, *ot, is_padding=pad, group_k=g, ue8m0=ue)
                f_e = lambda: eager_stage(hs, w, ids, pad, *oe, g, ue)
                f_m(), f_t(), f_e()
                torch.cuda.synchronize()
                match_eager = all(torch.equal(a, b) for a, b in zip(om, oe))
                match_triton = all(torch.equal(a, b) for a, b in zip(om, ot))
                nb = nbytes(T, H, scheme)
                src = torch.empty(nb // 2, device="cuda", dtype=torch.uint8)
                dst = torch.empty_like(src)
                r = dict(H=H, scheme=scheme, T=T, bytes=nb,
                         megamoe_us=bench(f_m, T), triton_us=bench(f_t, T),
                         eager_us=bench(f_e, T) if T <= 16384 or not args.quick else None,
                         memcpy_us=bench(lambda: dst.copy_(src), T),
                         match_eager=match_eager, match_triton=match_triton)
                r["megamoe_TBps"] = nb / r["megamoe_us"] * 1e-6
                r["memcpy_TBps"] = nb / r["memcpy_us"] * 1e-6
                r["frac_memcpy"] = r["memcpy_us"] / r["megamoe_us"]
                r["speedup_vs_triton"] = r["triton_us"] / r["megamoe_us"]
                rows.append(r)
                print(json.dumps(r), flush=True)
                with open(os.path.join(args.out, "bench_rows.jsonl"), "a") as f:
                    f.write(json.dumps(r) + "\n")
                del hs, w, ids, pad, om, ot, oe, src, dst
                torch.cuda.empty_cache()
    host = host_overhead()
    return dict(device=dev, torch=torch.__version__, triton=triton.__version__,
                empty_kernel_us=empty_us, rows=rows, host_overhead_us=host)


def host_overhead(n=3000):
    """Python-side microseconds per call (no graph, T = 1, H = 7168): wall time of n calls."""
    hs, w, ids, pad, outs = make(1, 7168, "mxfp8")
    o = outs()
    fns = {
        "megamoe.prepare_megamoe_inputs": lambda: megamoe.prepare_megamoe_inputs(hs, w, ids, *o, is_padding=pad),
        "triton launch (reference design)": lambda: stage_triton(hs, w, ids, *o, is_padding=pad),
    }
    op = getattr(getattr(torch.ops, "megamoe", None), "prepare_inputs", None)
    if op is not None:
        from megamoe._torch import _op_scheme_args
        sargs = _op_scheme_args(megamoe.MXFP8)
        fns["torch.ops.megamoe.prepare_inputs (custom op)"] = lambda: op(
            hs, w, ids, *o, pad, None, None, *sargs, False)
    res = {}
    for name, f in fns.items():
        for _ in range(200):
            f()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        res[name] = (t1 - t0) / n * 1e6
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--update-doc", metavar="MD", help="also splice the tables into MD (e.g. docs/PERFORMANCE.md) "
                    "between its bench_stage markers")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    res = run(args)
    with open(os.path.join(args.out, "bench.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = markdown(res)
    with open(os.path.join(args.out, "bench.md"), "w") as f:
        f.write(md)
    plot(res, os.path.join(args.out, "bench.png"))
    if args.update_doc:
        update_doc(args.update_doc, md)
    print(md)


if __name__ == "__main__":
    main()
