"""Full-buffer mode, routing-only staging (stage_megamoe_routing), the routed scaling factor,
the non-finite counter and explain(), on NumPy arrays (CPU backend), against
megamoe_npref.py. Torch variants are in test_torch_cpu.py."""

from __future__ import annotations

import re

import numpy as np
import pytest

import megamoe
import megamoe_npref as ref
from megamoe_testutil import ALL_SCHEMES, assert_bitwise, bits
from test_formats import FMT, gs_for, inputs, outputs

POISON_IDX = 0x5A5A5A5A5A5A5A5A


def poison_all(out: dict) -> dict:
    for a in out.values():
        a.view(np.uint8)[...] = 0xA5
    return out


# ---------------------------------------------------------------------------------------
# Full buffer


@pytest.mark.parametrize("name", ALL_SCHEMES)
@pytest.mark.parametrize("T,M", [(5, 5), (5, 17), (1, 64), (33, 40)])
def test_full_buffer_every_format(name, T, M):
    s = ALL_SCHEMES[name]
    H, K = 512, 6
    h, w, ids = inputs(T, H, K, seed=T + M)
    pad = np.arange(T) % 4 == 1
    out = poison_all(outputs(T, H, K, s, rows=M))
    gs = gs_for(name)
    megamoe.prepare_megamoe_inputs(h, w, ids, **out, is_padding=pad, hidden_quant=s, global_scale=gs, full_buffer=True)
    want = ref.stage_any(FMT[name], h, w, ids, pad, global_scale=None if gs is None else gs[0], rows=M)
    for n in ("x_fp8", "x_sf") + (("x_scales",) if "x_scales" in out else ()):
        assert_bitwise(out[n][:T], getattr(want, "x_q" if n == "x_fp8" else n), n)
        assert np.all(out[n][T:].view(np.uint8) == 0xA5), f"{n}: rows T..M-1 must stay untouched"
    assert_bitwise(out["topk_idx_out"], want.topk_idx, "topk_idx_out")
    assert_bitwise(out["topk_weights_out"], want.topk_weights, "topk_weights_out")
    assert np.all(bits(out["topk_weights_out"][T:]) == 0)  # +0.0, not -0.0


def test_full_buffer_zero_tokens_fills_the_whole_top_k_buffer():
    """T = 0 in full-buffer mode still fills the tail (the early T = 0 return must not skip it)."""
    H, K, M = 256, 4, 9
    h = np.empty((0, H), np.float32)
    w, ids = np.empty((0, K), np.float32), np.empty((0, K), np.int32)
    out = poison_all(outputs(0, H, K, megamoe.MXFP8, rows=M))
    megamoe.prepare_megamoe_inputs(h, w, ids, **out, full_buffer=True)
    assert np.all(out["topk_idx_out"] == -1) and np.all(bits(out["topk_weights_out"]) == 0)
    assert np.all(out["x_fp8"].view(np.uint8) == 0xA5) and np.all(out["x_sf"].view(np.uint8) == 0xA5)
    # ... and therefore reads and checks every argument then
    with pytest.raises(TypeError, match=re.escape("megamoe: topk_ids: expected an array (DLPack or buffer protocol), got str")):
        megamoe.prepare_megamoe_inputs(h, w, "junk", **out, full_buffer=True)
    with pytest.raises(ValueError, match=re.escape("megamoe: x_fp8: expected shape (9, 256), got shape (8, 256)")):
        megamoe.prepare_megamoe_inputs(h, w, ids, out["x_fp8"][:8], out["x_sf"], out["topk_idx_out"],
                                       out["topk_weights_out"], full_buffer=True)  # fmt: skip
    # without full_buffer nothing is read, as before
    megamoe.prepare_megamoe_inputs(h, w, "junk", None, None, None, None)
    st = megamoe.stage(h, w, ids, max_tokens=M)
    assert st.topk_idx.shape == (M, K) and np.all(st.topk_idx == -1) and np.all(bits(st.topk_weights) == 0)


