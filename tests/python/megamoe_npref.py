"""An independent NumPy reference of MegaMoE staging (docs/CONTRACT.md), for the Python tests.

Written from docs/CONTRACT.md only (no code shared with src/core, nothing imported from
megamoe): vectorized float32 arithmetic, UE8M0 by bit operations, fp8 e4m3fn by a nearest
search over the 127 non-negative finite codes with ties to the even code, saturation to
+-448, NaN -> 0x7F; fp8 e5m2 by counting the midpoints of its 124 non-negative finite
values (a tie goes to the even code), saturation to +-57344 (Inf included), NaN -> 0x7F;
e2m1 by counting midpoints (ties toward zero) or by a nearest search with ties to the even
code; every format of the contract (fp8 UE8M0 / fp32, MXFP8 e5m2, MXFP4 both tie rules,
NVFP4 static and per-token), the top-k repack with padding, routed scaling and the
full-buffer tail, and the non-finite count.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

F32 = np.float32
C_INV448 = F32(1.0) / F32(448.0)
assert C_INV448.view(np.uint32) == 0x3B124925
# e5m2's largest value: 57344 = 448 * 2^7, so fl(1/57344) is fl(1/448) * 2^-7 exactly.
C_INV57344 = F32(1.0) / F32(57344.0)
assert C_INV57344.view(np.uint32) == 0x37924925


def fp8_e4m3fn_values() -> np.ndarray:
    """float64 value of the fp8 e4m3fn codes 0x00..0x7E (ascending, all finite)."""
    codes = np.arange(127)
    exp, man = codes >> 3, codes & 7
    return np.where(exp == 0, man * 2.0**-9, (1.0 + man / 8.0) * 2.0 ** (exp - 7.0))


_POS = fp8_e4m3fn_values()


def nearest_even_code(mag: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Index (uint8) of the ``grid`` value nearest to each ``mag`` (non-negative, at most the
    grid's last value), ties to the even index (= the even code)."""
    hi = np.clip(np.searchsorted(grid, mag, side="left"), 0, len(grid) - 1)
    lo = np.maximum(hi - 1, 0)
    d_lo, d_hi = mag - grid[lo], grid[hi] - mag
    take_lo = (d_lo < d_hi) | ((d_lo == d_hi) & (lo % 2 == 0))
    return np.where(mag == grid[hi], hi, np.where(take_lo, lo, hi)).astype(np.uint8)


def to_fp8_e4m3fn(y: np.ndarray) -> np.ndarray:
    """cvt.rn.satfinite.e4m3x2.f32 on float32 ``y``: bytes (uint8), same shape."""
    y = np.asarray(y, dtype=F32)
    sign = (y.view(np.uint32) >> 31).astype(np.uint8) << 7
    mag = np.abs(y.astype(np.float64))
    nan = np.isnan(mag)
    mag = np.where(nan, 0.0, np.minimum(mag, 448.0))  # satfinite (Inf included)
    return np.where(nan, np.uint8(0x7F), nearest_even_code(mag, _POS) | sign).astype(np.uint8)


def fp8_e5m2_values() -> np.ndarray:
    """float64 value of the fp8 e5m2 codes 0x00..0x7B (ascending, all finite): 1 sign, 5
    exponent bits of bias 15, 2 mantissa bits; subnormals m * 2^-16."""
    codes = np.arange(124)
    exp, man = codes >> 2, codes & 3
    return np.where(exp == 0, man * 2.0**-16, (1.0 + man / 4.0) * 2.0 ** (exp - 15.0))


E5M2_POS = fp8_e5m2_values()
E5M2_MIDPOINTS = (E5M2_POS[:-1] + E5M2_POS[1:]) / 2  # exact in float64
assert len(E5M2_POS) == 124 and E5M2_POS[-1] == 57344.0 and E5M2_POS[4] == 2.0**-14


