"""Triton router kernel written from the router contract (docs/ROUTER.md), the baseline (c)
of bench/bench_router.py, and the router math in NumPy to check it against.

Per token: s_e = sqrt(softplus(logit_e)) in fp32 (softplus(x) = x for x > 20, else
log1p(exp(x))); the K largest b_e = fl(s_e + bias_e), ties to the lowest id, NaN b last;
w_k = fl(fl(s_k / max(sum_k s_k, 1e-20)) * alpha); optional EPLB map (replica p % count
of flat position p) and load record; padded tokens get ids -1 and weights +0.0.

One program routes BLOCK_T tokens over a [BLOCK_T, BLOCK_E] tile of logits; the K
selection rounds are a max over integer keys (the library's core::selection_key order:
NaN lowest, -0 == +0) and a min over the ids holding it. exp and log1p are libdevice's (as
torch's CUDA softplus), not the library's correctly rounded ones, so s may differ from
megamoe's by an ulp where libdevice misrounds: the checks allow that.
"""
import os

import numpy as np

try:  # the NumPy reference below works without triton / torch
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - exercised where triton is absent
    triton = None

WEIGHT_SUM_FLOOR = np.float32(1e-20)


if triton is not None:

    @triton.jit
    def _router_kernel(logits, bias, ids, w, pad, l2p, rcount, load, record,
                       s_l0, s_l1, s_i0, s_i1, s_w0, s_w1,
                       T, E, R, P, alpha,
                       K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
                       HAS_BIAS: tl.constexpr, HAS_PAD: tl.constexpr, HAS_EPLB: tl.constexpr,
                       LIBDEVICE: tl.constexpr):
        pid = tl.program_id(0)
        rows = pid * BLOCK_T + tl.arange(0, BLOCK_T)
        rmask = rows < T
        rows64 = rows.to(tl.int64)
        es = tl.arange(0, BLOCK_E)
        emask = es < E
        m2 = rmask[:, None] & emask[None, :]
        x = tl.load(logits + rows64[:, None] * s_l0 + es[None, :] * s_l1, mask=m2, other=0.0).to(tl.float32)
        if LIBDEVICE:
            sp = tl.where(x > 20.0, x, libdevice.log1p(libdevice.exp(x)))
        else:  # Triton's interpreter has no libdevice: log1p(y) = log(u) * y / (u - 1), u = 1 + y
            y = tl.exp(x)
            u = 1.0 + y
            sp = tl.where(x > 20.0, x, tl.where(u == 1.0, y, tl.log(u) * (y / (u - 1.0))))
        s = tl.sqrt_rn(sp)
        if HAS_BIAS:
            b = s + tl.load(bias + es, mask=emask, other=0.0).to(tl.float32)[None, :]
        else:
            b = s
        # Integer selection key (uint32 order held in int64): NaN -> 0, -0 -> +0, numbers
        # monotone from 1 up; lanes outside E and chosen experts -> -1.
        b = b + 0.0  # -0 + 0 = +0
        u = b.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
        key = tl.where(u >= 0x80000000, (~u) & 0xFFFFFFFF, u | 0x80000000)
        key = tl.where(b != b, 0, key)
        key = tl.where(m2, key, -1)
        ks = tl.arange(0, BLOCK_K)
        out_id = tl.zeros((BLOCK_T, BLOCK_K), dtype=tl.int32)
        out_s = tl.zeros((BLOCK_T, BLOCK_K), dtype=tl.float32)
        total = tl.zeros((BLOCK_T,), dtype=tl.float32)
        for k in tl.static_range(K):
            best = tl.max(key, axis=1)
            win = tl.min(tl.where(key == best[:, None], es[None, :], BLOCK_E), axis=1)
            hit = es[None, :] == win[:, None]
            sk = tl.sum(tl.where(hit, s, 0.0), axis=1)  # the one selected score, exactly
            total = total + sk  # k order, as the contract asks
            key = tl.where(hit, -1, key)
            out_id = tl.where(ks[None, :] == k, win[:, None], out_id)
            out_s = tl.where(ks[None, :] == k, sk[:, None], out_s)
        d = tl.where(total != total, total, tl.maximum(total, 1e-20))
        wk = tl.math.div_rn(out_s, d[:, None]) * alpha
        kmask = rmask[:, None] & (ks[None, :] < K)
        if HAS_PAD:
            padded = tl.load(pad + rows64, mask=rmask, other=0) != 0
        else:
            padded = tl.zeros((BLOCK_T,), dtype=tl.int1)
        if HAS_EPLB:
            p = rows64[:, None] * K + ks[None, :]
            c = tl.load(rcount + out_id, mask=kmask, other=1)
            c = tl.minimum(tl.maximum(c, 1), R)
            slot = (p % c.to(tl.int64)).to(tl.int32)
            phys = tl.load(l2p + out_id.to(tl.int64) * R + slot, mask=kmask, other=-1)
            # the flag loaded as a full tile: a scalar i1 in the mask is refused by Triton
            # 3.9's interpreter
            rec = tl.load(record + tl.zeros((BLOCK_T, BLOCK_K), dtype=tl.int32)) != 0
            ok = kmask & (~padded[:, None]) & (phys >= 0) & (phys < P) & rec
            tl.atomic_add(load + phys, tl.full((BLOCK_T, BLOCK_K), 1, tl.int32), mask=ok)
            out_id = phys
        out_id = tl.where(padded[:, None], -1, out_id)
        wk = tl.where(padded[:, None], 0.0, wk)
        tl.store(ids + rows64[:, None] * s_i0 + ks[None, :] * s_i1, out_id, mask=kmask)
        tl.store(w + rows64[:, None] * s_w0 + ks[None, :] * s_w1, wk, mask=kmask)


