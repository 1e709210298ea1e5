#!/usr/bin/env python3
"""Formats and full-buffer benchmark on one GPU, in one run (per call, CUDA-graph replays).

Part A (formats): megamoe staging for every activation format (MXFP8, FP8 fp32/128, MXFP4,
NVFP4 static, NVFP4 per-token), T from 1 to 65536, H 7168 and 4096, next to a same-run
device copy of the same number of bytes (read + written).

Part B (full buffer, symmetric-memory flavour): megamoe in full-buffer mode (tail of the
top-k buffers filled in the same launch) against megamoe staging alone, megamoe staging
plus a separate tail fill, a PyTorch eager rendering of vLLM's SM90 path (DeepGEMM-style
cast, then copies into the buffer and the tail fill), and a same-run copy of the same bytes.

    python3 bench/bench_formats.py --out /tmp/out [--quick]
Writes formats.jsonl and full_buffer.jsonl (one JSON row per configuration) to --out.
"""
import argparse
import json
import os
import sys

import torch
from triton.testing import do_bench_cudagraph

import megamoe

K = 8
FORMATS = {
    "mxfp8": megamoe.MXFP8,
    "fp8_fp32_g128": megamoe.FP8_FP32_G128,
    "mxfp4": megamoe.MXFP4,
    "nvfp4_static": megamoe.NVFP4_STATIC,
    "nvfp4_per_token": megamoe.NVFP4_PER_TOKEN,
}


def bench(fn, T):
    return do_bench_cudagraph(fn, rep=100 if T >= 16384 else 40, return_mode="median") * 1000.0


