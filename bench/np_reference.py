"""NumPy rendering of MegaMoE staging for every activation format, timed next to megamoe's
CPU backend by bench/run_cpu_bench.sh (the baseline an engine without the library would
write: whole-array float32 NumPy, bit operations for the codecs).

Written from SPEC.md "Scale and value" and "Activation formats": per group of G elements,
amax = NaN-ignoring max |x| (np.fmax), the scale codec, the multiplier, the element codec
(e4m3: round to nearest even on the significand bits, satfinite, NaN -> 0x7F; e2m1: count
of midpoints exceeded, ties toward zero or to nearest even), then the packed layouts. Rows
are processed in blocks of about 2^22 elements, which keeps the temporaries in cache and
so favours NumPy.

  python3 bench/np_reference.py --bench --T 1,64 --H 7168 --formats all --json out.jsonl
  python3 bench/np_reference.py --check DIR   # DIR from `megamoe_bench_cpu --dump DIR`
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

F32, U32, I32 = np.float32, np.uint32, np.int32
INV448 = F32(1.0) / F32(448.0)
E4M3_MIN_SUB = F32(2.0**-9)
MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
EVEN_UPPER = (0.75, 1.75, 3.5)  # midpoints whose upper neighbour has the even code

# name: (element codec, scale codec, G, second-level scale, ties toward zero)
FORMATS = {
    "mxfp8": ("e4m3", "ue8m0", 32, None, False),
    "fp8_fp32_g128": ("e4m3", "fp32", 128, None, False),
    "mxfp4": ("e2m1", "ue8m0", 32, None, True),
    "mxfp4_rne": ("e2m1", "ue8m0", 32, None, False),
    "nvfp4_static": ("e2m1", "e4m3", 16, "static", True),
    "nvfp4_per_token": ("e2m1", "e4m3", 16, "per_token", True),
}


def e4m3(y: np.ndarray) -> np.ndarray:
    """float32 -> e4m3fn bytes (cvt.rn.satfinite): RNE on the 24-bit significand at the
    e4m3 precision of the value's binade, saturating; NaN -> 0x7F."""
    b = y.view(U32)
    sign = (b >> 24) & 0x80
    a = b & 0x7FFFFFFF
    exp = (a >> 23).astype(I32)
    m24 = (b & 0x7FFFFF) | 0x800000
    shift = np.clip(141 - exp, 20, 25).astype(U32)  # 20: e4m3 normals; 21..24 subnormals
    q = (m24 + ((U32(1) << (shift - 1)) - 1) + ((m24 >> shift) & 1)) >> shift
    base = (np.maximum(exp - 121, 0) << 3).astype(U32)
    code = np.minimum(base + q, 0x7E)
    return np.where(a > 0x7F800000, U32(0x7F), code | sign).astype(np.uint8)


def e4m3_value(c: np.ndarray) -> np.ndarray:
    """e4m3fn byte -> float32 (0x7F / 0xFF -> NaN)."""
    c = c.astype(U32)
    e, m = (c >> 3) & 0xF, c & 7
    mag = np.where(e == 0, (m.astype(F32) * E4M3_MIN_SUB).view(U32), ((e + 120) << 23) | (m << 20))
    mag = np.where((c & 0x7F) == 0x7F, U32(0x7FC00000), mag)
    return (mag | ((c & 0x80) << 24)).astype(U32).view(F32)


def ue8m0(s: np.ndarray) -> np.ndarray:
    b = s.view(U32)
    e = ((b >> 23) & 0xFF) + ((b & 0x7FFFFF) != 0)
    return np.clip(e, 1, 254).astype(U32)


def ue8m0_inv(e: np.ndarray) -> np.ndarray:
    return np.where(e < 254, (254 - e) << 23, U32(0x00400000)).astype(U32).view(F32)


def e2m1(v: np.ndarray, ttz: bool) -> np.ndarray:
    """float32 -> e2m1 nibbles (uint8)."""
    a = np.abs(v)
    sign = ((v.view(U32) >> 28) & 8).astype(np.uint8)
    code = np.zeros(v.shape, np.uint8)
    for m in MIDPOINTS:
        code += (a >= F32(m)) if (not ttz and m in EVEN_UPPER) else (a > F32(m))
    if ttz:
        return np.where(code != 0, code | sign, np.uint8(0))
    return np.where(np.isnan(v), np.uint8(7), code | sign)


