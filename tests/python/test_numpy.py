"""CPU tests of the megamoe Python package with NumPy arrays (no torch needed).

Outputs are compared bit for bit with the independent NumPy reference in megamoe_npref.py.
Every output is poisoned before each call.
"""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

import megamoe
import megamoe_npref as ref
from megamoe_testutil import (
    SCHEMES,
    SEED_BM,
    SEED_H128,
    SEED_PAIR,
    SEED_SCHEME,
    SEED_TOPK,
    SEED_UE8M0,
    assert_bitwise,
    bits,
    is_e5m2,
    key,
)
from megamoe import QuantElem, QuantScheme, ScaleType

POISON = {np.uint8: 0xA5, np.int32: 0x5A5A5A5A, np.int64: 0x5A5A5A5A5A5A5A5A}


def poison(a: np.ndarray) -> np.ndarray:
    """Fill ``a`` (in place, any strides) with a recognizable non-result pattern."""
    if a.dtype == np.float32:
        a.view(np.int32)[...] = 0x7FBADBAD  # a NaN payload no staging result has
    else:
        a[...] = POISON[a.dtype.type]
    return a


def sf_cols(H: int, s: QuantScheme) -> int:
    return H // (4 * s.group_k) if s.ue8m0 else H // s.group_k


def outputs(T: int, H: int, K: int, s: QuantScheme) -> list:
    sf_dtype = np.int32 if s.ue8m0 else np.float32
    return [
        poison(np.empty((T, H), np.uint8)),
        poison(np.empty((T, sf_cols(H, s)), sf_dtype)),
        poison(np.empty((T, K), np.int64)),
        poison(np.empty((T, K), np.float32)),
    ]


def routing(rng, T: int, K: int, wdtype=np.float32, idtype=np.int32):
    w = rng.random((T, K)).astype(wdtype)
    ids = rng.integers(0, 256, (T, K)).astype(idtype)
    return w, ids


def check(outs, want: ref.Staged) -> None:
    x_fp8, x_sf, idx, w = outs
    assert_bitwise(x_fp8, want.x_fp8, "x_fp8")
    assert_bitwise(x_sf, want.x_sf, "x_sf")
    assert_bitwise(idx, want.topk_idx, "topk_idx_out")
    assert_bitwise(w, want.topk_weights, "topk_weights_out")


