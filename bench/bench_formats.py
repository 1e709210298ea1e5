#!/usr/bin/env python3
"""Formats and full-buffer benchmark on one GPU, in one run (per call, CUDA-graph replays).

Part A (formats): megamoe staging for every activation format (MXFP8, FP8 fp32/128, MXFP4,
NVFP4 static, NVFP4 per-token), T from 1 to 65536, H 7168 and 4096, next to a same-run
device copy of the same number of bytes (read + written).

Part B (full_buffer, symmetric-memory flavour): megamoe in full-buffer mode (tail of the
top-k buffers filled in the same launch) against megamoe staging alone, megamoe staging
plus a separate tail fill, a PyTorch eager rendering of vLLM's SM90 path (DeepGEMM-style
cast, then copies into the buffer and the tail fill), and a same-run copy of the same bytes.

Part C (nonfinite): the cost of the non-finite counter (nonfinite_count given) against
the same call without it, same run, measured off / on / off / on (the two offs give the
noise), per format and T; each after a check that the counter counts planted NaN / Inf.

Part D (deepgemm, opt-in: --parts deepgemm): full-buffer fills of DeepGEMM's SM90 FP8
MegaMoE buffer (megamoe.buffers.alloc_deepgemm_buffer "sm90_fp8", one rank, 256 experts,
16384 tokens per rank, top-k 8, H 7168, IH 2048; about 3.7 GB, twice), T from 1 to 16384:
prepare_megamoe_inputs(hs, w, ids, **buf.outputs(T)) (x / x_sf rows [0, T) and every row of
the top-k views, the tail -1 / 0 up to the aligned T, in one launch) next to a same-run copy
of the same bytes and the eager PyTorch rendering of the same fill (DeepGEMM-style fp32 per-128
cast with the 1e-10 floor, copies into a second buffer's views, the tail fill), after a check
that megamoe's bytes equal the eager rendering's in the input views.

Part E (online, opt-in: --parts online): NVFP4 with an online global scale, T in {1, 16, 64,
1024, 16384}, H 7168 and 4096, four timings of the same run:
  online_us        megamoe NVFP4_ONLINE: gs = fl(max(A, 2^-100) / 2688) of the whole [T, H]
                   tensor into global_scale, then NVFP4 static's staging under it (an amax
                   launch and the staging launch; a memset node before them where several
                   blocks accumulate gs)
  three_launch_us  FlashInfer's online design (a scale slot seeded, the amax reduced into it,
                   then the quant launch reading it) in PyTorch eager: torch.amax(x.abs()),
                   gs from it (torch.maximum, torch.div by a device 2688), then megamoe's
                   NVFP4_STATIC staging with that gs tensor (five launches)
  static_us        megamoe NVFP4_STATIC alone with a fixed gs (online's floor: no amax pass)
  copy_us          the same-run copy of the staging call's bytes (as part A's nvfp4_static)
and the ratios three_launch / online, online / static, copy / online. Each case first checks
that online and the three-launch rendering write identical bytes (x_q, x_sf, and
global_scale against the rendering's gs) and that static under that gs writes them too; a
case failing it is not timed, is reported on stderr, and the run exits 1. The part's
markdown table is printed at its end (--table renders it again from online.jsonl).

    python3 bench/bench_formats.py --out /tmp/out [--quick] [--parts formats,full_buffer,nonfinite,deepgemm,online]
    python3 bench/bench_formats.py --dry-run      # the configurations (no torch needed)
    python3 bench/bench_formats.py --cpu-check    # every check on the CPU backend, small sizes, no figures
    python3 bench/bench_formats.py --table ROWS.jsonl   # the online part's markdown table of a run's rows
Writes formats.jsonl, full_buffer.jsonl, nonfinite.jsonl, deepgemm.jsonl and online.jsonl (one
JSON row per configuration) to --out. The default parts are formats, full_buffer and
nonfinite. Without torch, a CUDA device or megamoe's CUDA backend (and without --cpu-check)
it says so and exits 0, measuring nothing.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchutil import Rows, copy_len, dry_run, header, timer  # noqa: E402

K = 8
FORMAT_NAMES = ("mxfp8", "fp8_fp32_g128", "mxfp4", "nvfp4_static", "nvfp4_per_token")
# Formats --formats also takes, outside the default set: bf16 pass-through (the copy kernel,
# whose target is the copy rate at T >= 16384).
OPTIONAL_FORMATS = ("bf16",)
# Set by main(): torch and megamoe are imported only for a real or CPU-check run.
torch = megamoe = None
DEV = "cuda"
FORMATS = {}
_bench = None


def bench(fn, T):
    return _bench(fn, 100 if T >= 16384 else 40)


def inputs(T, H, seed):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    hs = (torch.randn(T, H, device=DEV, generator=gen) * 17).bfloat16()
    ids = torch.randint(0, 256, (T, K), device=DEV, dtype=torch.int32, generator=gen)
    w = torch.rand(T, K, device=DEV, generator=gen)
    pad = torch.arange(T, device=DEV) % 5 == 4
    return hs, w, ids, pad


def alloc(T, H, scheme, rows=None):
    """Outputs from the public shape rule, with `rows` (>= T) rows for full-buffer mode."""
    rows = T if rows is None else rows
    o = megamoe.output_shapes(rows, H, K, scheme)
    dt = {"float8_e4m3fn": torch.uint8, "uint8": torch.uint8, "int32": torch.int32, "float32": torch.float32,
          "int64": torch.int64, "bfloat16": torch.bfloat16}
    t = lambda spec: torch.empty(*spec.shape, device=DEV, dtype=dt[spec.dtype])  # noqa: E731
    out = dict(xq=t(o.x_fp8), sf=t(o.x_sf), io=t(o.topk_idx_out), wo=t(o.topk_weights_out))
    out["x_scales"] = t(o.x_scales) if o.x_scales is not None else None
    out["global_scale"] = (torch.full((1,), 7.5, device=DEV) if o.global_scale is not None else None)
    return out


def nbytes(T, H, o):
    """Bytes a staging call moves: hidden (bf16) + ids/weights/padding in, outputs' T rows out."""
    rowb = lambda x: 0 if x is None else x[:T].numel() * x.element_size()  # noqa: E731
    return (T * H * 2 + T * K * (4 + 4) + T + rowb(o["xq"]) + rowb(o["sf"]) + rowb(o["io"]) + rowb(o["wo"])
            + rowb(o["x_scales"]))