def to_fp8_e5m2(y: np.ndarray) -> np.ndarray:
    """cvt.rn.satfinite.e5m2x2.f32 on float32 ``y``: bytes (uint8), same shape. The code of
    |y| is the number of midpoints strictly below it, plus one when |y| is a midpoint whose
    lower neighbour is odd (ties to the even code); finite values beyond 57344 and +-Inf
    saturate to +-57344 (0x7B / 0xFB), NaN (either sign) is 0x7F, the sign is kept (-0.0 ->
    0x80)."""
    y = np.asarray(y, dtype=F32)
    sign = (np.ascontiguousarray(y).view(np.uint32) >> 31).astype(np.uint8) << 7
    mag = np.abs(y.astype(np.float64))
    nan = np.isnan(mag)
    mag = np.where(nan, 0.0, np.minimum(mag, 57344.0))
    below = np.searchsorted(E5M2_MIDPOINTS, mag, side="left")
    tie = E5M2_MIDPOINTS[np.minimum(below, len(E5M2_MIDPOINTS) - 1)] == mag
    code = (below + (tie & (below % 2 == 1))).astype(np.uint8)
    return np.where(nan, np.uint8(0x7F), code | sign).astype(np.uint8)


def fp8_e5m2_to_f32(codes: np.ndarray) -> np.ndarray:
    """float32 value of fp8 e5m2 bytes (0x7C / 0xFC are +-Inf, 0x7D-0x7F / 0xFD-0xFF NaN)."""
    c = np.asarray(codes).astype(np.int64)
    mag = np.concatenate([E5M2_POS, [np.inf, np.nan, np.nan, np.nan]])[c & 0x7F]
    return np.where(c & 0x80, -mag, mag).astype(F32)