# ---------------------------------------------------------------------------------------
# Bit-exact results


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("T,H", [(1, 128), (3, 256), (7, 1536), (64, 384), (130, 1024)])
def test_bitwise_schemes(name, dtype, T, H):
    s = SCHEMES[name]
    if s.ue8m0 and (H // s.group_k) % 4:
        pytest.skip("UE8M0 needs H/G to be a multiple of 4 (see test_error_ue8m0_groups_per_word)")
    rng = np.random.default_rng(T * 1000 + H)
    h = ref.hidden_sample(rng, T, H)
    if dtype == np.float16:
        h = np.clip(h, -60000, 60000).astype(dtype)
    w, ids = routing(rng, T, 8)
    outs = outputs(T, H, 8, s)
    megamoe.prepare_megamoe_inputs(h, w, ids, *outs, hidden_quant=s)
    check(outs, ref.stage(h, w, ids, s.group_k, s.ue8m0, e5m2=is_e5m2(s)))


@pytest.mark.parametrize("name", SCHEMES)
def test_bitwise_special_values(name):
    """NaN (either sign), +-Inf, huge, subnormal inputs: the hardware's bytes."""
    s = SCHEMES[name]
    T, H = 33, 512
    h = ref.hidden_sample(np.random.default_rng(7), T, H, specials=True)
    h[5, 32:64] = np.nan  # an all-NaN group
    h[6, :] = -0.0
    w, ids = routing(np.random.default_rng(8), T, 4)
    outs = outputs(T, H, 4, s)
    megamoe.prepare_megamoe_inputs(h, w, ids, *outs, hidden_quant=s)
    check(outs, ref.stage(h, w, ids, s.group_k, s.ue8m0, e5m2=is_e5m2(s)))


def test_bitwise_multithreaded_size():
    """Large enough for the CPU backend's worker threads."""
    T, H = 1100, 256
    rng = np.random.default_rng(11)
    h = ref.hidden_sample(rng, T, H)
    w, ids = routing(rng, T, 8)
    outs = outputs(T, H, 8, megamoe.MXFP8)
    megamoe.prepare_megamoe_inputs(h, w, ids, *outs)
    check(outs, ref.stage(h, w, ids, 32, True))


def test_scale_is_product_with_rounded_reciprocal():
    """SPEC rule 3: s = amax * fl(1/448), not amax / 448 (they differ for many amax)."""
    rng = np.random.default_rng(3)
    amax = (rng.random(4096) * 100 + 1).astype(np.float32)
    h = np.zeros((4096, 128), np.float32)
    h[:, 0] = amax
    w, ids = routing(rng, 4096, 1)
    outs = outputs(4096, 128, 1, megamoe.FP8_FP32_G128)
    megamoe.prepare_megamoe_inputs(h, w, ids, *outs, hidden_quant=megamoe.FP8_FP32_G128)
    want = (amax * ref.C_INV448).astype(np.float32)
    assert_bitwise(outs[1][:, 0], want, "x_sf")
    assert np.any((amax / np.float32(448)).astype(np.float32) != want)  # the test bites


@pytest.mark.parametrize("wdtype", [np.float32, np.float16])
@pytest.mark.parametrize("idtype", [np.int32, np.int64])
@pytest.mark.parametrize("pdtype", [np.bool_, np.uint8])
def test_padding_and_topk_dtypes(wdtype, idtype, pdtype):
    T, H, K = 40, 256, 6
    rng = np.random.default_rng(5)
    h = ref.hidden_sample(rng, T, H)
    w, ids = routing(rng, T, K, wdtype, idtype)
    pad = np.zeros(T, pdtype)
    pad[::3] = 7 if pdtype == np.uint8 else True  # any nonzero byte means padded
    w[::3] = np.nan  # padded tokens give +0.0 even for NaN weights
    w[1, 0] = np.nan  # a kept NaN weight stays NaN
    if idtype == np.int64:
        ids[4, 0] = 2**40 + 3
    outs = outputs(T, H, K, megamoe.MXFP8)
    megamoe.prepare_megamoe_inputs(h, w, ids, *outs, is_padding=pad)
    want = ref.stage(h, w, ids, 32, True, pad)
    check(outs, want)
    assert np.all(outs[2][::3] == -1)
    assert np.all(bits(outs[3][::3]) == 0)  # +0.0, not -0.0 or NaN
    assert np.isnan(outs[3][1, 0])


def test_fp32_weights_are_bit_copies():
    T, K = 4, 4
    w = np.array([[np.nan, -0.0, 1e-45, -np.inf]] * T, np.float32)
    w.view(np.uint32)[0, 0] = 0x7FC01234  # NaN payload survives
    h = np.ones((T, 128), np.float32)
    ids = np.zeros((T, K), np.int32)
    outs = outputs(T, 128, K, megamoe.MXFP8)
    megamoe.prepare_megamoe_inputs(h, w, ids, *outs)
    assert_bitwise(outs[3], w, "topk_weights_out")


# ---------------------------------------------------------------------------------------
# Layouts: strides, views, read-only inputs


def test_noncontiguous_inputs_and_outputs():
    T, H, K = 37, 512, 8
    rng = np.random.default_rng(9)
    base = ref.hidden_sample(rng, T, H)
    # hidden: transposed storage, reversed rows, offset by one element
    h_t = np.asfortranarray(base)
    h_rev = np.ascontiguousarray(base[::-1])[::-1]
    big = np.zeros((T + 1, H + 1), np.float32)
    big[1:, 1:] = base
    h_off = big[1:, 1:]
    w, ids = routing(rng, T, K)
    w_t = np.asfortranarray(w)
    ids_s = np.zeros((T, 2 * K), ids.dtype)
    ids_s[:, ::2] = ids
    pad = np.zeros(2 * T, np.bool_)
    pad[::8] = True  # [::2] below: every 4th token padded
    want = ref.stage(base, w, ids, 128, False, pad[::2])
    for h in (h_t, h_rev, h_off):
        # outputs: transposed x_fp8, MN-major fp32 x_sf (DeepGEMM SM90: g * align(T, 4) + t),
        # strided / reversed top-k outputs
        x_fp8 = poison(np.empty((H, T), np.uint8)).T
        sf_buf = poison(np.empty((H // 128, (T + 3) // 4 * 4), np.float32))
        x_sf = sf_buf[:, :T].T
        idx = poison(np.empty((T, 3 * K), np.int64))[:, ::3]
        wo = poison(np.empty((T, K), np.float32))[::-1]
        megamoe.prepare_megamoe_inputs(
            h, w_t, ids_s[:, ::2], x_fp8, x_sf, idx, wo, is_padding=pad[::2],
            hidden_quant=megamoe.FP8_FP32_G128,
        )  # fmt: skip
        check((x_fp8, x_sf, idx, wo), want)
        assert np.all(bits(sf_buf[:, T:]) == 0x7FBADBAD)  # alignment padding untouched


def test_readonly_inputs():
    T, H = 9, 256
    rng = np.random.default_rng(2)
    h = ref.hidden_sample(rng, T, H)
    w, ids = routing(rng, T, 4)
    pad = np.zeros(T, bool)
    for a in (h, w, ids, pad):
        a.flags.writeable = False
    outs = outputs(T, H, 4, megamoe.MXFP8)
    megamoe.prepare_megamoe_inputs(h, w, ids, *outs, is_padding=pad)
    check(outs, ref.stage(h, w, ids, 32, True, pad))


@pytest.mark.parametrize("which", range(4))
def test_readonly_output_rejected(which):
    T, H = 2, 128
    h = np.ones((T, H), np.float32)
    w, ids = routing(np.random.default_rng(0), T, 2)
    outs = outputs(T, H, 2, megamoe.MXFP8)
    outs[which].flags.writeable = False
    name = ["x_fp8", "x_sf", "topk_idx_out", "topk_weights_out"][which]
    msg = f"megamoe: {name}: expected a writable array, got a read-only array"
    with pytest.raises(ValueError, match=re.escape(msg)):
        megamoe.prepare_megamoe_inputs(h, w, ids, *outs)


@pytest.mark.parametrize("T", [1, 5, 64, 200, 300])
@pytest.mark.parametrize("bm", [1, 3, 64, 128, 200, 256])
@pytest.mark.parametrize("G", [32, 128])
def test_shared_x_sf_transposed(T, bm, G):
    H = 512
    s = megamoe.MXFP8 if G == 32 else megamoe.FP8_UE8M0_G128
    rng = np.random.default_rng(T + bm)
    h = ref.hidden_sample(rng, T, H)
    w, ids = routing(rng, T, 4)
    R = ref.shared_rows_required(T, bm) + 5
    W = sf_cols(H, s)
    shared = poison(np.empty((W, R), np.int32)).T  # a transposed view, as TMA wants
    outs = outputs(T, H, 4, s)
    megamoe.prepare_megamoe_inputs(h, w, ids, *outs, shared_x_sf=shared, shared_block_m=bm,
                                   hidden_quant=s)  # fmt: skip
    want = ref.stage(h, w, ids, G, True)
    check(outs, want)
    rows = ref.shared_row(np.arange(T), bm)
    assert len(set(rows.tolist())) == T
    assert_bitwise(shared[rows], want.x_sf, "shared_x_sf")
    untouched = np.ones(R, bool)
    untouched[rows] = False
    assert np.all(shared[untouched] == 0x5A5A5A5A)


def test_zero_tokens_is_a_noop():
    h = np.empty((0, 100), np.float32)  # even a bad H: the reference returns first
    e = np.empty((0, 4), np.float32)
    ids = np.empty((0, 4), np.int32)
    megamoe.prepare_megamoe_inputs(h, e, ids, np.empty((0, 100), np.uint8),
                                   np.empty((0, 1), np.int32), np.empty((0, 4), np.int64), e.copy())  # fmt: skip


# ---------------------------------------------------------------------------------------
# Errors: the reference's messages, nothing written


class Call:
    """A valid call that tests break one piece at a time."""

    def __init__(self, T=8, H=256, K=4, scheme=megamoe.MXFP8):
        rng = np.random.default_rng(1)
        self.kw: dict[str, Any] = dict(
            hidden_states=rng.standard_normal((T, H)).astype(np.float32),
            topk_weights=rng.random((T, K)).astype(np.float32),
            topk_ids=rng.integers(0, 9, (T, K)).astype(np.int32),
        )
        x_fp8, x_sf, idx, w = outputs(T, H, K, scheme)
        self.kw.update(x_fp8=x_fp8, x_sf=x_sf, topk_idx_out=idx, topk_weights_out=w,
                       hidden_quant=scheme)  # fmt: skip

    def outs(self):
        names = ("x_fp8", "x_sf", "topk_idx_out", "topk_weights_out", "shared_x_sf")
        return [self.kw[n] for n in names if self.kw.get(n) is not None]

    def raises(self, exc, msg: str) -> None:
        before = [bits(o).copy() for o in self.outs()]
        with pytest.raises(exc, match=re.escape(msg)):
            megamoe.prepare_megamoe_inputs(**self.kw)
        for b, o in zip(before, self.outs()):
            assert np.array_equal(b, bits(o)), "a rejected call wrote an output"


def test_valid_call_helper_is_valid():
    c = Call()
    megamoe.prepare_megamoe_inputs(**c.kw)


def test_error_hidden_size():
    c = Call(H=200)
    c.raises(ValueError, SEED_H128)


def test_error_topk_shapes():
    c = Call()
    c.kw["topk_weights"] = np.zeros((8, 3), np.float32)
    c.raises(ValueError, SEED_TOPK)
    c = Call()
    c.kw["topk_weights"] = np.zeros((7, 4), np.float32)
    c.raises(ValueError, SEED_TOPK)


def test_error_shared_pairing():
    c = Call()
    c.kw["shared_block_m"] = 64
    c.raises(ValueError, SEED_PAIR)
    c = Call()
    c.kw["shared_x_sf"] = np.zeros((128, 2), np.int32)
    c.raises(ValueError, SEED_PAIR)


def test_error_shared_needs_ue8m0():
    c = Call(scheme=megamoe.FP8_FP32_G128)
    c.kw.update(shared_x_sf=np.zeros((128, 2), np.int32), shared_block_m=64)
    c.raises(ValueError, SEED_UE8M0)


@pytest.mark.parametrize("bm", [0, -5])
def test_error_shared_block_m(bm):
    c = Call()
    c.kw.update(shared_x_sf=np.zeros((128, 2), np.int32), shared_block_m=bm)
    c.raises(ValueError, SEED_BM)


@pytest.mark.parametrize(
    "shape,got", [((256, 3), "(256, 3)"), ((256,), "(256,)"), ((256, 1), "(256, 1)")]
)
def test_error_shared_shape(shape, got):
    c = Call()
    c.kw.update(shared_x_sf=np.zeros(shape, np.int32), shared_block_m=64)
    c.raises(ValueError, f"MegaMoE shared_x_sf must have shape (*, 2), got {got}.")


@pytest.mark.parametrize("T,bm,need", [(8, 64, 128), (200, 64, 512), (300, 200, 512), (8, 3, 384)])
def test_error_shared_rows(T, bm, need):
    assert ref.shared_rows_required(T, bm) == need
    c = Call(T=T)
    c.kw.update(shared_x_sf=np.zeros((need - 1, 2), np.int32), shared_block_m=bm)
    c.raises(ValueError, f"MegaMoE shared_x_sf has insufficient rows: requires {need}, got {need - 1}.")
    c.kw["shared_x_sf"] = poison(np.zeros((need, 2), np.int32))
    megamoe.prepare_megamoe_inputs(**c.kw)


BAD_SCHEMES = [
    # e5m2 is staged as MXFP8 e5m2 only (UE8M0 scales, G = 32: MXFP8_E5M2)
    QuantScheme(elem=QuantElem.FLOAT8_E5M2, group_k=128),
    QuantScheme(elem=QuantElem.FLOAT8_E5M2, scale=ScaleType.FLOAT32),
    QuantScheme(elem=QuantElem.INT8),
    QuantScheme(scale=ScaleType.FLOAT16),
    QuantScheme(group_k=48),
    QuantScheme(group_k=256),
    QuantScheme(group_k=0),
    QuantScheme(group_k=-1),
    QuantScheme(group_m=2),
    QuantScheme(is_static=True),
    QuantScheme(symmetric=False),
    QuantScheme(has_scale2=True),
    QuantScheme(scale=ScaleType.FLOAT32, group_k=96),
]


@pytest.mark.parametrize("scheme", BAD_SCHEMES, ids=repr)
def test_error_scheme(scheme):
    c = Call()
    c.kw["hidden_quant"] = scheme
    c.raises(ValueError, SEED_SCHEME + repr(scheme) + ".")
    with pytest.raises(ValueError, match=re.escape(SEED_SCHEME + repr(scheme) + ".")):
        megamoe.check_scheme(scheme)


@pytest.mark.parametrize(
    "field,bad,expected,got",
    [
        ("hidden_states", np.zeros((8, 256), np.int32), "dtype bfloat16 or float16 or float32", "dtype int32"),
        ("topk_weights", np.zeros((8, 4), np.int32), "dtype float32 or bfloat16 or float16", "dtype int32"),
        ("topk_ids", np.zeros((8, 4), np.float32), "dtype int32 or int64", "dtype float32"),
        ("x_fp8", np.zeros((8, 256), np.int32), "dtype float8_e4m3fn or uint8", "dtype int32"),
        ("x_sf", np.zeros((8, 2), np.float32), "dtype int32", "dtype float32"),
        ("topk_idx_out", np.zeros((8, 4), np.int32), "dtype int64", "dtype int32"),
        ("topk_weights_out", np.zeros((8, 4), np.float16), "dtype float32", "dtype float16"),
        ("x_fp8", np.zeros((8, 200), np.uint8), "shape (8, 256)", "shape (8, 200)"),
        ("x_sf", np.zeros((8, 8), np.int32), "shape (8, 2)", "shape (8, 8)"),
        ("x_sf", np.zeros((8, 2, 1), np.int32), "a tensor of rank <= 2", "3-D tensor of shape (8, 2, 1)"),
        ("topk_idx_out", np.zeros((8, 5), np.int64), "shape (8, 4)", "shape (8, 5)"),
        ("topk_weights_out", np.zeros((9, 4), np.float32), "shape (8, 4)", "shape (9, 4)"),
        ("hidden_states", np.zeros((8,), np.float32), "2-D tensor", "1-D tensor"),
        ("is_padding", np.zeros((7,), np.bool_), "shape (8,)", "shape (7,)"),
        ("is_padding", np.zeros((8,), np.int32), "dtype bool or uint8", "dtype int32"),
        ("is_padding", np.zeros((8, 1), np.bool_), "1-D tensor", "2-D tensor"),
        ("topk_ids", np.zeros((8, 4), np.int16), "dtype int32 or int64", "dtype int16"),
        ("hidden_states", np.zeros((8, 256), np.float64), "dtype bfloat16 or float16 or float32", "dtype float64"),
    ],
)  # fmt: skip
def test_error_dtype_rank_shape(field, bad, expected, got):
    c = Call()
    c.kw[field] = bad
    c.raises(ValueError, f"megamoe: {field}: expected {expected}, got {got}")


def test_error_topk_rows():
    c = Call()
    c.kw["topk_ids"] = np.zeros((7, 4), np.int32)
    c.kw["topk_weights"] = np.zeros((7, 4), np.float32)
    c.raises(ValueError, "megamoe: topk_ids: expected shape (8, 4), got shape (7, 4)")


def test_error_fp32_scales_need_fp32_x_sf():
    c = Call(scheme=megamoe.FP8_FP32_G128)
    c.kw["x_sf"] = np.zeros((8, 2), np.int32)
    c.raises(ValueError, "megamoe: x_sf: expected dtype float32, got dtype int32")


def test_error_ue8m0_groups_per_word():
    c = Call(H=128, scheme=QuantScheme(group_k=64))  # H/G = 2 exponents: not a whole word
    c.kw["x_sf"] = np.zeros((8, 0), np.int32)
    c.raises(ValueError, "hidden_size / group_size to be a multiple of 4")


def test_error_overlaps():
    c = Call()
    buf = poison(np.empty((16, 4), np.int64))
    c.kw["topk_idx_out"] = buf[:8]
    c.kw["topk_weights_out"] = buf[8:].view(np.float32)[:, ::2]  # disjoint: fine
    megamoe.prepare_megamoe_inputs(**c.kw)
    c = Call()
    c.kw["topk_weights_out"] = c.kw["topk_idx_out"].view(np.float32)[:, ::2]
    c.raises(ValueError, "megamoe: topk_idx_out: expected memory disjoint from topk_weights_out")
    c = Call()
    c.kw["x_fp8"] = c.kw["hidden_states"].view(np.uint8)[:, :256]
    c.raises(ValueError, "megamoe: x_fp8: expected memory disjoint from hidden_states, got overlapping memory")
    c = Call()
    c.kw["x_sf"] = np.zeros((1, 2), np.int32)[np.zeros(8, np.intp)]  # copies: fine
    megamoe.prepare_megamoe_inputs(**c.kw)
    c = Call()
    c.kw["x_sf"] = np.lib.stride_tricks.as_strided(np.zeros(2, np.int32), (8, 2), (0, 4))
    c.raises(ValueError, "megamoe: x_sf: expected strides that give every element its own address")


def test_error_not_an_array():
    c = Call()
    c.kw["topk_ids"] = [[1, 2, 3, 4]] * 8
    c.raises(TypeError, "megamoe: topk_ids: expected an array (DLPack or buffer protocol), got list")


def test_error_hidden_quant_type():
    c = Call()
    c.kw["hidden_quant"] = "mxfp8"
    c.raises(TypeError, "megamoe: hidden_quant: expected a megamoe.QuantScheme or a vLLM-style QuantKey")


# ---------------------------------------------------------------------------------------
# Schemes and vLLM QuantKey look-alikes


def test_scheme_api():
    s = megamoe.MXFP8
    assert (s.elem, s.scale, s.group_m, s.group_k) == (QuantElem.FLOAT8_E4M3, ScaleType.UE8M0, 1, 32)
    assert (s.is_static, s.symmetric, s.has_scale2, s.ue8m0) == (False, True, False, True)
    assert megamoe.FP8_UE8M0_G128 == QuantScheme(group_k=128)
    assert megamoe.FP8_FP32_G128 == QuantScheme(scale=ScaleType.FLOAT32, group_k=128)
    assert megamoe.FP8_FP32_G32 == QuantScheme.fp8_fp32_g32()
    assert megamoe.MXFP8 == QuantScheme() and megamoe.MXFP8 != megamoe.FP8_FP32_G32
    assert hash(megamoe.MXFP8) == hash(QuantScheme())
    assert megamoe.MXFP8 != "MXFP8"
    assert repr(s) == "QuantScheme(fp8_e4m3fn, scale=ue8m0, group=1x32, dynamic, symmetric)"
    assert repr(QuantScheme(scale=ScaleType.FLOAT32, group_k=128, is_static=True, has_scale2=True)) == (
        "QuantScheme(fp8_e4m3fn, scale=float32, group=1x128, static, symmetric, scale2=static)"
    )
    for p in SCHEMES.values():
        assert pickle.loads(pickle.dumps(p)) == p
        megamoe.check_scheme(p)
    t = QuantScheme()
    t.group_k = 128
    assert t == megamoe.FP8_UE8M0_G128
    assert isinstance(megamoe.has_cuda_backend(), bool)
    assert megamoe.__version__ == megamoe.version() and re.fullmatch(r"\d+\.\d+\.\d+", megamoe.__version__)


@pytest.mark.parametrize(
    "k,want",
    [
        (key(), megamoe.MXFP8),
        (key(sdtype="uint8"), megamoe.MXFP8),
        (key(G=128), megamoe.FP8_UE8M0_G128),
        (key(sdtype="float32", G=128), megamoe.FP8_FP32_G128),
        (key(sdtype=np.float32, G=32), megamoe.FP8_FP32_G32),
        (key(sdtype=np.dtype(np.float32), G=32), megamoe.FP8_FP32_G32),
        (key(elem="float8_e5m2"), megamoe.MXFP8_E5M2),
    ],
)
def test_quant_key_accepted(k, want):
    assert megamoe.as_scheme(k) == want
    T, H = 16, 512
    rng = np.random.default_rng(4)
    h = ref.hidden_sample(rng, T, H)
    w, ids = routing(rng, T, 4)
    outs = outputs(T, H, 4, want)
    megamoe.prepare_megamoe_inputs(h, w, ids, *outs, hidden_quant=k)
    check(outs, ref.stage(h, w, ids, want.group_k, want.ue8m0, e5m2=is_e5m2(want)))


@pytest.mark.parametrize(
    "k",
    [
        key(elem="float8_e5m2", G=128),
        key(elem="float8_e5m2", sdtype="float32"),
        key(elem="float8_e4m3fnuz"),
        key(elem="bfloat16"),
        key(sdtype="float16"),
        key(sdtype="bfloat16"),
        key(G=-1),  # per token
        key(G=-1, row=-1),  # per tensor
        key(G=64, row=2),
        key(G=96),
        key(static=True),
        key(sym=False),
        key(scale2=True),
    ],
    ids=str,
)
def test_quant_key_rejected(k):
    c = Call()
    c.kw["hidden_quant"] = k
    c.raises(ValueError, SEED_SCHEME + repr(megamoe.as_scheme(k)) + ".")


# ---------------------------------------------------------------------------------------
# stage() and dequantize()


@pytest.mark.parametrize("name", SCHEMES)
def test_stage_and_dequantize(name):
    s = SCHEMES[name]
    T, H = 21, 1024
    rng = np.random.default_rng(6)
    h = ref.hidden_sample(rng, T, H)
    w, ids = routing(rng, T, 8)
    pad = rng.random(T) < 0.3
    out = megamoe.stage(h, w, ids, is_padding=pad, hidden_quant=s)
    assert isinstance(out, megamoe.StagedInputs) and out.shared_x_sf is None
    assert out.x_fp8.dtype == np.uint8 and out.x_fp8.shape == (T, H)
    assert out.x_sf.dtype == (np.int32 if s.ue8m0 else np.float32)
    assert out.topk_idx.dtype == np.int64 and out.topk_weights.dtype == np.float32
    want = ref.stage(h, w, ids, s.group_k, s.ue8m0, pad, e5m2=is_e5m2(s))
    check(out[:4], want)
    deq = megamoe.dequantize(out.x_fp8, out.x_sf, s)
    expect = (ref.fp8_to_f32(want.x_fp8, is_e5m2(s)).reshape(T, -1, s.group_k) * want.scales[:, :, None]).reshape(T, H)
    assert deq.dtype == np.float32
    assert_bitwise(deq, expect.astype(np.float32), "dequantize")
    finite = np.isfinite(h) & (np.abs(h) > 1e-30)
    rel = np.abs(deq - h)[finite] / np.abs(h)[finite]
    assert np.all((rel <= 2.0**-3) | (np.abs(deq - h)[finite] <= want.scales.max()))


@pytest.mark.parametrize("bm", [1, 100, 128])
def test_stage_shared(bm):
    T, H = 130, 256
    rng = np.random.default_rng(8)
    h = ref.hidden_sample(rng, T, H)
    w, ids = routing(rng, T, 4)
    out = megamoe.stage(h, w, ids, shared_block_m=bm)
    R = ref.shared_rows_required(T, bm)
    assert out.shared_x_sf.shape == (R, 2) and out.shared_x_sf.dtype == np.int32
    rows = ref.shared_row(np.arange(T), bm)
    assert_bitwise(out.shared_x_sf[rows], out.x_sf, "shared_x_sf")
    mask = np.ones(R, bool)
    mask[rows] = False
    assert np.all(out.shared_x_sf[mask] == 0)


def test_stage_errors():
    h = np.zeros((4, 256), np.float32)
    w, ids = routing(np.random.default_rng(0), 4, 2)
    with pytest.raises(ValueError, match=re.escape(SEED_BM)):
        megamoe.stage(h, w, ids, shared_block_m=0)
    with pytest.raises(ValueError, match=re.escape(SEED_UE8M0)):
        megamoe.stage(h, w, ids, shared_block_m=64, hidden_quant=megamoe.FP8_FP32_G128)
    with pytest.raises(ValueError, match=re.escape(SEED_SCHEME)):
        megamoe.stage(h, w, ids, hidden_quant=QuantScheme(group_k=7))
    with pytest.raises(ValueError, match=re.escape(SEED_H128)):
        megamoe.stage(np.zeros((4, 192), np.float32), w, ids)
    with pytest.raises(ValueError, match=re.escape("megamoe: hidden_states: expected a tensor of rank <= 2, got 3-D")):
        megamoe.stage(np.zeros((4, 256, 1), np.float32), w, ids)
    with pytest.raises(TypeError, match="expected a torch.Tensor or numpy.ndarray"):
        megamoe.stage(memoryview(h), w, ids)


def test_stage_zero_tokens():
    out = megamoe.stage(np.zeros((0, 256), np.float32), np.zeros((0, 8), np.float32),
                        np.zeros((0, 8), np.int32))  # fmt: skip
    assert out.x_fp8.shape == (0, 256) and out.x_sf.shape == (0, 2) and out.topk_idx.shape == (0, 8)
    out = megamoe.stage(np.zeros((0, 256), np.float32), np.zeros((0, 8), np.float32), np.zeros((0, 8), np.int32),
                        scheme=megamoe.MXFP8_E5M2)  # fmt: skip
    assert out.x_fp8.shape == (0, 256) and out.x_fp8.dtype == np.uint8 and out.x_sf.shape == (0, 2)


def test_dequantize_special_exponents():
    x_fp8 = np.full((1, 128), 0x38, np.uint8)  # 1.0
    sf = np.array([[0x00 | (0x01 << 8) | (0x7F << 16) | (0xFE << 24)]], np.uint32).view(np.int32)
    d = megamoe.dequantize(x_fp8, sf)
    assert d[0, 0] == np.float32(2.0**-127) and d[0, 32] == np.float32(2.0**-126)
    assert d[0, 64] == 1.0 and d[0, 96] == np.float32(2.0**127)


# ---------------------------------------------------------------------------------------
# Packaging


def test_import_without_torch():
    """megamoe imports and works with torch unimportable, and does not import it."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import numpy as np, megamoe\n"
        "out = megamoe.stage(np.ones((2, 128), np.float32), np.ones((2, 1), np.float32),\n"
        "                    np.zeros((2, 1), np.int32))\n"
        "assert out.x_sf.tolist() == [[0x77777777], [0x77777777]], out.x_sf\n"
        "assert sys.modules['torch'] is None\n"
        "assert 'megamoe._torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_public_names_documented():
    for name in megamoe.__all__:
        obj = getattr(megamoe, name)
        if isinstance(obj, (str, QuantScheme)):
            continue
        assert obj.__doc__, name
