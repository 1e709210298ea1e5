"""megamoe.gate_route_and_stage (the gate producer) from Python, on the CPU backend.

- logits_out == an independent NumPy rendering of docs/CONTRACT.md's order ("Gate, route
  and stage"), bit for bit: each fused multiply-add formed in float64 (the product of two
  float32 is exact there, the sum's rounding error recovered by two-sum, the exact sum
  rounded to float64 by round-to-odd, then once to float32: the correctly rounded fma),
  16-column chains in column order, the chunk sums folded by halves, highest first;
- the router's outputs and every staged byte == megamoe.route_and_stage run on those
  reference logits (which the router tests check against the router's own rendering);
- y defaulting to hidden_states, strided views, fp32 and bf16 weights, odd widths, hash
  layers, EPLB, NaN / Inf inputs, full-buffer mode, T = 0;
- every argument error raises the library's message and writes nothing; CUDA tensors in a
  build without the CUDA backend are refused (UnsupportedError) before anything is written;
- torch (skipped without torch): the op against the direct call and NumPy, opcheck,
  FakeTensor, torch.compile.

NumPy has no bfloat16: bf16 arrays are uint16 bit patterns handed over as DLPack capsules.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import megamoe
from megamoe._signature import GATE_AND_ROUTE, GATE_ROUTE_AND_STAGE
from megamoe_testutil import (
    assert_bitwise,
    assert_fake_writes_nothing,
    clone_args,
    dlpack_capsule,
    same_mutated,
    spec_op_values,
    tbits,
    torch_staging_outputs,
)
from test_norm import bf, bf16_of_f32, f32_of_bf16

try:
    import torch
except ImportError:  # CI: NumPy only
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

F32, F64 = np.float32, np.float64
CHUNK = 16
POISON32 = 0x5A5A5A5A


# ---------------------------------------------------------------------------------------
# The NumPy rendering of the contract (docs/CONTRACT.md, "Gate, route and stage")


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """fl(a * b + c) for float32 arrays, one rounding (see the module's docstring)."""
    with np.errstate(all="ignore"):
        p = a.astype(F64) * b.astype(F64)  # exact
        cd = c.astype(F64)
        s = p + cd
        bb = s - p
        err = (p - (s - bb)) + (cd - bb)  # p + c == s + err exactly (finite values)
        u = s.view(np.uint64).copy()
        inexact = np.isfinite(s) & (err != 0)
        toward_zero = inexact & (np.signbit(s) != np.signbit(err))
        u[toward_zero] -= np.uint64(1)  # the truncation of s + err
        u[inexact] |= np.uint64(1)  # round to odd
        return u.view(F64).astype(F32)


def gate_logits(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The logits [T, E] of float32 rows y [T, H] and w [E, H] in the contract's order; NaN
    as 0x7FC00000."""
    T, H = y.shape
    E = w.shape[0]
    n = -(-H // CHUNK)
    N = 1
    while N < n:
        N *= 2
    c = np.zeros((N, T, E), F32)
    for j in range(n):
        acc = np.zeros((T, E), F32)
        for i in range(CHUNK * j, min(CHUNK * j + CHUNK, H)):  # the chain stops at the last column
            acc = fma32(y[:, i][:, None], w[:, i][None, :], acc)
        c[j] = acc
    h = N // 2
    while h >= 1:
        with np.errstate(all="ignore"):
            c[:h] = (c[:h].astype(F64) + c[h : 2 * h].astype(F64)).astype(F32)
        h //= 2
    out = c[0].copy()
    out.view(np.uint32)[np.isnan(out)] = 0x7FC00000
    return out


def test_reference_fma_rounds_once():
    """The reference's fma on values whose answers are known."""
    a = F32(1 + 2**-12)
    # (1 + 2^-12)^2 - (1 + 2^-11) = 2^-24: the fused result keeps it, a rounded product loses it
    assert fma32(np.array([a]), np.array([a]), np.array([-(1 + 2**-11)], F32))[0] == F32(2**-24)
    # ties of the final rounding: 1 + 2^-24 is halfway, to even (1); plus a sticky bit, up
    assert fma32(np.array([F32(1)]), np.array([F32(1)]), np.array([F32(2**-24)]))[0] == F32(1)
    assert fma32(np.array([F32(1 + 2**-23)]), np.array([F32(1)]), np.array([F32(2**-24)]))[0] == F32(1 + 2**-22)
    sticky = fma32(np.array([F32(2**-24 + 2**-47)]), np.array([F32(1)]), np.array([F32(1)]))[0]
    assert sticky == F32(1 + 2**-23)
    assert np.isnan(fma32(np.array([F32(np.inf)]), np.array([F32(0)]), np.array([F32(1)]))[0])
    # the fold of halves: chunk sums [1, 2^-24, 0, 2^-24] -> fl(1 + 0) + fl(2^-24 + 2^-24) =
    # 1 + 2^-23, where a running sum or adjacent pairs give 1
    y = np.zeros((1, 64), F32)
    y[0, 0], y[0, 16], y[0, 48] = 1, 2**-24, 2**-24
    assert gate_logits(y, np.ones((1, 64), F32))[0, 0] == F32(1 + 2**-23)


# ---------------------------------------------------------------------------------------
# Arrays and calls


def case(rng, T, E, H, K, wdtype="bf16", scale=0.05):
    y = bf16_of_f32((rng.standard_normal((T, H))).astype(F32))
    w = (rng.standard_normal((E, H)) * scale).astype(F32)
    if wdtype == "bf16":
        w = bf16_of_f32(w)
    bias = (rng.standard_normal(E) * 0.3).astype(F32)
    return y, w, bias


def as_f32(a: np.ndarray) -> np.ndarray:
    return f32_of_bf16(a) if a.dtype == np.uint16 else a


def outputs(T, H, K, scheme=megamoe.MXFP8, rows=None):
    M = T if rows is None else rows
    shapes = megamoe.output_shapes(M, H, K, scheme)
    out = {}
    for name, spec in zip(("x_fp8", "x_sf", "topk_idx_out", "topk_weights_out", "x_scales"), shapes[:4] + shapes[5:6]):
        if spec is not None:
            dt = np.dtype(np.uint8 if spec.dtype.startswith("float8_") else spec.dtype)
            out[name] = np.full(spec.shape + (dt.itemsize,), 0x5A, np.uint8).view(dt).reshape(spec.shape)
    return out


def topk_out(T, K):
    return np.full((T, K), POISON32, np.int32).view(F32), np.full((T, K), -7, np.int32)


def run_both(y, w, bias, K, scheme=megamoe.MXFP8, rows=None, hidden=None, y_view=None, **kw):
    """gate_route_and_stage (hidden_states = ``hidden`` or y, y passed only as ``y_view``)
    and route_and_stage on the reference logits; returns (gate outputs, route outputs,
    logits_out, reference logits)."""
    T, H = y.shape
    want = gate_logits(f32_of_bf16(y), as_f32(w))
    hs = hidden if hidden is not None else y
    got = dict(outputs(T, hs.shape[1], K, scheme, rows))
    gw, gi = topk_out(T, K)
    logits = np.full((T, w.shape[0]), POISON32, np.int32).view(F32)
    wt = bf(w) if w.dtype == np.uint16 else w
    extra = dict(kw)
    if y_view is not None:
        extra["y"] = y_view
    megamoe.gate_route_and_stage(bf(hs) if hs.dtype == np.uint16 else hs, wt, bias, gw, gi, **got, hidden_quant=scheme,
                                 logits_out=logits, full_buffer=rows is not None, **extra)  # fmt: skip
    plain = dict(outputs(T, hs.shape[1], K, scheme, rows))
    pw, pi = topk_out(T, K)
    megamoe.route_and_stage(bf(hs) if hs.dtype == np.uint16 else hs, want, bias, pw, pi, **plain, hidden_quant=scheme,
                            full_buffer=rows is not None, **{k: v for k, v in kw.items() if k != "logits_nonfinite_count"})
    got.update(topk_weights=gw, topk_ids=gi)
    plain.update(topk_weights=pw, topk_ids=pi)
    return got, plain, logits, want


def assert_same(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for k in want:
        assert_bitwise(got[k], want[k], k)


# ---------------------------------------------------------------------------------------
# Bitwise against the reference


@pytest.mark.parametrize("wdtype", ["bf16", "fp32"])
@pytest.mark.parametrize("T,E,H,K", [(1, 64, 2048, 6), (4, 144, 512, 8), (9, 256, 256, 1), (3, 384, 128, 16),
                                     (2, 512, 256, 6)])  # fmt: skip
def test_logits_route_and_staging_bitwise(wdtype, T, E, H, K):
    rng = np.random.default_rng(T * 1000 + E + H + K)
    y, w, bias = case(rng, T, E, H, K, wdtype)
    got, plain, logits, want = run_both(y, w, bias, K, routed_scaling_factor=1.5)
    assert_bitwise(logits, want, "logits_out")
    assert_same(got, plain)
    ids = plain["topk_ids"]
    assert np.all((ids >= 0) & (ids < E)) and np.all(plain["topk_weights"] > 0)  # every token really routed


@pytest.mark.parametrize("H", [1, 15, 16, 17, 33, 100, 129, 271])
def test_odd_widths_and_a_separate_y(H):
    """Partial last chunks and tree widths; y given apart from (fp32) hidden states."""
    rng = np.random.default_rng(H)
    T, E, K = 5, 40, 4
    y, w, bias = case(rng, T, E, H, K, "fp32" if H % 2 else "bf16")
    hidden = rng.standard_normal((T, 128)).astype(F32)
    got, plain, logits, want = run_both(y, w, bias, K, hidden=hidden, y_view=bf(y))
    assert_bitwise(logits, want, "logits_out")
    assert_same(got, plain)


def test_strided_views():
    """y and the weight as strided views (column-major weight, rows of y apart)."""
    rng = np.random.default_rng(5)
    T, E, H, K = 6, 64, 256, 6
    y, w, bias = case(rng, T, E, H, K, "fp32")
    big = np.full((T, H + 7), 0x7FC0, np.uint16)  # NaN between the rows: never read
    big[:, :H] = y
    wt = np.asfortranarray(w)
    want = gate_logits(f32_of_bf16(y), w)
    logits = np.full((E, T), POISON32, np.int32).view(F32).T  # a transposed output view
    gw, gi = topk_out(T, K)
    out = outputs(T, 128, K)
    megamoe.gate_route_and_stage(rng.standard_normal((T, 128)).astype(F32), wt, bias, gw, gi, **out,
                                 y=bf(big, shape=(T, H), strides=(H + 7, 1)), logits_out=logits)  # fmt: skip
    assert_bitwise(logits, want, "logits_out (transposed)")
    pw, pi = topk_out(T, K)
    megamoe.route(want, bias, pw, pi)
    assert_bitwise(gi, pi, "topk_ids")
    assert_bitwise(gw, pw, "topk_weights")


def test_y_defaults_to_hidden_states():
    rng = np.random.default_rng(6)
    T, E, H, K = 7, 128, 256, 6
    y, w, bias = case(rng, T, E, H, K)
    got, plain, logits, want = run_both(y, w, bias, K)
    again, _, logits2, _ = run_both(y, w, bias, K, y_view=bf(y))
    assert_bitwise(logits, want, "logits_out")
    assert_bitwise(logits2, want, "logits_out (y given)")
    assert_same(got, again)


def test_hash_layers_and_eplb():
    rng = np.random.default_rng(7)
    T, E, H, K, R = 10, 64, 256, 6, 3
    y, w, _ = case(rng, T, E, H, K)
    tid2eid = rng.integers(0, E, (50, K)).astype(np.int32)
    input_ids = rng.integers(0, 50, T).astype(np.int64)
    got, plain, logits, want = run_both(y, w, None, K, tid2eid=tid2eid, input_ids=input_ids)
    assert_bitwise(logits, want, "logits_out")
    assert_same(got, plain)
    y, w, bias = case(rng, T, E, H, K)
    l2p = rng.permutation(E * R).reshape(E, R).astype(np.int32)
    counts = rng.integers(1, R + 1, E).astype(np.int32)
    load = np.zeros(E * R, np.int64)
    got, plain, _, _ = run_both(y, w, bias, K, logical_to_physical_map=l2p, logical_replica_count=counts,
                                expert_load_view=load, record_enabled=np.ones(1, np.int32))  # fmt: skip
    assert_same(got, plain)
    assert load.sum() == 2 * T * K  # the gate call and route_and_stage both recorded into it
    assert np.all(load % 2 == 0)  # each physical expert as often by both


def test_nan_inf_inputs_counted_and_padding():
    rng = np.random.default_rng(8)
    T, E, H, K = 6, 64, 100, 6
    y, w, bias = case(rng, T, E, H, K, "fp32")
    y[0, 5] = 0x7FC0  # NaN: row 0 all NaN
    w[3, 17] = np.inf  # expert 3: +-Inf (NaN where y is 0)
    w[7, 2], w[7, 3] = -np.inf, np.inf  # expert 7: Inf - Inf
    pad = np.array([0, 0, 1, 0, 1, 0], bool)
    counter = np.zeros(1, np.int64)
    hidden = rng.standard_normal((T, 128)).astype(F32)
    got, plain, logits, want = run_both(y, w, bias, K, hidden=hidden, y_view=bf(y), is_padding=pad,
                                        logits_nonfinite_count=counter)  # fmt: skip
    assert_bitwise(logits, want, "logits_out")
    assert_same(got, plain)
    assert counter[0] == np.count_nonzero(~np.isfinite(want)) >= E + 2 * (T - 1)
    assert np.all(got["topk_ids"][pad] == -1) and np.all(got["topk_weights"][pad] == 0)
    assert np.all(logits.view(np.uint32)[np.isnan(logits)] == 0x7FC00000)


@pytest.mark.parametrize("name", ["MXFP8", "FP8_FP32_G128", "MXFP4", "NVFP4_PER_TOKEN"])
def test_formats_and_full_buffer(name):
    scheme = getattr(megamoe, name)
    rng = np.random.default_rng(len(name))
    y, w, bias = case(rng, 9, 64, 256, 6)
    got, plain, logits, want = run_both(y, w, bias, 6, scheme=scheme, rows=14)
    assert_bitwise(logits, want, "logits_out")
    assert_same(got, plain)
    assert np.all(got["topk_idx_out"][9:] == -1)


def test_zero_tokens():
    w = np.zeros((64, 128), F32)
    gw, gi = topk_out(0, 6)
    out = outputs(0, 128, 6)
    megamoe.gate_route_and_stage(bf(np.zeros((0, 128), np.uint16)), w, None, gw, gi, **out)  # returns at once
    out = outputs(0, 128, 6, rows=4)
    megamoe.gate_route_and_stage(bf(np.zeros((0, 128), np.uint16)), w, None, gw, gi, **out, full_buffer=True)
    assert np.all(out["topk_idx_out"] == -1) and np.all(out["topk_weights_out"] == 0)


@pytest.mark.parametrize("wdtype", ["bf16", "fp32"])
def test_gate_and_route_is_route_on_the_logits(wdtype):
    """Without staging: the logits, then route() on them (padding, counter, EPLB load)."""
    rng = np.random.default_rng(11)
    T, E, H, K, R = 12, 144, 300, 8, 2
    y, w, bias = case(rng, T, E, H, K, wdtype)
    y[3, 7] = 0x7F80  # +Inf: a row of non-finite logits
    want = gate_logits(f32_of_bf16(y), as_f32(w))
    pad = rng.random(T) < 0.25
    l2p = rng.permutation(E * R).reshape(E, R).astype(np.int32)
    counts = rng.integers(1, R + 1, E).astype(np.int32)
    eplb = dict(logical_to_physical_map=l2p, logical_replica_count=counts, record_enabled=np.ones(1, np.int32))
    gw, gi = topk_out(T, K)
    logits = np.full((T, E), POISON32, np.int32).view(F32)
    counter, load = np.zeros(1, np.int64), np.zeros(E * R, np.int64)
    megamoe.gate_and_route(bf(y), bf(w) if wdtype == "bf16" else w, bias, gw, gi, pad, routed_scaling_factor=1.5,
                           logits_out=logits, nonfinite_count=counter, expert_load_view=load, **eplb)  # fmt: skip
    pw, pi = topk_out(T, K)
    counter2, load2 = np.zeros(1, np.int64), np.zeros(E * R, np.int64)
    megamoe.route(want, bias, pw, pi, pad, routed_scaling_factor=1.5, nonfinite_count=counter2, expert_load_view=load2,
                  **eplb)  # fmt: skip
    assert_bitwise(logits, want, "logits_out")
    assert_bitwise(gi, pi, "topk_ids")
    assert_bitwise(gw, pw, "topk_weights")
    assert_bitwise(load, load2, "expert_load_view")
    assert counter[0] == counter2[0] == np.count_nonzero(~np.isfinite(want)) > 0
    text = megamoe.explain_gate_and_route(bf(y), bf(w) if wdtype == "bf16" else w, bias, gw, gi, pad)
    assert text.startswith("cpu backend: gate_and_route: the logits are computed in the call"), text
    assert megamoe.explain_gate_and_route(bf(y[:0]), w, bias, gw[:0], gi[:0]) == "nothing to do: y has no rows (T == 0)"


# ---------------------------------------------------------------------------------------
# Errors, refusals, explain


def error_args():
    rng = np.random.default_rng(9)
    y, w, bias = case(rng, 4, 64, 256, 6)
    return y, w, bias


@pytest.mark.parametrize(
    "what,change,exc,message",
    [
        ("weight width", dict(weight=np.zeros((64, 255), F32)), ValueError, "weight: expected shape (E, H)"),
        ("weight experts", dict(weight=np.zeros((513, 256), F32)), ValueError, "1 to 512 experts"),
        ("weight dtype", dict(weight=np.zeros((64, 256), np.float64)), ValueError, "weight: expected dtype"),
        ("y rows", dict(y="rows"), ValueError, "the rows of y"),
        ("logits_out dtype", dict(logits_out=np.zeros((4, 64), np.float64)), ValueError, "logits_out"),
        ("logits_out shape", dict(logits_out=np.zeros((4, 63), F32)), ValueError, "logits_out: expected shape"),
        ("top_k", dict(top_k=17), ValueError, "top_k"),
        ("weight not an array", dict(weight="w"), TypeError, "weight"),
    ],
)  # fmt: skip
def test_errors_write_nothing(what, change, exc, message):
    y, w, bias = error_args()
    T = y.shape[0]
    out = outputs(T, 256, 6)
    gw, gi = topk_out(T, 6)
    logits = np.full((T, 64), POISON32, np.int32).view(F32)
    kw = dict(logits_out=logits)
    weight = bf(w)
    for k, v in change.items():
        if k == "weight":
            weight = v
        elif k == "y":
            kw["y"] = bf(y[:3])
        else:
            kw[k] = v
    before = {k: v.copy() for k, v in out.items()}
    with pytest.raises(exc, match=re.escape(message)):
        megamoe.gate_route_and_stage(bf(y), weight, bias, gw, gi, **out, **kw)
    for k, v in before.items():
        assert_bitwise(out[k], v, k)
    assert np.all(gi == -7) and np.all(gw.view(np.int32) == POISON32)
    assert np.all(logits.view(np.int32) == POISON32)


@pytest.mark.skipif(megamoe.has_cuda_backend(), reason="a build with the CUDA backend runs CUDA tensors")
def test_cuda_tensors_without_the_cuda_backend():
    """CUDA tensors (device type 2 capsules; nothing is dereferenced) in a build without the
    CUDA backend get UnsupportedError from the library before anything is written (a build
    with it runs them: tests/cuda/test_gate_cuda.cu)."""
    y, w, bias = error_args()
    T = y.shape[0]
    out = outputs(T, 256, 6)
    gw, gi = topk_out(T, 6)
    before = {k: v.copy() for k, v in out.items()}
    caps = {k: dlpack_capsule(v, device=2) for k, v in out.items()}
    with pytest.raises(megamoe.UnsupportedError, match=re.escape("expected a CPU tensor (this build has no CUDA backend)")):
        megamoe.gate_route_and_stage(bf(y, device=2), bf(w, device=2), dlpack_capsule(bias, device=2),
                                     dlpack_capsule(gw, device=2), dlpack_capsule(gi, device=2), **caps)  # fmt: skip
    for k, v in before.items():
        assert_bitwise(out[k], v, k)


def test_explain_says_the_logits_are_computed_in_the_call():
    y, w, bias = error_args()
    T = y.shape[0]
    out = outputs(T, 256, 6)
    gw, gi = topk_out(T, 6)
    text = megamoe.explain_gate_route_and_stage(bf(y), bf(w), bias, gw, gi, **out)
    assert text.startswith("cpu backend: gate_route_and_stage: the logits are computed in the call"), text
    assert "then cpu backend: route_and_stage T=4 E=64 K=6" in text, text
    assert np.all(gi == -7)  # nothing runs
    assert megamoe.explain_gate_route_and_stage(bf(y[:0]), bf(w), bias, gw[:0], gi[:0], **out) == (
        "nothing to do: hidden_states has no rows (T == 0)")  # fmt: skip


def test_public_function():
    import inspect

    fn = megamoe.gate_route_and_stage
    assert inspect.signature(fn) == GATE_ROUTE_AND_STAGE.signature()
    assert fn.__module__ == "megamoe" and "Raises:" in fn.__doc__ and "gate_route_and_stage" in megamoe.__all__
    assert "explain_gate_route_and_stage" in megamoe.__all__
    assert inspect.signature(megamoe.gate_and_route) == GATE_AND_ROUTE.signature()
    assert megamoe.gate_and_route.__module__ == "megamoe" and "Raises:" in megamoe.gate_and_route.__doc__
    assert {"gate_and_route", "explain_gate_and_route"} <= set(megamoe.__all__)


# ---------------------------------------------------------------------------------------
# torch (CPU tensors)


def torch_args(T=6, H=256, E=64, K=6, scheme=megamoe.MXFP8, seed=0, full=False, wdtype="fp32"):
    g = np.random.default_rng(seed)
    bf16 = lambda a: torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)  # noqa: E731
    y, w, bias = case(g, T, E, H, K, wdtype)
    return dict(
        hidden_states=bf16(y),
        weight=bf16(w) if wdtype == "bf16" else torch.from_numpy(w),
        e_score_correction_bias=torch.from_numpy(bias),
        topk_weights=torch.full((T, K), float("nan")),
        topk_ids=torch.full((T, K), -7, dtype=torch.int32),
        **torch_staging_outputs(T + 3 if full else T, H, K, scheme),
        hidden_quant=scheme, full_buffer=full, routed_scaling_factor=1.5,
        logits_out=torch.full((T, E), -7.0),
        logits_nonfinite_count=torch.zeros(1, dtype=torch.int64),
    )  # fmt: skip


def same_outputs(a, b, what):
    same_mutated(GATE_ROUTE_AND_STAGE, a, b, what)


def op_values(a):
    return spec_op_values(GATE_ROUTE_AND_STAGE, a)


@needs_torch
@pytest.mark.parametrize("wdtype", ["fp32", "bf16"])
def test_torch_direct_op_and_numpy_agree(wdtype):
    a = torch_args(seed=3, wdtype=wdtype)
    b = clone_args(a)
    megamoe.gate_route_and_stage(**a)  # eager: the direct path
    torch.ops.megamoe.gate_route_and_stage(*op_values(b))
    same_outputs(a, b, "op vs direct")
    w = b["weight"]
    wf = f32_of_bf16(tbits(w).view(np.uint16)) if w.dtype == torch.bfloat16 else w.numpy()
    want = gate_logits(f32_of_bf16(tbits(b["hidden_states"]).view(np.uint16)), wf)
    assert_bitwise(a["logits_out"].numpy(), want, "logits_out")


@pytest.mark.skipif(torch is None or not hasattr(torch.library, "opcheck"), reason="needs torch.library.opcheck")
@pytest.mark.parametrize("option", ["plain", "full_buffer", "bf16_weight"])
def test_opcheck(option):
    a = torch_args(full=option == "full_buffer", wdtype="bf16" if option == "bf16_weight" else "fp32")
    torch.library.opcheck(torch.ops.megamoe.gate_route_and_stage.default, op_values(a))


@needs_torch
def test_torch_gate_and_route_op_and_direct_agree():
    a = torch_args(seed=8)
    r = dict(y=a["hidden_states"], weight=a["weight"], e_score_correction_bias=a["e_score_correction_bias"],
             topk_weights=a["topk_weights"], topk_ids=a["topk_ids"], routed_scaling_factor=1.5,
             logits_out=a["logits_out"], nonfinite_count=a["logits_nonfinite_count"])  # fmt: skip
    b = clone_args(r)
    megamoe.gate_and_route(**r)
    torch.ops.megamoe.gate_and_route(*spec_op_values(GATE_AND_ROUTE, b))
    same_mutated(GATE_AND_ROUTE, r, b, "op vs direct")
    want = gate_logits(f32_of_bf16(tbits(b["y"]).view(np.uint16)), b["weight"].numpy())
    assert_bitwise(r["logits_out"].numpy(), want, "logits_out")
    if hasattr(torch.library, "opcheck"):
        torch.library.opcheck(torch.ops.megamoe.gate_and_route.default, spec_op_values(GATE_AND_ROUTE, clone_args(r)))


@needs_torch
def test_op_schema_declares_every_output():
    schema = torch.ops.megamoe.gate_route_and_stage.default._schema
    mutated = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert mutated == set(GATE_ROUTE_AND_STAGE.mutates_args())
    assert "logits_out" in mutated and "y" not in mutated and "weight" not in mutated
    assert not schema.returns


@needs_torch
def test_fake_tensor_mode():
    assert_fake_writes_nothing(GATE_ROUTE_AND_STAGE, megamoe.gate_route_and_stage, torch_args())


@needs_torch
def test_torch_compile_fullgraph():
    a = torch_args(seed=4)
    b = clone_args(a)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(h, w, bias, tw, ti, q, sf, idx, wo, lo):
        megamoe.gate_route_and_stage(h, w, bias, tw, ti, q, sf, idx, wo, routed_scaling_factor=1.5, logits_out=lo)
        return wo.sum()

    names = ["hidden_states", "weight", "e_score_correction_bias", "topk_weights", "topk_ids", "x_fp8", "x_sf",
             "topk_idx_out", "topk_weights_out", "logits_out"]  # fmt: skip
    f(*[a[n] for n in names])
    megamoe.gate_route_and_stage(**{k: v for k, v in b.items() if k != "logits_nonfinite_count"})
    for k in ("topk_weights", "topk_ids", "x_fp8", "x_sf", "topk_idx_out", "topk_weights_out", "logits_out"):
        assert_bitwise(tbits(a[k]), tbits(b[k]), f"{k} compiled vs eager")
