"""Every format through the Python package (NumPy on the CPU backend), bit for bit against
the independent reference in megamoe_npref.py: fp8 UE8M0 / fp32, MXFP8 e5m2, MXFP4 with
either tie rule, NVFP4 static and per-token; the MXFP4 drop-in rule; the amax floor;
output_shapes; dequantize round trips (exact against the reference, SNR against the input);
e5m2's edge values. Outputs are poisoned before each call."""

from __future__ import annotations

import re

import numpy as np
import pytest

import megamoe
import megamoe_npref as ref
from megamoe import QuantElem, QuantScheme, Rounding, Scale2, ScaleType
from megamoe_testutil import ALL_SCHEMES, assert_bitwise, fp8_dtype_name, key

FMT = {name: ref.FORMATS[s.name] for name, s in ALL_SCHEMES.items()}
NP_DTYPES = {"float8_e4m3fn": np.uint8, "float8_e5m2": np.uint8, "uint8": np.uint8, "int32": np.int32,
             "int64": np.int64, "float32": np.float32}  # fmt: skip


def poisoned(spec) -> np.ndarray:
    a = np.empty(spec.shape, NP_DTYPES[spec.dtype])
    a.view(np.uint8)[...] = 0xA5
    return a


def outputs(T, H, K, s, rows=None) -> dict:
    o = megamoe.output_shapes(T if rows is None else rows, H, K, s)
    out = dict(x_fp8=poisoned(o.x_fp8), x_sf=poisoned(o.x_sf), topk_idx_out=poisoned(o.topk_idx_out),
               topk_weights_out=poisoned(o.topk_weights_out))  # fmt: skip
    if o.x_scales is not None:
        out["x_scales"] = poisoned(o.x_scales)
    return out


def inputs(T, H, K, seed=0, specials=False, dtype=np.float32):
    rng = np.random.default_rng(seed)
    h = ref.hidden_sample(rng, T, H, specials)
    if dtype == np.float16:
        h = np.clip(h, -60000, 60000).astype(np.float16)
    w = rng.random((T, K)).astype(np.float32)
    ids = rng.integers(0, 256, (T, K)).astype(np.int32)
    return h, w, ids


def check(out: dict, want: ref.Staged2, T=None) -> None:
    assert_bitwise(out["x_fp8"][:T], want.x_q, "x_fp8")
    assert_bitwise(out["x_sf"][:T], want.x_sf, "x_sf")
    assert_bitwise(out["topk_idx_out"], want.topk_idx, "topk_idx_out")
    assert_bitwise(out["topk_weights_out"], want.topk_weights, "topk_weights_out")
    if want.x_scales is not None:
        assert_bitwise(out["x_scales"][:T], want.x_scales, "x_scales")


def gs_for(name):
    return np.array([0.37], np.float32) if FMT[name].scale2 == "static" else None


@pytest.mark.parametrize("name", ALL_SCHEMES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("T,H", [(1, 128), (3, 256), (7, 1536), (64, 512), (130, 1024)])
def test_prepare_every_format_bitwise(name, dtype, T, H):
    s = ALL_SCHEMES[name]
    if s.ue8m0 and (H // s.group_k) % 4:
        pytest.skip("UE8M0 needs H/G to be a multiple of 4")
    h, w, ids = inputs(T, H, 8, seed=T * 7 + H, dtype=dtype)
    pad = np.arange(T) % 5 == 3
    out = outputs(T, H, 8, s)
    gs = gs_for(name)
    megamoe.prepare_megamoe_inputs(h, w, ids, **out, is_padding=pad, hidden_quant=s, global_scale=gs)
    check(out, ref.stage_any(FMT[name], h, w, ids, pad, global_scale=None if gs is None else gs[0]))


@pytest.mark.parametrize("name", ALL_SCHEMES)
def test_special_values_every_format(name):
    """NaN (either sign), +-Inf, huge, subnormal inputs, an all-NaN group, a -0.0 row."""
    s = ALL_SCHEMES[name]
    T, H = 33, 512
    h, w, ids = inputs(T, H, 4, seed=11, specials=True)
    h[5, 32:64] = np.nan
    h[6, :] = -0.0
    h[7, :16] = np.inf
    out = outputs(T, H, 4, s)
    gs = gs_for(name)
    megamoe.prepare_megamoe_inputs(h, w, ids, **out, hidden_quant=s, global_scale=gs)
    check(out, ref.stage_any(FMT[name], h, w, ids, global_scale=None if gs is None else gs[0]))


@pytest.mark.parametrize("name", ["MXFP4", "MXFP4_RNE", "NVFP4_STATIC", "NVFP4_PER_TOKEN"])
def test_fp4_ties_and_signs(name):
    """Values exactly on the e2m1 midpoints (and -0.0, tiny negatives) of both tie rules."""
    s = ALL_SCHEMES[name]
    T, H = 4, 128
    mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0], np.float32)
    h = np.zeros((T, H), np.float32)
    for t in range(T):
        row = np.concatenate([mids, -mids, [-0.0, -1e-3, 1e-3, 7.0]] * 8)[:H]
        h[t] = row * np.float32(2.0**t)
    w, ids = np.ones((T, 2), np.float32), np.zeros((T, 2), np.int32)
    out = outputs(T, H, 2, s)
    gs = gs_for(name)
    megamoe.prepare_megamoe_inputs(h, w, ids, **out, hidden_quant=s, global_scale=gs)
    check(out, ref.stage_any(FMT[name], h, w, ids, global_scale=None if gs is None else gs[0]))
    if name == "MXFP4":  # the two tie rules differ on these inputs
        rne = outputs(T, H, 2, megamoe.MXFP4_RNE)
        megamoe.prepare_megamoe_inputs(h, w, ids, **rne, hidden_quant=megamoe.MXFP4_RNE)
        assert not np.array_equal(rne["x_fp8"], out["x_fp8"])


@pytest.mark.parametrize("gs", [1.0, 1e-3, 3e5, 0.0, np.inf, np.nan])
def test_nvfp4_static_global_scales(gs):
    """The global scale is read from the array: extreme and degenerate values included."""
    T, H = 9, 256
    h, w, ids = inputs(T, H, 4, seed=3)
    out = outputs(T, H, 4, megamoe.NVFP4_STATIC)
    g = np.array([gs], np.float32)
    megamoe.prepare_megamoe_inputs(h, w, ids, **out, hidden_quant=megamoe.NVFP4_STATIC, global_scale=g)
    check(out, ref.stage_any(FMT["NVFP4_STATIC"], h, w, ids, global_scale=g[0]))
    g0 = np.array(gs, np.float32)  # a 0-D scalar is a one-element tensor too
    megamoe.prepare_megamoe_inputs(h, w, ids, **out, hidden_quant=megamoe.NVFP4_STATIC, global_scale=g0)
    check(out, ref.stage_any(FMT["NVFP4_STATIC"], h, w, ids, global_scale=g[0]))