def copy_us(nb, T):
    src = torch.empty(copy_len(nb), device=DEV, dtype=torch.uint8)
    dst = torch.empty_like(src)
    return bench(lambda: dst.copy_(src), T)


def stage_fn(hs, w, ids, pad, o, scheme, full=False, alpha=None, counter=None):
    return lambda: megamoe.prepare_megamoe_inputs(
        hs, w, ids, o["xq"], o["sf"], o["io"], o["wo"], is_padding=pad, hidden_quant=scheme,
        global_scale=o["global_scale"], x_scales=o["x_scales"], full_buffer=full, routed_scaling_factor=alpha,
        nonfinite_count=counter)


def sizes(args, part):
    """(Ts, Hs) of a part: the full grid, --quick, or the CPU check's small sizes."""
    if args.cpu_check:
        return [1, 5], [256]
    if args.T:
        return args.T, [7168, 4096] if part in ("formats", "online") else [7168]
    if part == "formats":
        return ([1, 64, 16384] if args.quick else [1, 8, 64, 256, 1024, 4096, 16384, 65536]), [7168, 4096]
    if part == "nonfinite":
        return ([1, 1024, 16384] if args.quick else [1, 64, 1024, 16384, 65536]), [7168]
    if part == "deepgemm":
        return ([1, 256, 16384] if args.quick else [1, 8, 64, 256, 1024, 4096, 16384]), [7168]
    if part == "online":
        return ([1, 64, 16384] if args.quick else [1, 16, 64, 1024, 16384]), [7168, 4096]
    raise ValueError(part)


