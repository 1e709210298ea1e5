"""The fused DeepSeek-V4 router from Python: megamoe.route, megamoe.route_and_stage, the
custom ops torch.ops.megamoe.route / route_and_stage and the vLLM drop-in
megamoe.dsv4_topk_prepare_megamoe.

- route() == an independent NumPy rendering of docs/ROUTER.md's rules, bit for bit (exp and
  log1p in double rounded once to fp32: the correctly rounded values but where a double
  lies within 2^-52 of an fp32 midpoint, about one input in 2^28), on fresh random logits,
  planted ties, NaN / +-Inf, hash layers, EPLB, padding; the outputs poisoned before;
- route_and_stage() == route() then megamoe.stage() bit for bit, every format and option;
- against vLLM's torch router (sqrt(softplus(logits.float())), topk of scores + bias,
  gather, renormalize, scale): ids equal but for sub-ulp near-ties, weights within 2 ulp;
- every argument error raises the documented type and writes nothing;
- torch: the custom ops against the direct calls, opcheck, FakeTensor, torch.compile;
- CUDA (skipped without a device and a CUDA build): GPU == CPU bit for bit, eager and
  replayed from a CUDA graph.
NumPy tests run everywhere (CI has no torch); torch tests skip without torch.
"""

from __future__ import annotations

import numpy as np
import pytest

import megamoe
import megamoe_npref as ref
from megamoe._signature import ROUTE, ROUTE_AND_STAGE
from megamoe_testutil import ALL_SCHEMES, assert_bitwise, bits, dlpack_capsule

try:
    import torch
except ImportError:  # CI: NumPy only
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")
HAS_CUDA = torch is not None and torch.cuda.is_available() and megamoe.has_cuda_backend()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and megamoe's CUDA backend")

F32 = np.float32
POISON32 = 0x5A5A5A5A
SUM_FLOOR = F32(1e-20)
QNAN = np.uint32(0x7FC00000)


# ---------------------------------------------------------------------------------------
# The NumPy rendering of the rules (docs/ROUTER.md, "The rules, per token")


def scores(logits: np.ndarray) -> np.ndarray:
    """s = sqrt(softplus(x)) in fp32: softplus(x) = x for x > 20, else fl(log1p(fl(exp(x))))."""
    x = np.asarray(logits, F32)
    with np.errstate(all="ignore"):
        e = np.exp(x.astype(np.float64)).astype(F32)
        sp = np.where(x > 20, x, np.log1p(e.astype(np.float64)).astype(F32))
        return np.sqrt(sp.astype(F32))


def select(b: np.ndarray, K: int) -> np.ndarray:
    """The K largest b per row: ties to the lower id, +0 == -0, NaNs last (by id)."""
    T, E = b.shape
    nan = np.isnan(b)
    with np.errstate(invalid="ignore"):
        neg = np.where(nan, F32(0), -b)
    ids = np.broadcast_to(np.arange(E), (T, E))
    return np.lexsort((ids, neg, nan), axis=-1)[:, :K]


def reference(logits, bias, K, alpha=None, pad=None, tid2eid=None, input_ids=None, eplb=None, ids_dtype=np.int32):
    """(topk_weights, topk_ids, load added, non-finite logits) by the rules; ``eplb`` =
    (map [E, R], counts [E], P, record); ``alpha`` None: no scaling (no product formed)."""
    x = np.asarray(logits, F32)
    T, E = x.shape
    s = scores(x)
    keep = np.ones(T, bool) if pad is None else ~np.asarray(pad).astype(bool)
    if tid2eid is None:
        b = s if bias is None else (s + np.asarray(bias, F32)).astype(F32)
        lid = select(b, K).astype(np.int64)
        ok = np.ones((T, K), bool)
    else:
        tab = np.asarray(tid2eid).astype(np.int64)
        rows = np.asarray(input_ids).astype(np.int64)
        row_ok = (rows >= 0) & (rows < tab.shape[0])
        keep &= row_ok
        lid = tab[np.where(row_ok, rows, 0)]
        ok = (lid >= 0) & (lid < E)
    ok &= keep[:, None]
    s_sel = np.where(ok, np.take_along_axis(s, np.where(ok, lid, 0), axis=1), F32(0))
    total = np.zeros(T, F32)
    with np.errstate(all="ignore"):
        for k in range(K):  # in k order, one fp32 rounding each
            total = (total + s_sel[:, k]).astype(F32)
        d = np.where(np.isnan(total), total, np.maximum(total, SUM_FLOOR)).astype(F32)
        w = (s_sel / d[:, None]).astype(F32)
        if alpha is not None:
            w = (w * F32(alpha)).astype(F32)
    w = np.where(np.isnan(w), QNAN.view(F32), w)
    w = np.where(ok, w, F32(0)).astype(F32)
    ids = np.where(ok, lid, -1)
    load = None
    if eplb is not None:
        emap, counts, P, record = eplb
        R = emap.shape[1]
        load = np.zeros(P, np.int64)
        pos = np.arange(T)[:, None] * K + np.arange(K)[None, :]
        c = np.clip(np.asarray(counts)[np.where(ok, ids, 0)], 1, R)
        phys = np.asarray(emap)[np.where(ok, ids, 0), pos % c]
        ids = np.where(ok, phys, -1)
        if record:
            hit = ok & (ids >= 0) & (ids < P)
            np.add.at(load, ids[hit], 1)
    return w, ids.astype(ids_dtype), load, int(np.count_nonzero(~np.isfinite(x)))


# ---------------------------------------------------------------------------------------
# Inputs and outputs