def online_gs(h: np.ndarray, floor: float) -> np.float32:
    """NVFP4 online's global scale, written independently: fl(max(A, floor) / 2688), A the
    NaN-ignoring max |x| of every element (Inf counts); floor 0: 1 where A < 2^-100."""
    a = np.abs(h.astype(np.float32))
    A = np.float32(0.0) if np.all(np.isnan(a)) else np.float32(np.nanmax(a))
    m = max(A, np.float32(floor))
    if floor == 0.0 and m < np.float32(2.0**-100):
        return np.float32(1.0)
    return np.float32(m / np.float32(2688.0))


@pytest.mark.parametrize("floor", [1e-4, 1e-10, 0.0])
@pytest.mark.parametrize("case", ["random", "specials", "zeros", "tiny", "all_nan", "inf"])
def test_nvfp4_online_writes_gs_and_static_bytes(floor, case):
    """NVFP4_ONLINE writes gs to global_scale (an output) and the bytes NVFP4_STATIC gives
    with that gs; padded rows count in the max."""
    T, H, K = 9, 256, 4
    h, w, ids = inputs(T, H, K, seed=5, specials=case == "specials")
    if case == "zeros":
        h[:] = 0.0
    elif case == "tiny":
        h = (h * np.float32(2.0**-120)).astype(np.float32)
    elif case == "all_nan":
        h[:] = np.nan
    elif case == "inf":
        h[3, 17] = -np.inf
    h[8, 5] = np.float32(1e4) if case == "random" else h[8, 5]  # the max on a padded row
    pad = (np.arange(T) == 8).astype(np.uint8)
    s = megamoe.NVFP4_ONLINE.with_amax_floor(floor)
    out = outputs(T, H, K, s)
    g = np.full(1, np.nan, np.float32)
    megamoe.prepare_megamoe_inputs(h, w, ids, **out, is_padding=pad, hidden_quant=s, global_scale=g)
    want = online_gs(h, floor)
    assert g.view(np.uint32)[0] == np.array([want], np.float32).view(np.uint32)[0], (g[0], want)
    st = outputs(T, H, K, megamoe.NVFP4_STATIC)
    megamoe.prepare_megamoe_inputs(h, w, ids, **st, is_padding=pad, hidden_quant=megamoe.NVFP4_STATIC,
                                   global_scale=g.copy())  # fmt: skip
    for k in st:
        assert_bitwise(out[k], st[k], k)
    check(out, ref.stage_any(FMT["NVFP4_STATIC"], h, w, ids, pad, global_scale=g[0]))


def test_nvfp4_online_global_scale_is_a_required_output():
    T, H, K = 3, 128, 2
    h, w, ids = inputs(T, H, K)
    s = megamoe.NVFP4_ONLINE
    with pytest.raises(ValueError, match=re.escape("megamoe: global_scale: expected a [1] float32 tensor (nvfp4_online writes one), got none")):
        megamoe.prepare_megamoe_inputs(h, w, ids, **outputs(T, H, K, s), hidden_quant=s)
    ro = np.zeros(1, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="global_scale"):
        megamoe.prepare_megamoe_inputs(h, w, ids, **outputs(T, H, K, s), hidden_quant=s, global_scale=ro)
    assert megamoe.output_shapes(T, H, K, s).global_scale is not None
    staged = megamoe.stage(h, w, ids, scheme=s)
    assert staged.global_scale.shape == (1,) and staged.global_scale[0] == online_gs(h, 1e-4)
    assert megamoe.stage(h, w, ids, scheme=megamoe.NVFP4_PER_TOKEN).global_scale is None
    text = megamoe.explain(h, w, ids, *staged[:4], hidden_quant=s, global_scale=staged.global_scale)
    assert text.startswith("cpu backend: nvfp4_online ") and "amax to global_scale" in text, text


@pytest.mark.parametrize("name", ALL_SCHEMES)
@pytest.mark.parametrize("floor", [1e-10, 1.0, 300.0, 0.0])
def test_amax_floor(name, floor):
    s = ALL_SCHEMES[name].with_amax_floor(floor)
    T, H = 17, 512
    h, w, ids = inputs(T, H, 4, seed=5)
    h[3] = 0.0
    h[4] *= np.float32(1e-30)
    out = outputs(T, H, 4, s)
    gs = gs_for(name)
    megamoe.prepare_megamoe_inputs(h, w, ids, **out, hidden_quant=s, global_scale=gs)
    check(out, ref.stage_any(FMT[name], h, w, ids, floor=floor, global_scale=None if gs is None else gs[0]))