def test_full_buffer_errors():
    T, H, K = 8, 256, 4
    h, w, ids = inputs(T, H, K)
    out = outputs(T, H, K, megamoe.MXFP8, rows=6)
    with pytest.raises(ValueError, match=re.escape("megamoe: topk_idx_out: expected at least 8 rows (full-buffer mode: max_tokens >= num_tokens), got 6 rows")):
        megamoe.prepare_megamoe_inputs(h, w, ids, **out, full_buffer=True)
    out = outputs(T, H, K, megamoe.MXFP8, rows=12)
    with pytest.raises(ValueError, match=re.escape("megamoe: topk_idx_out: expected shape (8, 4), got shape (12, 4)")):
        megamoe.prepare_megamoe_inputs(h, w, ids, **out)  # M rows without full_buffer
    with pytest.raises(TypeError, match=re.escape("megamoe: full_buffer: expected a bool, got str")):
        megamoe.prepare_megamoe_inputs(h, w, ids, **out, full_buffer="yes")


def test_stage_max_tokens():
    T, H, K, M = 7, 512, 8, 20
    h, w, ids = inputs(T, H, K, seed=2)
    for name, s in ALL_SCHEMES.items():
        gs = gs_for(name)
        st = megamoe.stage(h, w, ids, scheme=s, max_tokens=M, global_scale=gs, shared_block_m=64 if s.ue8m0 else None)
        want = ref.stage_any(FMT[name], h, w, ids, global_scale=None if gs is None else gs[0], rows=M)
        assert st.x_fp8.shape[0] == M and st.x_sf.shape[0] == M
        assert_bitwise(st.x_fp8[:T], want.x_q, name)
        assert_bitwise(st.topk_idx, want.topk_idx, name)
        assert_bitwise(st.topk_weights, want.topk_weights, name)
        if s.ue8m0:
            rows = ref.shared_row(np.arange(T), 64)
            assert_bitwise(st.shared_x_sf[rows], st.x_sf[:T], name + " shared_x_sf")
    with pytest.raises(ValueError, match="at least 7 rows"):
        megamoe.stage(h, w, ids, max_tokens=3)


# ---------------------------------------------------------------------------------------
# Routed scaling factor


@pytest.mark.parametrize("wdtype", [np.float32, np.float16])
@pytest.mark.parametrize("alpha", [2.5, 0.1, -1.0, 1e30, 0.0, -0.0])
def test_routed_scaling_factor(wdtype, alpha):
    T, H, K = 12, 256, 5
    h, w, ids = inputs(T, H, K, seed=3)
    w = (w * 4 - 1).astype(wdtype)
    w[1, 0] = np.nan
    w[2, 1] = -0.0
    w[4, 2] = np.inf if wdtype == np.float32 else np.float16(np.inf)  # row 4 is kept (alpha 0: Inf * 0)
    w[5, 3] = -w[4, 2]
    pad = np.arange(T) % 3 == 0
    out = outputs(T, H, K, megamoe.MXFP8, rows=T + 4)
    megamoe.prepare_megamoe_inputs(h, w, ids, **out, is_padding=pad, routed_scaling_factor=alpha, full_buffer=True)
    idx, wo = ref.topk(w, ids, pad, alpha, rows=T + 4)
    assert_bitwise(out["topk_idx_out"], idx, "topk_idx_out")
    assert_bitwise(out["topk_weights_out"], wo, "topk_weights_out")
    assert bits(out["topk_weights_out"])[1, 0] == bits(np.asarray(w[1:2, 0:1]).astype(np.float32))[0, 0]  # NaN bits kept
    if alpha == 0:  # a NaN the product makes: 0x7FC00000 whatever the hardware makes
        assert bits(out["topk_weights_out"])[4, 2] == 0x7FC00000 and bits(out["topk_weights_out"])[5, 3] == 0x7FC00000