def group_amax(x32: np.ndarray, G: int) -> np.ndarray:
    """Largest |x| per group of G columns [T, H/G] float32, NaN ignored (fmaxf from 0:
    an all-NaN group has amax 0)."""
    T, H = x32.shape
    return np.fmax.reduce(np.abs(x32.reshape(T, H // G, G)), axis=2, initial=F32(0.0)).astype(F32)


def ue8m0_exponent(s: np.ndarray) -> np.ndarray:
    """e = exponent(s) + (mantissa(s) != 0), clamped to [1, 254] (uint32)."""
    b = np.ascontiguousarray(s, dtype=F32).view(np.uint32)
    e = ((b >> 23) & 0xFF) + ((b & 0x7FFFFF) != 0)
    return np.clip(e, 1, 254).astype(np.uint32)


def group_scales(x32: np.ndarray, G: int, ue8m0: bool, floor: float = 1e-4, e5m2: bool = False):
    """(scale per group [T, H/G] float32, UE8M0 byte per group or None) of fp8 staging
    (amax / 448 for e4m3, amax / 57344 for e5m2: a product with the rounded reciprocal)."""
    amax = np.fmax(group_amax(x32, G), F32(floor)).astype(F32)
    s = (amax * (C_INV57344 if e5m2 else C_INV448)).astype(F32)
    zero_floor = F32(floor) == 0
    if not ue8m0:
        if zero_floor:  # floor 0: a scale whose reciprocal overflows (0 included) is 1
            with np.errstate(divide="ignore", over="ignore"):
                s = np.where(np.isinf(F32(1.0) / s), F32(1.0), s).astype(F32)
        return s, None
    e = ue8m0_exponent(s)
    if zero_floor:  # floor 0: a group whose amax is 0 has the unit scale 2^0
        e = np.where(amax == 0, np.uint32(127), e).astype(np.uint32)
    return (e << 23).view(F32), e.astype(np.uint8)


class Staged(NamedTuple):
    x_fp8: np.ndarray  # [T, H] uint8
    x_sf: np.ndarray  # [T, H/(4G)] int32 or [T, H/G] float32
    topk_idx: np.ndarray  # [T, K] int64
    topk_weights: np.ndarray  # [T, K] float32
    scales: np.ndarray  # [T, H/G] float32 scale per group


def stage(
    hidden: np.ndarray,
    weights: np.ndarray,
    ids: np.ndarray,
    G: int,
    ue8m0: bool,
    is_padding: Optional[np.ndarray] = None,
    floor: float = 1e-4,
    e5m2: bool = False,
) -> Staged:
    """The reference fp8 outputs for float inputs (hidden/weights given as any float dtype);
    ``e5m2``: MXFP8 e5m2's values (G 32, UE8M0) instead of e4m3fn."""
    x32 = np.asarray(hidden).astype(F32)
    T, H = x32.shape
    scale, e = group_scales(x32, G, ue8m0, floor, e5m2)
    with np.errstate(invalid="ignore", over="ignore"):  # Inf * 0 = NaN, as on the GPU
        r = (F32(1.0) / scale).astype(F32)
        y = (x32.reshape(T, H // G, G) * r[:, :, None]).astype(F32).reshape(T, H)
    q = to_fp8_e5m2(y) if e5m2 else to_fp8_e4m3fn(y)
    if ue8m0:
        sf = np.ascontiguousarray(e).view("<i4")  # byte j of word w = group 4w + j
    else:
        sf = scale.copy()
    pad = np.zeros(T, bool) if is_padding is None else np.asarray(is_padding).astype(bool)
    idx = np.where(pad[:, None], np.int64(-1), np.asarray(ids).astype(np.int64))
    w = np.asarray(weights).astype(F32)
    w = np.where(pad[:, None], F32(0.0), w).astype(F32)
    return Staged(q, sf, idx, w, scale)


def shared_row(t: np.ndarray, bm: int) -> np.ndarray:
    """Row of shared_x_sf that receives token t (SPEC.md scale layouts)."""
    abm = (bm + 127) // 128 * 128
    m = t % bm
    return (t // bm) * abm + (m // 128) * 128 + (m % 32) * 4 + (m % 128) // 32


def shared_rows_required(T: int, bm: int) -> int:
    return -(-T // bm) * ((bm + 127) // 128 * 128)


def fp8_to_f32(codes: np.ndarray, e5m2: bool = False) -> np.ndarray:
    """float32 value of fp8 e4m3fn bytes (``e5m2``: of fp8 e5m2 bytes)."""
    if e5m2:
        return fp8_e5m2_to_f32(codes)
    c = np.asarray(codes).astype(np.int64)
    mag = np.concatenate([_POS, [np.nan]])[c & 0x7F]
    return np.where(c & 0x80, -mag, mag).astype(F32)


def hidden_sample(rng: np.random.Generator, T: int, H: int, specials: bool = False) -> np.ndarray:
    """float32 activations with a wide spread of magnitudes per group; some all-zero rows,
    tiny (subnormal-scale) groups; with ``specials`` also NaN, +-Inf and huge values."""
    x = rng.standard_normal((T, H)).astype(F32)
    x *= (F32(2.0) ** rng.integers(-20, 20, size=(T, H // 32, 1)).astype(F32)).repeat(32, 2).reshape(T, H)
    if T > 2:
        x[1] = 0.0
        x[2, :64] *= F32(1e-38)
    if specials:
        flat = x.reshape(-1)
        n = flat.size
        for val in (np.nan, -np.nan, np.inf, -np.inf, 3e38, -1e30, 1e-45):
            flat[rng.integers(0, n, size=max(1, n // 500))] = val
    return x


# ---------------------------------------------------------------------------------------
# fp4 (e2m1) and NVFP4

E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
E2M1_MIDPOINTS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])


def e2m1_ttz(v: np.ndarray) -> np.ndarray:
    """Nibbles (uint8) of float32 ``v``, ties toward zero (DeepGEMM's reference): the code is
    how many midpoints |v| strictly exceeds (|v| > 5 and Inf give 6), the sign only with a
    nonzero code, NaN -> 0."""
    v = np.asarray(v, dtype=F32)
    mag = np.abs(v.astype(np.float64))
    code = (mag[..., None] > E2M1_MIDPOINTS).sum(-1).astype(np.uint8)  # NaN exceeds none
    neg = (np.ascontiguousarray(v).view(np.uint32) >> 31).astype(bool) & (code != 0)
    return (code | (neg.astype(np.uint8) << 3)).astype(np.uint8)


def e2m1_rne(v: np.ndarray) -> np.ndarray:
    """Nibbles of float32 ``v``, nearest with ties to the even code, saturating to 6, the sign
    always kept (-0.0 -> 0x8), NaN -> 0x7 (PTX cvt.rn.satfinite.e2m1x2.f32)."""
    v = np.asarray(v, dtype=F32)
    sign = (np.ascontiguousarray(v).view(np.uint32) >> 31).astype(np.uint8) << 3
    mag = np.abs(v.astype(np.float64))
    nan = np.isnan(mag)
    mag = np.where(nan, 0.0, np.minimum(mag, 6.0))
    return np.where(nan, np.uint8(0x7), nearest_even_code(mag, E2M1_GRID) | sign).astype(np.uint8)


def e2m1_to_f32(nibbles: np.ndarray) -> np.ndarray:
    """float32 value of e2m1 nibbles (0x8 is -0.0)."""
    n = np.asarray(nibbles).astype(np.int64)
    mag = E2M1_GRID[n & 7]
    return np.where(n & 8, -mag, mag).astype(F32)


def pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """[T, H] nibbles -> [T, H/2] bytes: byte j = column 2j (low) | column 2j+1 (high)."""
    c = np.asarray(codes, np.uint8)
    return (c[:, 0::2] | (c[:, 1::2] << 4)).astype(np.uint8)


def pack_words(byte_per_group: np.ndarray) -> np.ndarray:
    """[T, N] scale bytes -> [T, N/4] int32, byte j of word w = group 4w + j."""
    return np.ascontiguousarray(np.asarray(byte_per_group, np.uint8)).view("<i4")


def e4m3_round(y: np.ndarray) -> np.ndarray:
    """(byte, float32 value) of cvt.rn.satfinite.e4m3 on float32 ``y``."""
    b = to_fp8_e4m3fn(y)
    return b, fp8_to_f32(b)


def _grouped(x32: np.ndarray, G: int) -> np.ndarray:
    T, H = x32.shape
    return x32.reshape(T, H // G, G)


class Format(NamedTuple):
    """An accepted scheme as the reference sees it."""

    name: str
    fp4: bool
    sf: str  # "ue8m0", "fp32", "e4m3"
    G: int
    scale2: str  # "none", "static", "per_token"
    rne: bool = False
    e5m2: bool = False  # fp8 values are e5m2 (MXFP8 e5m2), else e4m3fn


FORMATS = {
    "mxfp8": Format("mxfp8", False, "ue8m0", 32, "none"),
    "fp8_ue8m0_g128": Format("fp8_ue8m0_g128", False, "ue8m0", 128, "none"),
    "fp8_fp32_g128": Format("fp8_fp32_g128", False, "fp32", 128, "none"),
    "fp8_fp32_g32": Format("fp8_fp32_g32", False, "fp32", 32, "none"),
    "mxfp8_e5m2": Format("mxfp8_e5m2", False, "ue8m0", 32, "none", e5m2=True),
    "mxfp4": Format("mxfp4", True, "ue8m0", 32, "none"),
    "mxfp4_rne": Format("mxfp4_rne", True, "ue8m0", 32, "none", rne=True),
    "nvfp4_static": Format("nvfp4_static", True, "e4m3", 16, "static"),
    "nvfp4_per_token": Format("nvfp4_per_token", True, "e4m3", 16, "per_token"),
}


class Staged2(NamedTuple):
    """Reference outputs of any format (x_q bytes: fp8 codes or packed nibbles)."""

    x_q: np.ndarray
    x_sf: np.ndarray
    topk_idx: np.ndarray
    topk_weights: np.ndarray
    x_scales: Optional[np.ndarray]
    values: np.ndarray  # [T, H] float32 value of each element (e4m3 / e5m2 / e2m1)
    scales: np.ndarray  # [T, H/G] float32 dequantization scale per group (second level folded in)


def quantize(fmt: Format, hidden: np.ndarray, floor: float = 1e-4, global_scale: Optional[float] = None):
    """(x_q, x_sf, x_scales, values, scales) of ``hidden`` (any float dtype) under ``fmt``."""
    x32 = np.asarray(hidden).astype(F32)
    T, H = x32.shape
    G = fmt.G
    xs = None
    with np.errstate(invalid="ignore", over="ignore", divide="ignore", under="ignore"):
        if not fmt.fp4:
            scale, e = group_scales(x32, G, fmt.sf == "ue8m0", floor, fmt.e5m2)
            r = (F32(1.0) / scale).astype(F32)
            y = (_grouped(x32, G) * r[:, :, None]).astype(F32).reshape(T, H)
            q = to_fp8_e5m2(y) if fmt.e5m2 else to_fp8_e4m3fn(y)
            sf = pack_words(e) if fmt.sf == "ue8m0" else scale.copy()
            return q, sf, None, fp8_to_f32(q, fmt.e5m2), scale
        amax = group_amax(x32, G)
        if fmt.sf == "ue8m0":  # MXFP4
            a = np.fmax(amax, F32(floor)).astype(F32)
            e = ue8m0_exponent((a / F32(6.0)).astype(F32))
            if F32(floor) == 0:  # floor 0: a group whose amax is 0 has the unit scale 2^0
                e = np.where(a == 0, np.uint32(127), e).astype(np.uint32)
            mult = np.ldexp(F32(1.0), (127 - e.astype(np.int64))).astype(F32)  # 2^(127 - e), exact (subnormal at 254)
            v = (_grouped(x32, G) * mult[:, :, None]).astype(F32).reshape(T, H)
            codes = e2m1_rne(v) if fmt.rne else e2m1_ttz(v)
            scale = (e << 23).view(F32)
            return pack_nibbles(codes), pack_words(e.astype(np.uint8)), None, e2m1_to_f32(codes), scale
        if fmt.scale2 == "static":
            gs = F32(global_scale)
            raw = (amax / F32(F32(6.0) * gs)).astype(F32)
            raw = np.where(np.isnan(raw), F32(2.0**-9), np.clip(raw, F32(2.0**-9), F32(448.0))).astype(F32)
            sfb, sfv = e4m3_round(raw)
            d = (sfv * gs).astype(F32)
            v = (_grouped(x32, G) / d[:, :, None]).astype(F32).reshape(T, H)
            codes = e2m1_ttz(v)
            return pack_nibbles(codes), pack_words(sfb), None, e2m1_to_f32(codes), d
        # per token
        row = np.fmax.reduce(np.abs(x32), axis=1, initial=F32(0.0)).astype(F32)
        ra = np.fmax(row, F32(floor)).astype(F32)
        pts = (ra / F32(2688.0)).astype(F32)
        if F32(floor) == 0:  # floor 0: rows below 2^-100 (the format's least positive floor) have pts 1
            pts = np.where(ra < F32(2.0**-100), F32(1.0), pts).astype(F32)
        sfb, sfv = e4m3_round((amax / (F32(6.0) * pts)[:, None].astype(F32)).astype(F32))
        d = (sfv * pts[:, None]).astype(F32)
        inv = np.where(sfv > 0, (F32(1.0) / d).astype(F32), F32(0.0)).astype(F32)
        v = (_grouped(x32, G) * inv[:, :, None]).astype(F32).reshape(T, H)
        codes = e2m1_ttz(v)
        return pack_nibbles(codes), pack_words(sfb), pts, e2m1_to_f32(codes), d


def _weight_product(w: np.ndarray, s) -> np.ndarray:
    """fl(w * s) by the weight rule: one fp32 rounding; a NaN weight keeps its bits, a NaN
    the product makes is 0x7FC00000."""
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = (w * np.asarray(s, F32)).astype(F32)
    # a NaN the product makes (Inf times 0, a NaN scale) is the canonical quiet NaN, whatever the hardware's
    scaled = np.where(np.isnan(scaled), np.uint32(0x7FC00000).view(F32), scaled)
    return np.where(np.isnan(w), w, scaled)


def topk(weights: np.ndarray, ids: np.ndarray, pad: Optional[np.ndarray] = None, alpha: Optional[float] = None,
         rows: Optional[int] = None, expert_scales: Optional[np.ndarray] = None):  # fmt: skip
    """(ids int64, weights float32) of the top-k repack: padded tokens -1 / +0.0, kept
    weights times alpha (one fp32 rounding; NaN keeps its bits, a NaN the product makes is
    0x7FC00000), then times expert_scales[id] where 0 <= id < E (the same rule), rows
    T..rows-1 -1 / +0.0."""
    w = np.asarray(weights).astype(F32)  # bf16/fp16 widen exactly (payloads kept by NumPy)
    T, K = w.shape
    idx = np.asarray(ids).astype(np.int64)
    if alpha is not None:
        w = _weight_product(w, F32(alpha))
    if expert_scales is not None:
        es = np.asarray(expert_scales, F32)
        inside = (idx >= 0) & (idx < es.shape[0])
        s = es[np.clip(idx, 0, max(es.shape[0] - 1, 0))] if es.shape[0] else np.ones_like(w)
        w = np.where(inside, _weight_product(w, s), w)
    p = np.zeros(T, bool) if pad is None else np.asarray(pad).astype(bool)
    idx = np.where(p[:, None], np.int64(-1), idx)
    w = np.where(p[:, None], F32(0.0), w).astype(F32)
    if rows is not None and rows > T:
        idx = np.concatenate([idx, np.full((rows - T, K), -1, np.int64)])
        w = np.concatenate([w, np.zeros((rows - T, K), F32)])
    return idx, w


def stage_any(fmt: Format, hidden, weights, ids, pad=None, floor: float = 1e-4, global_scale=None, alpha=None,
              rows: Optional[int] = None) -> Staged2:  # fmt: skip
    """Every output of staging under ``fmt`` (top-k with ``rows`` rows in full-buffer mode)."""
    q, sf, xs, values, scales = quantize(fmt, hidden, floor, global_scale)
    idx, w = topk(weights, ids, pad, alpha, rows)
    return Staged2(q, sf, idx, w, xs, values, scales)


def dequantized(st: Staged2, G: int) -> np.ndarray:
    """The reference dequantization: fl(value * scale) per element."""
    T, H = st.values.shape
    with np.errstate(invalid="ignore", over="ignore"):
        return (st.values.reshape(T, H // G, G) * st.scales[:, :, None]).astype(F32).reshape(T, H)


def nonfinite(hidden) -> int:
    """Number of NaN and +-Inf elements."""
    return int(np.count_nonzero(~np.isfinite(np.asarray(hidden).astype(F32))))


def snr_db(x: np.ndarray, y: np.ndarray) -> float:
    """10 log10(|x|^2 / |x - y|^2) over the finite elements of x."""
    x64, y64 = np.asarray(x, np.float64), np.asarray(y, np.float64)
    m = np.isfinite(x64)
    err = np.sum((x64[m] - y64[m]) ** 2)
    return float("inf") if err == 0 else float(10 * np.log10(np.sum(x64[m] ** 2) / err))
