"""An independent NumPy reference of MegaMoE staging (SPEC.md), for the Python tests.

Written from SPEC.md only (no code shared with src/core): vectorized float32 arithmetic,
UE8M0 by bit operations, fp8 e4m3fn by a nearest search over the 127 non-negative finite
codes with ties to the even code, saturation to +-448, NaN -> 0x7F.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

F32 = np.float32
C_INV448 = F32(1.0) / F32(448.0)
assert C_INV448.view(np.uint32) == 0x3B124925


def fp8_e4m3fn_values() -> np.ndarray:
    """float64 value of the fp8 e4m3fn codes 0x00..0x7E (ascending, all finite)."""
    codes = np.arange(127)
    exp, man = codes >> 3, codes & 7
    return np.where(exp == 0, man * 2.0**-9, (1.0 + man / 8.0) * 2.0 ** (exp - 7.0))


_POS = fp8_e4m3fn_values()


def to_fp8_e4m3fn(y: np.ndarray) -> np.ndarray:
    """cvt.rn.satfinite.e4m3x2.f32 on float32 ``y``: bytes (uint8), same shape."""
    y = np.asarray(y, dtype=F32)
    sign = (y.view(np.uint32) >> 31).astype(np.uint8) << 7
    mag = np.abs(y.astype(np.float64))
    nan = np.isnan(mag)
    mag = np.where(nan, 0.0, np.minimum(mag, 448.0))  # satfinite (Inf included)
    hi = np.clip(np.searchsorted(_POS, mag, side="left"), 0, 126)
    lo = np.maximum(hi - 1, 0)
    d_lo, d_hi = mag - _POS[lo], _POS[hi] - mag
    take_lo = (d_lo < d_hi) | ((d_lo == d_hi) & (lo % 2 == 0))
    code = np.where(mag == _POS[hi], hi, np.where(take_lo, lo, hi)).astype(np.uint8)
    return np.where(nan, np.uint8(0x7F), code | sign).astype(np.uint8)


def group_scales(x32: np.ndarray, G: int, ue8m0: bool):
    """(scale per group [T, H/G] float32, UE8M0 byte per group or None)."""
    T, H = x32.shape
    amax = np.fmax.reduce(np.abs(x32.reshape(T, H // G, G)), axis=2)  # NaN ignored
    amax = np.fmax(amax, F32(1e-4)).astype(F32)
    s = (amax * C_INV448).astype(F32)
    if not ue8m0:
        return s, None
    b = s.view(np.uint32)
    e = ((b >> 23) & 0xFF) + ((b & 0x7FFFFF) != 0)
    e = np.clip(e, 1, 254).astype(np.uint32)
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
) -> Staged:
    """The reference outputs for float inputs (hidden/weights given as any float dtype)."""
    x32 = np.asarray(hidden).astype(F32)
    T, H = x32.shape
    scale, e = group_scales(x32, G, ue8m0)
    with np.errstate(invalid="ignore", over="ignore"):  # Inf * 0 = NaN, as on the GPU
        r = (F32(1.0) / scale).astype(F32)
        y = (x32.reshape(T, H // G, G) * r[:, :, None]).astype(F32).reshape(T, H)
    q = to_fp8_e4m3fn(y)
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


def fp8_to_f32(codes: np.ndarray) -> np.ndarray:
    """float32 value of fp8 e4m3fn bytes."""
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