@pytest.mark.parametrize("alpha", [np.inf, -np.inf, np.nan])
def test_routed_scaling_factor_must_be_finite(alpha):
    T, H, K = 2, 128, 2
    h, w, ids = inputs(T, H, K)
    out = outputs(T, H, K, megamoe.MXFP8)
    with pytest.raises(ValueError, match=re.escape("megamoe: routed_scaling_factor: expected a finite value")):
        megamoe.prepare_megamoe_inputs(h, w, ids, **out, routed_scaling_factor=alpha)
    with pytest.raises(ValueError, match=re.escape("megamoe: routed_scaling_factor: expected a value within float32's range")):
        megamoe.prepare_megamoe_inputs(h, w, ids, **out, routed_scaling_factor=1e300)  # beyond fp32
    with pytest.raises(TypeError, match=re.escape("megamoe: routed_scaling_factor: expected a float or None, got str")):
        megamoe.prepare_megamoe_inputs(h, w, ids, **out, routed_scaling_factor="2")
    megamoe.prepare_megamoe_inputs(h, w, ids, **out, routed_scaling_factor=np.float32(2))
    megamoe.prepare_megamoe_inputs(h, w, ids, **out, routed_scaling_factor=3)


# ---------------------------------------------------------------------------------------
# Non-finite counter


@pytest.mark.parametrize("name", ALL_SCHEMES)
def test_nonfinite_counter_every_format(name):
    s = ALL_SCHEMES[name]
    T, H = 40, 512
    h, w, ids = inputs(T, H, 4, seed=8, specials=True)
    pad = np.arange(T) % 2 == 0  # padded tokens are counted too
    n = ref.nonfinite(h)
    assert n > 0
    count = np.array([5], np.int64)
    out = outputs(T, H, 4, s)
    megamoe.prepare_megamoe_inputs(h, w, ids, **out, is_padding=pad, hidden_quant=s, global_scale=gs_for(name),
                                   nonfinite_count=count)  # fmt: skip
    assert count[0] == 5 + n
    st = megamoe.stage(h, w, ids, scheme=s, global_scale=gs_for(name), nonfinite_count=count)
    assert count[0] == 5 + 2 * n and st.x_fp8.shape[0] == T
    c0 = np.array(0, np.int64)  # a 0-D counter
    with np.errstate(over="ignore"):
        h16 = h.astype(np.float16)  # more infinities
    megamoe.prepare_megamoe_inputs(h16, w, ids, **out, hidden_quant=s, global_scale=gs_for(name),
                                   nonfinite_count=c0)  # fmt: skip
    assert c0 == ref.nonfinite(h16) > n


def test_nonfinite_counter_errors_and_absence():
    T, H = 4, 256
    h, w, ids = inputs(T, H, 2)
    out = outputs(T, H, 2, megamoe.MXFP8)
    for bad, msg in [
        (np.zeros(1, np.int32), "megamoe: nonfinite_count: expected dtype int64, got dtype int32"),
        (np.zeros(2, np.int64), "megamoe: nonfinite_count: expected a one-element tensor (0-D, [1] or [1, 1]), got shape (2,)"),
        (h.view(np.int64)[:1, :1].reshape(1), "megamoe: nonfinite_count: expected memory disjoint from hidden_states"),
    ]:
        with pytest.raises(ValueError, match=re.escape(msg)):
            megamoe.prepare_megamoe_inputs(h, w, ids, **out, nonfinite_count=bad)
    ro = np.zeros(1, np.int64)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match=re.escape("megamoe: nonfinite_count: expected a writable array")):
        megamoe.prepare_megamoe_inputs(h, w, ids, **out, nonfinite_count=ro)
    h[0, 0] = np.nan
    megamoe.prepare_megamoe_inputs(h, w, ids, **out)  # no counter: nothing counted, nothing read


# ---------------------------------------------------------------------------------------
# Routing only