def logits_sample(rng, T, E, specials=False, ties=False):
    """Fresh logits: normal around 0 with a wide tail; ``ties`` plants equal and near-equal
    values, ``specials`` NaN / +-Inf and values around softplus's threshold."""
    x = (rng.standard_normal((T, E)) * rng.choice([0.5, 3.0, 12.0], (T, 1))).astype(F32)
    if ties and E > 1:
        x[:, rng.integers(0, E, max(1, E // 4))] = x[:, :1]
        nxt = np.nextafter(x[:, 1:2], F32(np.inf))
        x[:, rng.integers(0, E, max(1, E // 8))] = nxt
    if specials:
        n = T * E
        flat = x.reshape(-1)
        for v in (np.nan, np.inf, -np.inf, 20.0, np.nextafter(F32(20), F32(30)), -104.0, 89.0):
            flat[rng.integers(0, n, max(1, n // 97))] = v
    return x


def poisoned(T, K, ids_dtype=np.int32):
    return np.full((T, K), POISON32, np.int32).view(F32), np.full((T, K), POISON32, ids_dtype)


def bf16_bits(a: np.ndarray) -> np.ndarray:
    """The bfloat16 bits nearest (ties to even) to float32 ``a`` (NaNs kept quiet)."""
    u = np.asarray(a, F32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(a), np.uint16(0x7FC0), r)


def bf16(a_bits: np.ndarray):
    """A DLPack bfloat16 tensor over ``a_bits`` (NumPy has no bfloat16; no ml_dtypes needed)."""
    return dlpack_capsule(a_bits, dtype=(4, 16, 1))


def widen_bf16(a_bits: np.ndarray) -> np.ndarray:
    return (a_bits.astype(np.uint32) << 16).view(F32)


def check_route(got_w, got_ids, want_w, want_ids, what=""):
    assert_bitwise(got_ids, want_ids, f"topk_ids {what}")
    assert_bitwise(got_w, want_w, f"topk_weights {what}")


# ---------------------------------------------------------------------------------------
# route() against the rules


@pytest.mark.parametrize("E,K", [(1, 1), (7, 3), (33, 8), (200, 16), (256, 8), (384, 6), (512, 16)])
@pytest.mark.parametrize("ids_dtype", [np.int32, np.int64])
def test_route_matches_the_rules(E, K, ids_dtype):
    rng = np.random.default_rng(E * 31 + K)
    T = 37
    x = logits_sample(rng, T, E, ties=True)
    bias = (rng.standard_normal(E) * 0.3).astype(F32)
    w, ids = poisoned(T, K, ids_dtype)
    megamoe.route(x, bias, w, ids, routed_scaling_factor=1.5)
    want = reference(x, bias, K, 1.5, ids_dtype=ids_dtype)
    check_route(w, ids, want[0], want[1])


def test_route_without_scaling_factor_is_no_scaling():
    """routed_scaling_factor None: the weights are the quotients fl(s / d) themselves (the
    reference forms no product), the bytes of a factor of 1.0, subnormal quotients included
    (scores near 1.9e-22 beside 1.7e19)."""
    rng = np.random.default_rng(3)
    tiny = np.full((2, 4), -1000.0, F32)
    tiny[0, :2] = (3e38, -100.0)
    tiny[1, 1:3] = (3e38, -99.0)
    for x, K in ((logits_sample(rng, 37, 64, specials=True, ties=True), 6), (tiny, 2)):
        bias = (rng.standard_normal(x.shape[1]) * 0.3).astype(F32) if K == 6 else None
        w, ids = poisoned(x.shape[0], K)
        megamoe.route(x, bias, w, ids)
        want = reference(x, bias, K)
        check_route(w, ids, want[0], want[1])
        w1, ids1 = poisoned(x.shape[0], K)
        megamoe.route(x, bias, w1, ids1, routed_scaling_factor=1.0)
        assert np.array_equal(bits(w), bits(w1)) and np.array_equal(ids, ids1)
    assert np.count_nonzero((w != 0) & (np.abs(w) < np.finfo(F32).tiny)) == 2


def test_route_specials_padding_counter_and_no_bias():
    rng = np.random.default_rng(1)
    T, E, K = 64, 96, 6
    x = logits_sample(rng, T, E, specials=True, ties=True)
    x[3] = np.nan  # a token of NaNs: ids by id, weights NaN
    x[4] = -np.inf  # all scores +0: sum floored, weights +0
    x[5] = x[5, 0]  # all equal: the K lowest ids
    pad = rng.random(T) < 0.25
    count = np.array([5], np.int64)
    for bias in (None, (rng.standard_normal(E) * 4).astype(F32)):
        w, ids = poisoned(T, K)
        count[0] = 5
        megamoe.route(x, bias, w, ids, pad.astype(np.uint8), routed_scaling_factor=2.5, nonfinite_count=count)
        want = reference(x, bias, K, 2.5, pad)
        check_route(w, ids, want[0], want[1], f"bias={bias is not None}")
        assert count[0] == 5 + want[3]
    assert np.all(ids[pad] == -1) and np.all(bits(w[pad]) == 0)


def test_route_strided_transposed_and_bf16():
    rng = np.random.default_rng(2)
    T, E, K = 29, 160, 8
    x = logits_sample(rng, E, T).T  # transposed view
    bias = (rng.standard_normal(2 * E) * 0.2).astype(F32)[::2]
    w_full = np.full((T, 2 * K), POISON32, np.int32).view(F32)
    ids_full = np.full((T, 3 * K), POISON32, np.int64)
    megamoe.route(x, bias, w_full[:, ::2], ids_full[:, ::3], top_k=K)
    want = reference(x, bias, K, ids_dtype=np.int64)
    check_route(w_full[:, ::2], ids_full[:, ::3], want[0], want[1], "strided")
    assert np.all(bits(w_full[:, 1::2]) == POISON32) and np.all(ids_full[:, 1::3] == POISON32)
    # bf16 logits and bias: the library reads them exactly widened
    xb, bb = bf16_bits(logits_sample(rng, T, E)), bf16_bits(bias * 10)
    w, ids = poisoned(T, K)
    megamoe.route(bf16(xb), bf16(bb), w, ids, routed_scaling_factor=1.5)
    want = reference(widen_bf16(xb), widen_bf16(bb), K, 1.5)
    check_route(w, ids, want[0], want[1], "bf16")


def test_hash_layers():
    rng = np.random.default_rng(3)
    T, E, K, V = 50, 64, 6, 40
    x = logits_sample(rng, T, E, specials=True)
    tab = rng.integers(0, E, (V, K)).astype(np.int32)
    tab[3, 2], tab[4, 0], tab[5] = -1, E, 7  # invalid entries, a repeated id
    input_ids = rng.integers(0, V, T).astype(np.int64)
    input_ids[[1, 2]] = [-1, V]  # outside the table: the token behaves as padded
    input_ids[[6, 7, 8]] = [3, 4, 5]
    pad = rng.random(T) < 0.2
    for ids_dtype, in_dtype in ((np.int32, np.int32), (np.int64, np.int64)):
        w, ids = poisoned(T, K, ids_dtype)
        megamoe.route(x, None, w, ids, pad, routed_scaling_factor=1.5, tid2eid=tab, input_ids=input_ids.astype(in_dtype))
        want = reference(x, None, K, 1.5, pad, tab, input_ids, ids_dtype=ids_dtype)
        check_route(w, ids, want[0], want[1], f"hash {ids_dtype.__name__}")
    assert np.all(ids[1] == -1) and ids[6, 2] == -1 and ids[7, 0] == -1


@pytest.mark.parametrize("R", [1, 2, 4])
@pytest.mark.parametrize("load_dtype", [np.int32, np.int64])
def test_eplb_replicas_and_load(R, load_dtype):
    rng = np.random.default_rng(10 + R)
    T, E, K = 70, 48, 6
    P = E * R - 3  # the last physical ids are outside [0, P): never recorded
    x = logits_sample(rng, T, E, ties=True)
    bias = (rng.standard_normal(E) * 0.5).astype(F32)
    emap = rng.permutation(E * R).reshape(E, R).astype(np.int32)
    emap[0, -1] = -1  # vLLM's unused slot
    counts = rng.integers(1, R + 1, E).astype(np.int32)
    counts[:3] = [0, R + 5, -2]  # device data outside [1, R]: clamped
    pad = rng.random(T) < 0.3
    for record in (1, 0):
        load = np.full(P, 100, load_dtype)
        w, ids = poisoned(T, K)
        megamoe.route(x, bias, w, ids, pad, logical_to_physical_map=emap, logical_replica_count=counts,
                      expert_load_view=load, record_enabled=np.array([record], np.int32))  # fmt: skip
        want = reference(x, bias, K, 1.0, pad, eplb=(emap, counts, P, record))
        check_route(w, ids, want[0], want[1], f"eplb record={record}")
        assert np.array_equal(load.astype(np.int64) - 100, want[2]), f"record={record}"
        if not record:
            assert np.all(load == 100)
    # padded tokens are never recorded: padding every token records nothing
    load = np.zeros(P, load_dtype)
    megamoe.route(x, bias, w, ids, np.ones(T, bool), logical_to_physical_map=emap, logical_replica_count=counts,
                  expert_load_view=load, record_enabled=np.ones((1, 1), np.int32))  # fmt: skip
    assert not load.any() and np.all(ids == -1)


def test_no_tokens_returns_at_once():
    # router_logits [0, E]: nothing else is read, whatever it is
    megamoe.route(np.zeros((0, 8), F32), "not read", [], None, top_k="nor this")
    megamoe.route_and_stage("x", np.zeros((0, 8), F32), None, None, None, None, None, None, None)


# ---------------------------------------------------------------------------------------
# route_and_stage() == route() then stage()


def fused_outputs(T, H, K, scheme, rows=None, bm=None, ids_dtype=np.int32):
    """Poisoned outputs of a route_and_stage call (shared_x_sf zero-filled, as stage()
    allocates it)."""
    M = T if rows is None else rows
    shapes = megamoe.output_shapes(M, H, K, scheme)
    out = {}
    for name, spec in zip(("x_fp8", "x_sf", "topk_idx_out", "topk_weights_out", "x_scales"), shapes[:4] + shapes[5:6]):
        if spec is not None:  # every byte 0x5A
            dt = np.dtype(np.uint8 if spec.dtype.startswith("float8_") else spec.dtype)  # NumPy has no fp8
            out[name] = np.full(spec.shape + (dt.itemsize,), 0x5A, np.uint8).view(dt).reshape(spec.shape)
    if bm is not None:
        out["shared_x_sf"] = np.zeros(megamoe.output_shapes(T, H, K, scheme, bm).shared_x_sf.shape, np.int32)
        out["shared_block_m"] = bm
    w, ids = poisoned(T, K, ids_dtype)
    return w, ids, out


def route_then_stage(h, x, bias, K, scheme, alpha, pad, rows=None, bm=None, gs=None, **router):
    w, ids = poisoned(x.shape[0], K)
    megamoe.route(x, bias, w, ids, pad, routed_scaling_factor=alpha, **router)
    st = megamoe.stage(h, w, ids, pad, scheme=scheme, shared_block_m=bm, max_tokens=rows, global_scale=gs)
    return w, ids, st


@pytest.mark.parametrize("name", list(ALL_SCHEMES))
@pytest.mark.parametrize("option", ["plain", "padded", "full_buffer", "shared", "hash", "eplb"])
def test_fused_equals_route_then_stage(name, option):
    scheme = ALL_SCHEMES[name]
    if option == "shared" and not (scheme.ue8m0 and scheme.elem != megamoe.QuantElem.FLOAT4_E2M1):
        pytest.skip("shared_x_sf is for UE8M0 fp8 schemes")
    rng = np.random.default_rng(hash((name, option)) % 2**32)
    T, H, E, K = 19, 512, 72, 6
    h = ref.hidden_sample(rng, T, H)
    x = logits_sample(rng, T, E, ties=True)
    bias = (rng.standard_normal(E) * 0.5).astype(F32)
    pad = (rng.random(T) < 0.3) if option != "plain" else None
    rows = T + 5 if option == "full_buffer" else None
    bm = 16 if option == "shared" else None
    gs = np.array([0.37], F32) if scheme.scale2 == megamoe.Scale2.STATIC else None
    router, want_load = {}, None
    if option == "hash":
        bias = None
        router = dict(tid2eid=rng.integers(-1, E + 1, (30, K)).astype(np.int32),
                      input_ids=rng.integers(0, 31, T).astype(np.int32))  # fmt: skip
    if option == "eplb":
        R = 3
        router = dict(logical_to_physical_map=rng.permutation(E * R).reshape(E, R).astype(np.int32),
                      logical_replica_count=rng.integers(1, R + 1, E).astype(np.int32),
                      record_enabled=np.ones(1, np.int32))  # fmt: skip
        want_load = np.zeros(E * R, np.int64)
        router["expert_load_view"] = want_load
    w0, ids0, st = route_then_stage(h, x, bias, K, scheme, 1.5, pad, rows, bm, gs, **router)
    w, ids, out = fused_outputs(T, H, K, scheme, rows, bm)
    counts = np.zeros(1, np.int64), np.zeros(1, np.int64)
    if option == "eplb":
        router["expert_load_view"] = np.zeros_like(want_load)
    megamoe.route_and_stage(h, x, bias, w, ids, is_padding=pad, hidden_quant=scheme, routed_scaling_factor=1.5,
                            global_scale=gs, full_buffer=rows is not None, logits_nonfinite_count=counts[0],
                            nonfinite_count=counts[1], **out, **router)  # fmt: skip
    check_route(w, ids, w0, ids0, "fused public top-k")
    assert_bitwise(out["topk_idx_out"], st.topk_idx, "topk_idx_out")
    assert_bitwise(out["topk_weights_out"], st.topk_weights, "topk_weights_out")
    assert_bitwise(out["x_fp8"][:T], np.asarray(st.x_fp8).view(np.uint8)[:T], "x_fp8")
    assert_bitwise(out["x_sf"][:T], st.x_sf[:T], "x_sf")
    if "x_scales" in out:
        assert_bitwise(out["x_scales"][:T], st.x_scales[:T], "x_scales")
    if rows is not None:  # rows T.. of the activations untouched
        assert np.all(out["x_fp8"][T:].view(np.uint8) == 0x5A)
    if bm is not None:
        assert_bitwise(out["shared_x_sf"], st.shared_x_sf, "shared_x_sf")
    if option == "eplb":
        assert np.array_equal(router["expert_load_view"], want_load) and want_load.sum() > 0
    assert counts[0][0] == 0 and counts[1][0] == ref.nonfinite(h)


def test_fused_counters_and_full_buffer_without_tokens():
    rng = np.random.default_rng(5)
    T, H, E, K = 6, 256, 16, 4
    h = ref.hidden_sample(rng, T, H, specials=True)
    x = logits_sample(rng, T, E, specials=True)
    w, ids, out = fused_outputs(T, H, K, megamoe.MXFP8)
    lc, hc = np.array([2], np.int64), np.array([3], np.int64)
    megamoe.route_and_stage(h, x, None, w, ids, **out, logits_nonfinite_count=lc, nonfinite_count=hc)
    assert lc[0] == 2 + np.count_nonzero(~np.isfinite(x)) and hc[0] == 3 + ref.nonfinite(h)
    # T == 0 in full-buffer mode: the staged top-k tail is filled, nothing else written
    w, ids, out = fused_outputs(0, H, K, megamoe.MXFP8, rows=4)
    megamoe.route_and_stage(np.zeros((0, H), F32), np.zeros((0, E), F32), None, w, ids, **out, full_buffer=True)
    assert np.all(out["topk_idx_out"] == -1) and np.all(bits(out["topk_weights_out"]) == 0)
    assert np.all(out["x_fp8"].view(np.uint8) == 0x5A)


# ---------------------------------------------------------------------------------------
# The vLLM drop-in (dsv4_topk_prepare_megamoe)


def test_dsv4_drop_in_numpy():
    rng = np.random.default_rng(6)
    T, H, E = 11, 512, 256
    h = ref.hidden_sample(rng, T, H)
    x = logits_sample(rng, T, E)
    bias = (rng.standard_normal(E) * 0.3).astype(F32)
    pad = rng.random(T) < 0.3
    for dt in (np.int32, np.int64):
        w0, ids0, out0 = fused_outputs(T, H, 6, megamoe.MXFP8, bm=32, ids_dtype=dt)
        megamoe.route_and_stage(h, x, bias, w0, ids0, is_padding=pad, routed_scaling_factor=1.5, **out0)
        _, _, out = fused_outputs(T, H, 6, megamoe.MXFP8, bm=32)
        w, ids = megamoe.dsv4_topk_prepare_megamoe(h, x, bias, 1.5, dt, out["x_fp8"], out["x_sf"], out["topk_idx_out"],
                                                   out["topk_weights_out"], pad, out["shared_x_sf"], 32)  # fmt: skip
        assert w.shape == ids.shape == (T, 6) and w.dtype == F32 and ids.dtype == dt
        check_route(w, ids, w0, ids0, "drop-in")
        for k in out0:
            if k != "shared_block_m":
                assert_bitwise(out[k], out0[k], k)
    w, ids = megamoe.dsv4_topk_prepare_megamoe(h[:0], x[:0], bias, 1.5, np.int64, *[None] * 4)
    assert w.shape == ids.shape == (0, 6) and ids.dtype == np.int64
    with pytest.raises(ValueError, match="indices_dtype"):
        megamoe.dsv4_topk_prepare_megamoe(h, x, bias, 1.5, np.float32, *[None] * 4)
    with pytest.raises(TypeError, match="indices_dtype"):
        megamoe.dsv4_topk_prepare_megamoe(h, x, bias, 1.5, object(), *[None] * 4)
    with pytest.raises(TypeError, match="gating_output"):
        megamoe.dsv4_topk_prepare_megamoe(h, x.tolist(), bias, 1.5, np.int32, *[None] * 4)


# ---------------------------------------------------------------------------------------
# Argument errors: the documented type, a message naming the argument, nothing written


def route_call(T=8, E=32, K=4):
    rng = np.random.default_rng(8)
    w, ids = poisoned(T, K)
    return dict(router_logits=logits_sample(rng, T, E), e_score_correction_bias=np.zeros(E, F32),
                topk_weights=w, topk_ids=ids)  # fmt: skip


def fused_call(T=8, E=32, K=4, H=256):
    c = route_call(T, E, K)
    _, _, out = fused_outputs(T, H, K, megamoe.MXFP8)
    c.update(hidden_states=np.random.default_rng(9).standard_normal((T, H)).astype(F32), **out)
    return c


E_ = 32
ROUTE_ERRORS = [
    # (change, exception, text in the message)
    (dict(router_logits=[[0.0] * E_] * 8), TypeError, "router_logits: expected an array"),
    (dict(topk_ids=None), TypeError, "topk_ids: expected an array"),
    (dict(top_k="4"), TypeError, "top_k"),
    (dict(routed_scaling_factor="1.5"), TypeError, "routed_scaling_factor"),
    (dict(enable_pdl="yes"), TypeError, "enable_pdl"),
    (dict(stream=1.5), TypeError, "stream"),
    (dict(router_logits=np.zeros((8, 513), F32), e_score_correction_bias=None), ValueError, "router_logits: expected 1 to 512 experts"),
    (dict(router_logits=np.zeros((8, E_), np.float16)), ValueError, "router_logits: expected dtype float32 or bfloat16, got dtype float16"),
    (dict(router_logits=np.zeros((8, E_), np.float64)), ValueError, "router_logits: expected dtype float32 or bfloat16, got dtype float64"),
    (dict(router_logits=np.zeros((8, E_, 1), F32)), ValueError, "router_logits: expected a tensor of rank <= 2"),
    (dict(top_k=17), ValueError, "top_k: expected 1 <= top_k <= min(16, E = 32), got 17"),
    (dict(top_k=5), ValueError, "topk_ids"),
    (dict(routed_scaling_factor=float("inf")), ValueError, "routed_scaling_factor: expected a finite value"),
    (dict(e_score_correction_bias=np.zeros(E_ + 1, F32)), ValueError, "e_score_correction_bias: expected shape (32,)"),
    (dict(topk_weights=np.zeros((8, 4), np.float64)), ValueError, "topk_weights: expected dtype float32"),
    (dict(topk_ids=np.zeros((8, 4), np.int16)), ValueError, "topk_ids: expected dtype int32 or int64, got dtype int16"),
    (dict(topk_ids=np.zeros((8, 4), np.uint32)), ValueError, "topk_ids: expected dtype int32 or int64, got dtype uint32"),
    (dict(tid2eid=np.zeros((4, 4), np.int32), input_ids=np.zeros(8, np.int32)), ValueError, "e_score_correction_bias: expected none"),
    (dict(e_score_correction_bias=None, tid2eid=np.zeros((4, 4), np.int32)), ValueError, "input_ids: expected a tensor"),
    (dict(e_score_correction_bias=None, input_ids=np.zeros(8, np.int32)), ValueError, "tid2eid: expected a tensor"),
    (dict(e_score_correction_bias=None, tid2eid=np.zeros((4, 3), np.int32), input_ids=np.zeros(8, np.int32)), ValueError, "tid2eid: expected shape"),
    (dict(e_score_correction_bias=None, tid2eid=np.zeros((4, 4), np.int64), input_ids=np.zeros(8, np.int32)), ValueError, "tid2eid: expected dtype int32"),
    (dict(logical_to_physical_map=np.zeros((E_, 2), np.int32)), ValueError, "logical_replica_count: expected a tensor"),
    (dict(logical_to_physical_map=np.zeros((E_, 2), np.int32), logical_replica_count=np.ones(E_, np.int32),
          expert_load_view=np.zeros(64, np.int32), record_enabled=np.ones(1, np.int64)), ValueError, "record_enabled: expected dtype int32"),
    (dict(logical_to_physical_map=np.zeros((E_ - 1, 2), np.int32), logical_replica_count=np.ones(E_, np.int32),
          expert_load_view=np.zeros(64, np.int32), record_enabled=np.ones(1, np.int32)), ValueError, "logical_to_physical_map: expected shape"),
    (dict(is_padding=np.zeros(7, bool)), ValueError, "is_padding: expected shape (8,)"),
]  # fmt: skip


def _apply(call, change, counter):
    c = dict(call)
    for k, v in change.items():
        c[counter if k == "nonfinite_count" else k] = v
    return c


def _outputs(c):
    return {k: v.copy() for k, v in c.items() if isinstance(v, np.ndarray) and k in (
        "topk_weights", "topk_ids", "x_fp8", "x_sf", "topk_idx_out", "topk_weights_out", "expert_load_view")}  # fmt: skip


@pytest.mark.parametrize("change,exc,text", ROUTE_ERRORS + [
    (dict(nonfinite_count=np.zeros(1, np.int32)), ValueError, "expected dtype int64, got dtype int32"),
    (dict(nonfinite_count=np.zeros(2, np.int64)), ValueError, "expected a one-element tensor"),
])  # fmt: skip
@pytest.mark.parametrize("fused", [False, True], ids=["route", "route_and_stage"])
def test_errors(change, exc, text, fused):
    counter = "logits_nonfinite_count" if fused else "nonfinite_count"
    c = _apply(fused_call() if fused else route_call(), change, counter)
    before = _outputs(c)
    fn = megamoe.route_and_stage if fused else megamoe.route
    with pytest.raises(exc) as e:
        fn(**c)
    assert text in str(e.value), str(e.value)
    if "nonfinite_count" in change and exc is ValueError:
        assert f"megamoe: {counter}:" in str(e.value), "the router's counter is named as the caller passed it"
    for k, v in before.items():
        assert_bitwise(c[k], v, f"{k} written by a rejected call")


@pytest.mark.parametrize("change,text", [
    (dict(hidden_states=np.zeros((7, 256), F32)), "hidden_states: expected 8 tokens (the rows of router_logits)"),
    (dict(hidden_states=np.zeros((8, 200), F32)), "hidden_size to be a multiple of 128"),
    (dict(x_sf=np.zeros((8, 3), np.int32)), "x_sf"),
    (dict(shared_block_m=16), "requires both shared_x_sf and shared_block_m"),
    (dict(nonfinite_count=np.zeros(1, np.int32)), "megamoe: nonfinite_count: expected dtype int64"),
    (dict(topk_idx_out=np.zeros((8, 5), np.int64)), "topk_idx_out"),
])  # fmt: skip
def test_fused_staging_errors(change, text):
    c = fused_call()
    c.update(change)
    before = _outputs(c)
    with pytest.raises(ValueError) as e:
        megamoe.route_and_stage(**c)
    assert text in str(e.value), str(e.value)
    for k, v in before.items():
        assert_bitwise(c[k], v, f"{k} written by a rejected call")


def test_overlapping_outputs_rejected():
    c = fused_call()
    c["topk_weights"] = c["topk_weights_out"]  # the same memory as a staging output
    with pytest.raises(ValueError, match="overlap"):
        megamoe.route_and_stage(**c)
    c = route_call()
    c["topk_ids"] = c["topk_weights"].view(np.int32)
    with pytest.raises(ValueError, match="overlap"):
        megamoe.route(**c)


def test_devices():
    c = route_call()
    # a CUDA tensor among CPU ones: rejected before anything runs, with or without CUDA
    c["topk_weights"] = dlpack_capsule(c["topk_weights"], device=2)
    with pytest.raises(ValueError, match="device"):
        megamoe.route(**c)
    if megamoe.has_cuda_backend():
        return
    c = route_call()
    for k in ("router_logits", "e_score_correction_bias", "topk_weights", "topk_ids"):
        c[k] = dlpack_capsule(c[k], device=2)
    with pytest.raises(megamoe.UnsupportedError, match="no CUDA backend"):
        megamoe.route(**c)


def test_entry_point_signatures():
    import inspect

    assert inspect.signature(megamoe.route) == ROUTE.signature()
    assert inspect.signature(megamoe.route_and_stage) == ROUTE_AND_STAGE.signature()
    assert megamoe.route.__doc__ and megamoe.route_and_stage.__doc__
    with pytest.raises(TypeError):
        megamoe.route(np.zeros((1, 4), F32), None, *poisoned(1, 2), None, 2)  # top_k is keyword-only


# ---------------------------------------------------------------------------------------
# Torch: vLLM's router, the custom ops


def vllm_router(logits, bias, K, alpha):
    """vLLM's torch rendering of the DeepSeek-V4 router (_topk_softplus_sqrt_torch's math)."""
    s = torch.sqrt(torch.nn.functional.softplus(logits.float()))
    choice = s if bias is None else s + bias.float()
    _, idx = torch.topk(choice, k=K, dim=-1)
    w = s.gather(1, idx)
    w = w / w.sum(dim=-1, keepdim=True).clamp(min=1e-20)
    return (w * alpha).float(), idx


def ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in fp32 ulps of finite a and b (ordered integer images)."""
    def ordered(x):
        i = np.asarray(x, F32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    return np.abs(ordered(a) - ordered(b))


VLLM_CASES = [(256, 6, "float32"), (384, 6, "float32"), (384, 6, "bfloat16"), (64, 8, "float32"), (512, 16, "bfloat16")]


def vllm_case(E, K, dtype, seed=0):
    g = torch.Generator().manual_seed(E + K + 1000 * seed)
    logits = (torch.randn(300, E, generator=g) * 4).to(getattr(torch, dtype))
    bias = (torch.randn(E, generator=g) * 0.05 + 8.0).to(getattr(torch, dtype))  # DSv4-Flash: biases near 8
    w, ids = torch.empty(300, K), torch.empty(300, K, dtype=torch.int32)
    megamoe.route(logits, bias, w, ids, routed_scaling_factor=1.5)
    return logits, bias, w, ids


@needs_torch
@pytest.mark.parametrize("E,K,dtype", VLLM_CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_against_vllm_torch_router(E, K, dtype, seed):
    """Ids: a token may differ only by near-ties (its chosen biased scores, sorted, equal
    vLLM's within 2 ulp; bf16 logits and biases make exact ties common, which torch.topk
    breaks in no fixed order). Weights, where the ids agree: within 4 eps |w| (eps =
    2^-23): torch's CPU expf / log1pf are off by an ulp in about a fifth of the scores and
    torch.sum adds in another order; measured at most 3.3 eps (docs/ROUTER.md, "Python")."""
    logits, bias, w, ids = vllm_case(E, K, dtype, seed)
    vw, vids = vllm_router(logits, bias, K, 1.5)
    b = torch.sqrt(torch.nn.functional.softplus(logits.float())) + bias.float()  # vLLM's choice values
    ours = b.gather(1, ids.long()).sort(dim=1, descending=True).values.numpy()
    theirs = b.gather(1, vids).sort(dim=1, descending=True).values.numpy()
    assert ulps(ours, theirs).max() <= 2, "a selection that is no near-tie"
    same = (ids.long() == vids).all(dim=1)
    if dtype == "float32":
        assert same.all(), "float32 logits of this sample have no near-ties"
    rel = (w[same].double() - vw[same].double()).abs() / vw[same].double().abs()
    assert rel.max().item() <= 4 * 2.0**-23


@needs_torch
@pytest.mark.parametrize("E,K,dtype", VLLM_CASES)
def test_vllm_weight_formula_is_ours_bit_for_bit(E, K, dtype):
    """vLLM's renormalize-and-scale (gather, sum, clamp(1e-20), divide, scale) in fp32 on the
    correctly rounded scores, summed in k order: the same bits as route()."""
    logits, bias, w, ids = vllm_case(E, K, dtype)
    s = torch.from_numpy(scores(logits.float().numpy())).gather(1, ids.long())
    total = torch.zeros(s.shape[0])
    for k in range(K):
        total = total + s[:, k]
    want = s / total.clamp(min=1e-20)[:, None] * 1.5
    same_bits(w, want, "weights")


def torch_fused_args(T=9, H=512, E=64, K=6, scheme=megamoe.MXFP8, pad=True, seed=0, device="cpu", full=False,
                     eplb=False, x_dtype=None):  # fmt: skip
    """The arguments of route_and_stage (a dict), fresh inputs, poisoned outputs."""
    g = np.random.default_rng(seed)
    rows = T + 3 if full else T
    sh = megamoe.output_shapes(rows, H, K, scheme)
    fp8 = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}
    x_dt = x_dtype or fp8.get(sh.x_fp8.dtype, torch.uint8)
    dev = dict(device=device)
    a = dict(
        hidden_states=torch.from_numpy(ref.hidden_sample(g, T, H)).to(torch.bfloat16).to(device),
        router_logits=torch.from_numpy(logits_sample(g, T, E, ties=True)).to(device),
        e_score_correction_bias=torch.from_numpy((g.standard_normal(E) * 0.3).astype(F32)).to(device),
        topk_weights=torch.full((T, K), float("nan"), **dev),
        topk_ids=torch.full((T, K), -7, dtype=torch.int32, **dev),
        x_fp8=torch.full(sh.x_fp8.shape, 0x5A, dtype=torch.uint8, **dev).view(x_dt),
        x_sf=torch.full(sh.x_sf.shape, -7, dtype=getattr(torch, sh.x_sf.dtype), **dev),
        topk_idx_out=torch.full((rows, K), -7, dtype=torch.int64, **dev),
        topk_weights_out=torch.full((rows, K), -7.0, **dev),
        is_padding=torch.from_numpy(g.random(T) < 0.3).to(device) if pad else None,
        hidden_quant=scheme, routed_scaling_factor=1.5, full_buffer=full,
        logits_nonfinite_count=torch.zeros(1, dtype=torch.int64, **dev),
        nonfinite_count=torch.zeros(1, dtype=torch.int64, **dev),
    )  # fmt: skip
    if sh.x_scales is not None:
        a["x_scales"] = torch.full(sh.x_scales.shape, -7.0, **dev)
    if scheme.scale2 == megamoe.Scale2.STATIC:
        a["global_scale"] = torch.tensor([0.5], **dev)
    if eplb:
        R = 2
        a.update(logical_to_physical_map=torch.from_numpy(g.permutation(E * R).reshape(E, R).astype(np.int32)).to(device),
                 logical_replica_count=torch.from_numpy(g.integers(1, R + 1, E).astype(np.int32)).to(device),
                 expert_load_view=torch.zeros(E * R, dtype=torch.int64, **dev),
                 record_enabled=torch.ones(1, dtype=torch.int32, **dev))  # fmt: skip
    return a


MUTATED = [p.name for p in ROUTE_AND_STAGE.params if p.mutable]


def clone_args(a):
    return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in a.items()}


def same_bits(x, y, what):
    x, y = x.detach().cpu(), y.detach().cpu()
    if x.dtype.itemsize == 1:
        x, y = x.view(torch.uint8), y.view(torch.uint8)
    elif x.is_floating_point():
        x, y = x.view(torch.int32), y.view(torch.int32)
    assert_bitwise(x.numpy(), y.numpy(), what)


def same_outputs(a, b, what=""):
    for k in MUTATED:
        if a.get(k) is not None:
            same_bits(a[k], b[k], f"{k} {what}")


def op_values(spec, a):
    from megamoe._torch import _op_scheme_args

    return spec.op_values(spec.values(**a), _op_scheme_args)


@needs_torch
@pytest.mark.parametrize("name", list(ALL_SCHEMES))
def test_torch_direct_and_op_equal_numpy(name):
    scheme = ALL_SCHEMES[name]
    a = torch_fused_args(scheme=scheme, eplb=True, seed=3)
    b, c = clone_args(a), clone_args(a)
    megamoe.route_and_stage(**a)  # eager: the direct path
    torch.ops.megamoe.route_and_stage(*op_values(ROUTE_AND_STAGE, b))
    same_outputs(a, b, "op vs direct")
    fp8 = (torch.float8_e4m3fn, torch.float8_e5m2)
    np_args = {k: (v.view(torch.uint8) if isinstance(v, torch.Tensor) and v.dtype in fp8 else v)
               for k, v in c.items()}  # fmt: skip
    np_args = {k: (v.float().numpy() if isinstance(v, torch.Tensor) and v.dtype == torch.bfloat16 else
                   v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in np_args.items()}  # fmt: skip
    megamoe.route_and_stage(**np_args)
    for k in MUTATED:
        if a.get(k) is not None:
            got = a[k].view(torch.uint8) if a[k].dtype in fp8 else a[k]
            assert_bitwise(got.numpy(), np_args[k], f"{k} torch vs numpy")
    # route() through its op too (the same EPLB map, fresh loads)
    r = {k: c[k] for k in ("router_logits", "e_score_correction_bias", "is_padding", "logical_to_physical_map",
                           "logical_replica_count", "record_enabled")}  # fmt: skip
    w1, i1, l1 = torch.empty_like(a["topk_weights"]), torch.empty_like(a["topk_ids"]), torch.zeros_like(a["expert_load_view"])
    w2, i2, l2 = torch.empty_like(w1), torch.empty_like(i1), torch.zeros_like(l1)
    megamoe.route(**r, topk_weights=w1, topk_ids=i1, expert_load_view=l1, routed_scaling_factor=1.5)
    torch.ops.megamoe.route(*op_values(ROUTE, dict(r, topk_weights=w2, topk_ids=i2, expert_load_view=l2,
                                                   routed_scaling_factor=1.5)))  # fmt: skip
    for got, want, what in ((w1, a["topk_weights"], "weights"), (i1, a["topk_ids"], "ids"), (l1, a["expert_load_view"], "load"),
                            (w2, w1, "op weights"), (i2, i1, "op ids"), (l2, l1, "op load")):  # fmt: skip
        same_bits(got, want, f"route {what}")


@needs_torch
@pytest.mark.parametrize("option", ["plain", "full_buffer", "eplb", "nvfp4_per_token"])
def test_opcheck(option):
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("torch.library.opcheck is not in this torch")
    scheme = megamoe.NVFP4_PER_TOKEN if option == "nvfp4_per_token" else megamoe.MXFP8
    # uint8 x_fp8: opcheck compares tensors with allclose, which torch lacks for float8 on CPU
    a = torch_fused_args(scheme=scheme, full=option == "full_buffer", eplb=option == "eplb", x_dtype=torch.uint8)
    torch.library.opcheck(torch.ops.megamoe.route_and_stage.default, op_values(ROUTE_AND_STAGE, a))
    r = dict(router_logits=a["router_logits"], e_score_correction_bias=a["e_score_correction_bias"],
             topk_weights=a["topk_weights"], topk_ids=a["topk_ids"], is_padding=a["is_padding"],
             nonfinite_count=a["logits_nonfinite_count"])  # fmt: skip
    torch.library.opcheck(torch.ops.megamoe.route.default, op_values(ROUTE, r))


@needs_torch
def test_op_schema_declares_every_output():
    schema = torch.ops.megamoe.route_and_stage.default._schema
    mutated = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert mutated == set(ROUTE_AND_STAGE.mutates_args()) == {
        "topk_weights", "topk_ids", "x_fp8", "x_sf", "topk_idx_out", "topk_weights_out", "shared_x_sf",
        "expert_load_view", "logits_nonfinite_count", "global_scale", "x_scales", "nonfinite_count"}  # fmt: skip
    assert not schema.returns
    r = torch.ops.megamoe.route.default._schema
    assert {a.name for a in r.arguments if a.alias_info is not None and a.alias_info.is_write} == {
        "topk_weights", "topk_ids", "expert_load_view", "nonfinite_count"}


@needs_torch
def test_fake_tensor_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    a = torch_fused_args(eplb=True)
    with FakeTensorMode() as mode:
        fa = {k: (mode.from_tensor(v) if isinstance(v, torch.Tensor) else v) for k, v in a.items()}
        megamoe.route_and_stage(**fa)  # the op under the mode: its fake runs, nothing computed
        w, ids = megamoe.dsv4_topk_prepare_megamoe(fa["hidden_states"], fa["router_logits"],
                                                   fa["e_score_correction_bias"], 1.5, torch.int64, fa["x_fp8"],
                                                   fa["x_sf"], fa["topk_idx_out"], fa["topk_weights_out"])  # fmt: skip
        assert w.shape == ids.shape == (9, 6) and w.dtype == torch.float32 and ids.dtype == torch.int64


@needs_torch
def test_torch_compile_fullgraph():
    a = torch_fused_args(eplb=True, seed=4)
    b = clone_args(a)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(h, x, bias, w, ids, q, sf, idx, wo, pad, load, rec, emap, cnt):
        megamoe.route_and_stage(h, x, bias, w, ids, q, sf, idx, wo, pad, routed_scaling_factor=1.5,
                                logical_to_physical_map=emap, logical_replica_count=cnt, expert_load_view=load,
                                record_enabled=rec)  # fmt: skip
        return w.sum()

    names = ["hidden_states", "router_logits", "e_score_correction_bias", "topk_weights", "topk_ids", "x_fp8", "x_sf",
             "topk_idx_out", "topk_weights_out", "is_padding", "expert_load_view", "record_enabled",
             "logical_to_physical_map", "logical_replica_count"]  # fmt: skip
    f(*[a[n] for n in names])
    megamoe.route_and_stage(**{k: v for k, v in b.items() if k not in ("logits_nonfinite_count", "nonfinite_count")})
    for k in ("topk_weights", "topk_ids", "x_fp8", "x_sf", "topk_idx_out", "topk_weights_out", "expert_load_view"):
        same_bits(a[k], b[k], f"{k} compiled vs eager")


@needs_torch
def test_torch_compile_inductor_drop_in():
    """The default backend, with the drop-in's allocations inside the compiled region."""
    a = torch_fused_args(K=6, E=256, seed=6, x_dtype=torch.uint8)
    b = clone_args(a)

    @torch.compile(fullgraph=True)
    def f(h, x, bias, q, sf, idx, wo, pad):
        w, ids = megamoe.dsv4_topk_prepare_megamoe(h, x, bias, 1.5, torch.int64, q, sf, idx, wo, pad)
        return w * 2, ids

    w, ids = f(*[a[k] for k in ("hidden_states", "router_logits", "e_score_correction_bias", "x_fp8", "x_sf",
                                "topk_idx_out", "topk_weights_out", "is_padding")])  # fmt: skip
    b["topk_ids"] = torch.empty(9, 6, dtype=torch.int64)
    megamoe.route_and_stage(**{k: v for k, v in b.items() if k not in ("logits_nonfinite_count", "nonfinite_count")})
    same_bits(w, b["topk_weights"] * 2, "weights")
    same_bits(ids, b["topk_ids"], "ids")
    for k in ("x_fp8", "x_sf", "topk_idx_out", "topk_weights_out"):
        same_bits(a[k], b[k], k)


@needs_torch
def test_dsv4_drop_in_torch():
    a = torch_fused_args(K=6, E=256, seed=5)
    b = clone_args(a)
    megamoe.route_and_stage(**{k: v for k, v in a.items() if k not in ("logits_nonfinite_count", "nonfinite_count")})
    w, ids = megamoe.dsv4_topk_prepare_megamoe(b["hidden_states"], b["router_logits"], b["e_score_correction_bias"],
                                               1.5, torch.int32, b["x_fp8"], b["x_sf"], b["topk_idx_out"],
                                               b["topk_weights_out"], b["is_padding"])  # fmt: skip
    assert w.dtype == torch.float32 and ids.dtype == torch.int32 and ids.shape == (9, 6)
    same_bits(w, a["topk_weights"], "drop-in weights")
    same_bits(ids, a["topk_ids"], "drop-in ids")
    for k in ("x_fp8", "x_sf", "topk_idx_out", "topk_weights_out"):
        same_bits(b[k], a[k], k)
    with pytest.raises(ValueError, match="indices_dtype"):
        megamoe.dsv4_topk_prepare_megamoe(b["hidden_states"], b["router_logits"], None, 1.5, torch.float32,
                                          b["x_fp8"], b["x_sf"], b["topk_idx_out"], b["topk_weights_out"])  # fmt: skip
    with pytest.raises(TypeError, match="indices_dtype"):
        megamoe.dsv4_topk_prepare_megamoe(b["hidden_states"], b["router_logits"], None, 1.5, "int32",
                                          b["x_fp8"], b["x_sf"], b["topk_idx_out"], b["topk_weights_out"])  # fmt: skip


@needs_torch
def test_op_errors_are_value_errors():
    a = torch_fused_args()
    a["topk_ids"] = torch.zeros(9, 6, dtype=torch.int16)
    with pytest.raises(ValueError, match="topk_ids: expected dtype int32 or int64"):
        torch.ops.megamoe.route_and_stage(*op_values(ROUTE_AND_STAGE, a))


# ---------------------------------------------------------------------------------------
# CUDA: GPU == CPU, eager and replayed from a CUDA graph


def to_device(a, device):
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in a.items()}


@needs_cuda
@pytest.mark.parametrize("name", list(ALL_SCHEMES))
@pytest.mark.parametrize("option", ["plain", "full_buffer", "eplb"])
def test_cuda_equals_cpu_eager_and_graph(name, option):
    scheme = ALL_SCHEMES[name]
    cpu = torch_fused_args(T=77, scheme=scheme, full=option == "full_buffer", eplb=option == "eplb", seed=7)
    eager, graphed = to_device(cpu, "cuda"), to_device(cpu, "cuda")
    megamoe.route_and_stage(**cpu)
    megamoe.route_and_stage(**eager)
    torch.cuda.synchronize()
    same_outputs(eager, cpu, "cuda eager vs cpu")
    # Captured once, replayed twice on fresh copies of the inputs and outputs.
    start = clone_args(graphed)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s), torch.cuda.graph(graph, stream=s):
        megamoe.route_and_stage(**graphed)
    torch.cuda.current_stream().wait_stream(s)
    for _ in range(2):
        for k, v in start.items():
            if isinstance(v, torch.Tensor):
                graphed[k].copy_(v)
        graph.replay()
    torch.cuda.synchronize()
    same_outputs(graphed, cpu, "cuda graph replay vs cpu (loads and counters: one call's worth)")


@needs_cuda
def test_cuda_route_and_drop_in():
    cpu = torch_fused_args(T=300, E=384, K=6, seed=8)
    dev = to_device(cpu, "cuda")
    r = ("router_logits", "e_score_correction_bias", "topk_weights", "topk_ids", "is_padding")
    megamoe.route(**{k: cpu[k] for k in r}, routed_scaling_factor=1.5)
    megamoe.route(**{k: dev[k] for k in r}, routed_scaling_factor=1.5)
    torch.cuda.synchronize()
    same_bits(dev["topk_weights"], cpu["topk_weights"], "route weights")
    same_bits(dev["topk_ids"], cpu["topk_ids"], "route ids")
    w, ids = megamoe.dsv4_topk_prepare_megamoe(dev["hidden_states"], dev["router_logits"],
                                               dev["e_score_correction_bias"], 1.5, torch.int32, dev["x_fp8"],
                                               dev["x_sf"], dev["topk_idx_out"], dev["topk_weights_out"],
                                               dev["is_padding"])  # fmt: skip
    assert w.is_cuda and ids.is_cuda
    same_bits(w, cpu["topk_weights"], "drop-in weights")
    same_bits(ids, cpu["topk_ids"], "drop-in ids")
