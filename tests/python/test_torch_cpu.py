"""PyTorch integration on CPU tensors: custom op, opcheck, FakeTensor, torch.compile.

Skipped when torch is not installed (CI installs only numpy and pytest).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import megamoe  # noqa: E402
import megamoe_npref as ref  # noqa: E402
from megamoe import _torch as mt  # noqa: E402
from megamoe_testutil import SCHEMES, SEED_BM, SEED_SCHEME, assert_bitwise, key  # noqa: E402

OP = torch.ops.megamoe.prepare_inputs.default


def make(T, H, K, scheme, dtype=torch.bfloat16, x_dtype=torch.float8_e4m3fn, seed=0):
    g = np.random.default_rng(seed)
    h = torch.from_numpy(ref.hidden_sample(g, T, H)).to(dtype)
    w = torch.from_numpy(g.random((T, K)).astype(np.float32))
    ids = torch.from_numpy(g.integers(0, 256, (T, K)).astype(np.int32))
    sf_cols = H // (4 * scheme.group_k) if scheme.ue8m0 else H // scheme.group_k
    outs = [
        torch.full((T, H), 0xA5, dtype=torch.uint8).view(x_dtype),
        torch.full((T, sf_cols), -7, dtype=torch.int32 if scheme.ue8m0 else torch.float32),
        torch.full((T, K), -7, dtype=torch.int64),
        torch.full((T, K), -7.0, dtype=torch.float32),
    ]
    return h, w, ids, outs


def np_of(t):
    t = t.detach().cpu()
    if t.dtype in (torch.float8_e4m3fn,):
        t = t.view(torch.uint8)
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.numpy()


def check(outs, h, w, ids, scheme, pad=None):
    want = ref.stage(np_of(h), np_of(w), np_of(ids), scheme.group_k, scheme.ue8m0,
                     None if pad is None else np_of(pad))  # fmt: skip
    for got, exp, name in zip(outs, want, ("x_fp8", "x_sf", "topk_idx_out", "topk_weights_out")):
        assert_bitwise(np_of(got), exp, name)


def op_args(h, w, ids, outs, pad=None, shared=None, bm=None, scheme=megamoe.MXFP8, pdl=False):
    return (h, w, ids, *outs, pad, shared, bm, *mt._op_scheme_args(scheme), pdl)


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_public_function_bitwise(name, dtype):
    s = SCHEMES[name]
    h, w, ids, outs = make(35, 1024, 8, s, dtype)
    pad = torch.arange(35) % 4 == 1
    megamoe.prepare_megamoe_inputs(h, w, ids, *outs, is_padding=pad, hidden_quant=s)
    check(outs, h, w, ids, s, pad)


@pytest.mark.parametrize("name", SCHEMES)
def test_custom_op_bitwise(name):
    s = SCHEMES[name]
    h, w, ids, outs = make(20, 512, 4, s)
    OP(*op_args(h, w, ids, outs, scheme=s))
    check(outs, h, w, ids, s)


def test_uint8_x_fp8_and_noncontiguous():
    s = megamoe.FP8_FP32_G128
    h, w, ids, outs = make(19, 512, 4, s, x_dtype=torch.uint8)
    h_t = h.t().contiguous().t()
    x_sf = torch.full((4, 20), 3.0).t()[:19]  # MN-major view
    outs[1] = x_sf
    megamoe.prepare_megamoe_inputs(h_t, w.t().contiguous().t(), ids, *outs, hidden_quant=s)
    check(outs, h, w, ids, s)


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("padded", [False, True])
def test_opcheck(name, padded):
    s = SCHEMES[name]
    # uint8 x_fp8: opcheck's schema test compares tensors with allclose, which torch does
    # not implement for float8 on the CPU (see test_opcheck_fp8 for the rest).
    h, w, ids, outs = make(9, 512, 4, s, x_dtype=torch.uint8)
    pad = torch.tensor([0, 1, 0, 0, 1, 0, 0, 0, 1], dtype=torch.bool) if padded else None
    shared, bm = None, None
    if s.ue8m0 and padded:
        bm = 3
        shared = torch.zeros((ref.shared_rows_required(9, bm), outs[1].shape[1]), dtype=torch.int32)
    torch.library.opcheck(OP, op_args(h, w, ids, outs, pad, shared, bm, s))


def test_opcheck_fp8():
    h, w, ids, outs = make(9, 256, 4, megamoe.MXFP8)
    torch.library.opcheck(
        OP, op_args(h, w, ids, outs),
        test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"),
    )  # fmt: skip


def test_fake_tensor_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        h, w, ids, outs = make(9, 256, 4, megamoe.MXFP8)
        megamoe.prepare_megamoe_inputs(h, w, ids, *outs)  # goes through the fake kernel
        OP(*op_args(h, w, ids, outs))


def test_op_errors_are_value_errors():
    h, w, ids, outs = make(9, 256, 4, megamoe.MXFP8)
    with pytest.raises(ValueError, match=re.escape(SEED_BM)):
        megamoe.prepare_megamoe_inputs(h, w, ids, *outs, shared_x_sf=torch.zeros((128, 2), dtype=torch.int32),
                                       shared_block_m=0)  # fmt: skip
    bad = megamoe.QuantScheme(group_k=48)
    with pytest.raises(ValueError, match=re.escape(SEED_SCHEME + repr(bad) + ".")):
        OP(*op_args(h, w, ids, outs, scheme=bad))
    with pytest.raises(ValueError, match=re.escape("megamoe: topk_idx_out: expected dtype int64, got dtype int32")):
        megamoe.prepare_megamoe_inputs(h, w, ids, outs[0], outs[1], ids.clone(), outs[3])


def test_quant_key_with_torch_dtypes():
    k = key(elem=torch.float8_e4m3fn, sdtype=torch.float8_e8m0fnu, G=128)
    assert megamoe.as_scheme(k) == megamoe.FP8_UE8M0_G128
    k32 = key(elem=torch.float8_e4m3fn, sdtype=torch.float32, G=128)
    assert megamoe.as_scheme(k32) == megamoe.FP8_FP32_G128
    bad = key(elem=torch.float8_e5m2, sdtype=torch.float32, G=128)
    h, w, ids, outs = make(4, 512, 2, megamoe.FP8_FP32_G128)
    with pytest.raises(ValueError, match=re.escape(SEED_SCHEME + repr(megamoe.as_scheme(bad)))):
        megamoe.prepare_megamoe_inputs(h, w, ids, *outs, hidden_quant=bad)
    megamoe.prepare_megamoe_inputs(h, w, ids, *outs, hidden_quant=k32)
    check(outs, h, w, ids, megamoe.FP8_FP32_G128)


@pytest.mark.parametrize(
    "hq",
    [
        megamoe.MXFP8,
        megamoe.FP8_FP32_G128,
        key(elem=torch.float8_e4m3fn, sdtype=torch.float8_e8m0fnu, G=32),
        key(elem=torch.float8_e4m3fn, sdtype=torch.float32, G=128),
    ],
    ids=["MXFP8", "FP8_FP32_G128", "key_ue8m0", "key_fp32"],
)
def test_torch_compile_fullgraph(hq):
    s = megamoe.as_scheme(hq)
    h, w, ids, outs = make(13, 512, 4, s)
    pad = torch.arange(13) % 5 == 0

    def f(h, w, ids, pad, a, b, c, d):
        megamoe.prepare_megamoe_inputs(h, w, ids, a, b, c, d, is_padding=pad, hidden_quant=hq)
        return c.sum()

    torch._dynamo.reset()
    cf = torch.compile(f, fullgraph=True, backend="aot_eager")
    cf(h, w, ids, pad, *outs)
    check(outs, h, w, ids, s, pad)
    h2 = h * 3
    cf(h2, w, ids, pad, *outs)  # same graph, new data
    check(outs, h2, w, ids, s, pad)


def test_torch_compile_inductor():
    s = megamoe.MXFP8
    h, w, ids, outs = make(8, 256, 4, s)

    @torch.compile(fullgraph=True)
    def f(h, w, ids, a, b, c, d):
        megamoe.prepare_megamoe_inputs(h + 1, w, ids, a, b, c, d)
        return d * 2

    try:
        r = f(h, w, ids, *outs)
    except Exception as e:  # no working C++ compiler for Inductor's CPU code
        if "InductorError" in type(e).__name__ or "CppCompileError" in str(e):
            pytest.skip(f"Inductor CPU backend unavailable: {e}")
        raise
    check(outs, h + 1, w, ids, s)
    assert torch.equal(r, outs[3] * 2)


@pytest.mark.parametrize("name", SCHEMES)
def test_stage_and_dequantize(name):
    s = SCHEMES[name]
    h, w, ids, _ = make(17, 1024, 6, s)
    out = megamoe.stage(h, w, ids, hidden_quant=s, shared_block_m=64 if s.ue8m0 else None)
    assert out.x_fp8.dtype == torch.float8_e4m3fn and out.x_fp8.device == h.device
    assert out.x_sf.dtype == (torch.int32 if s.ue8m0 else torch.float32)
    check(out[:4], h, w, ids, s)
    if s.ue8m0:
        assert out.shared_x_sf.shape == (128, out.x_sf.shape[1])
        rows = torch.from_numpy(ref.shared_row(np.arange(17), 64))
        assert torch.equal(out.shared_x_sf[rows], out.x_sf)
    deq = megamoe.dequantize(out.x_fp8, out.x_sf, s)
    deq_np = megamoe.dequantize(np_of(out.x_fp8), np_of(out.x_sf), s)
    assert deq.dtype == torch.float32 and isinstance(deq, torch.Tensor)
    assert_bitwise(np_of(deq), deq_np, "dequantize torch vs numpy")
    assert_bitwise(np_of(megamoe.dequantize(out.x_fp8.view(torch.uint8), out.x_sf, s)), deq_np, "uint8")


def test_explicit_stream_argument_on_cpu():
    h, w, ids, outs = make(3, 256, 2, megamoe.MXFP8)
    megamoe.prepare_megamoe_inputs(h, w, ids, *outs, stream=0, enable_pdl=True)
    check(outs, h, w, ids, megamoe.MXFP8)


def test_requires_grad_input():
    h, w, ids, outs = make(3, 256, 2, megamoe.MXFP8, dtype=torch.float32)
    h.requires_grad_(True)
    megamoe.prepare_megamoe_inputs(h, w, ids, *outs)
    check(outs, h, w, ids, megamoe.MXFP8)


def test_mixed_numpy_output():
    h, w, ids, outs = make(3, 256, 2, megamoe.MXFP8)
    idx_np = np.full((3, 2), 5, np.int64)
    megamoe.prepare_megamoe_inputs(h, w, ids, outs[0], outs[1], idx_np, outs[3])
    assert np.array_equal(idx_np, np_of(ids).astype(np.int64))