@pytest.mark.parametrize("wdtype", [np.float32, np.float16])
@pytest.mark.parametrize("idtype", [np.int32, np.int64])
def test_stage_megamoe_routing(wdtype, idtype):
    T, K = 23, 6
    rng = np.random.default_rng(4)
    w = rng.random((T, K)).astype(wdtype)
    ids = rng.integers(-1, 384, (T, K)).astype(idtype)
    pad = (np.arange(T) % 5 == 2).astype(np.uint8) * 7
    idx, wo = np.full((T, K), POISON_IDX, np.int64), np.full((T, K), np.nan, np.float32)
    megamoe.stage_megamoe_routing(w, ids, idx, wo)
    want_i, want_w = ref.topk(w, ids)
    assert_bitwise(idx, want_i, "idx")
    assert_bitwise(wo, want_w, "w")
    megamoe.stage_megamoe_routing(w, ids, idx, wo, pad, routed_scaling_factor=1.5)
    want_i, want_w = ref.topk(w, ids, pad, 1.5)
    assert_bitwise(idx, want_i, "idx padded")
    assert_bitwise(wo, want_w, "w padded scaled")
    big_i, big_w = np.full((T + 9, K), POISON_IDX, np.int64), np.full((T + 9, K), np.nan, np.float32)
    megamoe.stage_megamoe_routing(w, ids, big_i, big_w, is_padding=pad, full_buffer=True)
    want_i, want_w = ref.topk(w, ids, pad, rows=T + 9)
    assert_bitwise(big_i, want_i, "idx full buffer")
    assert_bitwise(big_w, want_w, "w full buffer")


@pytest.mark.parametrize("alpha", [None, 0.75])
@pytest.mark.parametrize("routing_only", [False, True])
def test_expert_scales(alpha, routing_only):
    """Kept weights of ids in [0, E) times their expert's scale (after alpha), the rest kept;
    a strided table; ids past the table and negative ones; NaN / Inf / zero scales."""
    T, H, K, E = 19, 256, 6, 150
    h, w, ids = inputs(T, H, K, seed=8)
    ids = ids.astype(np.int64)
    ids[0, :3] = [-1, E - 1, E]
    w = (w * 4 - 1).astype(np.float32)
    w[1, 0], w[1, 1] = np.inf, np.nan
    rng = np.random.default_rng(9)
    table = np.full(2 * E, np.nan, np.float32)
    es = table[::2]  # a strided view
    es[:] = rng.uniform(-3, 3, E).astype(np.float32)
    ids[1, :4] = [5, 6, 3, 4]
    es[5], es[3], es[4] = 0.0, np.nan, np.inf  # Inf weight times 0, NaN and Inf scales
    pad = np.arange(T) % 4 == 3
    rows = T + 5
    if routing_only:
        idx, wo = np.full((rows, K), POISON_IDX, np.int64), np.full((rows, K), np.nan, np.float32)
        megamoe.stage_megamoe_routing(w, ids, idx, wo, pad, full_buffer=True, routed_scaling_factor=alpha,
                                      expert_scales=es)  # fmt: skip
    else:
        out = outputs(T, H, K, megamoe.MXFP8, rows=rows)
        megamoe.prepare_megamoe_inputs(h, w, ids, **out, is_padding=pad, full_buffer=True,
                                       routed_scaling_factor=alpha, expert_scales=es)  # fmt: skip
        idx, wo = out["topk_idx_out"], out["topk_weights_out"]
    want_i, want_w = ref.topk(w, ids, pad, alpha, rows=rows, expert_scales=es)
    assert_bitwise(idx, want_i, "idx")
    assert_bitwise(wo, want_w, "weights times expert scales")
    # the table changes weights (a test that passes with the table ignored proves nothing)
    assert not np.array_equal(bits(want_w), bits(ref.topk(w, ids, pad, alpha, rows=rows)[1]))