@pytest.mark.parametrize("name", ALL_SCHEMES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_amax_floor_zero_unit_scale(name, dtype):
    """Floor 0 (FlashInfer's ``amax > 0 ? amax / 448 : 1``): zero, -0.0 and NaN rows get the
    unit scale (UE8M0 byte 127, fp32 scale 1.0, NVFP4 per-token pts 1.0); rows of tiny
    values around the thresholds (fp32 scales s <= 2^-128, per-token rows below 2^-100) come
    out finite; bitwise against the NumPy reference; QuantScheme(amax_floor=0.0) and
    with_amax_floor(0.0) are the same scheme."""
    s = ALL_SCHEMES[name].with_amax_floor(0.0)
    assert s == QuantScheme(**{f: getattr(ALL_SCHEMES[name], f) for f in ("elem", "scale", "group_k", "scale2",
                                                                          "rounding")}, amax_floor=0.0)  # fmt: skip
    assert s.amax_floor == 0.0 and megamoe.check_scheme(s) is None
    assert s.name == ALL_SCHEMES[name].name + ("" if FMT[name].scale2 == "static" else "+floor=0")
    T, H = 12, 512
    h, w, ids = inputs(T, H, 4, seed=11)
    h[0] = 0.0
    h[1] = -0.0
    h[2] = np.nan
    h[3, :128] = 0.0  # a zero group (and, per token, a zero row's neighbour)
    for t, e in ((4, -101), (5, -100), (6, -119), (7, -122), (8, -126), (9, -133)):
        h[t] = np.ldexp(h[t] / np.abs(h[t]).max(), e)  # row max 2^e
    if dtype == np.float16:  # (rows 4-9 round to zero in f16)
        h = np.clip(h, -60000, 60000).astype(np.float16)
    out = outputs(T, H, 4, s)
    gs = gs_for(name)
    megamoe.prepare_megamoe_inputs(h, w, ids, **out, hidden_quant=s, global_scale=gs)
    want = ref.stage_any(FMT[name], h, w, ids, floor=0.0, global_scale=None if gs is None else gs[0])
    check(out, want)
    f = FMT[name]
    if f.scale2 == "static":
        return  # NVFP4 static reads no floor
    if f.scale2 == "per_token":
        assert (out["x_scales"][:3] == 1.0).all() and np.isfinite(out["x_scales"]).all()
        assert (out["x_sf"][:3] == 0).all()
    elif f.sf == "fp32":
        assert (out["x_sf"][:3] == 1.0).all() and (out["x_sf"][3, 0] == 1.0) and np.isfinite(out["x_sf"]).all()
        assert (out["x_sf"] > 0).all()
    else:
        assert (out["x_sf"][:3].view(np.uint8) == 127).all() and out["x_sf"][3].view(np.uint8)[0] == 127
    if not f.fp4:
        codes = out["x_fp8"].view(np.uint8)
        assert (codes[0] == 0).all() and (codes[1] == 0x80).all() and (codes[2] == 0x7F).all()
        assert not ((codes[3:] & 0x7F) == 0x7F).any()  # no NaN code from finite input


@pytest.mark.parametrize("xdtype", [np.uint8, np.int8])
def test_mxfp4_drop_in_rule(xdtype):
    """vLLM's MXFP4 path: the default scheme with a uint8/int8 x_fp8 of width H/2."""
    T, H = 21, 512
    h, w, ids = inputs(T, H, 6, seed=9)
    want = ref.stage_any(ref.FORMATS["mxfp4"], h, w, ids)
    x = np.full((T, H // 2), 0x5A, xdtype)
    sf = np.full((T, H // 128), 7, np.int32)
    idx, wo = np.zeros((T, 6), np.int64), np.zeros((T, 6), np.float32)
    megamoe.prepare_megamoe_inputs(h, w, ids, x, sf, idx, wo)  # hidden_quant left at MXFP8
    assert_bitwise(x.view(np.uint8), want.x_q, "x_fp8")
    assert_bitwise(sf, want.x_sf, "x_sf")
    # with the default scheme's floor changed too
    megamoe.prepare_megamoe_inputs(h, w, ids, x, sf, idx, wo, hidden_quant=megamoe.MXFP8.with_amax_floor(1.0))
    assert_bitwise(x.view(np.uint8), ref.stage_any(ref.FORMATS["mxfp4"], h, w, ids, floor=1.0).x_q, "x_fp8 floor")
    # an explicit fp8 scheme takes uint8 of width H only
    with pytest.raises(ValueError, match=re.escape("megamoe: x_fp8: expected shape (21, 512), got shape (21, 256)")):
        megamoe.prepare_megamoe_inputs(h, w, ids, x, sf, idx, wo, hidden_quant=megamoe.FP8_UE8M0_G128)


def test_strided_fp4_outputs():
    """Transposed packed x_fp8, MN-major scale words and per-token scales with a stride."""
    T, H = 37, 1024
    h, w, ids = inputs(T, H, 8, seed=4)
    s = megamoe.NVFP4_PER_TOKEN
    want = ref.stage_any(FMT["NVFP4_PER_TOKEN"], h, w, ids)
    x = np.full((H // 2, T), 0xA5, np.uint8).T
    sf_buf = np.full((H // 64, T + 3), 0x5A5A5A5A, np.int32)
    sf = sf_buf[:, :T].T
    xs = np.full(2 * T, np.nan, np.float32)[::2]
    idx, wo = np.zeros((T, 8), np.int64), np.zeros((T, 8), np.float32)
    megamoe.prepare_megamoe_inputs(np.asfortranarray(h), w, ids, x, sf, idx, wo, hidden_quant=s, x_scales=xs)
    check(dict(x_fp8=x, x_sf=sf, topk_idx_out=idx, topk_weights_out=wo, x_scales=xs), want)
    assert np.all(sf_buf[:, T:] == 0x5A5A5A5A)


def test_multithreaded_size_every_format():
    T, H = 1100, 512
    h, w, ids = inputs(T, H, 8, seed=12)
    for name, s in ALL_SCHEMES.items():
        out = outputs(T, H, 8, s)
        gs = gs_for(name)
        megamoe.prepare_megamoe_inputs(h, w, ids, **out, hidden_quant=s, global_scale=gs)
        check(out, ref.stage_any(FMT[name], h, w, ids, global_scale=None if gs is None else gs[0]))


# ---------------------------------------------------------------------------------------
# Second-level scale arguments


def test_second_level_scales_present_exactly_where_needed():
    T, H = 4, 256
    h, w, ids = inputs(T, H, 2)
    out = outputs(T, H, 2, megamoe.NVFP4_STATIC)
    with pytest.raises(ValueError, match=re.escape("megamoe: global_scale: expected a [1] float32 tensor (nvfp4_static needs one), got none")):
        megamoe.prepare_megamoe_inputs(h, w, ids, **out, hidden_quant=megamoe.NVFP4_STATIC)
    with pytest.raises(ValueError, match=re.escape("megamoe: global_scale: expected dtype float32, got dtype float16")):
        megamoe.prepare_megamoe_inputs(h, w, ids, **out, hidden_quant=megamoe.NVFP4_STATIC,
                                       global_scale=np.ones(1, np.float16))  # fmt: skip
    with pytest.raises(ValueError, match=re.escape("megamoe: global_scale: expected a one-element tensor")):
        megamoe.prepare_megamoe_inputs(h, w, ids, **out, hidden_quant=megamoe.NVFP4_STATIC,
                                       global_scale=np.ones(2, np.float32))  # fmt: skip
    pt = outputs(T, H, 2, megamoe.NVFP4_PER_TOKEN)
    xs = pt.pop("x_scales")
    with pytest.raises(ValueError, match=re.escape("megamoe: x_scales: expected a [T] float32 output (nvfp4_per_token writes one), got none")):
        megamoe.prepare_megamoe_inputs(h, w, ids, **pt, hidden_quant=megamoe.NVFP4_PER_TOKEN)
    with pytest.raises(ValueError, match=re.escape("megamoe: x_scales: expected shape (4,), got shape (3,)")):
        megamoe.prepare_megamoe_inputs(h, w, ids, **pt, hidden_quant=megamoe.NVFP4_PER_TOKEN, x_scales=xs[:3])
    mx = outputs(T, H, 2, megamoe.MXFP8)
    with pytest.raises(ValueError, match=re.escape("megamoe: x_scales: expected none (mxfp8 has no per-token scales), got a tensor")):
        megamoe.prepare_megamoe_inputs(h, w, ids, **mx, x_scales=xs)
    with pytest.raises(ValueError, match=re.escape("megamoe: global_scale: expected none (mxfp8 has no static global scale), got a tensor")):
        megamoe.prepare_megamoe_inputs(h, w, ids, **mx, global_scale=np.ones(1, np.float32))
    with pytest.raises(TypeError, match=re.escape("megamoe: x_scales: expected an array (DLPack or buffer protocol), got list")):
        megamoe.prepare_megamoe_inputs(h, w, ids, **pt, hidden_quant=megamoe.NVFP4_PER_TOKEN, x_scales=[1.0] * 4)
    ro = xs.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match=re.escape("megamoe: x_scales: expected a writable array, got a read-only array")):
        megamoe.prepare_megamoe_inputs(h, w, ids, **pt, hidden_quant=megamoe.NVFP4_PER_TOKEN, x_scales=ro)
    with pytest.raises(ValueError, match=re.escape("megamoe: x_scales: expected dtype float32, got big-endian float32")):
        megamoe.prepare_megamoe_inputs(h, w, ids, **pt, hidden_quant=megamoe.NVFP4_PER_TOKEN,
                                       x_scales=np.zeros(4, ">f4"))  # fmt: skip


@pytest.mark.parametrize(
    "scheme",
    [
        QuantScheme(elem=QuantElem.FLOAT4_E2M1, group_k=16),
        QuantScheme(elem=QuantElem.FLOAT4_E2M1, scale=ScaleType.FLOAT32),
        QuantScheme(elem=QuantElem.FLOAT4_E2M1, scale=ScaleType.FLOAT8_E4M3, group_k=16),
        QuantScheme(elem=QuantElem.FLOAT4_E2M1, scale=ScaleType.FLOAT8_E4M3, group_k=32, scale2=Scale2.STATIC),
        QuantScheme.nvfp4_per_token().with_amax_floor(1e-35),
        QuantScheme.mxfp8().with_amax_floor(-1e-4),
        QuantScheme.mxfp4().with_amax_floor(float("nan")),
        QuantScheme(scale2=Scale2.PER_TOKEN),
        QuantScheme(rounding=Rounding.TIES_TOWARD_ZERO),
    ],
    ids=repr,
)
def test_rejected_schemes_are_named(scheme):
    with pytest.raises(ValueError, match=re.escape(repr(scheme))):
        megamoe.check_scheme(scheme)
    h, w, ids = inputs(2, 256, 2)
    with pytest.raises(ValueError, match=re.escape(repr(scheme))):
        megamoe.stage(h, w, ids, scheme=scheme)


# ---------------------------------------------------------------------------------------
# Schemes in Python


def test_scheme_fields_presets_and_names():
    assert megamoe.MXFP4 == QuantScheme(elem=QuantElem.FLOAT4_E2M1, rounding=Rounding.TIES_TOWARD_ZERO)
    assert megamoe.MXFP4_RNE == QuantScheme.mxfp4(Rounding.NEAREST_EVEN) != megamoe.MXFP4
    assert megamoe.NVFP4_STATIC == QuantScheme(elem=QuantElem.FLOAT4_E2M1, scale=ScaleType.FLOAT8_E4M3, group_k=16,
                                               scale2=Scale2.STATIC, rounding=Rounding.TIES_TOWARD_ZERO)  # fmt: skip
    assert megamoe.NVFP4_PER_TOKEN.scale2 == Scale2.PER_TOKEN and megamoe.NVFP4_PER_TOKEN.has_scale2
    names = {n: s.name for n, s in ALL_SCHEMES.items()}
    assert names == {"MXFP8": "mxfp8", "FP8_UE8M0_G128": "fp8_ue8m0_g128", "FP8_FP32_G128": "fp8_fp32_g128",
                     "FP8_FP32_G32": "fp8_fp32_g32", "MXFP8_E5M2": "mxfp8_e5m2", "MXFP4": "mxfp4",
                     "MXFP4_RNE": "mxfp4_rne", "NVFP4_STATIC": "nvfp4_static",
                     "NVFP4_PER_TOKEN": "nvfp4_per_token"}  # fmt: skip
    assert megamoe.MXFP8_E5M2 == QuantScheme(elem=QuantElem.FLOAT8_E5M2) == QuantScheme.mxfp8_e5m2() != megamoe.MXFP8
    assert (megamoe.MXFP8_E5M2.scale, megamoe.MXFP8_E5M2.group_k, megamoe.MXFP8_E5M2.ue8m0) == (ScaleType.UE8M0, 32, True)
    f = megamoe.MXFP8.with_amax_floor(1e-10)
    assert f != megamoe.MXFP8 and f.amax_floor == np.float32(1e-10) and megamoe.MXFP8.amax_floor == np.float32(1e-4)
    assert f.name == "mxfp8+floor=1.00000001e-10" and "amax_floor=1.00000001e-10" in repr(f)  # the fp32 value
    assert hash(f) == hash(QuantScheme(amax_floor=1e-10)) and f == QuantScheme(amax_floor=1e-10)
    nan = QuantScheme(amax_floor=float("nan"))
    assert nan == QuantScheme(amax_floor=float("nan")) and hash(nan) == hash(QuantScheme(amax_floor=float("nan")))
    assert QuantScheme(amax_floor=0.0) == QuantScheme(amax_floor=-0.0)
    assert hash(QuantScheme(amax_floor=0.0)) == hash(QuantScheme(amax_floor=-0.0))
    assert QuantScheme(has_scale2=True).scale2 == Scale2.STATIC
    assert QuantScheme(has_scale2=True, scale2=Scale2.PER_TOKEN).scale2 == Scale2.PER_TOKEN
    with pytest.raises(ValueError, match="has_scale2=True contradicts scale2=Scale2.NONE"):
        QuantScheme(has_scale2=True, scale2=Scale2.NONE)
    t = QuantScheme()
    t.scale2 = Scale2.PER_TOKEN
    t.has_scale2 = True  # keeps the per-token kind
    assert t.scale2 == Scale2.PER_TOKEN
    t.has_scale2 = False
    assert t.scale2 == Scale2.NONE
    t.rounding, t.amax_floor = Rounding.NEAREST_EVEN, 2.0
    assert (t.rounding, t.amax_floor) == (Rounding.NEAREST_EVEN, 2.0)
    import pickle

    for s in ALL_SCHEMES.values():
        for v in (s, s.with_amax_floor(1e-10)):
            assert pickle.loads(pickle.dumps(v)) == v
    old = QuantScheme.__new__(QuantScheme)  # a megamoe 0.2 pickle state: 7 fields, bool scale2
    old.__setstate__((QuantElem.FLOAT8_E4M3, ScaleType.FLOAT32, 1, 128, False, True, False))
    assert old == megamoe.FP8_FP32_G128


@pytest.mark.parametrize(
    "k,want",
    [
        (key(elem="float4_e2m1fn_x2", sdtype="float8_e8m0fnu"), megamoe.MXFP4),
        (key(elem="uint8", sdtype="uint8"), megamoe.MXFP4),
        (key(elem="uint8", sdtype="float8_e4m3fn", G=16, scale2=True, scale2_static=True), megamoe.NVFP4_STATIC),
        (key(elem="uint8", sdtype="float8_e4m3fn", G=16, scale2=True, scale2_static=False), megamoe.NVFP4_PER_TOKEN),
        (key(elem=np.uint8, sdtype=np.dtype("float32"), G=128), QuantScheme(elem=QuantElem.FLOAT4_E2M1, scale=ScaleType.FLOAT32,
                                                                             group_k=128, rounding=Rounding.TIES_TOWARD_ZERO)),
    ],
    ids=["mxfp4_x2", "mxfp4_uint8", "nvfp4_static", "nvfp4_per_token", "fp4_fp32"],
)  # fmt: skip
def test_quant_key_fp4(k, want):
    assert megamoe.as_scheme(k) == want


def test_quant_key_fp4_stages():
    T, H = 6, 256
    h, w, ids = inputs(T, H, 2)
    k = key(elem="uint8", sdtype="float8_e4m3fn", G=16, scale2=True, scale2_static=False)
    out = outputs(T, H, 2, megamoe.NVFP4_PER_TOKEN)
    megamoe.prepare_megamoe_inputs(h, w, ids, **out, hidden_quant=k)
    check(out, ref.stage_any(FMT["NVFP4_PER_TOKEN"], h, w, ids))
    bad = key(elem="float4_e2m1fn_x2", sdtype="float32", G=32)
    with pytest.raises(ValueError, match=re.escape("fp4 e2m1 staging supports MXFP4")):
        megamoe.prepare_megamoe_inputs(h, w, ids, **out, hidden_quant=bad)


# ---------------------------------------------------------------------------------------
# output_shapes


def test_output_shapes_every_format():
    T, H, K = 5, 1024, 8
    o = megamoe.output_shapes(T, H, K)
    assert isinstance(o, megamoe.OutputShapes) and isinstance(o.x_fp8, megamoe.TensorSpec)
    assert o == megamoe.OutputShapes(((5, 1024), "float8_e4m3fn"), ((5, 8), "int32"), ((5, 8), "int64"),
                                     ((5, 8), "float32"), None, None, None)  # fmt: skip
    want_sf = {
        "MXFP8": ((5, 8), "int32"), "FP8_UE8M0_G128": ((5, 2), "int32"), "FP8_FP32_G128": ((5, 8), "float32"),
        "FP8_FP32_G32": ((5, 32), "float32"), "MXFP8_E5M2": ((5, 8), "int32"),
        "MXFP4": ((5, 8), "int32"), "MXFP4_RNE": ((5, 8), "int32"),
        "NVFP4_STATIC": ((5, 16), "int32"), "NVFP4_PER_TOKEN": ((5, 16), "int32"),
    }  # fmt: skip
    for name, s in ALL_SCHEMES.items():
        o = megamoe.output_shapes(T, H, K, s)
        fp4 = s.elem == QuantElem.FLOAT4_E2M1
        assert o.x_fp8 == (((5, 512), "uint8") if fp4 else ((5, 1024), fp8_dtype_name(s))), name
        assert o.x_sf == want_sf[name], name
        assert (o.x_scales == ((5,), "float32")) == (s.scale2 == Scale2.PER_TOKEN), name
        assert (o.global_scale == ((1,), "float32")) == (s.scale2 == Scale2.STATIC), name
        assert o.x_scales is None or s.scale2 == Scale2.PER_TOKEN
    assert megamoe.output_shapes(300, 512, 4, megamoe.MXFP8, 200).shared_x_sf == ((512, 4), "int32")
    assert megamoe.output_shapes(300, 512, 4, megamoe.MXFP8_E5M2, 200).shared_x_sf == ((512, 4), "int32")
    assert megamoe.output_shapes(0, 512, 4, megamoe.MXFP8, 64).shared_x_sf == ((0, 4), "int32")
    assert megamoe.output_shapes(3, 256, 2, key(G=128, sdtype="float32")).x_sf == ((3, 2), "float32")


def test_output_shapes_errors():
    with pytest.raises(ValueError, match=re.escape("DeepSeek V4 MegaMoE input staging requires hidden_size to be a multiple of 128.")):
        megamoe.output_shapes(4, 200, 8)
    with pytest.raises(ValueError, match=re.escape("hidden_size / group_size to be a multiple of 4")):
        megamoe.output_shapes(4, 128, 8, megamoe.FP8_UE8M0_G128)
    with pytest.raises(ValueError, match=re.escape("DeepSeek V4 MegaMoE shared input staging currently requires UE8M0-packed hidden scales.")):
        megamoe.output_shapes(4, 256, 8, megamoe.NVFP4_STATIC, 64)
    with pytest.raises(ValueError, match=re.escape("MegaMoE shared_block_m must be positive.")):
        megamoe.output_shapes(4, 256, 8, megamoe.MXFP8, 0)
    with pytest.raises(ValueError, match=re.escape("non-negative T, H and K")):
        megamoe.output_shapes(-1, 256, 8)
    with pytest.raises(ValueError, match=re.escape("more than int64 can count")):
        megamoe.output_shapes(4, 256, 8, megamoe.MXFP8, 2**63 - 1)
    with pytest.raises(ValueError, match=re.escape("T * H and T * K must fit in int64")):
        megamoe.output_shapes(2**62, 256, 8, megamoe.MXFP8)
    with pytest.raises(TypeError, match=re.escape("megamoe: T: expected an int or None, got float")):
        megamoe.output_shapes(4.0, 256, 8)
    with pytest.raises(TypeError, match=re.escape("megamoe.output_shapes: K: expected an int, got None")):
        megamoe.output_shapes(4, 256, None)
    with pytest.raises(TypeError, match=re.escape("megamoe: hidden_quant: expected a megamoe.QuantScheme")):
        megamoe.output_shapes(4, 256, 8, "mxfp8")
    assert megamoe.output_shapes(np.int64(4), np.int32(256), 8).x_fp8.shape == (4, 256)


# ---------------------------------------------------------------------------------------
# stage() and dequantize()


@pytest.mark.parametrize("name", ALL_SCHEMES)
def test_stage_and_dequantize_every_format(name):
    s = ALL_SCHEMES[name]
    T, H = 21, 1024
    rng = np.random.default_rng(6)
    h = (rng.standard_normal((T, H)) * 3).astype(np.float32)
    h[2, :100] *= 50  # a wide spread inside groups and rows
    w, ids = rng.random((T, 8)).astype(np.float32), rng.integers(0, 99, (T, 8)).astype(np.int32)
    pad = rng.random(T) < 0.3
    gs = None if FMT[name].scale2 != "static" else np.array([float(np.abs(h).max()) / (448 * 6)], np.float32)
    out = megamoe.stage(h, w, ids, pad, scheme=s, global_scale=gs)
    assert isinstance(out, megamoe.StagedInputs) and out.shared_x_sf is None
    o = megamoe.output_shapes(T, H, 8, s)
    for got, spec in zip(out, o[:4]):
        assert got.shape == spec.shape and got.dtype == NP_DTYPES[spec.dtype]
    want = ref.stage_any(FMT[name], h, w, ids, pad, global_scale=None if gs is None else gs[0])
    check(dict(zip(("x_fp8", "x_sf", "topk_idx_out", "topk_weights_out"), out[:4]), x_scales=out.x_scales), want)
    assert (out.x_scales is None) == (FMT[name].scale2 != "per_token")
    deq = megamoe.dequantize(out.x_fp8, out.x_sf, s, x_scales=out.x_scales, global_scale=gs)
    assert deq.dtype == np.float32 and deq.shape == (T, H)
    assert_bitwise(deq, ref.dequantized(want, s.group_k), "dequantize")
    snr = ref.snr_db(h, deq)
    # e4m3: ~31 dB, e5m2 (a mantissa bit less): ~25 dB, e2m1: ~12-18 dB
    floor = 9.0 if s.elem == QuantElem.FLOAT4_E2M1 else 20.0 if s.elem == QuantElem.FLOAT8_E5M2 else 25.0
    assert snr > floor, f"{name}: SNR {snr:.1f} dB"
    if s.elem == QuantElem.FLOAT4_E2M1 and s.scale == ScaleType.FLOAT8_E4M3:
        assert snr > 15.0, f"{name}: NVFP4's e4m3 scales should beat MXFP4's power-of-two ones ({snr:.1f} dB)"


def test_dequantize_drop_in_and_byte_views():
    T, H = 4, 512
    h, w, ids = inputs(T, H, 2, seed=1)
    fp4 = megamoe.stage(h, w, ids, scheme=megamoe.MXFP4)
    want = megamoe.dequantize(fp4.x_fp8, fp4.x_sf, megamoe.MXFP4)
    assert_bitwise(megamoe.dequantize(fp4.x_fp8, fp4.x_sf), want, "MXFP8 scheme with MXFP4-shaped arrays")
    assert_bitwise(megamoe.dequantize(fp4.x_fp8.view(np.int8), fp4.x_sf), want, "int8 bytes")
    assert_bitwise(megamoe.dequantize(fp4.x_fp8, fp4.x_sf.view(np.uint32), megamoe.MXFP4), want, "uint32 words")
    nibble = np.array([[0x80, 0x08] + [0] * 62], np.uint8)  # -0.0 in the high / low nibble
    d = megamoe.dequantize(nibble, np.full((1, 1), 0x7F7F7F7F, np.int32), megamoe.MXFP4)
    assert np.signbit(d[0, 1]) and np.signbit(d[0, 2]) and not np.signbit(d[0, 0])
    e = megamoe.dequantize(np.full((1, 64), 0x11, np.uint8), np.array([[0x00 | (0xFF << 8) | (0x80 << 16)]], np.int32), megamoe.MXFP4)
    assert e[0, 0] == np.float32(2.0**-128) and np.isnan(e[0, 32]) and e[0, 64] == 1.0  # fmt: skip


def test_stage_scheme_and_hidden_quant_are_one_argument():
    h, w, ids = inputs(3, 256, 2)
    a = megamoe.stage(h, w, ids, hidden_quant=megamoe.FP8_FP32_G128)
    b = megamoe.stage(h, w, ids, scheme=megamoe.FP8_FP32_G128)
    assert_bitwise(a.x_sf, b.x_sf, "x_sf")
    with pytest.raises(TypeError, match="give scheme= or hidden_quant="):
        megamoe.stage(h, w, ids, scheme=megamoe.MXFP4, hidden_quant=megamoe.MXFP8)
    with pytest.raises(ValueError, match=re.escape("megamoe: global_scale: expected a [1] float32 tensor (nvfp4_static needs one), got none")):
        megamoe.stage(h, w, ids, scheme=megamoe.NVFP4_STATIC)


# ---------------------------------------------------------------------------------------
# MXFP8 e5m2: edge values, QuantKeys, decoding


def test_e5m2_reference_encoder_edges():
    """The reference's own e5m2 encoder on the values that decide the codec: ties to the even
    code, the subnormal ends, saturation (finite and infinite) and NaN."""
    y = np.array([1.125, 1.375, 1.875, 53248, 57344, 61440, 1e9, -1e9, np.inf, -np.inf, np.nan, -np.nan,
                  2.0**-17, -(2.0**-17), 3 * 2.0**-17, 2.0**-16, 2.0**-14, 0.0, -0.0, 40000], np.float32)  # fmt: skip
    want = [0x3C, 0x3E, 0x40, 0x7A, 0x7B, 0x7B, 0x7B, 0xFB, 0x7B, 0xFB, 0x7F, 0x7F,
            0x00, 0x80, 0x02, 0x01, 0x04, 0x00, 0x80, 0x79]  # fmt: skip
    assert [int(b) for b in ref.to_fp8_e5m2(y)] == want
    # every finite code decodes to itself and encodes back
    codes = np.concatenate([np.arange(0x7C), np.arange(0x80, 0xFC)]).astype(np.uint8)
    assert_bitwise(ref.to_fp8_e5m2(ref.fp8_e5m2_to_f32(codes)), codes, "e5m2 round trip")


def test_e5m2_golden_edges():
    """MXFP8_E5M2 staging of hand-picked groups, against hard-coded bytes and the reference:
    a group whose anchor 40000 makes the scale 1 (UE8M0 127) holds the ties 1.125 -> 1.0 and
    1.375 -> 1.5 and the subnormal ends (2^-17 -> 0, 3 * 2^-17 -> 2^-15); 53248 (a tie
    between 49152 and 57344) -> 49152; +-Inf make the scale 2^127 and saturate to +-57344;
    NaN -> 0x7F; all-zero, all -0.0 and all-NaN groups take the floor's scale."""
    T, H = 2, 256
    h = np.zeros((T, H), np.float32)
    g = [h[0, 32 * i : 32 * (i + 1)] for i in range(8)]
    g[0][:12] = [40000, 1.125, 1.375, -1.125, -1.375, 2.0**-17, -(2.0**-17), 3 * 2.0**-17, 2.0**-16, 2.0**-14, 1.25, -1.0]
    g[1][:4] = [53248, 1.875, 2.5, -53248]
    g[2][:4] = [np.inf, -np.inf, 1.0, np.nan]
    g[4][:] = -0.0
    g[5][:] = np.nan
    g[6][:2] = [100000, 2.25]  # scale 2: 50000 -> 49152, 1.125 -> 1.0
    g[7][:2] = [1e-3, -5e-4]
    h[1] = h[0][::-1]  # the same groups reversed (the columns' order inside a group does not matter)
    w, ids = np.ones((T, 2), np.float32), np.zeros((T, 2), np.int32)
    s = megamoe.MXFP8_E5M2
    out = outputs(T, H, 2, s)
    megamoe.prepare_megamoe_inputs(h, w, ids, **out, hidden_quant=s)
    check(out, ref.stage_any(FMT["MXFP8_E5M2"], h, w, ids))
    q, sfb = out["x_fp8"].view(np.uint8), out["x_sf"].view(np.uint8).reshape(T, -1)
    assert list(q[0, :12]) == [0x79, 0x3C, 0x3E, 0xBC, 0xBE, 0x00, 0x80, 0x02, 0x01, 0x04, 0x3D, 0xBC]
    assert list(q[0, 32:36]) == [0x7A, 0x40, 0x41, 0xFA] and not q[0, 36:64].any()
    assert list(q[0, 64:68]) == [0x7B, 0xFB, 0x00, 0x7F]
    assert not q[0, 96:128].any() and np.all(q[0, 128:160] == 0x80) and np.all(q[0, 160:192] == 0x7F)
    assert list(q[0, 192:194]) == [0x7A, 0x3C]
    # the floor's scale: fl(1e-4 * fl(1/57344)) is in [2^-30, 2^-29): exponent 97, rounded up
    assert list(sfb[0]) == [127, 127, 254, 0x62, 0x62, 0x62, 128, 102]
    assert_bitwise(q[1], q[0][::-1], "x_fp8 of the reversed groups")
    assert_bitwise(sfb[1], sfb[0][::-1], "x_sf of the reversed groups")


def test_e5m2_dequantize_decodes_every_byte():
    """dequantize reads MXFP8_E5M2 bytes as e5m2 (0x7C / 0xFC +-Inf, 0x7D-0x7F NaN, subnormals
    m * 2^-16), each times its group's power of two, exactly; typed e4m3 bytes are refused."""
    b = np.arange(256, dtype=np.uint8).reshape(2, 128)
    sf = np.full((2, 1), 0x807F7E7F, np.uint32).view(np.int32)  # scales 1, 1/2, 1, 2 (bytes 7F 7E 7F 80)
    d = megamoe.dequantize(b, sf, megamoe.MXFP8_E5M2)
    scale = np.repeat(np.array([1.0, 0.5, 1.0, 2.0], np.float32), 32)
    assert_bitwise(d, (ref.fp8_e5m2_to_f32(b) * scale).astype(np.float32), "e5m2 dequantize")
    assert d[0, 1] == 2.0**-16 and d[0, 4] == 2.0**-14 and d[0, 0x3C] == 0.5  # 1.0 in the group of scale 1/2
    assert d[0, 0x7B] == 57344 * 2.0 and np.isposinf(d[0, 0x7C]) and np.all(np.isnan(d[0, 0x7D:0x80]))
    assert np.isneginf(d[1, 0x7C]) and d[1, 0x3C] == -0.5 and np.signbit(d[1, 0])
    assert_bitwise(megamoe.dequantize(b.view(np.int8), sf, megamoe.MXFP8_E5M2), d, "int8 bytes")
    # e4m3 reads the same bytes differently: the scheme picks the codec
    assert not np.array_equal(megamoe.dequantize(b, sf, megamoe.MXFP8), d, equal_nan=True)


@pytest.mark.parametrize(
    "k",
    [key(elem="float8_e5m2"), key(elem="float8_e5m2", sdtype="uint8"), key(elem="torch.float8_e5m2")],
    ids=["e8m0", "uint8_scales", "torch_name"],
)
def test_quant_key_e5m2(k):
    """A float8_e5m2 QuantKey with UE8M0 scales over groups of 32 is MXFP8_E5M2 and stages so."""
    assert megamoe.as_scheme(k) == megamoe.MXFP8_E5M2
    T, H = 9, 256
    h, w, ids = inputs(T, H, 2, seed=2)
    out = outputs(T, H, 2, megamoe.MXFP8_E5M2)
    megamoe.prepare_megamoe_inputs(h, w, ids, **out, hidden_quant=k)
    check(out, ref.stage_any(FMT["MXFP8_E5M2"], h, w, ids))


@pytest.mark.parametrize(
    "k",
    [key(elem="float8_e5m2", G=128), key(elem="float8_e5m2", sdtype="float32"), key(elem="float8_e5m2", G=16),
     key(elem="float8_e5m2", static=True)],
    ids=["g128", "fp32_scales", "g16", "static"],
)  # fmt: skip
def test_quant_key_e5m2_other_layouts_rejected(k):
    """e5m2 is staged as MXFP8 e5m2 only (UE8M0, G = 32); other layouts are named."""
    with pytest.raises(ValueError, match=re.escape(repr(megamoe.as_scheme(k)))):
        megamoe.check_scheme(megamoe.as_scheme(k))


def test_e5m2_bytes_match_ml_dtypes():
    """megamoe's e5m2 bytes are ml_dtypes' float8_e5m2 conversion (round to nearest even) of
    the scaled values x * 2^(127 - e), which staging keeps within +-57344 for finite inputs."""
    ml = pytest.importorskip("ml_dtypes")
    T, H = 64, 1024
    h, w, ids = inputs(T, H, 2, seed=21)
    out = megamoe.stage(h, w, ids, scheme=megamoe.MXFP8_E5M2)
    e = out.x_sf.view(np.uint8).reshape(T, -1).astype(np.int64)
    mult = np.ldexp(np.float32(1.0), 127 - e).astype(np.float32)
    v = (h.reshape(T, -1, 32) * mult[:, :, None]).astype(np.float32).reshape(T, H)
    assert np.all(np.isfinite(v)) and np.abs(v).max() <= 57344
    assert_bitwise(out.x_fp8, v.astype(ml.float8_e5m2).view(np.uint8), "x_fp8 vs ml_dtypes")
    # and the reference encoder agrees with ml_dtypes on every float32 in range, ties included
    y = np.concatenate([v.reshape(-1), ref.E5M2_MIDPOINTS.astype(np.float32), ref.E5M2_POS.astype(np.float32)])
    y = np.concatenate([y, -y])
    assert_bitwise(ref.to_fp8_e5m2(y), y.astype(ml.float8_e5m2).view(np.uint8), "reference vs ml_dtypes")
    # ml_dtypes' typed arrays are x_fp8 buffers too
    typed = np.zeros((T, H), ml.float8_e5m2)
    megamoe.prepare_megamoe_inputs(h, w, ids, typed, np.zeros_like(out.x_sf), np.zeros((T, 2), np.int64),
                                   np.zeros((T, 2), np.float32), hidden_quant=megamoe.MXFP8_E5M2)  # fmt: skip
    assert_bitwise(typed.view(np.uint8), out.x_fp8, "ml_dtypes float8_e5m2 x_fp8")
    with pytest.raises(ValueError, match=re.escape("megamoe: x_fp8: expected dtype float8_e5m2 or uint8, got dtype float8_e4m3fn")):
        megamoe.prepare_megamoe_inputs(h, w, ids, np.zeros((T, H), ml.float8_e4m3fn), out.x_sf, out.topk_idx,
                                       out.topk_weights, hidden_quant=megamoe.MXFP8_E5M2)  # fmt: skip


def test_bf16_preset_shapes_and_rejections():
    """BF16 pass-through: the preset's fields and name, x_fp8 [T, H] bfloat16 and an empty
    x_sf; no shared copy, a group_k or scales rejected; the floor ignored."""
    s = megamoe.BF16
    assert s == QuantScheme.bf16() == QuantScheme(elem=QuantElem.BFLOAT16, scale=ScaleType.NONE, group_k=0)
    assert s.name == "bf16" and s.with_amax_floor(1e-10).name == "bf16" and s.with_amax_floor(0.0).name == "bf16"
    o = megamoe.output_shapes(5, 384, 6, s)
    assert o == megamoe.OutputShapes(((5, 384), "bfloat16"), ((5, 0), "float32"), ((5, 6), "int64"),
                                     ((5, 6), "float32"), None, None, None)  # fmt: skip
    with pytest.raises(ValueError, match="shared"):
        megamoe.output_shapes(5, 384, 6, s, 64)
    with pytest.raises(ValueError, match="bf16"):
        megamoe.output_shapes(5, 384, 6, QuantScheme(elem=QuantElem.BFLOAT16, scale=ScaleType.NONE, group_k=32))
    with pytest.raises(ValueError):
        megamoe.output_shapes(5, 384, 6, QuantScheme(elem=QuantElem.BFLOAT16, scale=ScaleType.UE8M0, group_k=0))
    with pytest.raises(ValueError, match="multiple of 128"):
        megamoe.output_shapes(5, 200, 6, s)


def test_bf16_numpy_staging():
    """BF16 through NumPy (bfloat16 arrays from ml_dtypes): fp32 input rounded to nearest
    even (ties planted), every NaN 0x7FC0, x_sf None or [T, 0], top-k as MXFP8's."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    T, H, K = 6, 256, 3
    rng = np.random.default_rng(5)
    bits = rng.integers(0, 2**32, (T, H), dtype=np.uint64).astype(np.uint32)
    bits[:, ::3] = (bits[:, ::3] & 0xFFFF0000) | 0x8000
    h = bits.view(np.float32)
    ids = rng.integers(0, 64, (T, K)).astype(np.int32)
    w = rng.random((T, K), dtype=np.float32)
    lo = bits & 0xFFFF
    up = ((lo > 0x8000) | ((lo == 0x8000) & ((bits >> 16) & 1 == 1))).astype(np.uint32)
    want = np.where(np.isnan(h), 0x7FC0, ((bits >> 16) + up) & 0xFFFF).astype(np.uint16)
    for sf in (None, np.zeros((T, 0), np.float32)):
        x = np.zeros((T, H), ml_dtypes.bfloat16)
        idx, wo = np.zeros((T, K), np.int64), np.zeros((T, K), np.float32)
        megamoe.prepare_megamoe_inputs(h, w, ids, x, sf, idx, wo, hidden_quant=megamoe.BF16)
        assert np.array_equal(x.view(np.uint16), want)
        assert np.array_equal(idx, ids.astype(np.int64)) and np.array_equal(wo, w)
    with pytest.raises(ValueError, match="x_sf"):
        megamoe.prepare_megamoe_inputs(h, w, ids, x, np.zeros((T, 1), np.int32), idx, wo, hidden_quant=megamoe.BF16)
