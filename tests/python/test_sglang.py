"""SGLang drop-ins (DeepGEMM's mega_moe_pre_dispatch / mega_moe_pre_dispatch_sm90 as SGLang
calls them) on NumPy arrays: DeepGEMM's buffer semantics (first num_tokens rows staged,
top-k tail -1 / 0, other rows untouched), its formats, expert scales and routed scaling,
against megamoe_npref.py; and the one rounding where DeepGEMM's kernels and megamoe differ
(fp32 scales: amax / 448 there, amax * fl(1/448) here), measured."""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest

import megamoe
import megamoe_npref as ref
from megamoe_testutil import assert_bitwise, bits

F = ref.FORMATS


def bf16_like(rng, T, H):
    """float32 values bf16 can hold (SGLang stages bf16 hidden states)."""
    x = (rng.standard_normal((T, H)) * 4).astype(np.float32)
    return (x.view(np.uint32) & 0xFFFF0000).view(np.float32)


def buffers(P, H, K, fp4=False, sf_cols=None, sf_dtype=np.int32):
    return dict(
        buf_x=np.full((P, H // 2 if fp4 else H), 0xA5, np.uint8),
        buf_x_sf=np.full((P, sf_cols), 0x5A5A5A5A, np.int32).view(sf_dtype),
        buf_topk_idx=np.full((P, K), 0x4242, np.int64),
        buf_topk_weights=np.full((P, K), np.nan, np.float32),
    )


def routing(rng, n, K):
    return rng.integers(0, 256, (n, K)).astype(np.int32), rng.standard_normal((n, K)).astype(np.float32)


def check_rows(buf, want, n, P, x_name="buf_x"):
    assert_bitwise(buf[x_name][:n], want.x_q, x_name)
    assert_bitwise(buf["buf_x_sf"][:n], want.x_sf, "buf_x_sf")
    assert np.all(buf[x_name][n:] == 0xA5), "rows num_tokens.. of buf_x must stay untouched"
    assert np.all(buf["buf_x_sf"][n:].view(np.int32) == 0x5A5A5A5A), "rows num_tokens.. of buf_x_sf must stay untouched"
    assert np.all(buf["buf_topk_idx"][n:] == -1) and np.all(bits(buf["buf_topk_weights"][n:]) == 0)


def test_signatures_match_deepgemm():
    sig = inspect.signature(megamoe.mega_moe_pre_dispatch)
    assert list(sig.parameters)[:12] == [
        "x", "topk_idx", "topk_weights", "buf_x", "buf_x_sf", "buf_topk_idx", "buf_topk_weights",
        "num_tokens", "group_size", "mma_type", "buf_x_scales", "expert_scales",
    ]  # fmt: skip
    p = sig.parameters
    assert (p["group_size"].default, p["mma_type"].default, p["buf_x_scales"].default, p["expert_scales"].default) == (
        32, "fp8xfp4", None, None)  # fmt: skip
    assert p["num_tokens"].default is inspect.Parameter.empty
    s90 = inspect.signature(megamoe.mega_moe_pre_dispatch_sm90).parameters
    assert list(s90)[:10] == list(p)[:8] + ["group_size", "routed_scaling_factor"]
    assert (s90["group_size"].default, s90["routed_scaling_factor"].default) == (128, 1.0)
    # megamoe's own additions are keyword-only
    assert all(v.kind == inspect.Parameter.KEYWORD_ONLY for k, v in p.items() if k not in list(p)[:12])


@pytest.mark.parametrize("G", [32, 64, 128])
@pytest.mark.parametrize("n,P", [(7, 16), (16, 16), (1, 8)])
def test_pre_dispatch_fp8(G, n, P):
    rng = np.random.default_rng(G + n)
    H, K = 1024, 8
    x = bf16_like(rng, n, H)
    ids, w = routing(rng, n, K)
    buf = buffers(P, H, K, sf_cols=H // (4 * G))
    megamoe.mega_moe_pre_dispatch(x, ids, w, *buf.values(), num_tokens=n, group_size=G)
    fmt = ref.Format("fp8", False, "ue8m0", G, "none")
    want = ref.stage_any(fmt, x, w, ids, rows=P)
    check_rows(buf, want, n, P)
    assert_bitwise(buf["buf_topk_idx"], want.topk_idx, "buf_topk_idx")
    assert_bitwise(buf["buf_topk_weights"], want.topk_weights, "buf_topk_weights")


@pytest.mark.parametrize("mma_type", ["mxf4xmxf4", True])
@pytest.mark.parametrize("xdtype", ["uint8", "int8", "float8_e4m3fn"])
def test_pre_dispatch_mxfp4(mma_type, xdtype):
    rng = np.random.default_rng(1)
    n, P, H, K = 9, 12, 512, 6
    x = bf16_like(rng, n, H)
    ids, w = routing(rng, n, K)
    buf = buffers(P, H, K, fp4=True, sf_cols=H // 128)
    if xdtype == "float8_e4m3fn":  # DeepGEMM accepts any 1-byte view of the slot
        ml = pytest.importorskip("ml_dtypes")
        buf["buf_x"] = buf["buf_x"].view(ml.float8_e4m3fn)
    else:
        buf["buf_x"] = buf["buf_x"].view(xdtype)
    megamoe.mega_moe_pre_dispatch(x, ids, w, *buf.values(), n, 32, mma_type)
    buf["buf_x"] = buf["buf_x"].view(np.uint8)
    check_rows(buf, ref.stage_any(F["mxfp4"], x, w, ids, rows=P), n, P)


@pytest.mark.parametrize("scales_len", ["P", "n", "2D"])
def test_pre_dispatch_nvfp4(scales_len):
    rng = np.random.default_rng(2)
    n, P, H, K = 5, 11, 512, 4
    x = bf16_like(rng, n, H)
    ids, w = routing(rng, n, K)
    buf = buffers(P, H, K, fp4=True, sf_cols=H // 64)
    xs = np.full({"P": P, "n": n, "2D": P}[scales_len], np.nan, np.float32)
    if scales_len == "2D":
        xs = xs.reshape(P, 1)
    megamoe.mega_moe_pre_dispatch(x, ids, w, *buf.values(), num_tokens=n, group_size=16, mma_type="nvfp4xnvfp4",
                                  buf_x_scales=xs)  # fmt: skip
    want = ref.stage_any(F["nvfp4_per_token"], x, w, ids, rows=P)
    check_rows(buf, want, n, P)
    assert_bitwise(xs.reshape(-1)[:n], want.x_scales, "buf_x_scales")
    assert np.all(np.isnan(xs.reshape(-1)[n:])), "scales past num_tokens stay untouched"
    assert_bitwise(buf["buf_topk_idx"], want.topk_idx, "buf_topk_idx")


def test_pre_dispatch_expert_scales_and_zero_tokens():
    rng = np.random.default_rng(3)
    n, P, H, K, E = 6, 8, 256, 4, 10
    x = bf16_like(rng, n, H)
    ids, w = routing(rng, n, K)
    ids = ids % E
    ids[0, 0], ids[1, 1] = -1, E + 3  # a masked id (SGLang writes -1) and one past the table
    es = (rng.random(E) * 2).astype(np.float32)
    buf = buffers(P, H, K, sf_cols=H // 128)
    megamoe.mega_moe_pre_dispatch(x, ids, w, *buf.values(), n, expert_scales=es)
    valid = (ids >= 0) & (ids < E)
    want_w = np.where(valid, (w * es[np.clip(ids, 0, E - 1)]).astype(np.float32), w)
    assert_bitwise(buf["buf_topk_weights"][:n], want_w, "weights times expert scales")
    assert np.all(buf["buf_topk_idx"][:n] == ids)
    buf = buffers(P, H, K, sf_cols=H // 128)  # num_tokens = 0: only the tail fill (all of it)
    megamoe.mega_moe_pre_dispatch(x[:0], ids[:0], w[:0], *buf.values(), 0)
    assert np.all(buf["buf_topk_idx"] == -1) and np.all(bits(buf["buf_topk_weights"]) == 0)
    assert np.all(buf["buf_x"] == 0xA5)
    buf = buffers(P, H, K, sf_cols=H // 128)  # x with more rows than num_tokens: the first rows
    megamoe.mega_moe_pre_dispatch(x, ids, w, *buf.values(), 3)
    check_rows(buf, ref.stage_any(F["mxfp8"], x[:3], w[:3], ids[:3], rows=P), 3, P)


def test_pre_dispatch_errors():
    rng = np.random.default_rng(4)
    n, P, H, K = 4, 8, 256, 2
    x = bf16_like(rng, n, H)
    ids, w = routing(rng, n, K)

    def call(*a, **kw):
        buf = buffers(P, H, K, fp4=kw.pop("fp4", False), sf_cols=kw.pop("sf_cols", H // 128))
        before = {k: v.copy() for k, v in buf.items()}
        try:
            megamoe.mega_moe_pre_dispatch(x, ids, w, *buf.values(), *a, **kw)
        finally:  # a rejected call writes nothing
            for k, v in buf.items():
                assert_bitwise(v, before[k], k)

    cases = [
        ((n, 32, "bf16xbf16"), {}, ValueError, "megamoe: mma_type: expected 'fp8xfp4', 'mxf4xmxf4' or 'nvfp4xnvfp4'"),
        ((n, 16), {}, ValueError, "megamoe: group_size: expected 32, 64 or 128 for mma_type 'fp8xfp4', got 16"),
        ((n, 64, "mxf4xmxf4"), dict(fp4=True), ValueError, "megamoe: group_size: expected 32 (megamoe stages MXFP4 in groups of 32) for mma_type 'mxf4xmxf4', got 64"),
        ((n, 32, "nvfp4xnvfp4"), dict(fp4=True), ValueError, "megamoe: group_size: expected 16 for mma_type 'nvfp4xnvfp4', got 32"),
        ((n, 16, "nvfp4xnvfp4"), dict(fp4=True, sf_cols=4), ValueError, "megamoe: buf_x_scales: expected a float32 buffer"),
        ((n,), dict(buf_x_scales=np.zeros(P, np.float32)), ValueError, "megamoe: buf_x_scales: expected none"),
        ((n + 1,), {}, ValueError, "megamoe: num_tokens: expected 0 <= num_tokens <= x.shape[0] = 4, got 5"),
        ((-1,), {}, ValueError, "megamoe: num_tokens: expected 0 <= num_tokens"),
        ((2.0,), {}, TypeError, "megamoe: num_tokens: expected an int, got float"),
        ((n, 16, "nvfp4xnvfp4", np.zeros(2, np.float32)), dict(fp4=True, sf_cols=4), ValueError,
         "megamoe: buf_x_scales: expected at least num_tokens = 4 elements, got 2"),
        ((n,), dict(expert_scales=np.ones(3, np.float64)), ValueError, "megamoe: expert_scales: expected a 1-D float32 array"),
        ((n,), dict(sf_cols=3), ValueError, "megamoe: x_sf: expected shape (8, 2), got shape (8, 3)"),
        # packed-fp4 bytes under an fp8 mma_type: an error, not MXFP4 by the drop-in rule
        ((n,), dict(fp4=True), ValueError, "megamoe: buf_x: expected width 256 (one e4m3 byte per element for mma_type 'fp8xfp4'), got shape (8, 128)"),
        ((n, 32, False), dict(fp4=True), ValueError, "megamoe: buf_x: expected width 256"),
        ((n,), dict(expert_scales=np.ones((2, 3), np.float32)), ValueError, "megamoe: expert_scales: expected a 1-D float32 array, got shape (2, 3)"),
        ((n,), dict(expert_scales=[1.0, 2.0]), ValueError, "megamoe: expert_scales: expected a 1-D float32 array"),
    ]  # fmt: skip
    for a, kw, exc, msg in cases:
        with pytest.raises(exc, match=re.escape(msg)):
            call(*a, **kw)
    with pytest.raises(ValueError, match="at least 4 rows"):  # num_tokens beyond the buffer
        megamoe.mega_moe_pre_dispatch(x, ids, w, *buffers(2, H, K, sf_cols=2).values(), n)
    # NVFP4 with num_tokens scales (the two-call path): top-k buffers whose rows differ are
    # rejected before the first call writes the activations.
    buf = buffers(P, H, K, fp4=True, sf_cols=4)
    buf["buf_topk_weights"] = np.full((P + 1, K), np.nan, np.float32)
    before = {k: v.copy() for k, v in buf.items()}
    with pytest.raises(ValueError, match=re.escape("megamoe: buf_topk_weights: expected 8 rows (as buf_topk_idx), got shape (9, 2)")):
        megamoe.mega_moe_pre_dispatch(x, ids, w, *buf.values(), n, 16, "nvfp4xnvfp4", np.zeros(n, np.float32))
    for k, v in buf.items():
        assert_bitwise(v, before[k], k)


@pytest.mark.parametrize("G", [128, 32])
@pytest.mark.parametrize("alpha", [1.0, 2.5])
def test_pre_dispatch_sm90(G, alpha):
    rng = np.random.default_rng(G)
    n, P, H, K = 7, 16, 512, 8
    x = bf16_like(rng, n, H)
    x[1] = 0.0
    x[2, :G] = np.float32(3e-9)  # below 1e-4: DeepGEMM's SM90 floor is 1e-10
    ids, w = routing(rng, n, K)
    buf = buffers(P, H, K, sf_cols=H // G, sf_dtype=np.float32)
    megamoe.mega_moe_pre_dispatch_sm90(x, ids, w, *buf.values(), n, G, alpha)
    fmt = ref.Format("fp8_fp32", False, "fp32", G, "none")
    want = ref.stage_any(fmt, x, w, ids, floor=1e-10, alpha=None if alpha == 1.0 else alpha, rows=P)
    check_rows(buf, want, n, P)
    assert_bitwise(buf["buf_topk_idx"], want.topk_idx, "buf_topk_idx")
    assert_bitwise(buf["buf_topk_weights"], want.topk_weights, "buf_topk_weights")
    assert buf["buf_x_sf"][2, 0] == np.float32(np.float32(3e-9) * ref.C_INV448)  # the floor did not apply
    with pytest.raises(ValueError, match=re.escape("megamoe: group_size: expected 32 or 128 (DeepGEMM's SM90 pre-dispatch), got 64")):
        megamoe.mega_moe_pre_dispatch_sm90(x, ids, w, *buf.values(), n, 64)
    # the scaling factor is a number, as prepare_megamoe_inputs takes it
    for bad in ("2.5", True, None):
        with pytest.raises(TypeError, match="megamoe: routed_scaling_factor: expected a float"):
            megamoe.mega_moe_pre_dispatch_sm90(x, ids, w, *buf.values(), n, G, bad)


# ---------------------------------------------------------------------------------------
# Where DeepGEMM's kernels round differently (README-python.md, "SGLang drop-ins")


def deepgemm_scale(amax: np.ndarray, floor: float) -> np.ndarray:
    """DeepGEMM's pre-dispatch scale: fl(max(amax, floor) / 448) (a division)."""
    return (np.fmax(amax, np.float32(floor)) / np.float32(448.0)).astype(np.float32)


def megamoe_scale(amax: np.ndarray, floor: float) -> np.ndarray:
    return (np.fmax(amax, np.float32(floor)) * ref.C_INV448).astype(np.float32)


def test_ue8m0_exponents_agree_with_deepgemms_division():
    """For UE8M0 scales the two roundings give the same exponent for every fp32 amax (they
    differ by at most one ulp, never across a power of two): the fp8 and MXFP4 drop-ins
    are bit-exact with DeepGEMM's kernels. Checked on every power of two's neighbourhood."""
    k = np.arange(-30, 30, dtype=np.float64)
    base = (448.0 * 2.0**k).astype(np.float32)
    near = np.concatenate([np.nextafter(base, np.float32(np.inf)), base, np.nextafter(base, np.float32(0))])
    steps = (near.view(np.uint32)[:, None].astype(np.int64) + np.arange(-64, 65)).ravel()
    amax = np.concatenate([steps.astype(np.uint32).view(np.float32), np.random.default_rng(0).random(10**6).astype(np.float32) * 1e4])
    assert np.array_equal(ref.ue8m0_exponent(deepgemm_scale(amax, 1e-4)), ref.ue8m0_exponent(megamoe_scale(amax, 1e-4)))


def test_fp32_scales_differ_from_deepgemms_sm90_by_one_ulp_at_most():
    """fp32 scales (mega_moe_pre_dispatch_sm90): megamoe's fl(amax * fl(1/448)) is PyTorch's
    and the Triton reference's rule; DeepGEMM's SM90 kernel divides. The scales are at most
    one ulp apart (about half of them differ), and a value's fp8 code rarely moves by one."""
    rng = np.random.default_rng(1)
    amax = (rng.random(10**6) * 100 + 1e-3).astype(np.float32)
    a, b = deepgemm_scale(amax, 1e-10), megamoe_scale(amax, 1e-10)
    ulps = np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32))
    assert ulps.max() == 1 and 0.2 < ulps.mean() < 0.8