def test_expert_scales_errors_write_nothing():
    T, H, K = 4, 128, 2
    h, w, ids = inputs(T, H, K)
    for es, msg in [
        (np.ones(8, np.float64), "expert_scales: expected dtype float32"),
        (np.ones((2, 4), np.float32), "expert_scales"),
    ]:
        out = outputs(T, H, K, megamoe.MXFP8)
        before = {k: v.copy() for k, v in out.items()}
        with pytest.raises(ValueError, match=re.escape(msg)):
            megamoe.prepare_megamoe_inputs(h, w, ids, **out, expert_scales=es)
        for k in out:
            assert_bitwise(out[k], before[k], k)
        idx, wo = np.full((T, K), POISON_IDX, np.int64), np.full((T, K), np.nan, np.float32)
        with pytest.raises(ValueError, match=re.escape(msg)):
            megamoe.stage_megamoe_routing(w, ids, idx, wo, expert_scales=es)
        assert np.all(idx == POISON_IDX)


def test_stage_megamoe_routing_zero_tokens_and_errors():
    e_w, e_i = np.empty((0, 4), np.float32), np.empty((0, 4), np.int32)
    megamoe.stage_megamoe_routing(None, e_i, "junk", 3)  # T == 0: nothing else read
    idx, w = np.full((5, 4), 7, np.int64), np.full((5, 4), 7.0, np.float32)
    megamoe.stage_megamoe_routing(e_w, e_i, idx, w, full_buffer=True)
    assert np.all(idx == -1) and np.all(bits(w) == 0)
    T, K = 3, 4
    w_in, ids = np.ones((T, K), np.float32), np.zeros((T, K), np.int32)
    cases = [
        (dict(topk_weights=np.ones((T, K + 1), np.float32)), ValueError,
         "DeepSeek V4 MegaMoE input staging requires topk_weights and topk_ids to have the same shape."),
        (dict(topk_idx_out=np.zeros((T, K), np.int32)), ValueError, "megamoe: topk_idx_out: expected dtype int64, got dtype int32"),
        (dict(topk_weights_out=np.zeros((T + 1, K), np.float32)), ValueError, "megamoe: topk_weights_out: expected shape (3, 4), got shape (4, 4)"),
        (dict(is_padding=np.zeros(T, np.int16)), ValueError, "megamoe: is_padding: expected dtype bool or uint8, got dtype int16"),
        (dict(topk_ids=np.zeros((T, K), ">i4")), ValueError, "megamoe: topk_ids: expected dtype int32 or int64, got big-endian int32"),
        (dict(topk_weights_out=np.zeros((T, K), ">f4")), ValueError, "megamoe: topk_weights_out: expected dtype float32, got big-endian float32"),
        (dict(topk_weights=[[1.0] * K] * T), TypeError, "megamoe: topk_weights: expected an array (DLPack or buffer protocol), got list"),
        (dict(stream="0"), TypeError, "megamoe: stream: expected an int (a cudaStream_t) or None, got str"),
    ]  # fmt: skip
    for over, exc, msg in cases:
        kw = dict(topk_weights=w_in, topk_ids=ids, topk_idx_out=np.full((T, K), 9, np.int64),
                  topk_weights_out=np.full((T, K), 9.0, np.float32))  # fmt: skip
        kw.update(over)
        before = {n: kw[n].copy() for n in ("topk_idx_out", "topk_weights_out") if isinstance(kw[n], np.ndarray)}
        with pytest.raises(exc, match=re.escape(msg)):
            megamoe.stage_megamoe_routing(**kw)
        for n, b in before.items():
            assert np.array_equal(bits(kw[n]), bits(b)), f"a rejected call wrote {n}"
    out = np.zeros((T, K), np.int64)
    with pytest.raises(ValueError, match=re.escape("megamoe: topk_idx_out: expected memory disjoint from topk_weights_out")):
        megamoe.stage_megamoe_routing(w_in, ids, out, out.view(np.float32)[:, ::2])


