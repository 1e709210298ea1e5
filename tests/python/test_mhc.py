"""megamoe.mhc_pre_and_stage (the mHC producer) from Python, on the CPU backend.

- post_mix, comb_mix, pre_mix, layer_input and y == an independent NumPy rendering of
  docs/CONTRACT.md's formulas ("mHC pre and stage"), bit for bit: fp32 steps formed in
  float64 and rounded once to float32, exp in float64 rounded once (the contract's exp is
  correctly rounded; a float64 exp rounded to float32 differs from it only for values
  within 2^-29 relative of a midpoint), the 16-term chunk sums and the fold of halves, the
  ordered Sinkhorn, then test_norm's RMSNorm rendering;
- vLLM's 3-D shapes ([T, hc, H] residual, [T, hc, 1] post_mix, [T, hc, hc] comb_mix) and
  2-D ones, strided arrays;
- the staged outputs == megamoe.prepare_megamoe_inputs on the reference y, several formats;
- DeepSeek-V4.1's delayed form (pre_mix_in), full-buffer mode, T = 0, explain;
- argument errors raise the library's message and write nothing;
- torch (skipped without torch): the direct call (3-D shapes) and the op against the
  reference, opcheck, the op schema, FakeTensor, torch.compile (2-D and 3-D), T = 0, errors.
"""

from __future__ import annotations

import numpy as np
import pytest

import megamoe
from megamoe_testutil import ALL_SCHEMES, assert_bitwise
from test_norm import (
    F32,
    F64,
    assert_same_outputs,
    bf,
    bf16_bits,
    bf16_of_f32,
    f32_of_bf16,
    fl,
    norm_reference,
    staged_by_prepare,
    topk,
    weight_of,
)
from test_formats import gs_for, outputs

try:
    import torch
except ImportError:  # CI: NumPy only
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

CHUNK = 16
# (bf16 pass-through's x_fp8 is bf16, which NumPy lacks: tests/cpp/test_mhc.cpp covers it.)
FORMATS = ["MXFP8", "FP8_FP32_G128", "MXFP4", "NVFP4_PER_TOKEN", "NVFP4_STATIC", "MXFP8_E5M2"]


# ---------------------------------------------------------------------------------------
# The NumPy rendering of the contract (docs/CONTRACT.md, "mHC pre and stage")


def long_sum(t: np.ndarray) -> np.ndarray:
    """The contract's sum over the last axis (a multiple of 16 float32 terms): 16-term
    chunks in order, chunks beyond the count +0 up to a power of two, halves folded."""
    *lead, K = t.shape
    n = K // CHUNK
    c = t.reshape(*lead, n, CHUNK)
    acc = c[..., 0].astype(F32)
    for i in range(1, CHUNK):
        acc = fl(acc.astype(F64) + c[..., i])
    N = 1
    while N < n:
        N *= 2
    tree = np.zeros((*lead, N), F32)
    tree[..., :n] = acc
    h = N // 2
    while h >= 1:
        tree[..., :h] = fl(tree[..., :h].astype(F64) + tree[..., h : 2 * h])
        h //= 2
    return tree[..., 0]


