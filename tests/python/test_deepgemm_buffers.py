"""DeepGEMM's MegaMoE symmetric buffers: megamoe.buffers.deepgemm_layout (the C++
megamoe::deepgemm::buffer_layout through the binding), deepgemm_block_m and
alloc_deepgemm_buffer.

The reference below renders DeepGEMM's formulas on its own (recorded from DeepGEMM 0274ad7b:
csrc/apis/mega_moe.hpp, csrc/apis/sm90_mega.hpp, layout/mega_moe.cuh, scheduler/mega_moe.cuh,
heuristics/mega_moe.hpp; the ring layout from DeepGEMM main 54e2261: csrc/apis/mega.hpp), as a
list of DeepGEMM's buffers (records x record bytes) laid end to end; the worked examples are the
research notes' numbers for R = 1, E = 256, K = 6, H = 4096, IH = 2048, 512 tokens. Staging
into an allocated buffer runs on the CPU backend (NumPy views).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import megamoe
from megamoe import buffers as mb


def alloc_np(*args, **kw):
    """alloc_deepgemm_buffer with NumPy storage: these tests read the buffers with NumPy,
    and the default allocator is torch wherever torch is installed."""
    return mb.alloc_deepgemm_buffer(*args, allocator="numpy", **kw)

# ---------------------------------------------------------------------------------------
# The reference


def _up(a: int, b: int) -> int:
    return -(-a // b) * b


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


SIGNALS = 25_335_168  # sizeof(MegaMoESignals) for DeepGEMM's 72 ranks at most


def _signals() -> int:
    o = 44  # 4 grid counters, the NVLink counter and 2 signals, 4 task counters (bytes)
    for n in (72 * 8, 72 * 8, (2048 + 2048 + 512) * 8):  # three alignas(128) groups
        o = _up(o, 128) + n
    o += 2 * 4 * 2**20 + 8 * 2**20 + 4 * 2**20 + 4 * 2**15 + 4 * 2**20
    return _up(o, 128)


def _pool(R, E, T, K, max_bm, lcm):
    er = E // R
    return _up(R * T * min(K, er) + er * (max_bm - 1), lcm)


def _live(M, sms, H, IH):
    C, n1, n2 = sms // 2, 2 * IH // 256, H // 256
    warm = min(max(_cdiv(_cdiv(C, n2) * n1, C), _cdiv(n1 + (M - 1) * max(n1 - n2, 0), C) + 1), _cdiv(M * n1, C))
    live = _cdiv(min(warm * C, M * n1), n1)
    growth = _cdiv(M * (n2 - n1), n2) if n2 > n1 else 0
    return min(M, live + growth + _cdiv(C, min(n1, n2)))


def _lay(chain):
    """[(name, bytes, view)] end to end -> {name: (offset, bytes)} of the listed ones, total."""
    out, at = {}, 0
    for name, nbytes, view in chain:
        if view or nbytes:
            out[name] = (at, nbytes)
        at += nbytes
    return out, at


def ref_sm100(R, E, T, K, H, IH, S, mma, sms):
    T = _up(T, 1920)
    er = E // R
    bms = (8, 16, 32, 64, 96, 128, 192, 240)
    ring = _up(max(_live(_cdiv(T * R * min(K, er), bm) + er, sms, H, IH) * bm for bm in bms), 1920)
    bits = {"fp8xfp4": 8, "fp8xfp8": 8, "bf16xbf16": 16, "fp4xfp4": 4}[mma]
    g = 16 if mma == "fp4xfp4" else 32
    sf = mma != "bf16xbf16"
    sbits = 16 if mma == "fp4xfp4" else bits
    ssf = sf and sbits < 16
    nsf = max(ring // bm * _up(bm, 128) for bm in bms) if sf else 0
    nsh = _cdiv(T, 8) * 128 if (ssf and S) else 0
    P = _pool(R, E, T, K, 240, 1920)
    ws = _up(_signals() + E * T * 4 + P * 12, 16)
    chain = [("workspace", ws, False), ("routed_topk_weights", P * 4 if bits == 4 else 0, False),
             ("x", T * H * bits // 8, True)]  # fmt: skip
    chain += [("x_sf", T * H // g, True)] if sf else []
    chain += [("topk_idx", T * K * 8, True), ("topk_weights", T * K * 4, True)]
    if S:
        chain += [("shared_l1_acts_sf", nsh * H // g, True)] if ssf else []
        chain += [("shared_l2_acts", T * S * IH * sbits // 8, True)]
        chain += [("shared_l2_acts_sf", nsh * S * IH // g, True)] if ssf else []
    chain += [("l1_acts", ring * H * bits // 8, True)]
    chain += [("l1_acts_sf", nsf * H // g, True)] if sf else []
    chain += [("l1_topk_weights", 0 if bits == 4 else ring * 4, False), ("l2_acts", ring * IH * bits // 8, True)]
    chain += [("l2_acts_sf", nsf * IH // g, True)] if sf else []
    chain += [("combine", (K + (1 if S else 0)) * T * 2 * H, False)]
    regions, total = _lay(chain)
    return dict(T=T, ring=ring, nsf=nsf, pool=P, nsh=nsh, ws=ws, regions=regions, total=total)


def ref_sm90(R, E, T, K, H, IH):
    T = _up(T, 128)
    P = _pool(R, E, T, K, 240, 1920)
    nsf = P // 64 * 128
    ws = _up(_signals() + E * T * 4 + P * 12, 16)
    regions, total = _lay([
        ("workspace", ws, False), ("x", T * H, True), ("x_sf", T * H // 32, True), ("topk_idx", T * K * 8, True),
        ("topk_weights", T * K * 4, True), ("l1_acts", P * H, True), ("l1_acts_sf", nsf * H // 32, True),
        ("l1_topk_weights", P * 4, False), ("l2_acts", P * IH, True), ("l2_acts_sf", nsf * IH // 16, True),
        ("combine", K * T * 2 * H, False),
    ])  # fmt: skip
    return dict(T=T, ring=P, nsf=nsf, pool=P, nsh=0, ws=ws, regions=regions, total=total)


def ref_ring(R, E, T, K, H, IH, mma, ring=None):
    T = _up(T, 384)
    er = E // R
    if ring is None:
        lo = T * R
        hi = lo if er == 1 else min(T * R * er, _up(T * R * K + er * 383, 384))
        n = _up(768 * 1024, 384) if T >= 6144 else min(4224 * 72 * 6, _up(4224 * 72 * 6 + 6 * 383, 384))
        ring = min(max(n, lo), hi)
    sf = mma == "fp8xfp4"
    eb = 1 if sf else 2
    nsf = max(ring // bm * _up(bm, 128) for bm in (8, 16, 32, 64, 96, 128, 192))
    P = _pool(R, E, T, K, 192, 384)
    ws = _up(32 + E * 16 + er * 8 + ring // 8 * 16 + E * R * T * 4 + P * 12, 16)
    chain = [("workspace", ws, False), ("x", T * H * eb, True)]
    chain += [("x_sf", T * H // 32, True)] if sf else []
    chain += [("topk_idx", T * K * 8, True), ("topk_weights", T * K * 4, True), ("l1_acts", ring * H * eb, True)]
    chain += [("l1_acts_sf", nsf * H // 32, True)] if sf else []
    chain += [("l1_topk_weights", ring * 4, False), ("l2_acts", ring * IH * eb, True)]
    chain += [("l2_acts_sf", nsf * IH // 32, True)] if sf else []
    chain += [("combine", K * T * 2 * H, False)]
    regions, total = _lay(chain)
    return dict(T=T, ring=ring, nsf=nsf if sf else 0, pool=P, nsh=0, ws=ws, regions=regions, total=total)


def ref_block_m(R, E, n, K):
    """get_block_m_for_mega_moe in NumPy float32, operation by operation."""
    f = np.float32
    e = f(f(f(n) * f(R)) * f(K)) / f(E)
    c = f(e + np.sqrt(e))
    if not e > 24:
        return 16 if e <= 10 else 32
    blocks = int(np.ceil(f(c / f(240))))
    if blocks == 1 and c > 192 and E // R < 14:
        blocks = 2
    return next((bm for bm in (64, 128, 192) if f(blocks * bm) >= c), 240)


def check_against(lay: mb.DeepGEMMLayout, want: dict) -> None:
    assert lay.num_max_tokens == want["T"]
    assert lay.num_ring_tokens == want["ring"]
    assert lay.num_sf_ring_tokens == want["nsf"]
    assert lay.num_max_pool_tokens == want["pool"]
    assert lay.num_shared_sf_tokens == want["nsh"]
    assert lay.workspace_bytes == want["ws"]
    assert lay.nbytes == want["total"]
    assert {r.name: (r.offset, r.nbytes) for r in lay.regions} == want["regions"]
    assert [r.name for r in lay.regions] == list(want["regions"])


def check_well_formed(lay: mb.DeepGEMMLayout) -> None:
    at = 0
    for r in lay.regions:
        assert r.offset == at, r.name
        at += r.nbytes
        item = np.dtype({"float8_e4m3fn": "u1", "bfloat16": "u2"}.get(r.dtype, r.dtype)).itemsize
        assert math.prod(r.shape) * item == r.nbytes, r.name
        if len(r.shape) == 2:
            mn = r.name.endswith("_sf") and r.name != "x_sf"
            assert r.strides == ((1, r.shape[0]) if mn else (r.shape[1], 1)), r.name
        assert r.role == ("input" if r.name in ("x", "x_sf", "topk_idx", "topk_weights", "shared_l1_acts_sf") else "scratch")
    assert at == lay.nbytes


# ---------------------------------------------------------------------------------------
# (a) the layouts, (b) their form


def test_signal_block():
    assert _signals() == SIGNALS


def test_worked_examples_recorded_from_deepgemm_0274ad7b():
    ex = dict(num_ranks=1)
    l = mb.deepgemm_layout("sm100", 256, 512, 6, 4096, 2048, num_shared_experts=1, num_sms=148, **ex)
    assert (l.num_max_tokens, l.num_ring_tokens, l.num_sf_ring_tokens, l.workspace_bytes, l.nbytes) == (
        1920, 3840, 61440, 28_176_768, 191_760_768)  # fmt: skip
    assert [l.region(n).offset for n in ("x", "x_sf", "topk_idx", "topk_weights", "shared_l1_acts_sf", "combine")] == [
        28_176_768, 36_041_088, 36_286_848, 36_379_008, 36_425_088, 81_660_288]  # fmt: skip
    l = mb.deepgemm_layout("sm100", 256, 512, 6, 4096, 2048, num_shared_experts=1, mma_type="fp4xfp4", num_sms=148)
    assert l.nbytes == 186_384_768 and l.region("x").offset == 28_468_608 and l.region("x_sf").offset == 32_400_768
    assert l.region("routed_topk_weights").nbytes == 291_840 and l.region("shared_l1_acts_sf") is None
    l = mb.deepgemm_layout("sm90_fp8", 256, 512, 6, 4096, 2048)
    assert (l.num_max_tokens, l.num_max_pool_tokens, l.num_sf_ring_tokens, l.workspace_bytes, l.nbytes) == (
        512, 65280, 130560, 26_642_816, 488_772_992)  # fmt: skip
    assert [l.region(n).offset for n in ("x", "x_sf", "topk_idx", "topk_weights")] == [
        26_642_816, 28_739_968, 28_805_504, 28_830_080]  # fmt: skip
    # The ring layout, recorded from DeepGEMM main 54e2261.
    l = mb.deepgemm_layout("sm100_ring", 256, 512, 6, 4096, 2048)
    assert (l.num_max_tokens, l.num_ring_tokens, l.num_sf_ring_tokens, l.workspace_bytes, l.nbytes) == (
        768, 102_912, 1_646_592, 1_643_552, 991_540_256)  # fmt: skip
    assert [l.region(n).offset for n in ("x", "x_sf", "topk_idx", "topk_weights")] == [
        1_643_552, 4_789_280, 4_887_584, 4_924_448]  # fmt: skip


SM100_SWEEP = [
    c for i, c in enumerate(itertools.product(
        ("fp8xfp4", "fp8xfp8", "bf16xbf16", "fp4xfp4"), (1, 4, 16), (1, 6, 64), (0, 5, 2000), (1, 8), (512, 7168),
        (512, 1536, 4096), (0, 1, 3), (2, 132, 148)))
    if i % 11 == 0
]  # fmt: skip


@pytest.mark.parametrize("mma,R,er,T,K,H,IH,S,sms", SM100_SWEEP)
def test_sm100_layout_is_the_reference(mma, R, er, T, K, H, IH, S, sms):
    if mma == "fp4xfp4" and IH % 512:
        IH = 2048
    lay = mb.deepgemm_layout("sm100", R * er, T, K, H, IH, num_ranks=R, num_shared_experts=S, mma_type=mma, num_sms=sms)
    check_against(lay, ref_sm100(R, R * er, T, K, H, IH, S, mma, sms))
    check_well_formed(lay)


@pytest.mark.parametrize("R,er,T,K", list(itertools.product((1, 2, 8, 72), (1, 8, 28), (1, 128, 1000, 8000), (1, 6, 40))))
def test_sm90_layout_is_the_reference(R, er, T, K):
    for H, IH in ((256, 128), (7168, 3072)):
        want = ref_sm90(R, R * er, T, K, H, IH)
        if want["pool"] > 2**23:
            with pytest.raises(ValueError, match="num_ring_tokens <= kNumMaxRingBlocks"):
                mb.deepgemm_layout("sm90_fp8", R * er, T, K, H, IH, num_ranks=R)
            continue
        lay = mb.deepgemm_layout("sm90_fp8", R * er, T, K, H, IH, num_ranks=R)
        check_against(lay, want)
        check_well_formed(lay)


@pytest.mark.parametrize("mma", ["fp8xfp4", "bf16xbf16"])
@pytest.mark.parametrize("R,er,T,K", list(itertools.product((1, 4), (1, 32), (0, 500, 6144), (1, 6))))
def test_ring_layout_is_the_reference(mma, R, er, T, K):
    lay = mb.deepgemm_layout("sm100_ring", R * er, T, K, 7168, 3072, num_ranks=R, mma_type=mma)
    check_against(lay, ref_ring(R, R * er, T, K, 7168, 3072, mma))
    check_well_formed(lay)
    lo = _up(T, 384) * R
    if lo:
        lay = mb.deepgemm_layout("sm100_ring", R * er, T, K, 7168, 3072, num_ranks=R, mma_type=mma, num_ring_tokens=lo)
        check_against(lay, ref_ring(R, R * er, T, K, 7168, 3072, mma, lo))


def test_block_m_is_the_reference():
    for R, E, K in itertools.product((1, 2, 16), (8, 64, 256), (1, 6, 8)):
        for n in itertools.chain(range(0, 3000), range(3000, 40000, 97)):
            assert mb.deepgemm_block_m(R, E, 1920, n, K) == ref_block_m(R, E, n, K), (R, E, K, n)
    lay = mb.deepgemm_layout("sm100", 256, 4096, 8, 7168, 3072, num_sms=132)
    assert lay.block_m(4096) == ref_block_m(1, 256, 4096, 8) == 192
    assert mb.deepgemm_layout("sm90_fp8", 256, 4096, 8, 7168, 3072).block_m(4096) is None


# ---------------------------------------------------------------------------------------
# (c) rejections


@pytest.mark.parametrize(
    "variant,kw,match",
    [
        ("sm90_fp8", dict(num_experts=15), r"num_experts: expected a multiple of num_ranks = 2 \(DeepGEMM: num_experts % num_ranks == 0\)"),
        ("sm90_fp8", dict(hidden=384), "positive multiple of 256 for combine vectorization"),
        ("sm90_fp8", dict(intermediate_hidden=192), "intermediate_hidden: expected a positive multiple of 128"),
        ("sm90_fp8", dict(num_max_tokens_per_rank=0), r"num_max_tokens_per_rank: expected > 0"),
        ("sm90_fp8", dict(activation="situ"), "swiglu activation only"),
        ("sm90_fp8", dict(num_shared_experts=1), "SM90 FP8 MegaMoE has no shared experts"),
        ("sm90_fp8", dict(mma_type="fp4xfp4"), "FP8 x FP8 only"),
        ("sm90_fp8", dict(num_ranks=73, num_experts=73), r"num_ranks <= kNumMaxRanks"),
        ("sm100", dict(num_sms=131), r"num_sms: expected an even SM count >= 2"),
        ("sm100", dict(num_sms=None), "num_sms: expected the SM count"),
        ("sm100", dict(hidden=640), r"hidden % 256 == 0"),
        ("sm100", dict(intermediate_hidden=64), r"\(intermediate_hidden \* 2\) % 256 == 0"),
        ("sm100", dict(mma_type="fp4xfp4", hidden=768), r"NVFP4: hidden % 512 == 0"),
        ("sm100", dict(mma_type="fp8xfp8", activation="situ"), "only FP8xFP4 MegaMoE supports situ"),
        ("sm100", dict(mma_type="int8xint8"), "mma_type: expected one of 'fp8xfp4', 'fp8xfp8', 'bf16xbf16', 'fp4xfp4'"),
        ("sm100", dict(num_shared_experts=-1), "num_shared_experts: expected an int in"),
        ("sm100", dict(num_max_tokens_per_rank=300000), "kNumMaxSharedL2Blocks"),
        ("sm100", dict(num_experts=4096, num_ranks=4), r"num_experts <= kNumMaxExperts"),
        ("sm100_ring", dict(num_ring_tokens=385), r"num_ring_tokens % kLCMCandidateBlockM == 0"),
        ("sm100_ring", dict(num_ring_tokens=384), r"num_ring_tokens: expected within \[768, "),
        ("sm100_ring", dict(mma_type="fp8xfp8"), "fp8xfp4 or bf16xbf16"),
        ("sm100_ring", dict(hidden=256), "a scale row of a multiple of 16 bytes"),
        ("sm100_ring", dict(num_shared_experts=2), "ring layout has no shared experts"),
        ("sm200", dict(), "variant: expected one of 'sm90_fp8', 'sm100', 'sm100_ring'"),
        ("sm100", dict(hidden=2**63), "hidden: 9223372036854775808 does not fit in int64"),
        ("sm100", dict(hidden=2**31), r"hidden: expected an int in \[1, 2147483647\] \(DeepGEMM takes it as int\)"),
    ],
)
def test_rejections_name_the_argument_and_the_rule(variant, kw, match):
    args = dict(num_experts=16, num_max_tokens_per_rank=256, num_topk=6, hidden=1024, intermediate_hidden=512, num_ranks=2,
                num_sms=132 if variant == "sm100" else None)  # fmt: skip
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        mb.deepgemm_layout(variant, **args)


def test_type_errors_and_block_m_rejections():
    with pytest.raises(TypeError, match="hidden: expected an int"):
        mb.deepgemm_layout("sm90_fp8", 16, 256, 6, "1024", 512)
    with pytest.raises(TypeError, match="variant: expected a str"):
        mb.deepgemm_layout(90, 16, 256, 6, 1024, 512)
    with pytest.raises(ValueError, match="num_experts: expected an int in \\[1,"):
        mb.deepgemm_block_m(1, 0, 0, 5, 6)
    with pytest.raises(ValueError, match="num_tokens: expected an int in \\[0,"):
        mb.deepgemm_block_m(1, 8, 0, -1, 6)
    with pytest.raises(ValueError, match="mma_type: expected one of"):
        mb.deepgemm_block_m(1, 8, 0, 1, 6, "fp16")


# ---------------------------------------------------------------------------------------
# (d) full-buffer staging into the buffer's input views (CPU backend)


def _shared_row(t, bm):
    """DeepGEMM's row of token t in shared_l1_acts_sf (transform_sf_token_idx)."""
    m = t % bm
    return (t // bm) * _up(bm, 128) + (m & ~127) + (m & 31) * 4 + ((m >> 5) & 3)


def _poisoned(spec):
    a = np.empty(spec.shape, np.uint8 if spec.dtype.startswith("float8") else np.dtype(spec.dtype))
    a.view(np.uint8)[...] = 0xA5
    return a


CASES = {
    "sm90_fp8": dict(variant="sm90_fp8", mma_type=None, S=0, H=512, IH=256),
    "sm100_fp8xfp4_shared": dict(variant="sm100", mma_type="fp8xfp4", S=1, H=512, IH=256),
    "sm100_fp8xfp8_2shared": dict(variant="sm100", mma_type="fp8xfp8", S=2, H=256, IH=128),
    "sm100_nvfp4_shared": dict(variant="sm100", mma_type="fp4xfp4", S=1, H=512, IH=512),
    "sm100_ring_fp8xfp4": dict(variant="sm100_ring", mma_type="fp8xfp4", S=0, H=512, IH=512),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("T", [0, 1, 129, 300])
def test_full_buffer_staging_writes_exactly_the_input_views(case, T):
    c = CASES[case]
    E, K = 16, 6
    buf = alloc_np(c["variant"], E, 300, K, c["H"], c["IH"], num_shared_experts=c["S"],
                                   mma_type=c["mma_type"], num_sms=132 if c["variant"] == "sm100" else None)  # fmt: skip
    lay = buf.layout
    M, H = lay.num_max_tokens, c["H"]
    assert not buf.storage.any()  # zero-filled as DeepGEMM's
    for r in lay.regions:  # every view is the storage's bytes at the region's offset
        v = buf.views[r.name]
        assert v.__array_interface__["data"][0] - buf.storage.__array_interface__["data"][0] == r.offset
        assert np.may_share_memory(v, buf.storage) or r.nbytes == 0
    buf.storage[...] = 0xA5
    rng = np.random.default_rng(T + len(case))
    h = (rng.standard_normal((T, H)) * 3).astype(np.float32)
    w = rng.random((T, K)).astype(np.float32)
    ids = rng.integers(0, E, (T, K)).astype(np.int32)
    pad = np.arange(T) % 7 == 2
    gs = np.array([0.5], np.float32) if c["mma_type"] == "fp4xfp4" else None
    out = buf.outputs(T)
    assert out["full_buffer"] is True and out["hidden_quant"] == lay.scheme
    megamoe.prepare_megamoe_inputs(h, w, ids, **out, is_padding=pad, global_scale=gs)

    # The same call into separately allocated outputs of the same shapes (strides too).
    q = lay.scheme
    bm = out.get("shared_block_m")
    o = megamoe.output_shapes(M, H, K, q, bm)
    sep = {n: _poisoned(getattr(o, n)) for n in ("x_fp8", "x_sf", "topk_idx_out", "topk_weights_out")}
    if bm is not None:
        rows = lay.num_shared_sf_tokens
        sep["shared_x_sf"] = np.full((buf.shared_l1_acts_sf.shape[1], rows), 0xA5A5A5A5 - 2**32, np.int32).T
        sep["shared_block_m"] = bm
    megamoe.prepare_megamoe_inputs(h, w, ids, **sep, hidden_quant=q, is_padding=pad, global_scale=gs, full_buffer=True)
    as_bytes = lambda a: np.ascontiguousarray(a).view(np.uint8)  # noqa: E731
    assert np.array_equal(as_bytes(buf.x), as_bytes(sep["x_fp8"]))
    assert np.array_equal(as_bytes(buf.x_sf), as_bytes(sep["x_sf"]))
    assert np.array_equal(buf.topk_idx, sep["topk_idx_out"])
    assert np.array_equal(as_bytes(buf.topk_weights), as_bytes(sep["topk_weights_out"]))
    if bm is not None:
        assert np.array_equal(buf.shared_l1_acts_sf, sep["shared_x_sf"])
        # DeepGEMM's permuted copy of x_sf: token t's words at row transform_sf_token_idx(t).
        t = np.arange(T)
        assert np.array_equal(buf.shared_l1_acts_sf[_shared_row(t, bm)], buf.x_sf[:T])
    # Tail rows: top-k -1 / +0.0 up to the aligned T; x and x_sf rows past T untouched.
    assert (buf.topk_idx[T:] == -1).all() and (buf.topk_weights[T:].view(np.uint32) == 0).all()
    assert (as_bytes(buf.x[T:]) == 0xA5).all() and (as_bytes(buf.x_sf[T:]) == 0xA5).all()
    # Every byte outside the input views is still poison.
    mask = np.ones(lay.nbytes, bool)
    for r in lay.inputs():
        mask[r.offset : r.offset + r.nbytes] = False
    assert (buf.storage[mask] == 0xA5).all()
    if T:
        assert not (as_bytes(buf.x[:T]) == 0xA5).all()


def test_outputs_refusals_and_views():
    b = alloc_np("sm100", 8, 64, 4, 256, 128, mma_type="bf16xbf16", num_shared_experts=1, num_sms=132)
    assert b.x_sf is None and b.shared_l1_acts is b.x and b.shared_l2_acts.dtype == np.uint16  # bf16 bits in NumPy
    with pytest.raises(ValueError, match="copy them into buf.x"):
        b.outputs(5)
    r = b.routing_outputs()
    megamoe.stage_megamoe_routing(np.ones((3, 4), np.float32), np.zeros((3, 4), np.int32), **r)
    assert (b.topk_idx[3:] == -1).all() and (b.topk_idx[:3] == 0).all()
    b = alloc_np("sm100", 8, 64, 4, 256, 128, num_shared_experts=1, num_sms=132)
    with pytest.raises(ValueError, match="num_tokens: expected the call's token count"):
        b.outputs()
    with pytest.raises(ValueError, match="x_scales"):
        b.outputs(5, scheme=megamoe.NVFP4_PER_TOKEN)
    assert b.shared_l1_acts is b.x and b.views["workspace"].shape == (b.layout.workspace_bytes,)
    assert b.l1_acts_sf.strides == (4, 4 * b.layout.num_sf_ring_tokens)
    n = alloc_np("sm100", 8, 64, 4, 512, 512, mma_type="fp4xfp4", num_shared_experts=1, num_sms=132)
    assert n.shared_l1_acts is None and n.shared_l1_acts_sf is None and n.x.shape == (1920, 256)
    s = alloc_np("sm90_fp8", 8, 64, 4, 256, 128)
    assert s.shared_l2_acts is None and s.x_sf.dtype == np.float32 and s.layout.scheme.amax_floor == np.float32(1e-10)
    assert s.outputs()["hidden_quant"] == megamoe.FP8_FP32_G128.with_amax_floor(1e-10)
    assert s.peer(0) is s
    with pytest.raises(ValueError, match="not symmetric memory"):
        s.peer(1)
    with pytest.raises(ValueError, match="allocator='numpy' allocates on the CPU"):
        mb.alloc_deepgemm_buffer("sm90_fp8", 8, 64, 4, 256, 128, allocator="numpy", device="cuda")
    with pytest.raises(ValueError, match="allocator: expected"):
        mb.alloc_deepgemm_buffer("sm90_fp8", 8, 64, 4, 256, 128, allocator="mmap")
    u = alloc_np("sm90_fp8", 8, 64, 4, 256, 128, zero=False)
    assert u.storage.shape == (u.layout.nbytes,)


def test_views_over_an_existing_buffer():
    lay = mb.deepgemm_layout("sm100", 16, 100, 4, 512, 256, num_shared_experts=1, num_sms=132)
    raw = np.zeros(lay.nbytes + 64, np.int8)  # as DeepGEMM's torch.int8 buffer, a bit larger
    buf = mb.deepgemm_views(raw, lay)
    assert buf.x.__array_interface__["data"][0] == raw.ctypes.data + lay.region("x").offset
    h = np.random.default_rng(3).standard_normal((7, 512)).astype(np.float32)
    w, ids = np.ones((7, 4), np.float32), np.arange(28, dtype=np.int32).reshape(7, 4) % 16
    megamoe.prepare_megamoe_inputs(h, w, ids, **buf.outputs(7))
    own = alloc_np("sm100", 16, 100, 4, 512, 256, num_shared_experts=1, num_sms=132)
    megamoe.prepare_megamoe_inputs(h, w, ids, **own.outputs(7))
    assert np.array_equal(raw.view(np.uint8)[: lay.nbytes], own.storage)
    with pytest.raises(ValueError, match="expected at least"):
        mb.deepgemm_views(raw[: lay.nbytes - 1], lay)
    with pytest.raises(ValueError, match="contiguous 1-D int8 or uint8"):
        mb.deepgemm_views(np.zeros(lay.nbytes, np.int16), lay)
    with pytest.raises(ValueError, match="contiguous 1-D int8 or uint8"):
        mb.deepgemm_views(np.zeros(2 * lay.nbytes, np.uint8)[::2], lay)
    with pytest.raises(TypeError, match="expected a torch tensor or NumPy array"):
        mb.deepgemm_views(bytearray(lay.nbytes), lay)


def test_nvfp4_ties_are_where_deepgemms_test_differs():
    """docs/BUFFERS.md: DeepGEMM's NVFP4 test rounds e2m1 ties to the even code, megamoe's
    NVFP4 toward zero; they differ exactly at |v| = 0.75, 1.75, 3.5 (one code)."""
    buf = alloc_np("sm100", 8, 16, 2, 512, 512, mma_type="fp4xfp4", num_sms=132)
    h = np.zeros((1, 512), np.float32)
    h[0, :8] = [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]  # amax 6: the group's scale is 1.0
    megamoe.prepare_megamoe_inputs(h, np.ones((1, 2), np.float32), np.zeros((1, 2), np.int32), **buf.outputs(1),
                                   global_scale=np.ones(1, np.float32))  # fmt: skip
    nib = np.stack([buf.x[0, :4] & 15, buf.x[0, :4] >> 4], 1).reshape(-1)
    assert buf.x_sf[0, 0] & 0xFF == 0x38  # e4m3 1.0
    ttz = [7, 0, 1, 2, 3, 4, 5, 6]
    deepgemm_test = [7, 0, 2, 2, 4, 4, 6, 6]  # its RNE helper: > 0.25, >= 0.75, > 1.25, >= 1.75, > 2.5, >= 3.5, > 5
    assert nib.tolist() == ttz
    assert [i for i in range(8) if ttz[i] != deepgemm_test[i]] == [2, 4, 6]