def test_routing_only_leaves_quantized_buffers_alone():
    """vLLM's test: routing-only staging repacks the top-k and touches nothing else; the full
    path still quantizes afterwards."""
    T, H, K = 9, 512, 6
    h, w, ids = inputs(T, H, K, seed=5)
    # The four staging buffers as views of one poisoned allocation: the activation and
    # scale bytes must keep their poison.
    act = T * H + T * (H // 128) * 4  # x then sf (8-byte aligned ends: 4608 + 144)
    mem = np.full(act + T * K * 12, 0xA5, np.uint8)
    x = mem[: T * H].reshape(T, H)
    sf = mem[T * H : act].view(np.int32).reshape(T, H // 128)
    idx = mem[act : act + T * K * 8].view(np.int64).reshape(T, K)
    wo = mem[act + T * K * 8 :].view(np.float32).reshape(T, K)
    megamoe.stage_megamoe_routing(w, ids, idx, wo)
    assert np.all(mem[:act] == 0xA5), "routing-only staging wrote activation or scale bytes"
    assert np.array_equal(idx, ids.astype(np.int64)) and np.array_equal(wo, w)
    megamoe.prepare_megamoe_inputs(h, w, ids, x, sf, idx, wo)
    assert_bitwise(x, ref.stage_any(ref.FORMATS["mxfp8"], h, w, ids).x_q, "x_fp8")


# ---------------------------------------------------------------------------------------
# explain


def test_explain():
    T, H, K = 6, 512, 4
    h, w, ids = inputs(T, H, K)
    out = outputs(T, H, K, megamoe.NVFP4_PER_TOKEN)
    text = megamoe.explain(h, w, ids, **out, hidden_quant=megamoe.NVFP4_PER_TOKEN)
    assert text.startswith("cpu backend:") and "nvfp4_per_token" in text and f"T={T}" in text
    count = np.zeros(1, np.int64)
    assert "non-finite" in megamoe.explain(h, w, ids, **out, hidden_quant=megamoe.NVFP4_PER_TOKEN, nonfinite_count=count)
    assert np.all(out["x_fp8"].view(np.uint8) == 0xA5), "explain must not stage"
    assert megamoe.explain(np.empty((0, 3), np.float32), None, None, None, None, None, None).startswith("nothing to do")
    with pytest.raises(ValueError, match=re.escape("megamoe: x_scales: expected a [T] float32 output (nvfp4_per_token writes one), got none")):
        megamoe.explain(h, w, ids, out["x_fp8"], out["x_sf"], out["topk_idx_out"], out["topk_weights_out"],
                        hidden_quant=megamoe.NVFP4_PER_TOKEN)  # fmt: skip




def test_cpu_threads():
    if not hasattr(megamoe, "set_cpu_threads"):
        pytest.skip("this library has no megamoe::set_cpu_threads")
    before = megamoe.cpu_threads()
    assert before >= 1
    try:
        megamoe.set_cpu_threads(1)
        assert megamoe.cpu_threads() == 1
        T, H = 1100, 256  # large enough for worker threads, here on the calling thread only
        h, w, ids = inputs(T, H, 4, seed=6)
        out = outputs(T, H, 4, megamoe.MXFP4)
        megamoe.prepare_megamoe_inputs(h, w, ids, **out, hidden_quant=megamoe.MXFP4)
        check_one = out["x_fp8"].copy()
        megamoe.set_cpu_threads(0)
        assert megamoe.cpu_threads() >= 1
        megamoe.prepare_megamoe_inputs(h, w, ids, **out, hidden_quant=megamoe.MXFP4)
        assert np.array_equal(check_one, out["x_fp8"])
        with pytest.raises(ValueError, match="set_cpu_threads"):
            megamoe.set_cpu_threads(-1)
    finally:
        megamoe.set_cpu_threads(0)