def inputs(T, H, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    hs = (torch.randn(T, H, device="cuda", generator=gen) * 17).bfloat16()
    ids = torch.randint(0, 256, (T, K), device="cuda", dtype=torch.int32, generator=gen)
    w = torch.rand(T, K, device="cuda", generator=gen)
    pad = torch.arange(T, device="cuda") % 5 == 4
    return hs, w, ids, pad


def alloc(T, H, scheme, rows=None):
    """Outputs from the public shape rule, with `rows` (>= T) rows for full-buffer mode."""
    rows = T if rows is None else rows
    o = megamoe.output_shapes(rows, H, K, scheme)
    dt = {"float8_e4m3fn": torch.uint8, "uint8": torch.uint8, "int32": torch.int32, "float32": torch.float32,
          "int64": torch.int64}
    t = lambda spec: torch.empty(*spec.shape, device="cuda", dtype=dt[spec.dtype])  # noqa: E731
    out = dict(xq=t(o.x_fp8), sf=t(o.x_sf), io=t(o.topk_idx_out), wo=t(o.topk_weights_out))
    out["x_scales"] = t(o.x_scales) if o.x_scales is not None else None
    out["global_scale"] = (torch.full((1,), 7.5, device="cuda") if o.global_scale is not None else None)
    return out


def nbytes(T, H, o):
    """Bytes a staging call moves: hidden (bf16) + ids/weights/padding in, outputs' T rows out."""
    rowb = lambda x: 0 if x is None else x[:T].numel() * x.element_size()  # noqa: E731
    return (T * H * 2 + T * K * (4 + 4) + T + rowb(o["xq"]) + rowb(o["sf"]) + rowb(o["io"]) + rowb(o["wo"])
            + rowb(o["x_scales"]))


def copy_us(nb, T):
    src = torch.empty(max(nb // 2, 1), device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    return bench(lambda: dst.copy_(src), T)


def stage_fn(hs, w, ids, pad, o, scheme, full=False, alpha=None):
    return lambda: megamoe.prepare_megamoe_inputs(
        hs, w, ids, o["xq"], o["sf"], o["io"], o["wo"], is_padding=pad, hidden_quant=scheme,
        global_scale=o["global_scale"], x_scales=o["x_scales"], full_buffer=full, routed_scaling_factor=alpha)


def part_formats(args, out):
    Ts = [1, 8, 64, 256, 1024, 4096, 16384, 65536] if not args.quick else [1, 64, 16384]
    for H in (7168, 4096):
        for name, scheme in FORMATS.items():
            for T in Ts:
                hs, w, ids, pad = inputs(T, H, T * 31 + H)
                o = alloc(T, H, scheme)
                f = stage_fn(hs, w, ids, pad, o, scheme)
                f()
                torch.cuda.synchronize()
                nb = nbytes(T, H, o)
                r = dict(part="formats", H=H, format=name, T=T, bytes=nb, megamoe_us=bench(f, T),
                         copy_us=copy_us(nb, T))
                r["megamoe_TBps"] = nb / r["megamoe_us"] * 1e-6
                r["copy_TBps"] = nb / r["copy_us"] * 1e-6
                r["frac_copy"] = r["copy_us"] / r["megamoe_us"]
                r["over_copy_us"] = r["megamoe_us"] - r["copy_us"]
                print(json.dumps(r), flush=True)
                out.write(json.dumps(r) + "\n")
                del hs, w, ids, pad, o
                torch.cuda.empty_cache()


def eager_sm90(hs, w, ids, pad, buf, T, alpha):
    """vLLM's SM90 path as eager PyTorch: DeepGEMM-style fp32 per-128 cast (amax floor 1e-10),
    then copies into the symmetric buffer and the tail fill."""
    H = hs.shape[1]
    x = hs.float().view(T, H // 128, 128)
    s = x.abs().amax(dim=2).clamp(min=1e-10) * (1.0 / 448.0)
    q = (x * (1.0 / s)[..., None]).to(torch.float8_e4m3fn).view(T, H)
    buf["xq"][:T].copy_(q.view(torch.uint8))
    buf["sf"][:T].copy_(s)
    buf["io"][:T].copy_(torch.where(pad[:, None], -1, ids.long()))
    buf["wo"][:T].copy_(torch.where(pad[:, None], 0.0, w * alpha))
    buf["io"][T:].fill_(-1)
    buf["wo"][T:].zero_()


def part_full_buffer(args, out):
    H = 7168
    scheme = megamoe.FP8_FP32_G128.with_amax_floor(1e-10)
    alpha = 1.5
    cases = [(T, M) for T in (1, 8, 64) for M in (256, 8192)] + [(T, 8192) for T in (256, 1024, 4096)]
    if args.quick:
        cases = [(1, 256), (64, 8192), (1024, 8192)]
    for T, M in cases:
        hs, w, ids, pad = inputs(T, H, T * 17 + M)
        full = alloc(T, H, scheme, rows=M)
        alone = alloc(T, H, scheme)
        sep = alloc(T, H, scheme, rows=M)
        eag = alloc(T, H, scheme, rows=M)
        f_full = stage_fn(hs, w, ids, pad, full, scheme, full=True, alpha=alpha)
        f_alone = stage_fn(hs, w, ids, pad, alone, scheme, alpha=alpha)
        sep_rows = {k: (v[:T] if v is not None and k not in ("global_scale",) else v) for k, v in sep.items()}
        f_sep_stage = stage_fn(hs, w, ids, pad, sep_rows, scheme, alpha=alpha)

        def f_sep():
            f_sep_stage()
            sep["io"][T:].fill_(-1)
            sep["wo"][T:].zero_()

        f_eager = lambda: eager_sm90(hs, w, ids, pad, eag, T, alpha)  # noqa: E731
        for f in (f_full, f_alone, f_sep, f_eager):
            f()
        torch.cuda.synchronize()
        same = all(torch.equal(full[k], sep[k]) for k in ("io", "wo")) and torch.equal(full["xq"][:T], sep["xq"][:T])
        nb = nbytes(T, H, alone) + (M - T) * K * 12
        r = dict(part="full_buffer", H=H, T=T, max_tokens=M, bytes=nb, full_us=bench(f_full, T),
                 alone_us=bench(f_alone, T), separate_fill_us=bench(f_sep, T), eager_sm90_us=bench(f_eager, T),
                 copy_us=copy_us(nb, T), full_equals_separate=same)
        r["full_over_alone_us"] = r["full_us"] - r["alone_us"]
        r["speedup_vs_eager"] = r["eager_sm90_us"] / r["full_us"]
        print(json.dumps(r), flush=True)
        out.write(json.dumps(r) + "\n")
        del hs, w, ids, pad, full, alone, sep, eag
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--parts", default="formats,full_buffer")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    print(json.dumps(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                          megamoe=megamoe.__version__)), flush=True)
    if "formats" in args.parts:
        with open(os.path.join(args.out, "formats.jsonl"), "w") as f:
            part_formats(args, f)
    if "full_buffer" in args.parts:
        with open(os.path.join(args.out, "full_buffer.jsonl"), "w") as f:
            part_full_buffer(args, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