def part_formats(args, out):
    Ts, Hs = sizes(args, "formats")
    for H in Hs:
        for name, scheme in FORMATS.items():
            for T in Ts:
                hs, w, ids, pad = inputs(T, H, T * 31 + H)
                o = alloc(T, H, scheme)
                f = stage_fn(hs, w, ids, pad, o, scheme)
                f()
                sync()
                nb = nbytes(T, H, o)
                r = dict(part="formats", H=H, format=name, T=T, bytes=nb, megamoe_us=bench(f, T),
                         copy_us=copy_us(nb, T))
                r["megamoe_TBps"] = nb / r["megamoe_us"] * 1e-6
                r["copy_TBps"] = nb / r["copy_us"] * 1e-6
                r["frac_copy"] = r["copy_us"] / r["megamoe_us"]
                r["over_copy_us"] = r["megamoe_us"] - r["copy_us"]
                out.write(r)
                del hs, w, ids, pad, o
                empty_cache()


def eager_sm90(hs, w, ids, pad, buf, T, alpha):
    """vLLM's SM90 path as eager PyTorch: DeepGEMM-style fp32 per-128 cast (amax floor 1e-10),
    then copies into the symmetric buffer and the tail fill. pad None: no padded tokens;
    alpha None: the weights as given."""
    H = hs.shape[1]
    x = hs.float().view(T, H // 128, 128)
    s = x.abs().amax(dim=2).clamp(min=1e-10) * (1.0 / 448.0)
    q = (x * (1.0 / s)[..., None]).to(torch.float8_e4m3fn).view(T, H)
    buf["xq"][:T].copy_(q.view(torch.uint8))
    buf["sf"][:T].copy_(s)
    wa = w if alpha is None else w * alpha
    if pad is None:
        buf["io"][:T].copy_(ids)
        buf["wo"][:T].copy_(wa)
    else:
        buf["io"][:T].copy_(torch.where(pad[:, None], -1, ids.long()))
        buf["wo"][:T].copy_(torch.where(pad[:, None], 0.0, wa))
    buf["io"][T:].fill_(-1)
    buf["wo"][T:].zero_()


def part_full_buffer(args, out):
    H = 256 if args.cpu_check else 7168
    scheme = megamoe.FP8_FP32_G128.with_amax_floor(1e-10)
    alpha = 1.5
    cases = [(T, M) for T in (1, 8, 64) for M in (256, 8192)] + [(T, 8192) for T in (256, 1024, 4096)]
    if args.quick:
        cases = [(1, 256), (64, 8192), (1024, 8192)]
    if args.cpu_check:
        cases = [(1, 16), (5, 64)]
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
        sync()
        same = all(torch.equal(full[k], sep[k]) for k in ("io", "wo")) and torch.equal(full["xq"][:T], sep["xq"][:T])
        # The eager rendering writes the same bytes as megamoe's full-buffer call.
        same_eager = (all(torch.equal(full[k], eag[k]) for k in ("io", "wo"))
                      and all(torch.equal(full[k][:T], eag[k][:T]) for k in ("xq", "sf")))
        nb = nbytes(T, H, alone) + (M - T) * K * 12
        r = dict(part="full_buffer", H=H, T=T, max_tokens=M, bytes=nb, full_us=bench(f_full, T),
                 alone_us=bench(f_alone, T), separate_fill_us=bench(f_sep, T), eager_sm90_us=bench(f_eager, T),
                 copy_us=copy_us(nb, T), full_equals_separate=same, full_equals_eager_sm90=same_eager)
        r["full_over_alone_us"] = r["full_us"] - r["alone_us"]
        r["speedup_vs_eager"] = r["eager_sm90_us"] / r["full_us"]
        out.write(r)
        del hs, w, ids, pad, full, alone, sep, eag
        empty_cache()


def deepgemm_config(args, Ts):
    """(num_experts, num_max_tokens_per_rank, top-k, H, IH) of the deepgemm part's buffer."""
    if args.cpu_check:
        return 256, 64, K, 256, 128
    return 256, max(16384, max(Ts)), K, 7168, 2048


def part_deepgemm(args, out):
    Ts, _ = sizes(args, "deepgemm")
    E, M, k, H, IH = deepgemm_config(args, Ts)
    # megamoe's buffer and the eager rendering's, both zero-filled as DeepGEMM's.
    buf = megamoe.buffers.alloc_deepgemm_buffer("sm90_fp8", E, M, k, H, IH, device=DEV,
                                                allocator="torch")  # fmt: skip
    eag_buf = megamoe.buffers.alloc_deepgemm_buffer("sm90_fp8", E, M, k, H, IH, device=DEV, allocator="torch")
    lay = buf.layout
    Ma = lay.num_max_tokens
    eag = dict(xq=eag_buf.x.view(torch.uint8), sf=eag_buf.x_sf, io=eag_buf.topk_idx, wo=eag_buf.topk_weights)
    bits = lambda t: t.view({1: torch.uint8, 4: torch.int32, 8: torch.int64}[t.element_size()])  # noqa: E731
    for T in Ts:
        hs, w, ids, _ = inputs(T, H, T * 23 + H)
        kw = buf.outputs(T)

        def f_full(hs=hs, w=w, ids=ids, kw=kw):
            megamoe.prepare_megamoe_inputs(hs, w, ids, **kw)

        f_eager = lambda hs=hs, w=w, ids=ids, T=T: eager_sm90(hs, w, ids, None, eag, T, None)  # noqa: E731
        f_full()
        f_eager()
        sync()
        # Byte equality in the input views: x / x_sf rows [0, T), every top-k row (the tail too).
        eq = {n: torch.equal(bits(getattr(buf, n)[:T]), bits(getattr(eag_buf, n)[:T])) for n in ("x", "x_sf")}
        for n in ("topk_idx", "topk_weights"):
            eq[n] = torch.equal(bits(getattr(buf, n)), bits(getattr(eag_buf, n)))
        tail_ok = bool((buf.topk_idx[T:] == -1).all()) and bool((bits(buf.topk_weights[T:]) == 0).all())
        # Bytes of the call: activations, ids, weights read; x / x_sf written for T rows; the
        # top-k views written for every row of the aligned buffer.
        nb = T * H * 2 + T * k * (4 + 4) + T * (H + H // 128 * 4) + Ma * k * (8 + 4)
        r = dict(part="deepgemm", variant=lay.variant, num_experts=E, num_max_tokens=Ma, top_k=k, H=H, IH=IH,
                 buffer_bytes=lay.nbytes, T=T, bytes=nb, full_us=bench(f_full, T), copy_us=copy_us(nb, T),
                 eager_us=bench(f_eager, T), equal_x=eq["x"], equal_x_sf=eq["x_sf"], equal_topk_idx=eq["topk_idx"],
                 equal_topk_weights=eq["topk_weights"], tail_ok=tail_ok)  # fmt: skip
        r["deepgemm_equals_eager"] = all(eq.values()) and tail_ok
        r["copy_over_full"] = r["copy_us"] / r["full_us"]
        r["eager_over_full"] = r["eager_us"] / r["full_us"]
        r["full_TBps"] = nb / r["full_us"] * 1e-6
        r["copy_TBps"] = nb / r["copy_us"] * 1e-6
        out.write(r)
        del hs, w, ids, kw, f_full, f_eager
        empty_cache()
    del buf, eag_buf, eag
    empty_cache()


def part_nonfinite(args, out):
    Ts, Hs = sizes(args, "nonfinite")
    names = [n for n in (("mxfp8", "fp8_fp32_g128", "mxfp4") if not args.quick else ("mxfp8", "mxfp4")) if n in FORMATS]
    for H in Hs:
        for name in names:
            scheme = FORMATS[name]
            for T in Ts:
                hs, w, ids, pad = inputs(T, H, T * 13 + H)
                o = alloc(T, H, scheme)
                counter = torch.zeros(1, dtype=torch.int64, device=DEV)
                # Check: the counter adds the planted non-finite elements (one NaN, one Inf).
                planted = hs.clone()
                planted[0, 0] = float("nan")
                planted[-1, -1] = float("inf")
                stage_fn(planted, w, ids, pad, o, scheme, counter=counter)()
                sync()
                counted = int(counter.item())
                counter.zero_()
                off = stage_fn(hs, w, ids, pad, o, scheme)
                on = stage_fn(hs, w, ids, pad, o, scheme, counter=counter)
                t = [bench(f, T) for f in (off, on, off, on)]
                sync()
                r = dict(part="nonfinite", H=H, format=name, T=T, counted_planted=counted,
                         counter_ok=counted == 2 and int(counter.item()) == 0,
                         off_us=min(t[0], t[2]), on_us=min(t[1], t[3]), off_runs_us=[t[0], t[2]],
                         on_runs_us=[t[1], t[3]])
                r["on_minus_off_us"] = r["on_us"] - r["off_us"]
                r["on_over_off"] = r["on_us"] / r["off_us"]
                r["noise_us"] = abs(t[0] - t[2])
                out.write(r)
                del hs, w, ids, pad, o, planted
                empty_cache()


# NVFP4_ONLINE's default amax floor (docs/CONTRACT.md "NVFP4 online"): gs = fl(max(A, floor) / 2688).
ONLINE_FLOOR = 2.0 ** -100
ONLINE_TIMED = ["online_us", "three_launch_us", "static_us", "copy_us"]
# Where a run's rows name none (--table of rows without the card fields).
_HEADER = {}


def three_launch_fn(hs, w, ids, pad, o, floor_t, div_t):
    """FlashInfer's online NVFP4 staging in PyTorch eager, writing gs into o["global_scale"].

    FlashInfer's MegaMoE input staging (flashinfer/moe_ep/kernel_src/cutedsl_megamoe/src/src/
    inputs_process.py, the nvfp4 online branch) runs three launches, the kernel boundaries
    standing in for a grid barrier: one seeds the (1,) scale slot, one reduces every token's
    amax into it (an atomic min of 2688 / amax), one quantizes under it; its benchmarks form
    the global amax as tensor.abs().max() (benchmarks/routines/moe_utils.py,
    calculate_fp4_global_scale). Here: the global amax as torch.amax(x.abs()) (an abs and a
    reduction launch; every row, padded ones included, as megamoe's), megamoe's gs rule from
    it (torch.maximum with the floor, promoted to fp32, then torch.div by a device tensor
    2688: an IEEE division, where a host scalar divisor would multiply by an inexact
    reciprocal), then megamoe's NVFP4_STATIC staging under that gs tensor. Graph-safe: no host
    sync."""
    gs = o["global_scale"]
    static = stage_fn(hs, w, ids, pad, o, megamoe.NVFP4_STATIC)

    def f():
        amax = torch.amax(hs.abs())
        torch.div(torch.maximum(amax, floor_t), div_t, out=gs)
        static()
    return f


def online_finish(r):
    """The ratios and rates of an online row of times."""
    r["three_launch_over_online"] = r["three_launch_us"] / r["online_us"]
    r["online_over_static"] = r["online_us"] / r["static_us"]
    r["copy_over_online"] = r["copy_us"] / r["online_us"]
    r["online_minus_static_us"] = r["online_us"] - r["static_us"]
    r["online_TBps"] = r["bytes"] / r["online_us"] * 1e-6
    r["copy_TBps"] = r["bytes"] / r["copy_us"] * 1e-6
    return r


def part_online(args, out):
    Ts, Hs = sizes(args, "online")
    online, static = megamoe.NVFP4_ONLINE, megamoe.NVFP4_STATIC
    floor_t = torch.full((1,), ONLINE_FLOOR, device=DEV, dtype=torch.float32)
    div_t = torch.full((1,), 2688.0, device=DEV, dtype=torch.float32)
    bits = lambda t: t.view(torch.int32) if t.element_size() == 4 else t  # noqa: E731
    done = []
    for H in Hs:
        for T in Ts:
            hs, w, ids, pad = inputs(T, H, T * 41 + H)
            o_a, o_b, o_c = alloc(T, H, online), alloc(T, H, static), alloc(T, H, static)
            f_a = stage_fn(hs, w, ids, pad, o_a, online)
            f_b = three_launch_fn(hs, w, ids, pad, o_b, floor_t, div_t)
            f_a()
            f_b()
            sync()
            # Check: the same bytes from both; static under that gs writes them too.
            o_c["global_scale"].copy_(o_a["global_scale"])
            f_c = stage_fn(hs, w, ids, pad, o_c, static)
            f_c()
            sync()
            eq = {k: torch.equal(bits(o_a[key]), bits(o_b[key])) for k, key in
                  (("equal_x_q", "xq"), ("equal_x_sf", "sf"), ("equal_global_scale", "global_scale"),
                   ("equal_topk_idx", "io"), ("equal_topk_weights", "wo"))}
            r = dict(part="online", H=H, T=T, floor=ONLINE_FLOOR, global_scale=float(o_a["global_scale"][0]),
                     three_launch_global_scale=float(o_b["global_scale"][0]), **eq)
            r["online_equals_three_launch"] = all(eq.values())
            r["static_equals_online"] = all(torch.equal(bits(o_a[k]), bits(o_c[k])) for k in ("xq", "sf", "io", "wo"))
            r.update(device=_HEADER.get("device"), torch=_HEADER.get("torch"), commit=_HEADER.get("commit"))
            if not (r["online_equals_three_launch"] and r["static_equals_online"]):
                diff = [k for k, v in eq.items() if not v] + ([] if r["static_equals_online"] else ["static"])
                print(f"bench_formats.py: online H={H} T={T}: CHECK FAILED, not timed: megamoe NVFP4_ONLINE and "
                      f"the three-launch rendering differ in {', '.join(diff)} (gs {r['global_scale']!r} vs "
                      f"{r['three_launch_global_scale']!r})", file=sys.stderr, flush=True)
            else:
                nb = nbytes(T, H, o_a)
                r.update(bytes=nb, online_us=bench(f_a, T), three_launch_us=bench(f_b, T), static_us=bench(f_c, T),
                         copy_us=copy_us(nb, T))
                online_finish(r)
            out.write(r)
            done.append(r)
            del hs, w, ids, pad, o_a, o_b, o_c, f_a, f_b, f_c
            empty_cache()
    print(online_markdown(done), flush=True)


ONLINE_COLUMNS = [  # (heading, row key, format)
    ("H", "H", "{}"), ("T", "T", "{}"), ("online us", "online_us", "{:.2f}"),
    ("3-launch us", "three_launch_us", "{:.2f}"), ("static us", "static_us", "{:.2f}"),
    ("copy us", "copy_us", "{:.2f}"), ("3-launch / online", "three_launch_over_online", "{:.2f}x"),
    ("online / static", "online_over_static", "{:.2f}x"), ("copy / online", "copy_over_online", "{:.0%}"),
    ("online - static us", "online_minus_static_us", "{:+.2f}"), ("bytes equal", "online_equals_three_launch", "{}"),
]


def online_cell(row, key, form):
    v = row.get(key)
    if v is None:
        return "-"
    if isinstance(v, bool):  # a failed check in capitals
        return "yes" if v else "NO"
    return form.format(v)


def online_markdown(rows):
    """The markdown table of the online rows (part "online") of @p rows, in their order; the
    card, torch and commit of the first above it."""
    rows = [r for r in rows if r.get("part") == "online"]
    if not rows:
        return "(no rows)"
    r0 = rows[0]
    out = [f"{r0.get('device')}, torch {r0.get('torch')}, megamoe {r0.get('commit') or 'commit unknown'}", "",
           "| " + " | ".join(c[0] for c in ONLINE_COLUMNS) + " |", "|" + "|".join("---:" for _ in ONLINE_COLUMNS) + "|"]
    for r in rows:
        ok = r.get("online_equals_three_launch") and r.get("static_equals_online", True)
        out.append("| " + " | ".join(online_cell(dict(r, online_equals_three_launch=bool(ok)), key, form)
                                      for _, key, form in ONLINE_COLUMNS) + " |")
    return "\n".join(out)


def no_cuda_reason():
    """Why nothing can be measured here (None when a run can go ahead)."""
    try:
        import torch as _torch
    except ImportError:
        return "torch is not installed"
    if not _torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    try:
        import megamoe as _megamoe
    except ImportError as e:
        return f"megamoe is not importable ({e})"
    if not _megamoe.has_cuda_backend():
        return "this megamoe build has no CUDA backend"
    return None


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def empty_cache():
    if DEV == "cuda":
        torch.cuda.empty_cache()


PARTS = {"formats": part_formats, "full_buffer": part_full_buffer, "nonfinite": part_nonfinite,
         "deepgemm": part_deepgemm, "online": part_online}


def plan(args):
    for part in args.parts.split(","):
        if part == "full_buffer":
            yield dict(part=part, cases="decode T 1/8/64 x max_tokens 256/8192, prefill T 256/1024/4096 x 8192")
            continue
        if part == "deepgemm":
            Ts, _ = sizes(args, part)
            E, M, k, H, IH = deepgemm_config(args, Ts)
            yield dict(part=part, variant="sm90_fp8", num_experts=E, num_max_tokens_per_rank=M, top_k=k, H=H,
                       IH=IH, T=Ts, timed=["full_us", "copy_us", "eager_us"])
            continue
        Ts, Hs = sizes(args, part)
        for H in Hs:
            if part == "online":
                yield dict(part=part, H=H, T=Ts, floor=ONLINE_FLOOR, timed=ONLINE_TIMED)
                continue
            yield dict(part=part, H=H, T=Ts)


def main(argv=None):
    global torch, megamoe, DEV, FORMATS, _bench, _HEADER
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--parts", default="formats,full_buffer,nonfinite")
    ap.add_argument("--formats", default=",".join(FORMAT_NAMES), help="the formats of the formats and nonfinite "
                    "parts, comma-separated (an A/B of one kernel times only its formats)")
    ap.add_argument("--T", type=lambda v: [int(t) for t in v.split(",")], default=None,
                    help="token counts of the formats, nonfinite, deepgemm and online parts, comma-separated "
                    "(default: the grid; the deepgemm buffer takes max(16384, the largest) tokens per rank)")
    ap.add_argument("--dry-run", action="store_true", help="list the configurations and exit (no torch)")
    ap.add_argument("--cpu-check", action="store_true",
                    help="run every part on the CPU backend at small sizes (checks only, no figures)")
    ap.add_argument("--table", metavar="ROWS.jsonl", help="print the online part's markdown table of a run's rows "
                    "and exit")
    args = ap.parse_args(argv)
    if args.table:
        with open(args.table) as f:
            print(online_markdown([json.loads(line) for line in f if line.strip()]))
        return 0
    for part in args.parts.split(","):
        if part not in PARTS:
            ap.error(f"--parts: {part!r} is none of {sorted(PARTS)}")
    formats = args.formats.split(",")
    for f in formats:
        if f not in FORMAT_NAMES + OPTIONAL_FORMATS:
            ap.error(f"--formats: {f!r} is none of {FORMAT_NAMES + OPTIONAL_FORMATS}")
    if args.T is not None and (not args.T or min(args.T) < 1):
        ap.error("--T: positive token counts")
    if args.dry_run:
        return dry_run(plan(args), args.out)
    why = None if args.cpu_check else no_cuda_reason()
    if why is not None:
        print(f"bench_formats.py: {why}; nothing measured (this benchmark runs on a CUDA GPU)", file=sys.stderr)
        return 0
    import torch as _torch

    import megamoe as _megamoe
    import megamoe.buffers  # noqa: F401  (the deepgemm part's megamoe.buffers)
    torch, megamoe = _torch, _megamoe
    DEV = "cpu" if args.cpu_check else "cuda"
    FORMATS = {n: getattr(megamoe, n.upper()) for n in formats}
    _bench = timer(DEV)
    os.makedirs(args.out, exist_ok=True)
    _HEADER = header(cpu_check=args.cpu_check)
    print(json.dumps(_HEADER), flush=True)
    bad = 0
    for part in args.parts.split(","):
        rows = Rows(None if args.cpu_check else os.path.join(args.out, f"{part}.jsonl"))
        checked = []
        write = rows.write

        def keep(r, write=write, checked=checked):
            checked.append(r)
            write(r)
        rows.write = keep
        PARTS[part](args, rows)
        rows.close()
        for r in checked:
            bad += not all(r.get(k, True) for k in ("full_equals_separate", "full_equals_eager_sm90", "counter_ok",
                                                      "deepgemm_equals_eager", "online_equals_three_launch",
                                                      "static_equals_online"))
    print(json.dumps(dict(kind="summary", rows_failing_checks=bad)), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
