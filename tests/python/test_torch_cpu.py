"""PyTorch integration on CPU tensors: custom op, opcheck, FakeTensor, torch.compile.

Skipped when torch is not installed (CI installs only numpy and pytest).
"""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import megamoe  # noqa: E402
import megamoe_npref as ref  # noqa: E402
from megamoe import _torch as mt  # noqa: E402
from megamoe._signature import PREPARE  # noqa: E402
from megamoe_testutil import SCHEMES, SEED_BM, SEED_SCHEME, assert_bitwise, is_e5m2, key  # noqa: E402

OP = torch.ops.megamoe.prepare_inputs.default
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def make(T, H, K, scheme, dtype=torch.bfloat16, x_dtype=None, seed=0):
    """Inputs and poisoned outputs; x_fp8 is the scheme's fp8 dtype unless ``x_dtype`` says."""
    if x_dtype is None:
        x_dtype = torch.float8_e5m2 if is_e5m2(scheme) else torch.float8_e4m3fn
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
    if t.dtype in FP8:
        t = t.view(torch.uint8)
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.numpy()


def check(outs, h, w, ids, scheme, pad=None):
    want = ref.stage(np_of(h), np_of(w), np_of(ids), scheme.group_k, scheme.ue8m0,
                     None if pad is None else np_of(pad), e5m2=is_e5m2(scheme))  # fmt: skip
    for got, exp, name in zip(outs, want, ("x_fp8", "x_sf", "topk_idx_out", "topk_weights_out")):
        assert_bitwise(np_of(got), exp, name)


def op_args(h, w, ids, outs, pad=None, shared=None, bm=None, scheme=megamoe.MXFP8, pdl=False, **more):
    """The op's arguments, through the one table (megamoe._signature.PREPARE)."""
    given = dict(hidden_states=h, topk_weights=w, topk_ids=ids, x_fp8=outs[0], x_sf=outs[1], topk_idx_out=outs[2],
                 topk_weights_out=outs[3], is_padding=pad, shared_x_sf=shared, shared_block_m=bm,
                 hidden_quant=scheme, enable_pdl=pdl, **more)  # fmt: skip
    values = [given.get(p.name, p.default) for p in PREPARE.params]
    return tuple(PREPARE.op_values(values, mt._op_scheme_args))


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
    e5 = key(elem=torch.float8_e5m2, sdtype=torch.float8_e8m0fnu, G=32)
    assert megamoe.as_scheme(e5) == megamoe.MXFP8_E5M2
    bad = key(elem=torch.float8_e5m2, sdtype=torch.float32, G=128)  # e5m2 is MXFP8 e5m2 only
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
        megamoe.MXFP8_E5M2,
        key(elem=torch.float8_e5m2, sdtype=torch.float8_e8m0fnu, G=32),
    ],
    ids=["MXFP8", "FP8_FP32_G128", "key_ue8m0", "key_fp32", "MXFP8_E5M2", "key_e5m2"],
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
    except Exception as e:
        # Skipped only when Inductor could not compile its CPU code (no working C++
        # compiler); InductorError wraps every failure, a real one included, so the cause
        # chain decides.
        chain, c = [], e
        while c is not None and len(chain) < 16:
            chain.append(c)
            c = c.__cause__ or c.__context__
        if shutil.which("g++") is None and shutil.which("c++") is None or any(
            "CppCompileError" in type(x).__name__ or "CppCompileError" in str(x) for x in chain
        ):
            pytest.skip(f"Inductor CPU backend unavailable: {e}")
        raise
    check(outs, h + 1, w, ids, s)
    assert torch.equal(r, outs[3] * 2)


@pytest.mark.parametrize("name", SCHEMES)
def test_stage_and_dequantize(name):
    s = SCHEMES[name]
    h, w, ids, _ = make(17, 1024, 6, s)
    out = megamoe.stage(h, w, ids, hidden_quant=s, shared_block_m=64 if s.ue8m0 else None)
    assert out.x_fp8.dtype == (torch.float8_e5m2 if is_e5m2(s) else torch.float8_e4m3fn)
    assert out.x_fp8.device == h.device
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


# ---------------------------------------------------------------------------------------
# Every format, the new arguments, the routing op, the SGLang drop-ins (torch, CPU)