def amax_groups(x: np.ndarray, G: int) -> np.ndarray:
    T, H = x.shape
    m = np.fmax.reduce(np.abs(x).reshape(T, H // G, G), axis=2)
    return np.fmax(m, F32(0.0))  # an all-NaN group: 0


def stage_block(x: np.ndarray, fmt: str, floor: float, gs: float):
    """x: [T, H] float32. Returns (x_q bytes, x_sf, x_scales or None)."""
    elem, sfc, G, s2, ttz = FORMATS[fmt]
    T, H = x.shape
    floor = F32(floor)
    amax = amax_groups(x, G)
    x_scales = None
    if fmt in ("mxfp8", "fp8_fp32_g128"):
        s = (np.fmax(amax, floor) * INV448).astype(F32)
        if sfc == "ue8m0":
            sf = ue8m0(s)
            mult = ue8m0_inv(sf)
        else:
            sf, mult = s, (F32(1.0) / s).astype(F32)
    elif fmt in ("mxfp4", "mxfp4_rne"):
        sf = ue8m0((np.fmax(amax, floor) / F32(6.0)).astype(F32))
        mult = ue8m0_inv(sf)
    elif s2 == "static":
        q = (amax / (F32(6.0) * F32(gs))).astype(F32)
        sf = e4m3(np.fmin(np.fmax(q, E4M3_MIN_SUB), F32(448.0)).astype(F32))
        mult = (e4m3_value(sf) * F32(gs)).astype(F32)
    else:
        row = np.fmax(np.fmax.reduce(np.abs(x), axis=1), F32(0.0))
        pts = (np.fmax(row, floor) / F32(2688.0)).astype(F32)
        x_scales = pts
        sf = e4m3((amax / (F32(6.0) * pts)[:, None]).astype(F32))
        scale = e4m3_value(sf)
        den = (scale * pts[:, None]).astype(F32)
        mult = np.where(scale > 0, F32(1.0) / np.where(scale > 0, den, F32(1.0)), F32(0.0)).astype(F32)
    xg = x.reshape(T, H // G, G)
    if s2 == "static":
        v = (xg / mult[:, :, None]).astype(F32)
    else:
        v = (xg * mult[:, :, None]).astype(F32)
    v = v.reshape(T, H)
    if elem == "e4m3":
        xq = e4m3(v)
    else:
        n = e2m1(v, ttz)
        xq = (n[:, 0::2] | (n[:, 1::2] << 4)).astype(np.uint8)
    if sfc == "fp32":
        x_sf = sf.astype(F32)
    else:
        x_sf = np.ascontiguousarray(sf.astype(np.uint8)).view("<i4")  # byte j of word w = group 4w + j
    return xq, x_sf, x_scales


def stage(hidden_bits: np.ndarray, weights, ids, pad, fmt: str, floor: float = 1e-4, gs: float = 1.0,
          block_elems: int = 1 << 22):
    """bf16 hidden (uint16 bits [T, H]) -> (x_q, x_sf, topk_idx, topk_w, x_scales)."""
    T, H = hidden_bits.shape
    rows = max(1, block_elems // H)
    parts = []
    with np.errstate(all="ignore"):
        for t0 in range(0, T, rows):
            x = (hidden_bits[t0:t0 + rows].astype(U32) << 16).view(F32)
            parts.append(stage_block(x, fmt, floor, gs))
    xq = np.concatenate([p[0] for p in parts])
    x_sf = np.concatenate([p[1] for p in parts])
    xs = None if parts[0][2] is None else np.concatenate([p[2] for p in parts])
    padm = np.asarray(pad).astype(bool)[:, None]
    idx = np.where(padm, np.int64(-1), ids.astype(np.int64))
    w = np.where(padm, F32(0.0), weights.astype(F32)).astype(F32)
    return xq, x_sf, idx, w, xs


def bf16_randn(rng: np.random.Generator, T: int, H: int) -> np.ndarray:
    x = (rng.standard_normal((T, H), dtype=F32) * F32(17.0)).view(U32)
    return ((x + 0x7FFF + ((x >> 16) & 1)) >> 16).astype(np.uint16)


def check(dirname: str) -> int:
    """Compare with megamoe's bytes (bench_cpu --dump) and, for the fp8 formats, with the
    independent reference of the Python tests."""
    with open(os.path.join(dirname, "manifest.json")) as f:
        cases = json.load(f)
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
    try:
        import megamoe_npref  # noqa: E402
    except ImportError:
        megamoe_npref = None
    bad = 0
    for c in cases:
        fmt, T, H, K = c["format"], c["T"], c["H"], c["K"]

        def load(name, dt, shape=None):
            a = np.fromfile(os.path.join(dirname, f"{fmt}_{name}.bin"), dtype=dt)
            return a.reshape(shape) if shape is not None else a

        hidden = load("hidden", np.uint16, (T, H))
        w, ids, pad = load("w", F32, (T, K)), load("ids", I32, (T, K)), load("pad", np.uint8)
        xq, sf, idx, wo, xs = stage(hidden, w, ids, pad, fmt, gs=c["gs"])
        got = {"xq": xq, "sf": sf, "idx": idx, "wout": wo}
        if xs is not None:
            got["xscales"] = xs
        for name, arr in got.items():
            want = np.fromfile(os.path.join(dirname, f"{fmt}_{name}.bin"), dtype=np.uint8)
            ok = np.array_equal(np.ascontiguousarray(arr).view(np.uint8).reshape(-1), want)
            bad += not ok
            print(f"{fmt:16s} {name:8s} {'same bytes' if ok else 'DIFFERENT'}")
        if megamoe_npref is not None and FORMATS[fmt][0] == "e4m3":
            x32 = (hidden.astype(U32) << 16).view(F32)
            ref = megamoe_npref.stage(x32, w, ids, FORMATS[fmt][2], FORMATS[fmt][1] == "ue8m0", pad)
            ok = np.array_equal(ref.x_fp8, xq) and np.array_equal(np.asarray(ref.x_sf).view(np.uint8), sf.view(np.uint8))
            bad += not ok
            print(f"{fmt:16s} {'npref':8s} {'same bytes' if ok else 'DIFFERENT'} (tests/python/megamoe_npref.py)")
    print("check:", "all equal" if bad == 0 else f"{bad} differences")
    return 1 if bad else 0


def bench(Ts, Hs, fmts, min_time: float, max_reps: int, out) -> None:
    print(f"{'format':16s} {'H':>6s} {'T':>6s} {'numpy us':>12s} {'reps':>5s}")
    for H in Hs:
        for T in Ts:
            rng = np.random.default_rng(T * 31 + H)
            hidden = bf16_randn(rng, T, H)
            K = 8
            w = rng.random((T, K), dtype=F32)
            ids = rng.integers(0, 256, (T, K), dtype=I32)
            pad = (np.arange(T) % 5 == 4).astype(np.uint8)
            gs = 17.0 * 5.0 / 2688.0
            for fmt in fmts:
                stage(hidden[:1], w[:1], ids[:1], pad[:1], fmt, gs=gs)  # warm up
                times = []
                t_start = time.perf_counter()
                while len(times) < 1 or (time.perf_counter() - t_start < min_time and len(times) < max_reps):
                    t0 = time.perf_counter()
                    stage(hidden, w, ids, pad, fmt, gs=gs)
                    times.append(time.perf_counter() - t0)
                us = float(np.median(times)) * 1e6
                print(f"{fmt:16s} {H:6d} {T:6d} {us:12.1f} {len(times):5d}", flush=True)
                if out is not None:
                    out.write(json.dumps({"format": fmt, "H": H, "T": T, "numpy_us": round(us, 3),
                                          "reps": len(times)}) + "\n")
                    out.flush()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", metavar="DIR")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--T", default="1,64,1024,4096,16384")
    ap.add_argument("--H", default="7168,4096")
    ap.add_argument("--formats", default="all")
    ap.add_argument("--min-time", type=float, default=1.0)
    ap.add_argument("--max-reps", type=int, default=50)
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.check:
        return check(a.check)
    if not a.bench:
        ap.error("give --check DIR or --bench")
    fmts = list(FORMATS) if a.formats == "all" else a.formats.split(",")
    out = open(a.json, "a") if a.json else None
    bench([int(t) for t in a.T.split(",")], [int(h) for h in a.H.split(",")], fmts, a.min_time, a.max_reps, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