def exp32(v: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return np.exp(np.asarray(v, F32).astype(F64)).astype(F32)


def sigmoid32(v: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return fl(1.0 / fl(1.0 + exp32(-np.asarray(v, F32)).astype(F64)).astype(F64))


def ordered_sum(m: np.ndarray, axis: int) -> np.ndarray:
    """Sum along ``axis`` from the first element, in index order, each step rounded."""
    m = np.moveaxis(m, axis, -1)
    s = m[..., 0]
    for k in range(1, m.shape[-1]):
        s = fl(s.astype(F64) + m[..., k])
    return np.expand_dims(s, axis)


def canonical(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, F32).copy()
    v.view(np.uint32)[np.isnan(v)] = 0x7FC00000
    return v


def mhc_reference(x, fn, scale, base, w, hc, rms_eps=1e-6, pre_eps=1e-6, sk_eps=1e-6, post_mult=2.0, repeat=20,
                  norm_eps=1e-6, pre_in=None):  # fmt: skip
    """(pre, post, comb [T, hc, hc], z bits, y bits) for bf16 bits ``x`` [T, hc * H]."""
    T, K = x.shape
    H = K // hc
    xf = f32_of_bf16(x).astype(F64)
    f = lambda v: float(F32(v))  # noqa: E731 - the parameters as the library receives them
    rms_eps, pre_eps, sk_eps, post_mult, norm_eps = map(f, (rms_eps, pre_eps, sk_eps, post_mult, norm_eps))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        S = long_sum(fl(xf * xf)).astype(F64)
        d = np.stack([long_sum(fl(xf * fn[m].astype(F64))) for m in range(fn.shape[0])], axis=1).astype(F64)
        r = fl(1.0 / fl(np.sqrt(fl(fl(S / K).astype(F64) + rms_eps).astype(F64))).astype(F64)).astype(F64)
        g = np.array([0] * hc + [1] * hc + [2] * (hc * hc))
        a = fl(fl(fl(d * r[:, None]).astype(F64) * scale[g].astype(F64)).astype(F64) + base.astype(F64))
        pre = fl(sigmoid32(a[:, :hc]).astype(F64) + pre_eps)
        post = fl(sigmoid32(a[:, hc : 2 * hc]).astype(F64) * post_mult)
        c = a[:, 2 * hc :].reshape(T, hc, hc).astype(F32)
        nan_row = np.isnan(c).any(axis=2, keepdims=True)
        m = np.where(nan_row, np.float32(np.nan), np.max(np.where(np.isnan(c), -np.inf, c), axis=2, keepdims=True))
        e = exp32(fl(c.astype(F64) - m))
        c = fl(fl(e.astype(F64) / ordered_sum(e, 2)).astype(F64) + sk_eps)
        c = fl(c.astype(F64) / fl(ordered_sum(c, 1).astype(F64) + sk_eps))
        for _ in range(repeat - 1):
            c = fl(c.astype(F64) / fl(ordered_sum(c, 2).astype(F64) + sk_eps))
            c = fl(c.astype(F64) / fl(ordered_sum(c, 1).astype(F64) + sk_eps))
        q = (pre if pre_in is None else pre_in).astype(F64)
        u = fl(q[:, :1] * xf[:, :H])
        for j in range(1, hc):
            u = fl(u.astype(F64) + fl(q[:, j : j + 1] * xf[:, j * H : (j + 1) * H]))
    z = bf16_of_f32(u)
    y, _ = norm_reference(z, None, w, eps=norm_eps)
    return canonical(pre), canonical(post), canonical(c), z, y


def test_reference_pieces():
    """The rendering's pieces on values whose answers are known."""
    assert long_sum(np.ones((1, 48), F32))[0] == 48.0
    assert sigmoid32(np.array([0.0], F32))[0] == 0.5
    assert sigmoid32(np.array([-200.0], F32))[0] == 0.0
    # equal logits: Sinkhorn keeps the matrix uniform
    hc, H = 4, 128
    x = np.zeros((1, hc * H), np.uint16)
    fn = np.zeros((hc * (hc + 2), hc * H), F32)
    _, post, comb, z, y = mhc_reference(x, fn, np.ones(3, F32), np.zeros(hc * (hc + 2), F32), np.ones(H, F32), hc)
    assert np.all(comb == comb.flat[0]) and abs(comb.flat[0] - 0.25) < 1e-5
    assert np.all(post == 1.0) and np.all(z == 0) and np.all(y == 0)


# ---------------------------------------------------------------------------------------
# Problems


def problem(rng, T, hc, H, wdtype="fp32"):
    M, K = hc * (hc + 2), hc * H
    x = bf16_bits(rng, T, K, 1.5)
    fn = (rng.standard_normal((M, K)) * 0.02).astype(F32)
    scale = (0.05 + 0.5 * rng.random(3)).astype(F32)
    base = (0.3 * rng.standard_normal(M)).astype(F32)
    return x, fn, scale, base, weight_of(rng, H, wdtype)


def mhc_outputs(T, hc, H, three_d=False):
    post = np.full((T, hc, 1) if three_d else (T, hc), np.nan, F32)
    comb = np.full((T, hc, hc) if three_d else (T, hc * hc), np.nan, F32)
    return post, comb


# ---------------------------------------------------------------------------------------
# Bitwise against the reference


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("hc", [1, 2, 4, 8])
@pytest.mark.parametrize("T,H", [(1, 128), (5, 384), (3, 1152)])
def test_mhc_and_staging_bitwise(name, hc, T, H):
    s = ALL_SCHEMES[name]
    if s.ue8m0 and (H // s.group_k) % 4:
        pytest.skip("UE8M0 needs H/G to be a multiple of 4")
    rng = np.random.default_rng(T * 131 + H + hc)
    x, fn, scale, base, w = problem(rng, T, hc, H, "bf16" if hc % 2 else "fp32")
    tw, ti = topk(rng, T)
    pre_r, post_r, comb_r, z_r, y_r = mhc_reference(x, fn, scale, base, w, hc, repeat=7)
    post, comb = mhc_outputs(T, hc, H)
    pre = np.full((T, hc), np.nan, F32)
    z = np.full((T, H), 0xA5A5, np.uint16)
    y = np.full((T, H), 0xA5A5, np.uint16)
    out = outputs(T, H, 6, s)
    gs = gs_for(name)
    kw = {} if gs is None else {"global_scale": gs}
    megamoe.mhc_pre_and_stage(bf(x), fn, scale, base, bf(w) if w.dtype == np.uint16 else w, post, comb, tw, ti, **out,
                              hidden_quant=s, sinkhorn_repeat=7, pre_mix=pre, layer_input=bf(z), y=bf(y), **kw)  # fmt: skip
    assert_bitwise(post, post_r, "post_mix")
    assert_bitwise(comb, comb_r.reshape(T, hc * hc), "comb_mix")
    assert_bitwise(pre, pre_r, "pre_mix")
    assert_bitwise(z, z_r, "layer_input")
    assert_bitwise(y, y_r, "y")
    assert_same_outputs(out, staged_by_prepare(y_r, tw, ti, s, **kw))


def test_vllm_shapes_and_strides():
    """[T, hc, 1] post_mix and [T, hc, hc] comb_mix (2-D views are written), a column-major
    fn, custom scalars; no y: the rows are staged only."""
    T, hc, H = 6, 4, 256
    rng = np.random.default_rng(3)
    x, fn, scale, base, w = problem(rng, T, hc, H)
    kw = dict(rms_eps=1e-5, hc_pre_eps=0.01, hc_sinkhorn_eps=1e-4, hc_post_mult_value=1.5, sinkhorn_repeat=3,
              norm_eps=1e-5)  # fmt: skip
    _, post_r, comb_r, _, y_r = mhc_reference(x, fn, scale, base, w, hc, rms_eps=1e-5, pre_eps=0.01, sk_eps=1e-4,
                                              post_mult=1.5, repeat=3, norm_eps=1e-5)  # fmt: skip
    post, comb = mhc_outputs(T, hc, H, three_d=True)
    tw, ti = topk(rng, T)
    out = outputs(T, H, 6, megamoe.MXFP8)
    megamoe.mhc_pre_and_stage(bf(x), np.asfortranarray(fn), scale, base, w, post, comb, tw, ti, **out, **kw)
    assert_bitwise(post.reshape(T, hc), post_r, "post_mix")
    assert_bitwise(comb, comb_r, "comb_mix")
    assert_same_outputs(out, staged_by_prepare(y_r, tw, ti, megamoe.MXFP8))
    # a 3-D NumPy residual is flattened (uint16 is no bf16 to the library: its dtype error names it)
    with pytest.raises(ValueError, match="residual: expected dtype bfloat16"):
        megamoe.mhc_pre_and_stage(x.reshape(T, hc, H), fn, scale, base, w, post, comb, tw, ti,
                                  **outputs(T, H, 6, megamoe.MXFP8))  # fmt: skip


def test_strided_three_d_bf16_residual():
    """A [T, hc, H] bfloat16 residual with strides (every other column of a wider array),
    as ml_dtypes' NumPy bfloat16: flattened by a copy, the same results."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    T, hc, H = 3, 2, 384
    rng = np.random.default_rng(5)
    x, fn, scale, base, w = problem(rng, T, hc, H)
    big = np.zeros((T, hc, 2 * H), np.uint16)
    big[:, :, ::2] = x.reshape(T, hc, H)
    residual = big.view(ml_dtypes.bfloat16)[:, :, ::2]
    _, post_r, comb_r, _, y_r = mhc_reference(x, fn, scale, base, w, hc)
    post, comb = mhc_outputs(T, hc, H)
    y = np.full((T, H), 0xA5A5, np.uint16)
    tw, ti = topk(rng, T)
    out = outputs(T, H, 6, megamoe.MXFP8)
    megamoe.mhc_pre_and_stage(residual, fn, scale, base, w, post, comb, tw, ti, **out, y=bf(y))
    assert_bitwise(post, post_r, "post_mix")
    assert_bitwise(comb, comb_r.reshape(T, hc * hc), "comb_mix")
    assert_bitwise(y, y_r, "y")


def test_three_d_outputs_without_a_view_are_refused():
    T, hc, H = 3, 2, 128
    rng = np.random.default_rng(4)
    x, fn, scale, base, w = problem(rng, T, hc, H)
    post = np.full((T, hc), np.nan, F32)
    comb = np.full((hc, hc, T), np.nan, F32).transpose(2, 1, 0)  # [T, hc, hc] with no 2-D view
    tw, ti = topk(rng, T)
    out = outputs(T, H, 6, megamoe.MXFP8)
    before = {k: v.copy() for k, v in out.items()}
    with pytest.raises(ValueError, match=r"comb_mix: expected strides that allow a view of shape \(3, 4\)"):
        megamoe.mhc_pre_and_stage(bf(x), fn, scale, base, w, post, comb, tw, ti, **out)
    assert np.isnan(post).all() and np.isnan(comb).all()
    for k in out:
        assert_bitwise(out[k], before[k], k)


def test_delayed_form_and_full_buffer():
    T, hc, H, rows = 4, 4, 512, 9
    rng = np.random.default_rng(8)
    x, fn, scale, base, w = problem(rng, T, hc, H)
    pre_in = rng.random((T, hc)).astype(F32)
    pre_r, post_r, comb_r, z_r, y_r = mhc_reference(x, fn, scale, base, w, hc, pre_in=pre_in)
    post, comb = mhc_outputs(T, hc, H)
    pre = np.full((T, hc), np.nan, F32)
    y = np.full((T, H), 0xA5A5, np.uint16)
    tw, ti = topk(rng, T)
    out = outputs(T, H, 6, megamoe.FP8_FP32_G128, rows=rows)
    megamoe.mhc_pre_and_stage(bf(x), fn, scale, base, w, post, comb, tw, ti, **out, hidden_quant=megamoe.FP8_FP32_G128,
                              pre_mix_in=pre_in, pre_mix=pre, y=bf(y), full_buffer=True)  # fmt: skip
    assert_bitwise(pre, pre_r, "pre_mix")
    assert_bitwise(y, y_r, "y")
    assert_same_outputs(out, staged_by_prepare(y_r, tw, ti, megamoe.FP8_FP32_G128, rows=rows, full_buffer=True))


def test_zero_tokens_and_explain():
    hc, H = 4, 256
    rng = np.random.default_rng(9)
    x, fn, scale, base, w = problem(rng, 0, hc, H)
    post, comb = mhc_outputs(0, hc, H)
    tw, ti = topk(rng, 0)
    out = outputs(0, H, 6, megamoe.MXFP8)
    megamoe.mhc_pre_and_stage(bf(x), fn, scale, base, w, post, comb, tw, ti, **out)  # returns at once
    assert megamoe.explain_mhc_pre_and_stage(bf(x), fn, scale, base, w, post, comb, tw, ti, **out).startswith(
        "nothing to do: residual has no rows")
    T = 3
    x, fn, scale, base, w = problem(rng, T, hc, H)
    post, comb = mhc_outputs(T, hc, H)
    tw, ti = topk(rng, T)
    out = outputs(T, H, 6, megamoe.MXFP8)
    text = megamoe.explain_mhc_pre_and_stage(bf(x), fn, scale, base, w, post, comb, tw, ti, **out, sinkhorn_repeat=5)
    assert text.startswith("cpu backend: mhc_pre T=3 H=256 hc_mult=4 sinkhorn_repeat=5") and "mxfp8" in text, text
    assert np.isnan(post).all()  # explain runs nothing


@pytest.mark.parametrize(
    "edit,exc,msg",
    [
        (dict(sinkhorn_repeat=0), ValueError, "sinkhorn_repeat: expected 1 to 65536 rounds"),
        (dict(sinkhorn_repeat=None), TypeError, "sinkhorn_repeat: expected an int, got NoneType"),
        (dict(rms_eps=None), TypeError, "rms_eps: expected a float, got NoneType"),
        (dict(hc_sinkhorn_eps=-1.0), ValueError, "hc_sinkhorn_eps: expected a finite value >= 0"),
        (dict(hc_post_mult_value=float("inf")), ValueError, "hc_post_mult_value: expected a finite value"),
        (dict(fn=np.zeros((23, 1024), F32)), ValueError, "fn: expected shape (24, 1024)"),
        (dict(hc_base=np.zeros(24, np.float64)), ValueError, "hc_base: expected dtype float32"),
        (dict(post_mix=np.zeros((5, 17), F32)), ValueError, "post_mix: expected shape (T, hc_mult) with 1 <= hc_mult <= 16"),
        (dict(pre_mix_in=np.zeros((5, 3), F32)), ValueError, "pre_mix_in: expected shape (5, 4)"),
        (dict(pre_mix=np.zeros((5, 4), np.float64)), ValueError, "pre_mix: expected dtype float32"),
    ],
)  # fmt: skip
def test_errors_write_nothing(edit, exc, msg):
    T, hc, H = 5, 4, 256
    rng = np.random.default_rng(10)
    x, fn, scale, base, w = problem(rng, T, hc, H)
    post, comb = mhc_outputs(T, hc, H)
    tw, ti = topk(rng, T)
    out = outputs(T, H, 6, megamoe.MXFP8)
    y = np.full((T, H), 0xA5A5, np.uint16)
    args = {"fn": fn, "hc_base": base, "post_mix": post, **edit}
    before = {k: v.copy() for k, v in out.items()}
    with pytest.raises(exc, match=re_escape(msg)):
        megamoe.mhc_pre_and_stage(bf(x), args.pop("fn"), scale, args.pop("hc_base"), w, args.pop("post_mix"), comb, tw,
                                  ti, **out, y=bf(y), **args)  # fmt: skip
    assert np.isnan(post).all() and np.isnan(comb).all() and np.all(y == 0xA5A5)
    for k in out:
        assert_bitwise(out[k], before[k], k)


def re_escape(s: str) -> str:
    import re

    return re.escape(s)


# ---------------------------------------------------------------------------------------
# torch


@needs_torch
def test_torch_op_matches_the_direct_call_and_the_reference():
    T, hc, H = 5, 4, 384
    rng = np.random.default_rng(11)
    x, fn, scale, base, w = problem(rng, T, hc, H)
    pre_r, post_r, comb_r, z_r, y_r = mhc_reference(x, fn, scale, base, w, hc)
    tw, ti = topk(rng, T)
    residual = torch.from_numpy(x.view(np.int16)).view(torch.bfloat16).reshape(T, hc, H)
    post = torch.full((T, hc, 1), float("nan"))
    comb = torch.full((T, hc, hc), float("nan"))
    y = torch.empty((T, H), dtype=torch.bfloat16)
    o = megamoe.output_shapes(T, H, 6, megamoe.MXFP8)
    out = dict(x_fp8=torch.empty(o.x_fp8[0], dtype=torch.float8_e4m3fn), x_sf=torch.empty(o.x_sf[0], dtype=torch.int32),
               topk_idx_out=torch.empty(o.topk_idx_out[0], dtype=torch.int64),
               topk_weights_out=torch.empty(o.topk_weights_out[0]))  # fmt: skip
    megamoe.mhc_pre_and_stage(residual, torch.from_numpy(fn), torch.from_numpy(scale), torch.from_numpy(base),
                              torch.from_numpy(w), post, comb, torch.from_numpy(tw), torch.from_numpy(ti), **out,
                              y=y)  # fmt: skip
    assert_bitwise(post.reshape(T, hc).numpy(), post_r, "post_mix")
    assert_bitwise(comb.numpy(), comb_r, "comb_mix")
    assert_bitwise(y.view(torch.int16).numpy().view(np.uint16), y_r, "y")
    # through the op (2-D views), the same bytes
    post2, comb2, y2 = torch.full((T, hc), float("nan")), torch.full((T, hc * hc), float("nan")), torch.empty_like(y)
    out2 = {k: torch.empty_like(v) for k, v in out.items()}
    from megamoe._signature import MHC_AND_STAGE
    from megamoe._torch import _op_scheme_args

    vals = MHC_AND_STAGE.values(residual=residual.reshape(T, hc * H), fn=torch.from_numpy(fn),
                                hc_scale=torch.from_numpy(scale), hc_base=torch.from_numpy(base),
                                norm_weight=torch.from_numpy(w), post_mix=post2, comb_mix=comb2,
                                topk_weights=torch.from_numpy(tw), topk_ids=torch.from_numpy(ti), **out2, y=y2)  # fmt: skip
    torch.ops.megamoe.mhc_pre_and_stage(*MHC_AND_STAGE.op_values(vals, _op_scheme_args))
    assert torch.equal(post2.view(torch.int32), post.reshape(T, hc).view(torch.int32))
    assert torch.equal(comb2.view(torch.int32), comb.reshape(T, hc * hc).view(torch.int32))
    assert torch.equal(y2.view(torch.int16), y.view(torch.int16))
    for k in out:
        assert torch.equal(out2[k].view(torch.uint8), out[k].view(torch.uint8)), k


@needs_torch
def test_cuda_tensors_equal_the_cpu_or_are_refused_without_the_backend():
    """A CUDA build runs CUDA tensors (the same bytes as the CPU backend, one launch for
    MXFP8, two for NVFP4 online); a build without the CUDA backend refuses them, nothing
    written."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    T, hc, H = 7, 4, 512
    rng = np.random.default_rng(23)
    x, fn, scale, base, w = problem(rng, T, hc, H)
    tw, ti = topk(rng, T)

    def call(device, scheme):
        o = megamoe.output_shapes(T, H, 6, scheme)
        t = lambda a: torch.from_numpy(a).to(device)  # noqa: E731
        residual = torch.from_numpy(x.view(np.int16)).view(torch.bfloat16).reshape(T, hc * H).to(device)
        post = torch.full((T, hc), float("nan"), device=device)
        comb = torch.full((T, hc * hc), float("nan"), device=device)
        y = torch.zeros((T, H), dtype=torch.bfloat16, device=device)
        out = dict(x_fp8=torch.zeros(o.x_fp8[0], dtype=getattr(torch, o.x_fp8[1]), device=device),
                   x_sf=torch.zeros(o.x_sf[0], dtype=getattr(torch, o.x_sf[1]), device=device),
                   topk_idx_out=torch.zeros(o.topk_idx_out[0], dtype=torch.int64, device=device),
                   topk_weights_out=torch.zeros(o.topk_weights_out[0], device=device))  # fmt: skip
        if o.global_scale is not None:
            out["global_scale"] = torch.zeros(o.global_scale[0], device=device)
        megamoe.mhc_pre_and_stage(residual, t(fn), t(scale), t(base), t(w), post, comb, t(tw), t(ti), **out, y=y,
                                  hidden_quant=scheme)  # fmt: skip
        return [post, comb, y.view(torch.int16)] + [v.view(torch.uint8) for v in out.values()]

    for scheme in (megamoe.MXFP8, megamoe.NVFP4_ONLINE):
        if not megamoe.has_cuda_backend():
            with pytest.raises(megamoe.UnsupportedError):
                call("cuda", scheme)
            return
        want = call("cpu", scheme)
        got = call("cuda", scheme)
        torch.cuda.synchronize()
        for a, b in zip(want, got):
            assert torch.equal(a.view(torch.uint8).reshape(-1), b.cpu().view(torch.uint8).reshape(-1)), scheme


@needs_torch
def test_torch_fake_tensor_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from megamoe._signature import MHC_AND_STAGE
    from megamoe._torch import _op_scheme_args

    T, hc, H = 3, 4, 256
    with FakeTensorMode():
        vals = MHC_AND_STAGE.values(
            residual=torch.empty(T, hc * H, dtype=torch.bfloat16), fn=torch.empty(24, hc * H),
            hc_scale=torch.empty(3), hc_base=torch.empty(24), norm_weight=torch.empty(H),
            post_mix=torch.empty(T, hc), comb_mix=torch.empty(T, hc * hc), topk_weights=torch.empty(T, 6),
            topk_ids=torch.empty(T, 6, dtype=torch.int32), x_fp8=torch.empty(T, H, dtype=torch.float8_e4m3fn),
            x_sf=torch.empty(T, H // 128, dtype=torch.int32), topk_idx_out=torch.empty(T, 6, dtype=torch.int64),
            topk_weights_out=torch.empty(T, 6))  # fmt: skip
        torch.ops.megamoe.mhc_pre_and_stage(*MHC_AND_STAGE.op_values(vals, _op_scheme_args))


def torch_mhc_args(T=5, hc=4, H=256, scheme=None, seed=0, full=False, three_d=False):
    """Keyword arguments of megamoe.mhc_pre_and_stage as torch tensors, outputs poisoned."""
    scheme = scheme or megamoe.MXFP8
    g = np.random.default_rng(seed)
    x, fn, scale, base, w = problem(g, T, hc, H)
    rows = T + 3 if full else T
    sh = megamoe.output_shapes(rows, H, 6, scheme)
    tw, ti = topk(g, T)
    residual = torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16)
    a = dict(
        residual=residual.reshape(T, hc, H) if three_d else residual,
        fn=torch.from_numpy(fn), hc_scale=torch.from_numpy(scale), hc_base=torch.from_numpy(base),
        norm_weight=torch.from_numpy(w),
        post_mix=torch.full((T, hc, 1) if three_d else (T, hc), -7.0),
        comb_mix=torch.full((T, hc, hc) if three_d else (T, hc * hc), -7.0),
        topk_weights=torch.from_numpy(tw), topk_ids=torch.from_numpy(ti),
        x_fp8=torch.full(sh.x_fp8.shape, 0x5A, dtype=torch.uint8),
        x_sf=torch.full(sh.x_sf.shape, -7, dtype=getattr(torch, sh.x_sf.dtype)),
        topk_idx_out=torch.full((rows, 6), -7, dtype=torch.int64), topk_weights_out=torch.full((rows, 6), -7.0),
        hidden_quant=scheme, full_buffer=full, sinkhorn_repeat=9,
        pre_mix=torch.full((T, hc), -7.0), layer_input=torch.full((T, H), 7.0, dtype=torch.bfloat16),
        y=torch.full((T, H), 7.0, dtype=torch.bfloat16), nonfinite_count=torch.zeros(1, dtype=torch.int64),
    )  # fmt: skip
    if sh.x_scales is not None:
        a["x_scales"] = torch.full(sh.x_scales.shape, -7.0)
    return a


def _tbits(t):
    t = t.detach().contiguous()
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]).numpy()


def _mutated():
    from megamoe._signature import MHC_AND_STAGE

    return [p.name for p in MHC_AND_STAGE.params if p.mutable]


def _op_values(a):
    from megamoe._signature import MHC_AND_STAGE
    from megamoe._torch import _op_scheme_args

    return MHC_AND_STAGE.op_values(MHC_AND_STAGE.values(**a), _op_scheme_args)


@pytest.mark.skipif(torch is None or not hasattr(torch.library, "opcheck"), reason="needs torch.library.opcheck")
@pytest.mark.parametrize("option", ["plain", "full_buffer", "nvfp4_per_token"])
def test_opcheck(option):
    scheme = megamoe.NVFP4_PER_TOKEN if option == "nvfp4_per_token" else megamoe.MXFP8
    a = torch_mhc_args(scheme=scheme, full=option == "full_buffer")
    torch.library.opcheck(torch.ops.megamoe.mhc_pre_and_stage.default, _op_values(a))


@needs_torch
def test_op_schema_declares_every_output():
    schema = torch.ops.megamoe.mhc_pre_and_stage.default._schema
    mutated = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert mutated == set(_mutated()) == {
        "post_mix", "comb_mix", "x_fp8", "x_sf", "topk_idx_out", "topk_weights_out", "shared_x_sf", "pre_mix",
        "layer_input", "y", "global_scale", "x_scales", "nonfinite_count"}  # fmt: skip
    assert not schema.returns


@needs_torch
@pytest.mark.parametrize("three_d", [False, True], ids=["2d", "3d"])
def test_torch_compile_fullgraph(three_d):
    """Compiled (vLLM's 3-D shapes too: the views are taken inside the graph) == eager."""
    a = torch_mhc_args(seed=4, three_d=three_d)
    b = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in a.items()}
    names = ["residual", "fn", "hc_scale", "hc_base", "norm_weight", "post_mix", "comb_mix", "topk_weights",
             "topk_ids", "x_fp8", "x_sf", "topk_idx_out", "topk_weights_out", "y"]  # fmt: skip

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(res, fn, sc, ba, w, post, comb, tw, ti, q, sf, idx, wo, y):
        megamoe.mhc_pre_and_stage(res, fn, sc, ba, w, post, comb, tw, ti, q, sf, idx, wo, sinkhorn_repeat=9, y=y)
        return wo.sum()

    f(*[a[n] for n in names])
    megamoe.mhc_pre_and_stage(**{n: b[n] for n in names}, sinkhorn_repeat=9)
    for k in ("post_mix", "comb_mix", "x_fp8", "x_sf", "topk_idx_out", "topk_weights_out", "y"):
        assert_bitwise(_tbits(a[k]), _tbits(b[k]), f"{k} compiled vs eager")


@needs_torch
def test_torch_zero_tokens_and_errors():
    a = torch_mhc_args(T=0)
    megamoe.mhc_pre_and_stage(**dict(a, fn=None))  # T = 0: nothing read
    a = torch_mhc_args()
    msg = "megamoe: residual: expected dtype bfloat16, got dtype float32"
    with pytest.raises(ValueError, match=re_escape(msg)):
        megamoe.mhc_pre_and_stage(**dict(a, residual=a["residual"].float()))
    with pytest.raises(ValueError, match=re_escape(msg)):
        torch.ops.megamoe.mhc_pre_and_stage(*_op_values(dict(a, residual=a["residual"].float())))
    assert torch.all(a["post_mix"] == -7.0) and torch.all(a["x_fp8"] == 0x5A)
