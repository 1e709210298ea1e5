"""megamoe.rmsnorm_and_stage (the RMSNorm producer) from Python, on the CPU backend.

- y and residual_out == an independent NumPy rendering of docs/CONTRACT.md's formulas
  ("RMSNorm and stage"), bit for bit: fp32 steps formed in float64 and rounded once to
  float32 (exact for +, *, / and sqrt of float32 operands), bf16 by round to nearest even
  with NaN as 0x7FC0 (uint32 bit math), the 16-column chunk sums and the fold of halves in
  the contract's order; on random rows, special values and several widths;
- the staged outputs == megamoe.prepare_megamoe_inputs on the reference y, for every format
  and with the staging options;
- in place (y the same view as x, residual_out as residual), full-buffer mode, T = 0;
- every argument error raises the library's message and writes nothing;
- torch (skipped without torch): the op against the direct call and NumPy, in place (eager,
  through the op, compiled), opcheck, FakeTensor, torch.compile.

NumPy has no bfloat16: bf16 arrays are uint16 bit patterns handed over as DLPack capsules
of DLPack's bfloat type (ml_dtypes' bfloat16 arrays too, when it is installed).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import megamoe
from megamoe._signature import NORM_AND_STAGE
from megamoe_testutil import (
    ALL_SCHEMES,
    assert_bitwise,
    assert_fake_writes_nothing,
    clone_args,
    dlpack_capsule,
    same_mutated,
    spec_op_values,
    tbits,
    torch_staging_outputs,
)
from test_formats import gs_for, outputs

try:
    import torch
except ImportError:  # CI: NumPy only
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

F32, F64 = np.float32, np.float64
CHUNK = 16
DL_BFLOAT = (4, 16, 1)  # DLPack's (code, bits, lanes) of bfloat16
FORMATS = ["MXFP8", "FP8_FP32_G128", "MXFP4", "NVFP4_PER_TOKEN"]


# ---------------------------------------------------------------------------------------
# The NumPy rendering of the contract (docs/CONTRACT.md, "RMSNorm and stage")


def f32_of_bf16(b: np.ndarray) -> np.ndarray:
    return (np.asarray(b, np.uint16).astype(np.uint32) << 16).view(F32)


def bf16_of_f32(f: np.ndarray) -> np.ndarray:
    """Round to nearest even; every NaN becomes 0x7FC0 (PyTorch's c10::BFloat16 rule)."""
    u = np.asarray(f, F32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, 0x7FC0, rounded).astype(np.uint16)


def fl(v) -> np.ndarray:
    """One fp32 rounding of a float64 value (the exact result of an fp32 operation)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(v, F64).astype(F32)


def norm_reference(x, residual=None, weight=None, eps=1e-6):
    """(y, z) as uint16 bf16 bits for bf16 bit arrays ``x`` / ``residual`` [T, H] and a
    weight [H] (float32 values, or uint16 bf16 bits); z is what residual_out receives."""
    xf = f32_of_bf16(x)
    zb = np.asarray(x, np.uint16) if residual is None else bf16_of_f32(fl(xf.astype(F64) + f32_of_bf16(residual)))
    z = f32_of_bf16(zb).astype(F64)
    T, H = z.shape
    sq = fl(z * z).astype(F64).reshape(T, H // CHUNK, CHUNK)
    acc = sq[:, :, 0].astype(F32)
    for i in range(1, CHUNK):  # each chunk in order
        acc = fl(acc.astype(F64) + sq[:, :, i])
    n = H // CHUNK
    N = 1
    while N < n:
        N *= 2
    c = np.zeros((T, N), F32)  # chunks n..N-1 are +0
    c[:, :n] = acc
    h = N // 2
    while h >= 1:  # fold the halves, highest first
        c[:, :h] = fl(c[:, :h].astype(F64) + c[:, h : 2 * h])
        h //= 2
    S = c[:, 0].astype(F64)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = fl(fl(S / H).astype(F64) + float(F32(eps)))
        s = fl(1.0 / fl(np.sqrt(mean.astype(F64))).astype(F64))
    w = np.asarray(weight)
    wf = (f32_of_bf16(w) if w.dtype == np.uint16 else w.astype(F32)).astype(F64)
    with np.errstate(invalid="ignore"):
        t = f32_of_bf16(bf16_of_f32(fl(z * s[:, None].astype(F64)))).astype(F64)
        y = bf16_of_f32(fl(t * wf[None, :]))
    return y, zb


def test_reference_rounding_rules():
    """The reference's own pieces on values whose answers are known."""
    f = np.array([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-8 + 2**-20, -0.0, np.inf, np.nan, -np.nan], F32)
    assert list(bf16_of_f32(f)) == [0x3F80, 0x3F80, 0x3F82, 0x3F81, 0x8000, 0x7F80, 0x7FC0, 0x7FC0]
    # the midpoint between the largest bf16 (0x7F7F, odd) and 2^128 rounds to the even: +Inf
    assert bf16_of_f32(np.array([0x7F7F8000, 0x7F7F7FFF], np.uint32).view(F32)).tolist() == [0x7F80, 0x7F7F]
    # a row of ones: S = H, s = 1 / sqrt(1 + eps)
    y, _ = norm_reference(np.full((1, 128), 0x3F80, np.uint16), None, np.ones(128, F32), eps=0.0)
    assert np.all(y == 0x3F80)


# ---------------------------------------------------------------------------------------
# Arrays


def bf16_bits(rng: np.random.Generator, T: int, H: int, scale: float = 1.0) -> np.ndarray:
    return bf16_of_f32((rng.standard_normal((T, H)) * scale).astype(F32))


def bf(a: np.ndarray, **kw):
    """A bfloat16 DLPack capsule over the uint16 bits ``a`` (a fresh one per call: a capsule
    is imported once)."""
    assert a.dtype == np.uint16
    return dlpack_capsule(a, dtype=DL_BFLOAT, **kw)


def call(x, residual, weight, topk_weights, topk_ids, out, **kw):
    """rmsnorm_and_stage with bf16 bit arrays as capsules (x, residual, weight if uint16,
    y and residual_out)."""
    cap = lambda a: bf(a) if isinstance(a, np.ndarray) and a.dtype == np.uint16 else a  # noqa: E731
    for k in ("y", "residual_out"):
        if k in kw:
            kw[k] = cap(kw[k])
    megamoe.rmsnorm_and_stage(cap(x), cap(residual), cap(weight), topk_weights, topk_ids, **out, **kw)


def staged_by_prepare(y_bits, topk_weights, topk_ids, scheme, rows=None, **kw):
    """What prepare_megamoe_inputs stages for the rows ``y_bits`` (bf16), outputs poisoned."""
    T, H = y_bits.shape
    out = outputs(T, H, topk_ids.shape[1], scheme, rows=rows)
    if "shared_block_m" in kw:
        out["shared_x_sf"] = kw.pop("shared_x_sf").copy()
    megamoe.prepare_megamoe_inputs(bf(y_bits), topk_weights, topk_ids, **out, hidden_quant=scheme, **kw)
    return out


def assert_same_outputs(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for k in want:
        assert_bitwise(got[k], want[k], k)


def topk(rng, T, K=6, E=64):
    return rng.random((T, K)).astype(F32), rng.integers(0, E, (T, K)).astype(np.int32)


def weight_of(rng, H, dtype):
    w = (1.0 + 0.5 * rng.standard_normal(H)).astype(F32)
    return bf16_of_f32(w) if dtype == "bf16" else w


# ---------------------------------------------------------------------------------------
# Bitwise against the reference


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("wdtype", ["fp32", "bf16"])
@pytest.mark.parametrize("T,H", [(1, 128), (5, 384), (9, 640), (33, 1024)])
def test_norm_and_staging_bitwise(name, with_residual, wdtype, T, H):
    s = ALL_SCHEMES[name]
    if s.ue8m0 and (H // s.group_k) % 4:
        pytest.skip("UE8M0 needs H/G to be a multiple of 4")
    rng = np.random.default_rng(T * 31 + H)
    x = bf16_bits(rng, T, H, 3.0)
    res = bf16_bits(rng, T, H, 0.5) if with_residual else None
    w = weight_of(rng, H, wdtype)
    tw, ti = topk(rng, T)
    y_ref, z_ref = norm_reference(x, res, w, eps=1e-5)
    y = np.full((T, H), 0xA5A5, np.uint16)
    extra = {}
    if with_residual:
        extra["residual_out"] = np.full((T, H), 0xA5A5, np.uint16)
    out = outputs(T, H, 6, s)
    call(x, res, w, tw, ti, out, hidden_quant=s, eps=1e-5, y=y, **extra)
    assert_bitwise(y, y_ref, "y")
    if with_residual:
        assert_bitwise(extra["residual_out"], z_ref, "residual_out")
    assert_same_outputs(out, staged_by_prepare(y_ref, tw, ti, s))


@pytest.mark.parametrize("name", list(ALL_SCHEMES))
def test_every_format_without_y(name):
    """The rows are staged without being written anywhere (no y): the same bytes."""
    s = ALL_SCHEMES[name]
    T, H = 7, 512
    rng = np.random.default_rng(5)
    x, res = bf16_bits(rng, T, H, 2.0), bf16_bits(rng, T, H)
    w = weight_of(rng, H, "fp32")
    tw, ti = topk(rng, T)
    gs = gs_for(name)
    kw = {} if gs is None else {"global_scale": gs}
    out = outputs(T, H, 6, s)
    x0, res0 = x.copy(), res.copy()
    call(x, res, w, tw, ti, out, hidden_quant=s, **kw)
    assert_bitwise(x, x0, "x (read only)")
    assert_bitwise(res, res0, "residual (read only)")
    y_ref, _ = norm_reference(x, res, w)
    assert_same_outputs(out, staged_by_prepare(y_ref, tw, ti, s, **kw))


def test_special_rows():
    """NaN and Inf in a row, a zero row, rows whose sum of squares overflows (s = 0) or is
    tiny, subnormal and -0.0 elements, weights with NaN / Inf / 0; eps = 0 with a zero row
    gives s = Inf (y NaN)."""
    H = 256
    rng = np.random.default_rng(11)
    rows = bf16_of_f32((rng.standard_normal((10, H)) * 2).astype(F32))
    rows[1, 7] = 0x7FC1  # NaN (a payload: y is the canonical NaN)
    rows[2, 100] = 0x7F80  # +Inf: S = Inf, s = 0, y = NaN where z is infinite
    rows[3] = 0  # a zero row
    rows[4] = bf16_of_f32(np.full(H, 3e38, F32))  # S overflows: y = +-0
    rows[5] = bf16_of_f32(np.full(H, 1e-30, F32))  # S underflows toward eps
    rows[6] = 0x0001  # subnormal bf16
    rows[7, ::2] = 0x8000  # -0.0
    rows[8] = bf16_of_f32(np.full(H, -2.0**60, F32))
    w = weight_of(rng, H, "fp32")
    w[3], w[9], w[10] = np.nan, np.inf, 0.0
    tw, ti = topk(rng, 10)
    for eps in (1e-6, 0.0, 0.5):
        y = np.zeros((10, H), np.uint16)
        cnt = np.zeros(1, np.int64)
        out = outputs(10, H, 6, megamoe.MXFP8)
        call(rows, None, w, tw, ti, out, eps=eps, y=y, nonfinite_count=cnt)
        y_ref, _ = norm_reference(rows, None, w, eps=eps)
        assert_bitwise(y, y_ref, f"y (eps={eps})")
        nonfinite = int(np.sum(~np.isfinite(f32_of_bf16(y_ref))))
        assert cnt[0] == nonfinite, "the counter counts y's non-finite values"
        assert_same_outputs(out, staged_by_prepare(y_ref, tw, ti, megamoe.MXFP8))
    assert np.all(f32_of_bf16(y_ref[1]) != f32_of_bf16(y_ref[1]))  # a NaN row is NaN throughout
    y0, _ = norm_reference(rows, None, w, eps=0.0)
    assert np.all(y0[3] == 0x7FC0), "eps = 0 on a zero row: s = Inf, y = NaN"


def test_sum_order_is_the_contracts():
    """Rows of magnitudes spread over 2^-4..2^5 make the partial sums inexact, so the sum of
    squares depends on its order. y's bf16 rounding hides most one-ulp changes of s, but
    in this sample (fixed seed) some y differ when the chunks are summed in reverse or the
    halves folded in reversed pairs: the contract's order is what the library follows."""
    T, H = 256, 1152
    rng = np.random.default_rng(H)
    v = rng.uniform(1, 2, (T, H)) * np.exp2(rng.integers(-4, 5, (T, H))) * rng.choice([-1, 1], (T, H))
    x = bf16_of_f32(v.astype(F32))
    w = np.ones(H, F32)
    tw, ti = topk(rng, T)
    y = np.zeros((T, H), np.uint16)
    call(x, None, w, tw, ti, outputs(T, H, 6, megamoe.MXFP8), y=y, eps=0.0)
    assert_bitwise(y, norm_reference(x, None, w, eps=0.0)[0], "y")


def test_residual_add_rounds_once_to_bf16():
    """z = bf16(fl(x + residual)): sums exactly between two bf16 values go to the even one."""
    H = 128
    x = np.full((2, H), 0x3F80, np.uint16)  # 1.0
    res = np.zeros((2, H), np.uint16)
    res[0] = bf16_of_f32(np.full(H, 2.0**-8, F32))  # 1 + 2^-8: a tie, stays 1.0
    res[1] = bf16_of_f32(np.full(H, 3 * 2.0**-8, F32))  # 1 + 3*2^-8: a tie, goes up to 1 + 2^-6
    z = np.zeros((2, H), np.uint16)
    tw, ti = topk(np.random.default_rng(0), 2)
    call(x, res, np.ones(H, F32), tw, ti, outputs(2, H, 6, megamoe.MXFP8), residual_out=z)
    assert np.all(z[0] == 0x3F80) and np.all(z[1] == 0x3F82)


def test_strided_rows_and_weight():
    """Column slices of wider buffers and a strided weight (any strides are taken)."""
    T, H = 6, 256
    rng = np.random.default_rng(2)
    xb, rb = bf16_bits(rng, T, 2 * H), bf16_bits(rng, T, 3 * H)
    wb = weight_of(rng, 2 * H, "bf16")
    x, res, w = xb[:, H:], rb[:, ::3], wb[::2]
    yb = np.zeros((T, 2 * H), np.uint16)
    tw, ti = topk(rng, T)
    out = outputs(T, H, 6, megamoe.MXFP8)
    megamoe.rmsnorm_and_stage(bf(x), bf(res), bf(w), tw, ti, **out, y=bf(yb[:, ::2]))
    y_ref, _ = norm_reference(x, res, w)
    assert_bitwise(yb[:, ::2], y_ref, "y")
    assert np.all(yb[:, 1::2] == 0), "y's strides are kept"
    assert_same_outputs(out, staged_by_prepare(y_ref, tw, ti, megamoe.MXFP8))


def test_staging_options():
    """Padding, shared_x_sf, the routed scaling factor, per-expert scales and the counter
    apply to the normalized rows as prepare_megamoe_inputs applies them."""
    T, H, bm = 10, 512, 8
    rng = np.random.default_rng(4)
    x, res = bf16_bits(rng, T, H), bf16_bits(rng, T, H)
    w = weight_of(rng, H, "bf16")
    tw, ti = topk(rng, T)
    pad = np.arange(T) % 3 == 1
    scales = (0.5 + rng.random(64)).astype(F32)
    shared_rows = megamoe.output_shapes(T, H, 6, megamoe.MXFP8, bm).shared_x_sf.shape
    shared = np.full(shared_rows, 0x5A5A5A5A, np.int32)
    opts = dict(is_padding=pad, shared_block_m=bm, routed_scaling_factor=1.5, expert_scales=scales)
    out = outputs(T, H, 6, megamoe.MXFP8)
    out["shared_x_sf"] = shared.copy()
    cnt = np.array([5], np.int64)
    call(x, res, w, tw, ti, out, nonfinite_count=cnt, **opts)
    y_ref, _ = norm_reference(x, res, w)
    want = staged_by_prepare(y_ref, tw, ti, megamoe.MXFP8, shared_x_sf=shared, **opts)
    assert_same_outputs(out, want)
    assert cnt[0] == 5


def test_in_place():
    """y = x and residual_out = residual as the very same views (vLLM's fused_add_rms_norm)."""
    T, H = 8, 384
    rng = np.random.default_rng(9)
    x, res = bf16_bits(rng, T, H, 4.0), bf16_bits(rng, T, H)
    w = weight_of(rng, H, "fp32")
    tw, ti = topk(rng, T)
    y_ref, z_ref = norm_reference(x, res, w)
    out = outputs(T, H, 6, megamoe.FP8_FP32_G128)
    megamoe.rmsnorm_and_stage(bf(x), bf(res), w, tw, ti, **out, hidden_quant=megamoe.FP8_FP32_G128,
                              y=bf(x), residual_out=bf(res))  # fmt: skip
    assert_bitwise(x, y_ref, "x (now y)")
    assert_bitwise(res, z_ref, "residual (now z)")
    assert_same_outputs(out, staged_by_prepare(y_ref, tw, ti, megamoe.FP8_FP32_G128))


def test_in_place_ml_dtypes_same_object():
    """With ml_dtypes, the same bfloat16 array object may be passed as x and y."""
    ml = pytest.importorskip("ml_dtypes")
    T, H = 4, 256
    rng = np.random.default_rng(1)
    bits = bf16_bits(rng, T, H)
    x = bits.copy().view(ml.bfloat16)
    w = weight_of(rng, H, "fp32")
    tw, ti = topk(rng, T)
    y_ref, _ = norm_reference(bits, None, w)
    out = outputs(T, H, 6, megamoe.MXFP8)
    megamoe.rmsnorm_and_stage(x, None, w, tw, ti, **out, y=x)
    assert_bitwise(x.view(np.uint16), y_ref, "x (now y)")


def test_full_buffer():
    T, M, H = 5, 12, 256
    rng = np.random.default_rng(3)
    x = bf16_bits(rng, T, H)
    w = weight_of(rng, H, "fp32")
    tw, ti = topk(rng, T)
    out = outputs(T, H, 6, megamoe.MXFP8, rows=M)
    call(x, None, w, tw, ti, out, full_buffer=True)
    y_ref, _ = norm_reference(x, None, w)
    want = staged_by_prepare(y_ref, tw, ti, megamoe.MXFP8, rows=M, full_buffer=True)
    assert_same_outputs(out, want)
    assert np.all(out["topk_idx_out"][T:] == -1) and np.all(out["x_fp8"][T:] == 0xA5)


def test_zero_tokens():
    H = 256
    x = np.zeros((0, H), np.uint16)
    # without full_buffer nothing else is read (as prepare_megamoe_inputs)
    megamoe.rmsnorm_and_stage(bf(x), "junk", None, None, None, None, None, None, None, eps=-1.0)
    megamoe.rmsnorm_and_stage(x.astype(np.float64), None, None, None, None, None, None, None, None)
    # full buffer: every argument is checked and the top-k tail filled
    tw, ti = np.zeros((0, 6), F32), np.zeros((0, 6), np.int32)
    out = outputs(0, H, 6, megamoe.MXFP8, rows=4)
    call(x, None, np.ones(H, F32), tw, ti, out, full_buffer=True, y=np.zeros((0, H), np.uint16))
    assert np.all(out["topk_idx_out"] == -1) and np.all(out["topk_weights_out"].view(np.uint32) == 0)
    assert np.all(out["x_fp8"] == 0xA5)
    with pytest.raises(ValueError, match=re.escape("megamoe: weight: expected shape (256,), got shape (128,)")):
        call(x, None, np.ones(128, F32), tw, ti, outputs(0, H, 6, megamoe.MXFP8, rows=4), full_buffer=True)


# ---------------------------------------------------------------------------------------
# Errors: the library's messages, nothing written


def error_case_args():
    T, H = 4, 256
    rng = np.random.default_rng(8)
    x, res = bf16_bits(rng, T, H), bf16_bits(rng, T, H)
    tw, ti = topk(rng, T)
    return x, res, weight_of(rng, H, "fp32"), tw, ti


ERRORS = [
    # (what to change, exception, message)
    ("x float32", ValueError, "megamoe: x: expected dtype bfloat16, got dtype float32"),
    ("x float64", ValueError, "megamoe: x: expected dtype bfloat16, got dtype float64"),
    ("x None", TypeError, "megamoe: x: expected an array (DLPack or buffer protocol), got None"),
    ("weight None", TypeError, "megamoe: weight: expected an array (DLPack or buffer protocol), got None"),
    ("residual rows", ValueError, "megamoe: residual: expected shape (4, 256), got shape (3, 256)"),
    ("weight shape", ValueError, "megamoe: weight: expected shape (256,), got shape (128,)"),
    ("weight float16", ValueError, "megamoe: weight: expected dtype bfloat16 or float32, got dtype float16"),
    ("residual_out alone", ValueError, "megamoe: residual_out: expected none (the call has no residual), got a tensor"),
    ("eps negative", ValueError, "megamoe: eps: expected a finite value >= 0, got -1"),
    ("eps nan", ValueError, "megamoe: eps: expected a finite value >= 0, got nan"),
    ("eps huge", ValueError, "megamoe: eps: expected a value within float32's range, got 1.0000000000000001e+300"),
    ("eps str", TypeError, "megamoe: eps: expected a float, got str"),
    ("eps None", TypeError, "megamoe: eps: expected a float, got NoneType"),
    ("y shape", ValueError, "megamoe: y: expected shape (4, 256), got shape (4, 128)"),
    ("y uint16", ValueError, "megamoe: y: expected dtype bfloat16, got dtype uint16"),
    ("y overlaps x", ValueError, "megamoe: y: expected memory disjoint from x, got overlapping memory"),
    ("y overlaps x_fp8", ValueError, "megamoe: x_fp8: expected memory disjoint from y, got overlapping memory"),
    ("topk rows", ValueError, "megamoe: topk_ids: expected shape (4, 6), got shape (3, 6)"),
    ("H % 128 (x)", ValueError, "(x: expected hidden_size % 128 == 0, got 192)"),
    ("H % 128 (y)", ValueError, "(y: expected hidden_size % 128 == 0, got 192)"),
    ("x_scales for mxfp8", ValueError, "megamoe: x_scales: expected none (mxfp8 has no per-token scales), got a tensor"),
    ("scheme", TypeError, "hidden_quant"),
]


@pytest.mark.parametrize("what,exc,message", ERRORS, ids=[e[0] for e in ERRORS])
def test_errors_write_nothing(what, exc, message):
    x, res, w, tw, ti = error_case_args()
    T, H = x.shape
    out = outputs(T, H, 6, megamoe.MXFP8)
    y = np.full((T, H), 0xA5A5, np.uint16)
    z = np.full((T, H), 0xA5A5, np.uint16)
    a = dict(x=bf(x), residual=None, weight=w, topk_weights=tw, topk_ids=ti, **out, y=bf(y))
    if what == "x float32":
        a["x"] = f32_of_bf16(x)
    elif what == "x float64":
        a["x"] = f32_of_bf16(x).astype(F64)
    elif what == "x None":
        a["x"] = None
    elif what == "weight None":
        a["weight"] = None
    elif what == "residual rows":
        a["residual"] = bf(res[:3])
    elif what == "weight shape":
        a["weight"] = w[:128]
    elif what == "weight float16":
        a["weight"] = w.astype(np.float16)
    elif what == "residual_out alone":
        a["residual_out"] = bf(z)
    elif what.startswith("eps"):
        bad = {"eps negative": -1.0, "eps nan": float("nan"), "eps huge": 1e300, "eps str": "1", "eps None": None}
        a["eps"] = bad[what]
    elif what == "y shape":
        a["y"] = bf(y[:, :128])
    elif what == "y uint16":
        a["y"] = y
    elif what == "y overlaps x":
        wide = np.concatenate([x.reshape(-1), np.zeros(1, np.uint16)])
        a["x"] = bf(wide[: T * H].reshape(T, H))
        a["y"] = bf(wide[1:].reshape(T, H))
    elif what == "y overlaps x_fp8":  # y's bytes start halfway into x_fp8's
        buf = np.full(3 * T * H, 0xA5, np.uint8)
        out["x_fp8"] = a["x_fp8"] = buf[: T * H].reshape(T, H)
        a["y"] = bf(buf[T * H // 2 : T * H // 2 + 2 * T * H].view(np.uint16).reshape(T, H))
        y = buf[T * H :].view(np.uint16)  # y's bytes past x_fp8, checked below
    elif what == "topk rows":
        a["topk_weights"], a["topk_ids"] = tw[:3], ti[:3]
    elif what.startswith("H % 128"):
        a["x"], a["residual"], a["weight"] = bf(x[:, :192]), None, w[:192]
        if what.endswith("(x)"):
            del a["y"]
        else:
            a["y"] = bf(y[:, :192])
    elif what == "x_scales for mxfp8":
        a["x_scales"] = np.zeros(T, F32)
    elif what == "scheme":
        a["hidden_quant"] = "mxfp8"
    before = {k: v.copy() for k, v in out.items()}
    with pytest.raises(exc, match=re.escape(message)):
        megamoe.rmsnorm_and_stage(**a)
    for k, v in before.items():
        assert_bitwise(out[k], v, k)
    assert np.all(y == 0xA5A5) and np.all(z == 0xA5A5), "the norm's outputs are untouched"


@pytest.mark.skipif(megamoe.has_cuda_backend(), reason="a build with the CUDA backend runs CUDA tensors")
def test_cuda_tensors_without_the_cuda_backend():
    """CUDA tensors (device type 2 capsules; nothing is dereferenced) in a build without the
    CUDA backend get UnsupportedError from the library before anything is written."""
    x, _, w, tw, ti = error_case_args()
    T, H = x.shape
    out = outputs(T, H, 6, megamoe.MXFP8)
    before = {k: v.copy() for k, v in out.items()}
    caps = {k: dlpack_capsule(v, device=2) for k, v in out.items()}
    with pytest.raises(megamoe.UnsupportedError, match=re.escape("expected a CPU tensor (this build has no CUDA backend)")):
        megamoe.rmsnorm_and_stage(bf(x, device=2), None, dlpack_capsule(w, device=2), dlpack_capsule(tw, device=2),
                                  dlpack_capsule(ti, device=2), **caps)  # fmt: skip
    for k, v in before.items():
        assert_bitwise(out[k], v, k)


def test_public_function():
    import inspect

    fn = megamoe.rmsnorm_and_stage
    assert inspect.signature(fn) == NORM_AND_STAGE.signature()
    positional = [n for n, p in inspect.signature(fn).parameters.items() if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert positional[:5] == ["x", "residual", "weight", "topk_weights", "topk_ids"]
    assert inspect.signature(fn).parameters["residual"].default is inspect.Parameter.empty
    assert inspect.signature(fn).parameters["eps"].default == 1e-6
    assert fn.__module__ == "megamoe" and "Raises:" in fn.__doc__ and "rmsnorm_and_stage" in megamoe.__all__
    assert inspect.signature(megamoe.explain_rmsnorm_and_stage) == NORM_AND_STAGE.signature()


def test_explain_names_the_norm_then_the_staging():
    x, _, w, tw, ti = error_case_args()
    T, H = x.shape
    out = outputs(T, H, 6, megamoe.MXFP8)
    before = {k: v.copy() for k, v in out.items()}
    text = megamoe.explain_rmsnorm_and_stage(bf(x), None, w, tw, ti, **out)
    assert text.startswith(f"cpu backend: rmsnorm T={T} H={H} over token rows"), text
    assert "then cpu backend: mxfp8" in text, text
    for k, v in before.items():  # nothing runs
        assert_bitwise(out[k], v, k)
    assert megamoe.explain_rmsnorm_and_stage(bf(x[:0]), None, w, tw[:0], ti[:0], **out) == (
        "nothing to do: x has no rows (T == 0)")  # fmt: skip
    with pytest.raises(ValueError, match="eps"):
        megamoe.explain_rmsnorm_and_stage(bf(x), None, w, tw, ti, **out, eps=-1.0)


# ---------------------------------------------------------------------------------------
# torch (CPU tensors)


def torch_args(T=6, H=256, scheme=megamoe.MXFP8, residual=True, seed=0, full=False):
    g = np.random.default_rng(seed)
    rows = T + 3 if full else T
    bf16 = lambda a: torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)  # noqa: E731
    tw, ti = topk(g, T)
    a = dict(
        x=bf16(bf16_bits(g, T, H, 2.0)),
        residual=bf16(bf16_bits(g, T, H)) if residual else None,
        weight=torch.from_numpy(weight_of(g, H, "fp32")),
        topk_weights=torch.from_numpy(tw), topk_ids=torch.from_numpy(ti),
        **torch_staging_outputs(rows, H, 6, scheme),
        hidden_quant=scheme, full_buffer=full, eps=1e-5,
        y=torch.full((T, H), 7.0, dtype=torch.bfloat16),
        residual_out=torch.full((T, H), 7.0, dtype=torch.bfloat16) if residual else None,
        nonfinite_count=torch.zeros(1, dtype=torch.int64),
    )  # fmt: skip
    return a


def same_outputs(a, b, what):
    same_mutated(NORM_AND_STAGE, a, b, what)


def op_values(a):
    return spec_op_values(NORM_AND_STAGE, a)


@needs_torch
@pytest.mark.parametrize("name", FORMATS)
def test_torch_direct_op_and_numpy_agree(name):
    a = torch_args(scheme=ALL_SCHEMES[name], seed=3)
    b = clone_args(a)
    megamoe.rmsnorm_and_stage(**a)  # eager: the direct path
    torch.ops.megamoe.rmsnorm_and_stage(*op_values(b))
    same_outputs(a, b, "op vs direct")
    y_ref, z_ref = norm_reference(tbits(b["x"]).view(np.uint16), tbits(b["residual"]).view(np.uint16),
                                  b["weight"].numpy(), eps=1e-5)  # fmt: skip
    assert_bitwise(tbits(a["y"]).view(np.uint16), y_ref, "y")
    assert_bitwise(tbits(a["residual_out"]).view(np.uint16), z_ref, "residual_out")


@needs_torch
def test_torch_in_place():
    a = torch_args(seed=5)
    x, res = a["x"].clone(), a["residual"].clone()
    y_ref, z_ref = norm_reference(tbits(x).view(np.uint16), tbits(res).view(np.uint16), a["weight"].numpy(), eps=1e-5)
    b = clone_args(a)
    a.update(y=a["x"], residual_out=a["residual"])
    megamoe.rmsnorm_and_stage(**a)
    assert_bitwise(tbits(a["x"]).view(np.uint16), y_ref, "x (now y)")
    assert_bitwise(tbits(a["residual"]).view(np.uint16), z_ref, "residual (now z)")
    b.update(y=b["x"], residual_out=b["residual"])
    torch.ops.megamoe.rmsnorm_and_stage(*op_values(b))  # the op, in place
    same_outputs(a, b, "op in place vs direct")


@pytest.mark.skipif(torch is None or not hasattr(torch.library, "opcheck"), reason="needs torch.library.opcheck")
@pytest.mark.parametrize("option", ["plain", "full_buffer", "nvfp4_per_token", "no_residual"])
def test_opcheck(option):
    scheme = megamoe.NVFP4_PER_TOKEN if option == "nvfp4_per_token" else megamoe.MXFP8
    a = torch_args(scheme=scheme, full=option == "full_buffer", residual=option != "no_residual")
    torch.library.opcheck(torch.ops.megamoe.rmsnorm_and_stage.default, op_values(a))


@needs_torch
def test_op_schema_declares_every_output():
    schema = torch.ops.megamoe.rmsnorm_and_stage.default._schema
    mutated = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert mutated == set(NORM_AND_STAGE.mutates_args()) == {
        "x_fp8", "x_sf", "topk_idx_out", "topk_weights_out", "shared_x_sf", "y", "residual_out", "global_scale",
        "x_scales", "nonfinite_count"}  # fmt: skip
    assert not schema.returns


@needs_torch
def test_fake_tensor_mode():
    assert_fake_writes_nothing(NORM_AND_STAGE, megamoe.rmsnorm_and_stage, torch_args())


@needs_torch
def test_torch_compile_fullgraph():
    a = torch_args(seed=4)
    b = clone_args(a)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(x, res, w, tw, ti, q, sf, idx, wo, y, z):
        megamoe.rmsnorm_and_stage(x, res, w, tw, ti, q, sf, idx, wo, eps=1e-5, y=y, residual_out=z)
        return wo.sum()

    names = ["x", "residual", "weight", "topk_weights", "topk_ids", "x_fp8", "x_sf", "topk_idx_out",
             "topk_weights_out", "y", "residual_out"]  # fmt: skip
    f(*[a[n] for n in names])
    megamoe.rmsnorm_and_stage(**{k: v for k, v in b.items() if k != "nonfinite_count"})
    for k in ("x_fp8", "x_sf", "topk_idx_out", "topk_weights_out", "y", "residual_out"):
        assert_bitwise(tbits(a[k]), tbits(b[k]), f"{k} compiled vs eager")


@needs_torch
def test_torch_compile_in_place():
    """y = x and residual_out = residual inside a compiled region: the functionalized op
    writes its copies back into x and residual."""
    a = torch_args(seed=7)
    b = clone_args(a)
    y_ref, z_ref = norm_reference(tbits(a["x"]).view(np.uint16), tbits(a["residual"]).view(np.uint16),
                                  a["weight"].numpy(), eps=1e-5)  # fmt: skip

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(x, res, w, tw, ti, q, sf, idx, wo):
        megamoe.rmsnorm_and_stage(x, res, w, tw, ti, q, sf, idx, wo, eps=1e-5, y=x, residual_out=res)
        return x.float().sum()

    names = ["x", "residual", "weight", "topk_weights", "topk_ids", "x_fp8", "x_sf", "topk_idx_out", "topk_weights_out"]
    f(*[a[n] for n in names])
    assert_bitwise(tbits(a["x"]).view(np.uint16), y_ref, "x (now y)")
    assert_bitwise(tbits(a["residual"]).view(np.uint16), z_ref, "residual (now z)")
    megamoe.rmsnorm_and_stage(**{n: b[n] for n in names}, eps=1e-5, y=b["x"], residual_out=b["residual"])
    for k in ("x_fp8", "x_sf", "topk_idx_out", "topk_weights_out"):
        assert_bitwise(tbits(a[k]), tbits(b[k]), f"{k} compiled vs eager")


@needs_torch
def test_torch_zero_tokens_and_errors():
    a = torch_args(T=0, residual=False)
    megamoe.rmsnorm_and_stage(**dict(a, weight=None))  # T = 0: nothing read
    a = torch_args()
    with pytest.raises(ValueError, match=re.escape("megamoe: x: expected dtype bfloat16, got dtype float32")):
        megamoe.rmsnorm_and_stage(**dict(a, x=a["x"].float()))
    with pytest.raises(ValueError, match=re.escape("megamoe: x: expected dtype bfloat16, got dtype float32")):
        torch.ops.megamoe.rmsnorm_and_stage(*op_values(dict(a, x=a["x"].float())))