from megamoe._signature import ROUTING  # noqa: E402
from megamoe_testutil import ALL_SCHEMES, bits  # noqa: E402

FMT = {name: ref.FORMATS[s.name] for name, s in ALL_SCHEMES.items()}
ROUTING_OP = torch.ops.megamoe.stage_routing.default
TORCH_DTYPES = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2, "uint8": torch.uint8,
                "int32": torch.int32, "int64": torch.int64, "float32": torch.float32}  # fmt: skip


def make_any(T, H, K, scheme, rows=None, dtype=torch.bfloat16, seed=0, x_dtype=None):
    """Inputs and poisoned outputs (dict by argument name) of any format; rows: full buffer."""
    g = np.random.default_rng(seed)
    h = torch.from_numpy(ref.hidden_sample(g, T, H)).to(dtype)
    w = torch.from_numpy(g.random((T, K)).astype(np.float32))
    ids = torch.from_numpy(g.integers(0, 256, (T, K)).astype(np.int32))
    o = megamoe.output_shapes(T if rows is None else rows, H, K, scheme)
    out = {}
    for name in ("x_fp8", "x_sf", "topk_idx_out", "topk_weights_out", "x_scales"):
        spec = getattr(o, name)
        if spec is not None:
            t = torch.empty(spec.shape, dtype=TORCH_DTYPES[spec.dtype])
            t.view(torch.uint8).fill_(0xA5)
            out[name] = t
    if x_dtype is not None:
        out["x_fp8"] = out["x_fp8"].view(x_dtype)
    gs = torch.tensor([0.37]) if o.global_scale is not None else None
    return h, w, ids, out, gs


def want_any(name, h, w, ids, gs=None, pad=None, alpha=None, rows=None):
    return ref.stage_any(FMT[name], np_of(h), np_of(w), np_of(ids), None if pad is None else np_of(pad),
                         global_scale=None if gs is None else float(gs[0]), alpha=alpha, rows=rows)  # fmt: skip


def check_any(out, want, T):
    assert_bitwise(np_of(out["x_fp8"].view(torch.uint8))[:T], want.x_q, "x_fp8")
    assert_bitwise(np_of(out["x_sf"])[:T], want.x_sf, "x_sf")
    assert_bitwise(np_of(out["topk_idx_out"]), want.topk_idx, "topk_idx_out")
    assert_bitwise(np_of(out["topk_weights_out"]), want.topk_weights, "topk_weights_out")
    if want.x_scales is not None:
        assert_bitwise(np_of(out["x_scales"])[:T], want.x_scales, "x_scales")