def block_t(T, E):
    """Tokens per program: one at decode sizes (a program per token fills the SMs), more
    once there are tokens to spare, within a 2048-element logits tile."""
    be = triton.next_power_of_2(E)
    return max(1, min(8 if T >= 1024 else 1, 2048 // be))


def route_triton(logits, topk_ids, topk_weights, top_k, e_score_correction_bias=None, routed_scaling_factor=1.0,
                 is_padding=None, logical_to_physical_map=None, logical_replica_count=None, expert_load_view=None,
                 record_enabled=None):
    """Route [T, E] logits into topk_ids [T, K] int32 and topk_weights [T, K] fp32 (EPLB:
    all four EPLB tensors, expert_load_view int32)."""
    T, E = logits.shape
    K = int(top_k)
    assert topk_ids.dtype.itemsize == 4 and tuple(topk_ids.shape) == (T, K)
    eplb = logical_to_physical_map is not None
    if eplb:
        assert expert_load_view.dtype.itemsize == 4, "Triton baseline: int32 expert_load_view"
    bt = block_t(T, E)
    dummy = logits
    R = logical_to_physical_map.shape[1] if eplb else 1
    P = expert_load_view.shape[0] if eplb else 0
    grid = (triton.cdiv(T, bt),)
    _router_kernel[grid](
        logits, e_score_correction_bias if e_score_correction_bias is not None else dummy, topk_ids, topk_weights,
        is_padding if is_padding is not None else dummy,
        logical_to_physical_map if eplb else topk_ids, logical_replica_count if eplb else topk_ids,
        expert_load_view if eplb else topk_ids, record_enabled if eplb else topk_ids,
        logits.stride(0), logits.stride(1), topk_ids.stride(0), topk_ids.stride(1),
        topk_weights.stride(0), topk_weights.stride(1), T, E, R, P, float(routed_scaling_factor),
        K=K, BLOCK_T=bt, BLOCK_E=triton.next_power_of_2(E), BLOCK_K=triton.next_power_of_2(K),
        HAS_BIAS=e_score_correction_bias is not None, HAS_PAD=is_padding is not None, HAS_EPLB=eplb,
        LIBDEVICE=os.environ.get("TRITON_INTERPRET", "0") != "1",
        num_warps=4 if E > 256 or bt > 1 else 2)


# ---------------------------------------------------------------------------------------
# NumPy reference (the contract's math; exp / log1p / sqrt each rounded once to fp32 from
# double, i.e. correctly rounded fp32 functions but for rare double-rounding cases).


def scores_ref(logits):
    x = np.asarray(logits, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(x.astype(np.float64)).astype(np.float32)
        l1p = np.log1p(e.astype(np.float64)).astype(np.float32)
    sp = np.where(x > 20, x, l1p)
    return np.sqrt(sp.astype(np.float64)).astype(np.float32)


def selection_keys(b):
    b = np.asarray(b, dtype=np.float32) + np.float32(0.0)
    u = b.view(np.uint32).astype(np.int64)
    key = np.where(u >= 0x80000000, (~u) & 0xFFFFFFFF, u | 0x80000000)
    return np.where(np.isnan(b), 0, key)


def route_ref(logits, top_k, bias=None, alpha=1.0, is_padding=None, l2p=None, rcount=None, num_physical=0):
    """(ids int32 [T, K], weights fp32 [T, K], load int64 [P] or None), ids physical with EPLB."""
    s = scores_ref(logits)
    T, E = s.shape
    b = s if bias is None else (s + np.asarray(bias, dtype=np.float32)[None, :]).astype(np.float32)
    key = selection_keys(b)
    # lexsort: last key is primary; descending key, then ascending id
    order = np.argsort(-key * (E + 1) + np.arange(E)[None, :], axis=1, kind="stable")[:, :top_k]
    ids = order.astype(np.int32)
    sel = np.take_along_axis(s, order, axis=1)
    total = np.zeros(T, dtype=np.float32)
    for k in range(top_k):
        total = (total + sel[:, k]).astype(np.float32)
    d = np.where(np.isnan(total), total, np.maximum(total, WEIGHT_SUM_FLOOR)).astype(np.float32)
    with np.errstate(invalid="ignore", divide="ignore"):
        w = ((sel / d[:, None]).astype(np.float32) * np.float32(alpha)).astype(np.float32)
    w = np.where(np.isnan(w), np.float32(np.nan), w)
    pad = np.zeros(T, dtype=bool) if is_padding is None else np.asarray(is_padding).astype(bool)
    load = None
    if l2p is not None:
        l2p = np.asarray(l2p)
        R = l2p.shape[1]
        c = np.clip(np.asarray(rcount)[ids], 1, R)
        p = np.arange(T * top_k).reshape(T, top_k)
        phys = l2p[ids, p % c].astype(np.int32)
        load = np.zeros(num_physical, dtype=np.int64)
        ok = (~pad[:, None]) & (phys >= 0) & (phys < num_physical)
        np.add.at(load, phys[ok], 1)
        ids = phys
    ids = np.where(pad[:, None], -1, ids).astype(np.int32)
    w = np.where(pad[:, None], np.float32(0.0), w).astype(np.float32)
    return ids, w, load


def ulp_diff(a, b):
    """Elementwise distance in fp32 ulps (NaN == NaN counts 0, NaN vs number a huge value)."""
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)

    def ordered(x):
        i = x.view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)

    d = np.abs(ordered(a) - ordered(b))
    both_nan = np.isnan(a) & np.isnan(b)
    one_nan = np.isnan(a) ^ np.isnan(b)
    return np.where(both_nan, 0, np.where(one_nan, 1 << 40, d))


def compare_routes(ref, got, scores=None, bias=None):
    """Agreement of two routings ((ids, weights) pairs): the fraction of tokens with the same
    id set, and the largest weight distance in ulps over tokens whose ids agree. Tokens
    whose ids differ are reported, and accepted when their biased scores tie within 2 ulp
    at the selection boundary (libdevice's exp / log1p may misround by an ulp)."""
    ri, rw = (np.asarray(x) for x in ref)
    gi, gw = (np.asarray(x) for x in got)
    same = np.all(ri == gi, axis=1)
    max_ulp = int(ulp_diff(rw[same], gw[same]).max()) if same.any() else 0
    return dict(tokens=int(ri.shape[0]), ids_equal=float(same.mean()) if len(same) else 1.0,
                tokens_differing=int((~same).sum()), max_weight_ulp=max_ulp)