@pytest.mark.parametrize("name", ALL_SCHEMES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_every_format_torch_bitwise(name, dtype):
    s = ALL_SCHEMES[name]
    h, w, ids, out, gs = make_any(19, 1024, 6, s, dtype=dtype)
    pad = torch.arange(19) % 4 == 1
    megamoe.prepare_megamoe_inputs(h, w, ids, **out, is_padding=pad, hidden_quant=s, global_scale=gs)
    check_any(out, want_any(name, h, w, ids, gs, pad), 19)


@pytest.mark.parametrize("x_dtype", [torch.uint8, torch.int8, getattr(torch, "float4_e2m1fn_x2", torch.uint8)])
def test_mxfp4_drop_in_torch_dtypes(x_dtype):
    """vLLM's MXFP4 path with torch buffers: uint8 / int8 (and float4_e2m1fn_x2, which travels
    as its bytes) x_fp8 of width H/2 under the default scheme."""
    h, w, ids, out, _ = make_any(9, 512, 4, megamoe.MXFP4, x_dtype=x_dtype)
    megamoe.prepare_megamoe_inputs(h, w, ids, out["x_fp8"], out["x_sf"], out["topk_idx_out"], out["topk_weights_out"])
    check_any(out, want_any("MXFP4", h, w, ids), 9)
    OP(*op_args(h, w, ids, [out[n] for n in ("x_fp8", "x_sf", "topk_idx_out", "topk_weights_out")]))
    check_any(out, want_any("MXFP4", h, w, ids), 9)
    st = megamoe.stage(h, w, ids, scheme=megamoe.MXFP4)
    deq = megamoe.dequantize(out["x_fp8"], out["x_sf"])  # the default scheme reads MXFP4-shaped arrays as MXFP4
    assert_bitwise(np_of(deq), np_of(megamoe.dequantize(st.x_fp8, st.x_sf, megamoe.MXFP4)), "dequantize")


@pytest.mark.skipif(not hasattr(torch, "float4_e2m1fn_x2"), reason="no float4_e2m1fn_x2 in this torch")
def test_packed_fp4_dtype_only_for_x_fp8():
    """A float4_e2m1fn_x2 tensor travels as its bytes only as x_fp8; as any other argument (a
    mask here) it is an error, and nothing is written."""
    h, w, ids, out, _ = make_any(4, 256, 2, megamoe.MXFP4, x_dtype=torch.uint8)
    pad = torch.zeros(4, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    before = {k: v.clone() for k, v in out.items()}
    with pytest.raises(ValueError, match=re.escape("is_padding: got dtype torch.float4_e2m1fn_x2, which only x_fp8")):
        megamoe.prepare_megamoe_inputs(h, w, ids, **out, is_padding=pad, hidden_quant=megamoe.MXFP4)
    for k, v in out.items():
        assert torch.equal(v.view(torch.uint8), before[k].view(torch.uint8)), k


OPTIONS = {
    "plain": {},
    "full_buffer": dict(full_buffer=True),
    "scaled": dict(routed_scaling_factor=2.5),
    "counter": dict(nonfinite_count=True),
    "all": dict(full_buffer=True, routed_scaling_factor=0.5, nonfinite_count=True),
}


def staged_call(name, option, T=9, H=512, K=4):
    s = ALL_SCHEMES[name]
    opts = dict(OPTIONS[option])
    rows = T + 5 if opts.get("full_buffer") else None
    h, w, ids, out, gs = make_any(T, H, K, s, rows=rows, x_dtype=torch.uint8)
    if opts.pop("nonfinite_count", False):
        h[0, :3] = float("nan")
        opts["nonfinite_count"] = torch.tensor([2], dtype=torch.int64)
    kw = dict(out, hidden_quant=s, global_scale=gs, **opts)
    return (h, w, ids), kw, rows


def op_call_args(inputs, kw):
    given = dict(zip(("hidden_states", "topk_weights", "topk_ids"), inputs), **kw)
    values = [given.get(p.name, p.default) for p in PREPARE.params]
    return tuple(PREPARE.op_values(values, mt._op_scheme_args))


@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize("name", ALL_SCHEMES)
def test_op_every_format_and_option_matches_eager(name, option):
    inputs, kw, rows = staged_call(name, option)
    OP(*op_call_args(inputs, kw))
    want = want_any(name, *inputs, kw["global_scale"], alpha=kw.get("routed_scaling_factor"), rows=rows)
    check_any(kw, want, inputs[0].shape[0])
    if kw.get("nonfinite_count") is not None:
        assert int(kw["nonfinite_count"][0]) == 2 + 3


@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize("name", ["MXFP8", "FP8_FP32_G128", "MXFP8_E5M2", "MXFP4", "NVFP4_STATIC", "NVFP4_PER_TOKEN"])
def test_opcheck_every_format_and_option(name, option):
    inputs, kw, _ = staged_call(name, option)
    torch.library.opcheck(OP, op_call_args(inputs, kw))


@pytest.mark.parametrize("name,x_dtype", [("MXFP8", torch.float8_e4m3fn), ("MXFP8_E5M2", torch.float8_e5m2)])
def test_opcheck_float8_x_fp8_all_but_the_schema_test(name, x_dtype):
    """With a torch.float8_e4m3fn (or, for MXFP8_E5M2, float8_e5m2) x_fp8 every opcheck test
    passes but test_schema, whose SchemaCheckMode compares the tensors around the call with
    torch ops torch lacks for float8 ("not implemented for 'Float8_e4m3fn'"): checked here,
    so a torch that gains them makes this test say so."""
    inputs, kw, _ = staged_call(name, "all")
    kw["x_fp8"] = kw["x_fp8"].view(x_dtype)
    args = op_call_args(inputs, kw)
    torch.library.opcheck(OP, args, test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))
    try:
        torch.library.opcheck(OP, args, test_utils=("test_schema",))
    except Exception as e:  # the documented limitation
        assert "Float8" in repr(e) or "float8" in repr(e), repr(e)
    else:  # pragma: no cover - a torch that compares float8 tensors
        pass


def test_opcheck_with_inputs_that_require_grad():
    """opcheck's test_autograd_registration runs only when an input requires grad: the ops
    have no Autograd kernel of their own (the dispatcher's fallback passes them through)."""
    h, w, ids, outs = make(9, 256, 4, megamoe.MXFP8, dtype=torch.float32, x_dtype=torch.uint8)
    h.requires_grad_(True)
    w.requires_grad_(True)
    torch.library.opcheck(OP, op_args(h, w, ids, outs))
    OP(*op_args(h, w, ids, outs))
    check(outs, h.detach(), w.detach(), ids, megamoe.MXFP8)


def test_op_scheme_cache():
    """The kernels' scheme from the op's plain values: equal to scheme_from_plain, built once
    per distinct scheme, a zero floor always afresh (+0.0 and -0.0 are one dict key)."""
    from megamoe._scheme import scheme_from_plain

    for s in ALL_SCHEMES.values():
        f = mt._scheme_ints(s)
        assert mt._op_scheme(f) == scheme_from_plain(f) == s
        assert mt._op_scheme(f) is mt._op_scheme(tuple(f))
    f = mt._scheme_ints(megamoe.MXFP8.with_amax_floor(0.0))
    neg = f[:8] + (-0.0,)
    assert str(mt._op_scheme(neg).amax_floor) == "-0.0" and str(mt._op_scheme(f).amax_floor) == "0.0"


def test_ops_registration():
    """The eight ops come from megamoe's DEF library (Library.define / impl on the CPU and CUDA
    keys / register_fake; no Python Autograd or ADInplaceOrView kernel, which is what made
    torch.library.custom_op dearer per call); the public objects are their packets."""
    for name, obj in (("prepare_inputs", mt.prepare_inputs_op), ("stage_routing", mt.stage_routing_op),
                      ("route", mt.route_op), ("route_and_stage", mt.route_and_stage_op),
                      ("rmsnorm_and_stage", mt.rmsnorm_and_stage_op),
                      ("gate_route_and_stage", mt.gate_route_and_stage_op),
                      ("gate_and_route", mt.gate_and_route_op),
                      ("mhc_pre_and_stage", mt.mhc_pre_and_stage_op)):  # fmt: skip
        assert obj is getattr(torch.ops.megamoe, name)
        qualname = f"megamoe::{name}"
        for key in ("CPU", "CUDA", "Meta"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(qualname, key), (qualname, key)
        for key in ("Autograd", "ADInplaceOrView", "CompositeImplicitAutograd"):
            assert not torch._C._dispatch_has_kernel_for_dispatch_key(qualname, key), (qualname, key)
        assert torch.Tag.pt2_compliant_tag in obj.default.tags
    assert mt._LIB.ns == "megamoe"


def test_routing_op_and_opcheck():
    T, K = 11, 6
    g = np.random.default_rng(3)
    w = torch.from_numpy(g.random((T, K)).astype(np.float32)).to(torch.bfloat16)
    ids = torch.from_numpy(g.integers(0, 384, (T, K)).astype(np.int64))
    pad = torch.arange(T) % 3 == 0
    idx, wo = torch.full((T + 4, K), 9, dtype=torch.int64), torch.full((T + 4, K), 9.0)
    megamoe.stage_megamoe_routing(w, ids, idx, wo, pad, full_buffer=True, routed_scaling_factor=2.0)
    wi, ww = ref.topk(np_of(w), np_of(ids), np_of(pad), 2.0, rows=T + 4)
    assert_bitwise(np_of(idx), wi, "idx")
    assert_bitwise(np_of(wo), ww, "w")
    values = [w, ids, idx, wo, pad, True, 2.0, None, None, False]  # expert_scales None, stream None
    assert len(values) == len(ROUTING.names)
    op_args_r = tuple(ROUTING.op_values(values, None))
    idx.fill_(7)
    ROUTING_OP(*op_args_r)
    assert_bitwise(np_of(idx), wi, "idx through the op")
    torch.library.opcheck(ROUTING_OP, op_args_r)
    torch.library.opcheck(ROUTING_OP, (w[:0], ids[:0], idx, wo, None, True, None, None, False))  # T = 0, full buffer
    megamoe.stage_megamoe_routing(w[:0], ids[:0], "junk", None)  # T = 0: nothing else read


def test_zero_tokens_full_buffer_torch():
    h = torch.empty(0, 256)
    w, ids = torch.empty(0, 4), torch.empty(0, 4, dtype=torch.int32)
    idx, wo = torch.full((6, 4), 5, dtype=torch.int64), torch.full((6, 4), 5.0)
    x, sf = torch.zeros(6, 256, dtype=torch.float8_e4m3fn), torch.zeros(6, 2, dtype=torch.int32)
    megamoe.prepare_megamoe_inputs(h, w, ids, x, sf, idx, wo, full_buffer=True)
    assert torch.all(idx == -1) and torch.all(wo.view(torch.int32) == 0)
    idx.fill_(5)
    OP(*op_args(h, w, ids, [x, sf, idx, wo], full_buffer=True))
    assert torch.all(idx == -1)


@pytest.mark.parametrize("name", ["MXFP8", "MXFP8_E5M2", "NVFP4_PER_TOKEN", "NVFP4_STATIC", "MXFP4_RNE"])
def test_torch_compile_fullgraph_new_arguments(name):
    s = ALL_SCHEMES[name]
    T, H, K = 13, 512, 4
    h, w, ids, out, gs = make_any(T, H, K, s, rows=T + 3)
    count = torch.zeros(1, dtype=torch.int64)

    def f(h, w, ids, out, gs, count):
        megamoe.prepare_megamoe_inputs(h, w, ids, **out, hidden_quant=s, global_scale=gs, full_buffer=True,
                                       routed_scaling_factor=1.5, nonfinite_count=count)  # fmt: skip
        megamoe.stage_megamoe_routing(w, ids, out["topk_idx_out"], out["topk_weights_out"], full_buffer=True,
                                      routed_scaling_factor=1.5)  # fmt: skip
        return out["topk_weights_out"].sum()

    torch._dynamo.reset()
    cf = torch.compile(f, fullgraph=True, backend="aot_eager")
    cf(h, w, ids, out, gs, count)
    check_any(out, want_any(name, h, w, ids, gs, alpha=1.5, rows=T + 3), T)
    h2 = h * 3
    h2[0, 0] = float("inf")
    cf(h2, w, ids, out, gs, count)
    check_any(out, want_any(name, h2, w, ids, gs, alpha=1.5, rows=T + 3), T)
    assert int(count[0]) == 1


def test_fake_tensor_mode_new_arguments():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        inputs, kw, _ = staged_call("NVFP4_STATIC", "all")
        megamoe.prepare_megamoe_inputs(*inputs, **kw)
        OP(*op_call_args(inputs, kw))
        idx, wo = kw["topk_idx_out"], kw["topk_weights_out"]
        megamoe.stage_megamoe_routing(inputs[1], inputs[2], idx, wo, full_buffer=True)


@pytest.mark.parametrize("name", ALL_SCHEMES)
def test_stage_and_dequantize_every_format_torch(name):
    s = ALL_SCHEMES[name]
    h, w, ids, _, gs = make_any(17, 1024, 6, s)
    out = megamoe.stage(h, w, ids, scheme=s, global_scale=gs, max_tokens=20)
    o = megamoe.output_shapes(20, 1024, 6, s)
    assert out.x_fp8.dtype == TORCH_DTYPES[o.x_fp8.dtype] and tuple(out.x_fp8.shape) == o.x_fp8.shape
    assert (out.x_scales is None) == (o.x_scales is None)
    want = want_any(name, h, w, ids, gs, rows=20)
    assert_bitwise(np_of(out.x_fp8.view(torch.uint8))[:17], want.x_q, "x_fp8")
    assert_bitwise(np_of(out.topk_idx), want.topk_idx, "topk_idx")
    xq, sf = out.x_fp8[:17], out.x_sf[:17]
    xs = None if out.x_scales is None else out.x_scales[:17]
    deq = megamoe.dequantize(xq, sf, s, x_scales=xs, global_scale=gs)
    deq_np = megamoe.dequantize(np_of(xq.view(torch.uint8)), np_of(sf), s, x_scales=None if xs is None else np_of(xs),
                                global_scale=None if gs is None else np_of(gs))  # fmt: skip
    assert isinstance(deq, torch.Tensor) and deq.dtype == torch.float32
    assert_bitwise(np_of(deq), deq_np, "dequantize torch vs numpy")
    assert_bitwise(deq_np, ref.dequantized(want, s.group_k), "dequantize vs the reference")
    with pytest.raises(TypeError, match=re.escape("megamoe.dequantize: x_sf: expected a torch.Tensor, got ndarray")):
        megamoe.dequantize(xq, np_of(sf), s, x_scales=xs, global_scale=gs)


def test_sglang_drop_ins_torch():
    g = np.random.default_rng(5)
    n, P, H, K = 6, 10, 512, 8
    x = torch.from_numpy(ref.hidden_sample(g, n, H)).to(torch.bfloat16)
    ids = torch.from_numpy(g.integers(0, 256, (n, K)).astype(np.int32))
    w = torch.from_numpy(g.random((n, K)).astype(np.float32))
    buf_x = torch.zeros(P, H // 2, dtype=torch.int8)
    buf_sf = torch.zeros(P, H // 64, dtype=torch.int32)
    bi, bw = torch.full((P, K), 3, dtype=torch.int64), torch.full((P, K), 3.0)
    xs = torch.zeros(P)
    megamoe.mega_moe_pre_dispatch(x, ids, w, buf_x, buf_sf, bi, bw, num_tokens=n, group_size=16,
                                  mma_type="nvfp4xnvfp4", buf_x_scales=xs)  # fmt: skip
    want = ref.stage_any(ref.FORMATS["nvfp4_per_token"], np_of(x), np_of(w), np_of(ids), rows=P)
    assert_bitwise(np_of(buf_x.view(torch.uint8))[:n], want.x_q, "buf_x")
    assert_bitwise(np_of(xs)[:n], want.x_scales, "buf_x_scales")
    assert_bitwise(np_of(bi), want.topk_idx, "buf_topk_idx")
    buf_x8 = torch.zeros(P, H, dtype=torch.float8_e4m3fn)
    buf_sf32 = torch.zeros(P, H // 128)

    def sm90(x, ids, w, a, b, c, d):
        megamoe.mega_moe_pre_dispatch_sm90(x, ids, w, a, b, c, d, n, 128, 2.0)
        return d.sum()

    torch._dynamo.reset()
    torch.compile(sm90, fullgraph=True, backend="aot_eager")(x, ids, w, buf_x8, buf_sf32, bi, bw)
    want = ref.stage_any(ref.Format("f", False, "fp32", 128, "none"), np_of(x), np_of(w), np_of(ids), floor=1e-10,
                         alpha=2.0, rows=P)  # fmt: skip
    assert_bitwise(np_of(buf_x8)[:n], want.x_q, "sm90 buf_x")
    assert_bitwise(np_of(buf_sf32)[:n], want.x_sf, "sm90 buf_x_sf")
    assert_bitwise(np_of(bw), want.topk_weights, "sm90 buf_topk_weights")


def test_assume_constant_result_is_the_attribute_megamoe_sets():
    """megamoe marks _scheme_ints the way torch.compiler.assume_constant_result does, without
    importing torch._dynamo; if torch changes what the decorator does, this says so."""
    import torch._dynamo  # noqa: F401  (this test process may load it)

    def f():
        return 0

    before = set(vars(f))
    torch.compiler.assume_constant_result(f)
    assert {k: v for k, v in vars(f).items() if k not in before} == {"_dynamo_marked_constant": True}
    assert mt._scheme_ints._dynamo_marked_constant is True


def test_nonfinite_counter_torch():
    h, w, ids, out, _ = make_any(8, 256, 2, megamoe.MXFP8)
    h[2, 5] = float("inf")
    h[3, :4] = float("nan")
    c = torch.tensor([1], dtype=torch.int64)
    megamoe.prepare_megamoe_inputs(h, w, ids, **out, nonfinite_count=c)
    assert int(c[0]) == 6
    with pytest.raises(ValueError, match=re.escape("megamoe: nonfinite_count: expected dtype int64, got dtype int32")):
        megamoe.prepare_megamoe_inputs(h, w, ids, **out, nonfinite_count=c.int())
