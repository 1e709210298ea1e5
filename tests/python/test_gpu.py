"""GPU tests of the Python package: bitwise against PyTorch renderings of DeepGEMM's
``per_token_cast_to_fp8`` and ``per_token_cast_to_fp4`` and of FlashInfer's MXFP8 e5m2
quantization run by torch on the GPU, every format bitwise against the CPU backend (eager
and under CUDA graph capture), plus layouts, CUDA graphs, streams, torch.compile, opcheck
and the SGLang drop-ins.

Skipped unless torch.cuda.is_available() and megamoe was built with its CUDA backend.
Run on a GPU machine:
    pip install . && pytest tests/python/test_gpu.py -v
The test logic itself can be exercised on CPU tensors (the library's CPU backend; CUDA-only
tests skip):  MEGAMOE_TEST_DEVICE=cpu pytest tests/python/test_gpu.py
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import megamoe  # noqa: E402
import megamoe_npref as npref  # noqa: E402
from megamoe_testutil import SCHEMES, assert_bitwise, dlpack_capsule, is_e5m2, key  # noqa: E402

DEVICE = os.environ.get("MEGAMOE_TEST_DEVICE", "cuda")
if DEVICE == "cuda":
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device", allow_module_level=True)
    if not megamoe.has_cuda_backend():
        pytest.skip("megamoe was built without its CUDA backend", allow_module_level=True)
ON_CUDA = DEVICE.startswith("cuda")
cuda_only = pytest.mark.skipif(not ON_CUDA, reason="CUDA only")

OP = torch.ops.megamoe.prepare_inputs.default


def op_args(h, w, ids, outs, **given):
    """The custom op's arguments through the one table (megamoe._signature.PREPARE)."""
    from megamoe._signature import PREPARE
    from megamoe._torch import _op_scheme_args

    given.update(zip(("hidden_states", "topk_weights", "topk_ids", "x_fp8", "x_sf", "topk_idx_out", "topk_weights_out"),
                     (h, w, ids, *outs)))  # fmt: skip
    return tuple(PREPARE.op_values([given.get(p.name, p.default) for p in PREPARE.params], _op_scheme_args))
T_LIST = [1, 2, 7, 63, 64, 65, 127, 128, 135, 434, 4096]
H_LIST = [256, 4096, 7168]


# ---------------------------------------------------------------------------------------
# Reference: DeepGEMM's per_token_cast_to_fp8 (packed UE8M0 when the scale is UE8M0),
# written as PyTorch ops and run by torch on the same device. Finite inputs only (torch's
# fp8 cast differs from the hardware's satfinite conversion on NaN / Inf / overflow).


def per_token_cast_to_fp8(x: torch.Tensor, G: int, ue8m0: bool):
    """(fp8 bytes [T, H] uint8, x_sf) as DeepGEMM computes them with torch on x.device."""
    T, H = x.shape
    xv = x.reshape(T, H // G, G)
    amax = xv.abs().float().amax(dim=2).clamp(1e-4)
    sf = amax * (1.0 / 448.0)  # multiplication by the fp32 constant 1/448 (SPEC rule 3)
    e = None
    if ue8m0:  # ceil to a power of two through the bits (SPEC rule 4)
        b = sf.view(torch.int32)
        e = ((b >> 23) & 0xFF) + ((b & 0x7FFFFF) != 0).to(torch.int32)
        e = e.clamp(1, 254)
        sf = (e << 23).view(torch.float32)
    q = (xv.float() * (1.0 / sf.unsqueeze(2))).to(torch.float8_e4m3fn).reshape(T, H)
    if ue8m0:
        x_sf = e.to(torch.uint8).contiguous().view(torch.int32)  # 4 exponents per word, LE
    else:
        x_sf = sf
    return q.view(torch.uint8), x_sf


def mxfp8_e5m2_quantize(x: torch.Tensor, G: int = 32):
    """(e5m2 bytes [T, H] uint8, packed UE8M0 words [T, H/128] int32) of MXFP8 e5m2 as
    FlashInfer's mxfp8_e5m2 computes it, written as PyTorch ops run on x.device: per group of
    G the NaN-ignoring amax, s = amax.clamp(min=1e-4) / 57344.0, the power-of-two scale
    2^ceil(log2 s) (exponent clamped to [-126, 127]), values x * (1 / scale) cast to e5m2.
    Finite inputs only: torch's e5m2 cast rounds to nearest even like the hardware's
    satfinite conversion but overflows to Inf (which the scale rules out for finite x)."""
    T, H = x.shape
    xv = x.float().reshape(T, H // G, G)
    amax = torch.nan_to_num(xv, nan=0.0).abs().amax(dim=2)
    # A CUDA tensor divided by a Python float is multiplied by its fp32 reciprocal, fl(1/57344):
    # the contract's product. (The CPU backend of torch divides; the UE8M0 exponent comes out
    # the same here.)
    s = amax.clamp(min=1e-4) / 57344.0
    # ceil(log2 s) exactly, from frexp (s = m 2^x, m in [0.5, 1): x - 1 when m == 0.5, else x):
    # FlashInfer rounds the scale up to a power of two in hardware (cvt.rp.satfinite.ue8x2),
    # where a log2 can miss both ways: in float32 a value just above a power of two rounds
    # to the integer below, and CUDA's float64 log2 of an exact power of two may land just
    # above it (bf16 amaxes of 1.75 * 2^n give such s exactly).
    m, x2 = torch.frexp(s)
    e = torch.where(m == 0.5, x2 - 1, x2).clamp(-126, 127).to(torch.int32)
    scale = ((e + 127) << 23).view(torch.float32)  # 2^e, exact
    q = (xv * (1 / scale).unsqueeze(2)).to(torch.float8_e5m2).reshape(T, H)
    x_sf = (e + 127).to(torch.uint8).contiguous().view(torch.int32)  # 4 exponent bytes per word, LE
    return q.view(torch.uint8), x_sf


def topk_ref(w: torch.Tensor, ids: torch.Tensor, pad):
    idx = ids.long()
    # Exact IEEE widening, NaN payloads kept (the contract; CUDA's own half->float returns a
    # canonical NaN, so widen on the host where NumPy/x86 keep the payload).
    wf = torch.from_numpy(w.cpu().numpy().astype("float32")).to(w.device) if w.dtype == torch.float16 else w.float()
    if pad is not None:
        p = pad.bool().unsqueeze(1)
        idx = torch.where(p, torch.full_like(idx, -1), idx)
        wf = torch.where(p, torch.zeros_like(wf), wf)
    return idx, wf


def same_bits(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Bitwise equality (on the device; numpy only to report the first mismatch)."""
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert got.element_size() == want.element_size(), what
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[got.element_size()]
    g, w = got.contiguous().view(ints), want.contiguous().view(ints)
    if not torch.equal(g, w):
        assert_bitwise(g.cpu().numpy(), w.cpu().numpy(), what)


def check(h, w, ids, outs, scheme, pad=None) -> None:
    x_fp8, x_sf, idx, wo = outs
    if is_e5m2(scheme):
        q, sf = mxfp8_e5m2_quantize(h, scheme.group_k)
    else:
        q, sf = per_token_cast_to_fp8(h, scheme.group_k, scheme.ue8m0)
    same_bits(x_fp8.view(torch.uint8), q, "x_fp8")
    same_bits(x_sf, sf, "x_sf")
    ridx, rw = topk_ref(w, ids, pad)
    same_bits(idx, ridx, "topk_idx_out")
    same_bits(wo, rw, "topk_weights_out")


# ---------------------------------------------------------------------------------------
# Inputs and outputs


def gen(seed: int) -> torch.Generator:
    g = torch.Generator(device=DEVICE)
    g.manual_seed(seed)
    return g


def hidden(T: int, H: int, dtype=torch.bfloat16, seed: int = 0) -> torch.Tensor:
    """randn * 17 with a per-(token, 32-group) power-of-two spread, a zero row and a tiny
    row; finite in every dtype."""
    g = gen(seed)
    x = torch.randn(T, H, generator=g, device=DEVICE) * 17
    k = torch.randint(-8, 9, (T, H // 32, 1), generator=g, device=DEVICE).float()
    x = (x.view(T, H // 32, 32) * torch.exp2(k)).view(T, H)
    if T > 2:
        x[1] = 0
        x[2] *= 1e-6
    return x.to(dtype)


def routing(T: int, K: int = 8, wdtype=torch.float32, idtype=torch.int32, seed: int = 1):
    g = gen(seed)
    w = torch.rand(T, K, generator=g, device=DEVICE).to(wdtype)
    ids = torch.randint(0, 384, (T, K), generator=g, device=DEVICE, dtype=idtype)
    return w, ids


def sf_cols(H: int, s) -> int:
    return H // (4 * s.group_k) if s.ue8m0 else H // s.group_k


def outputs(T: int, H: int, K: int, s, x_dtype=None):
    """Poisoned outputs; x_fp8 is the scheme's fp8 dtype unless ``x_dtype`` says."""
    if x_dtype is None:
        x_dtype = torch.float8_e5m2 if is_e5m2(s) else torch.float8_e4m3fn
    return [
        torch.full((T, H), 0xA5, dtype=torch.uint8, device=DEVICE).view(x_dtype),
        torch.full((T, sf_cols(H, s)), 0x5A5A5A5A, dtype=torch.int32, device=DEVICE).view(
            torch.int32 if s.ue8m0 else torch.float32
        ),
        torch.full((T, K), -7, dtype=torch.int64, device=DEVICE),
        torch.full((T, K), -7.0, dtype=torch.float32, device=DEVICE),
    ]


def valid(s, H: int) -> bool:
    return not s.ue8m0 or (H // s.group_k) % 4 == 0


def sync() -> None:
    if ON_CUDA:
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------
# The reference cases


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("H", H_LIST)
@pytest.mark.parametrize("T", T_LIST)
def test_reference_cases(T, H, name):
    s = SCHEMES[name]
    if not valid(s, H):
        pytest.skip("UE8M0 with G=128 needs H % 512 == 0")
    h = hidden(T, H, seed=T * 7 + H)
    w, ids = routing(T)
    pad = torch.arange(T, device=DEVICE) % 5 == 4
    outs = outputs(T, H, 8, s)
    megamoe.prepare_megamoe_inputs(h, w, ids, *outs, is_padding=pad, hidden_quant=s)
    sync()
    check(h, w, ids, outs, s, pad)


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("T", [7, 434, 4096])
def test_hidden_dtypes(T, dtype, name):
    s = SCHEMES[name]
    H = 7168
    h = hidden(T, H, dtype, seed=T)
    w, ids = routing(T)
    outs = outputs(T, H, 8, s)
    megamoe.prepare_megamoe_inputs(h, w, ids, *outs, hidden_quant=s)
    sync()
    check(h, w, ids, outs, s)


@pytest.mark.parametrize("H", [4096, 7168])
@pytest.mark.parametrize("T", [1, 64, 4096])
def test_mxfp8_e5m2_matches_torch_rendering(T, H):
    """MXFP8_E5M2 staging on the test device, bit for bit against FlashInfer's mxfp8_e5m2
    written as PyTorch ops and run by torch on the same device (mxfp8_e5m2_quantize): the
    e5m2 bytes of x_fp8 (a torch.float8_e5m2 tensor, compared as uint8) and the UE8M0 bytes
    of x_sf; in bf16 and in float32, whose inputs the bf16 grid does not round first."""
    s = megamoe.MXFP8_E5M2
    w, ids = routing(T)
    for dtype in (torch.bfloat16, torch.float32):
        h = hidden(T, H, dtype, seed=T + H)
        if dtype == torch.float32:
            h = h * (1 + torch.rand(T, H, generator=gen(T), device=DEVICE) * 2.0**-7)  # off the bf16 grid
        outs = outputs(T, H, 8, s)
        assert outs[0].dtype == torch.float8_e5m2
        megamoe.prepare_megamoe_inputs(h, w, ids, *outs, hidden_quant=s)
        sync()
        q, sf = mxfp8_e5m2_quantize(h)
        same_bits(outs[0].view(torch.uint8), q, f"x_fp8 (e5m2 bytes) {dtype}")
        same_bits(outs[1].view(torch.uint8), sf.view(torch.uint8), f"x_sf (UE8M0 bytes) {dtype}")
        assert not torch.any((outs[0].view(torch.uint8) & 0x7F) > 0x7B)  # no Inf / NaN byte for finite x


@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("idtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("pdtype", [torch.bool, torch.uint8])
@pytest.mark.parametrize("T", [1, 65, 4096])
def test_padding_with_nan_weights(T, pdtype, idtype, wdtype):
    H, K = 256, 6
    h = hidden(T, H)
    w, ids = routing(T, K, wdtype, idtype)
    pad_base = torch.zeros(2 * T, dtype=pdtype, device=DEVICE)
    pad_base[::6] = 3 if pdtype == torch.uint8 else True  # nonzero byte = padded
    pad = pad_base[::2]  # a strided mask: every 3rd token padded
    w[pad.bool()] = float("nan")
    if T > 1:
        w[1, 0] = float("nan")  # kept NaN weight stays NaN
    outs = outputs(T, H, K, megamoe.MXFP8)
    megamoe.prepare_megamoe_inputs(h, w, ids, *outs, is_padding=pad)
    sync()
    check(h, w, ids, outs, megamoe.MXFP8, pad)
    assert torch.all(outs[2][pad.bool()] == -1)
    assert torch.all(outs[3][pad.bool()].view(torch.int32) == 0)  # +0.0 exactly


@pytest.mark.parametrize("name", ["MXFP8", "FP8_UE8M0_G128", "MXFP8_E5M2"])
@pytest.mark.parametrize("bm", [1, 64, 96, 128, 192, 256])
@pytest.mark.parametrize("T", [1, 65, 434, 4096])
def test_shared_x_sf_transposed_view(T, bm, name):
    s = SCHEMES[name]
    H = 7168
    h = hidden(T, H, seed=bm)
    w, ids = routing(T)
    R = npref.shared_rows_required(T, bm) + 3
    W = sf_cols(H, s)
    shared = torch.full((W, R), 0x5A5A5A5A, dtype=torch.int32, device=DEVICE).t()  # MN-major
    outs = outputs(T, H, 8, s)
    megamoe.prepare_megamoe_inputs(h, w, ids, *outs, shared_x_sf=shared, shared_block_m=bm,
                                   hidden_quant=s)  # fmt: skip
    sync()
    check(h, w, ids, outs, s)
    rows = torch.from_numpy(npref.shared_row(np.arange(T), bm)).to(DEVICE)
    same_bits(shared[rows], outs[1], "shared_x_sf")
    untouched = torch.ones(R, dtype=torch.bool, device=DEVICE)
    untouched[rows] = False
    assert torch.all(shared[untouched] == 0x5A5A5A5A)


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("T", [1, 7, 64, 135, 4096])
def test_noncontiguous_hidden(T, name):
    s = SCHEMES[name]
    H = 4096
    base = hidden(T, H, seed=3)
    w, ids = routing(T)
    views = {
        "transposed": base.t().contiguous().t(),
        "column_slice": torch.cat([torch.zeros(T, 64, dtype=base.dtype, device=DEVICE), base,
                                   torch.zeros(T, 64, dtype=base.dtype, device=DEVICE)], 1)[:, 64:64 + H],
        "row_stride": torch.cat([base, base], 1)[:, :H],
        "every_other_column": torch.stack([base, base], 2).reshape(T, 2 * H)[:, ::2],
    }  # fmt: skip
    for label, h in views.items():
        assert torch.equal(h, base), label
        outs = outputs(T, H, 8, s)
        megamoe.prepare_megamoe_inputs(h, w.t().contiguous().t(), ids, *outs, hidden_quant=s)
        sync()
        check(base, w, ids, outs, s)


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("T", [1, 63, 135, 4096])
@pytest.mark.parametrize("H", [256, 7168])
def test_misaligned_pointers(T, H, name):
    """Every tensor starts one element past an aligned address."""
    s = SCHEMES[name]
    if not valid(s, H):
        pytest.skip("UE8M0 with G=128 needs H % 512 == 0")
    K = 8

    def off1(shape, dtype, fill=0):
        n = int(np.prod(shape))
        return torch.full((n + 1,), fill, dtype=dtype, device=DEVICE)[1:].view(shape)

    base = hidden(T, H, seed=5)
    w0, ids0 = routing(T, K)
    h = off1((T, H), base.dtype)
    h.copy_(base)
    w = off1((T, K), w0.dtype)
    w.copy_(w0)
    ids = off1((T, K), ids0.dtype)
    ids.copy_(ids0)
    pad = off1((T,), torch.bool)
    pad[::3] = True
    outs = [
        off1((T, H), torch.uint8, 0xA5),
        off1((T, sf_cols(H, s)), torch.int32 if s.ue8m0 else torch.float32, 7),
        off1((T, K), torch.int64, 7),
        off1((T, K), torch.float32, 7),
    ]
    for o in outs:
        assert o.data_ptr() % 16 != 0
    megamoe.prepare_megamoe_inputs(h, w, ids, *outs, is_padding=pad, hidden_quant=s)
    sync()
    check(base, w0, ids0, outs, s, pad)


@pytest.mark.parametrize("T", [1, 65, 434, 4096])
def test_strided_outputs(T):
    """Transposed x_fp8, DeepGEMM SM90's MN-major TMA-aligned fp32 x_sf (scale of token t,
    group g at g * align(T, 4) + t), column-strided top-k outputs."""
    s = megamoe.FP8_FP32_G128
    H, K = 7168, 8
    h = hidden(T, H, seed=9)
    w, ids = routing(T, K)
    aligned = (T + 3) // 4 * 4
    sf_buf = torch.full((H // 128, aligned), 7.0, device=DEVICE)
    outs = [
        torch.full((H, T), 0xA5, dtype=torch.uint8, device=DEVICE).t(),
        sf_buf[:, :T].t(),
        torch.full((T, 2 * K), 7, dtype=torch.int64, device=DEVICE)[:, ::2],
        torch.full((K, T), 7.0, device=DEVICE).t(),
    ]
    megamoe.prepare_megamoe_inputs(h, w, ids, *outs, hidden_quant=s)
    sync()
    check(h, w, ids, outs, s)
    assert torch.all(sf_buf[:, T:] == 7.0)


@pytest.mark.parametrize("name", SCHEMES)
def test_gpu_matches_cpu_backend_on_special_values(name):
    """NaN (both signs), +-Inf, huge and subnormal inputs: CUDA and CPU backends give the
    same bytes, and both match the hardware-semantics NumPy reference."""
    s = SCHEMES[name]
    T, H = 300, 7168
    x = npref.hidden_sample(np.random.default_rng(0), T, H, specials=True)
    x[4, 32:64] = np.nan
    h_cpu = torch.from_numpy(x)
    w_cpu, ids_cpu = torch.rand(T, 8), torch.randint(0, 9, (T, 8), dtype=torch.int32)
    got = []
    for dev in ("cuda", "cpu") if ON_CUDA else ("cpu", "cpu"):
        outs = [
            torch.full((T, H), 0xA5, dtype=torch.uint8, device=dev),
            torch.zeros((T, sf_cols(H, s)), dtype=torch.int32 if s.ue8m0 else torch.float32, device=dev),
            torch.zeros((T, 8), dtype=torch.int64, device=dev),
            torch.zeros((T, 8), dtype=torch.float32, device=dev),
        ]  # fmt: skip
        megamoe.prepare_megamoe_inputs(h_cpu.to(dev), w_cpu.to(dev), ids_cpu.to(dev), *outs,
                                       hidden_quant=s)  # fmt: skip
        got.append([o.cpu() for o in outs])
    want = npref.stage(x, w_cpu.numpy(), ids_cpu.numpy(), s.group_k, s.ue8m0, e5m2=is_e5m2(s))
    for g_cuda, g_cpu, wnt, nm in zip(got[0], got[1], want, ("x_fp8", "x_sf", "idx", "w")):
        same_bits(g_cuda, g_cpu, nm + " cuda vs cpu")
        assert_bitwise(g_cuda.numpy(), wnt, nm + " cuda vs numpy reference")


# ---------------------------------------------------------------------------------------
# Big problems


def test_more_tokens_than_grid_rows():
    T, H = 70000, 256
    h = hidden(T, H, seed=1)
    w, ids = routing(T)
    outs = outputs(T, H, 8, megamoe.MXFP8)
    megamoe.prepare_megamoe_inputs(h, w, ids, *outs)
    sync()
    check(h, w, ids, outs, megamoe.MXFP8)


@cuda_only
def test_more_than_2_31_elements():
    H = 7168
    T = 2**31 // H + 300
    free, _ = torch.cuda.mem_get_info()
    if free < 3.5 * T * H + (2 << 30):
        pytest.skip("not enough free device memory")
    h = torch.empty(T, H, dtype=torch.bfloat16, device=DEVICE)
    for i in range(0, T, 32768):
        h[i:i + 32768] = hidden(min(32768, T - i), H, seed=i)
    w, ids = routing(T)
    x_fp8 = torch.full((T, H), 0xA5, dtype=torch.uint8, device=DEVICE)
    x_sf = torch.zeros(T, H // 128, dtype=torch.int32, device=DEVICE)
    idx = torch.zeros(T, 8, dtype=torch.int64, device=DEVICE)
    wo = torch.zeros(T, 8, device=DEVICE)
    megamoe.prepare_megamoe_inputs(h, w, ids, x_fp8, x_sf, idx, wo)
    sync()
    boundary = 2**31 // H
    for lo, hi in [(0, 256), (boundary - 256, boundary + 256), (T - 512, T)]:
        check(h[lo:hi], w[lo:hi], ids[lo:hi], [x_fp8[lo:hi], x_sf[lo:hi], idx[lo:hi], wo[lo:hi]],
              megamoe.MXFP8)  # fmt: skip


# ---------------------------------------------------------------------------------------
# Streams, CUDA graphs, PDL


@cuda_only
@pytest.mark.parametrize("explicit", [False, True])
def test_side_stream(explicit):
    T, H = 434, 7168
    h = hidden(T, H)
    w, ids = routing(T)
    outs = outputs(T, H, 8, megamoe.MXFP8)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    if explicit:
        megamoe.prepare_megamoe_inputs(h, w, ids, *outs, stream=s.cuda_stream)
    else:
        with torch.cuda.stream(s):
            megamoe.prepare_megamoe_inputs(h, w, ids, *outs)
    s.synchronize()
    check(h, w, ids, outs, megamoe.MXFP8)


@cuda_only
@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("T", [1, 64, 4096])
def test_cuda_graph_capture_and_replay(T, pdl, name):
    s = SCHEMES[name]
    H = 7168
    h = hidden(T, H, seed=1)
    w, ids = routing(T)
    pad = torch.zeros(T, dtype=torch.bool, device=DEVICE)
    shared, bm = None, None
    if s.ue8m0:
        bm = 64
        shared = torch.zeros((npref.shared_rows_required(T, bm), sf_cols(H, s)), dtype=torch.int32,
                             device=DEVICE)  # fmt: skip
    outs = outputs(T, H, 8, s)

    def step():
        h2 = h * 2  # a producer kernel right before staging (what PDL overlaps with)
        megamoe.prepare_megamoe_inputs(h2, w, ids, *outs, is_padding=pad, shared_x_sf=shared,
                                       shared_block_m=bm, hidden_quant=s, enable_pdl=pdl)  # fmt: skip

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture, as torch recommends
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for seed in (11, 12):  # new data in the static inputs, then replay
        h.copy_(hidden(T, H, seed=seed))
        w2, ids2 = routing(T, seed=seed)
        w.copy_(w2)
        ids.copy_(ids2)
        pad.copy_(torch.arange(T, device=DEVICE) % (seed - 8) == 0)
        for o in outs:
            o.view(torch.uint8).fill_(0xA5)
        graph.replay()
        torch.cuda.synchronize()
        check(h * 2, w, ids, outs, s, pad)
        if shared is not None:
            rows = torch.from_numpy(npref.shared_row(np.arange(T), bm)).to(DEVICE)
            same_bits(shared[rows], outs[1], "shared_x_sf")


@cuda_only
def test_pdl_back_to_back():
    T, H = 4096, 7168
    h = hidden(T, H)
    w, ids = routing(T)
    outs = outputs(T, H, 8, megamoe.MXFP8)
    for _ in range(3):
        h2 = h + 0  # the previous kernel writes what staging reads
        megamoe.prepare_megamoe_inputs(h2, w, ids, *outs, enable_pdl=True)
    sync()
    check(h, w, ids, outs, megamoe.MXFP8)


# ---------------------------------------------------------------------------------------
# PyTorch integration


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("padded", [False, True])
def test_opcheck(name, padded):
    s = SCHEMES[name]
    T, H = 135, 7168
    h = hidden(T, H)
    w, ids = routing(T)
    # uint8 x_fp8: opcheck's schema test compares outputs with allclose, which torch does not
    # implement for float8; test_opcheck_fp8 covers the fp8 dtype with the other checks.
    outs = outputs(T, H, 8, s, x_dtype=torch.uint8)
    pad = (torch.arange(T, device=DEVICE) % 3 == 0) if padded else None
    shared, bm = None, None
    if s.ue8m0 and padded:
        bm = 128
        shared = torch.zeros((npref.shared_rows_required(T, bm), sf_cols(H, s)), dtype=torch.int32,
                             device=DEVICE)  # fmt: skip
    args = op_args(h, w, ids, outs, is_padding=pad, shared_x_sf=shared, shared_block_m=bm, hidden_quant=s)
    torch.library.opcheck(OP, args)


def test_opcheck_fp8():
    T, H = 64, 4096
    h = hidden(T, H)
    w, ids = routing(T)
    outs = outputs(T, H, 8, megamoe.MXFP8)
    args = op_args(h, w, ids, outs, enable_pdl=True)
    torch.library.opcheck(
        OP, args, test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    )


@pytest.mark.parametrize(
    "hq",
    [megamoe.MXFP8, megamoe.FP8_FP32_G128, key(elem=torch.float8_e4m3fn, sdtype=torch.float8_e8m0fnu, G=128),
     megamoe.MXFP8_E5M2, key(elem=torch.float8_e5m2, sdtype=torch.float8_e8m0fnu, G=32)],
    ids=["MXFP8", "FP8_FP32_G128", "QuantKey_ue8m0_g128", "MXFP8_E5M2", "QuantKey_e5m2"],
)
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_torch_compile_fullgraph(hq, mode):
    s = megamoe.as_scheme(hq)
    T, H = 135, 7168
    h = hidden(T, H)
    w, ids = routing(T)
    pad = torch.arange(T, device=DEVICE) % 7 == 0
    outs = outputs(T, H, 8, s)

    def layer(h, w, ids, pad, a, b, c, d):
        x = h * 2  # fused by Inductor before the op
        megamoe.prepare_megamoe_inputs(x, w, ids, a, b, c, d, is_padding=pad, hidden_quant=hq)
        return d.sum()

    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, mode=mode)
    for seed in (0, 1, 2):
        h = hidden(T, H, seed=seed)
        compiled(h, w, ids, pad, *outs)
        sync()
        check(h * 2, w, ids, outs, s, pad)


@cuda_only
def test_torch_compile_inside_cuda_graph():
    T, H = 64, 7168
    h = hidden(T, H)
    w, ids = routing(T)
    outs = outputs(T, H, 8, megamoe.MXFP8)
    compiled = torch.compile(lambda *a: megamoe.prepare_megamoe_inputs(*a), fullgraph=True)
    compiled(h, w, ids, *outs)  # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        compiled(h, w, ids, *outs)
    h.copy_(hidden(T, H, seed=4))
    g.replay()
    torch.cuda.synchronize()
    check(h, w, ids, outs, megamoe.MXFP8)


def test_fake_tensor_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        h = torch.empty(16, 512, dtype=torch.bfloat16, device=DEVICE)
        w = torch.empty(16, 8, device=DEVICE)
        ids = torch.empty(16, 8, dtype=torch.int32, device=DEVICE)
        outs = [torch.empty(16, 512, dtype=torch.float8_e4m3fn, device=DEVICE),
                torch.empty(16, 4, dtype=torch.int32, device=DEVICE),
                torch.empty(16, 8, dtype=torch.int64, device=DEVICE),
                torch.empty(16, 8, device=DEVICE)]  # fmt: skip
        megamoe.prepare_megamoe_inputs(h, w, ids, *outs)


@pytest.mark.parametrize("name", SCHEMES)
def test_stage_and_dequantize(name):
    s = SCHEMES[name]
    T, H = 135, 7168
    h = hidden(T, H)
    w, ids = routing(T)
    out = megamoe.stage(h, w, ids, hidden_quant=s, shared_block_m=128 if s.ue8m0 else None)
    assert out.x_fp8.dtype == (torch.float8_e5m2 if is_e5m2(s) else torch.float8_e4m3fn)
    assert out.x_fp8.device == h.device
    sync()
    check(h, w, ids, list(out[:4]), s)
    deq = megamoe.dequantize(out.x_fp8, out.x_sf, s)
    assert deq.device == h.device and deq.dtype == torch.float32
    deq_np = megamoe.dequantize(out.x_fp8.view(torch.uint8).cpu().numpy(), out.x_sf.cpu().numpy(), s)
    assert_bitwise(deq.cpu().numpy(), deq_np, "dequantize")
    x = h.float()
    amax = x.reshape(T, -1, s.group_k).abs().amax(2, keepdim=True).clamp(1e-4)
    # half an ulp (e4m3: 3 mantissa bits, e5m2: 2), or half the smallest subnormal (e4m3:
    # 2^-9, e5m2: 2^-16) of a scale of at most 2 amax / max
    rel, fmax, sub = (2.0**-3, 57344.0, 2.0**-17) if is_e5m2(s) else (2.0**-4, 448.0, 2.0**-10)
    bound = x.abs() * rel + (amax * (2.0 / fmax) * sub).expand(-1, -1, s.group_k).reshape(T, H)
    assert torch.all((deq - x).abs() <= bound)


def test_zero_tokens():
    h = torch.empty(0, 7168, dtype=torch.bfloat16, device=DEVICE)
    w, ids = routing(0)
    outs = outputs(0, 7168, 8, megamoe.MXFP8)
    megamoe.prepare_megamoe_inputs(h, w, ids, *outs)
    sync()


@cuda_only
def test_device_mismatch_is_value_error():
    T, H = 4, 256
    h = hidden(T, H)
    w, ids = routing(T)
    outs = outputs(T, H, 8, megamoe.MXFP8)
    outs[2] = outs[2].cpu()
    with pytest.raises(ValueError, match=re.escape("megamoe: topk_idx_out: expected device cuda:0, got device cpu")):
        megamoe.prepare_megamoe_inputs(h, w, ids, *outs)
    if torch.cuda.device_count() > 1:
        outs[2] = outs[3].to("cuda:1").long()
        with pytest.raises(ValueError, match="expected device cuda:0, got device cuda:1"):
            megamoe.prepare_megamoe_inputs(h, w, ids, *outs)


# ---------------------------------------------------------------------------------------
# Every format: CUDA against the CPU backend, MXFP4 against DeepGEMM's fp4 cast

from megamoe_testutil import ALL_SCHEMES  # noqa: E402

TORCH_DTYPES = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2, "uint8": torch.uint8,
                "int32": torch.int32, "int64": torch.int64, "float32": torch.float32}  # fmt: skip
GLOBAL_SCALE = 0.37


def outputs_any(T, H, K, s, device, rows=None):
    """Poisoned outputs (dict by argument name) of any format from megamoe.output_shapes."""
    o = megamoe.output_shapes(T if rows is None else rows, H, K, s)
    out = {}
    for name in ("x_fp8", "x_sf", "topk_idx_out", "topk_weights_out", "x_scales"):
        spec = getattr(o, name)
        if spec is not None:
            out[name] = torch.empty(spec.shape, dtype=TORCH_DTYPES[spec.dtype], device=device)
            out[name].view(torch.uint8).fill_(0xA5)
    gs = torch.tensor([GLOBAL_SCALE], device=device) if o.global_scale is not None else None
    return out, gs


def stage_on(device, h, w, ids, s, pad=None, count=False, **kw):
    T, H = h.shape
    out, gs = outputs_any(T, H, w.shape[1], s, device, kw.get("rows"))
    kw.pop("rows", None)
    c = torch.zeros(1, dtype=torch.int64, device=device) if count else None
    megamoe.prepare_megamoe_inputs(h.to(device), w.to(device), ids.to(device), **out,
                                   is_padding=None if pad is None else pad.to(device), hidden_quant=s,
                                   global_scale=gs, nonfinite_count=c, **kw)  # fmt: skip
    sync()
    res = {k: v.cpu() for k, v in out.items()}
    if c is not None:
        res["count"] = c.cpu()
    return res


def same_all(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys(), what
    for k in a:
        same_bits(a[k], b[k], f"{what}: {k}")


@cuda_only
@pytest.mark.parametrize("name", ALL_SCHEMES)
@pytest.mark.parametrize("T,H", [(1, 256), (7, 4096), (135, 7168), (4096, 7168)])
def test_every_format_cuda_matches_cpu_backend(name, T, H):
    """Special values (NaN both signs, +-Inf, huge, subnormal) and the non-finite counter:
    the CUDA backend's bytes are the CPU backend's (both are the contract's)."""
    s = ALL_SCHEMES[name]
    if s.ue8m0 and (H // s.group_k) % 4:
        pytest.skip("UE8M0 needs H/G to be a multiple of 4")
    x = npref.hidden_sample(np.random.default_rng(T + H), T, H, specials=T > 2)
    h = torch.from_numpy(x).to(torch.bfloat16)
    w, ids = torch.rand(T, 8), torch.randint(0, 384, (T, 8), dtype=torch.int32)
    pad = torch.arange(T) % 5 == 4
    got = stage_on("cuda", h, w, ids, s, pad, count=True)
    want = stage_on("cpu", h, w, ids, s, pad, count=True)
    same_all(got, want, f"{name} cuda vs cpu")


@cuda_only
@pytest.mark.parametrize("name", ALL_SCHEMES)
@pytest.mark.parametrize("T,H", [(1, 256), (9, 4096), (135, 7168), (4096, 7168)])
def test_every_format_cuda_amax_floor_zero(name, T, H):
    """Amax floor 0 (the unit scale, CONTRACT.md "Amax floor 0") on CUDA: zero, -0.0 and NaN
    rows, a zero half row, rows scaled to 2^-100 .. 2^-134 (fp32 scales at s <= 2^-128,
    NVFP4 per-token rows below 2^-100): the CPU backend's bytes and the NumPy reference's."""
    s = ALL_SCHEMES[name].with_amax_floor(0.0)
    if s.ue8m0 and (H // s.group_k) % 4:
        pytest.skip("UE8M0 needs H/G to be a multiple of 4")
    x = npref.hidden_sample(np.random.default_rng(T + H + 1), T, H, specials=T > 2)
    for t in range(T):
        r = t % 8
        if r == 1:
            x[t] = 0.0
        elif r == 2:
            x[t] = -0.0
        elif r == 3:
            x[t] = np.nan
        elif r == 4:
            x[t, : H // 2] = 0.0
        elif r >= 5:  # finite, row max 2^-100, 2^-117, 2^-134
            f = np.where(np.isfinite(x[t]), x[t], np.float32(1.0))
            x[t] = np.ldexp(f / np.abs(f).max(), -100 - 17 * (r - 5))
    h = torch.from_numpy(x).to(torch.bfloat16)
    w, ids = torch.rand(T, 8), torch.randint(0, 384, (T, 8), dtype=torch.int32)
    got = stage_on("cuda", h, w, ids, s, count=True)
    want = stage_on("cpu", h, w, ids, s, count=True)
    same_all(got, want, f"{name} floor 0 cuda vs cpu")
    ref = npref.stage_any(npref.FORMATS[s.name.split("+")[0]], h.float().numpy(), w.numpy(), ids.numpy(), floor=0.0,
                          global_scale=GLOBAL_SCALE)  # fmt: skip
    assert_bitwise(got["x_fp8"].view(torch.uint8).numpy(), ref.x_q, "x_fp8")
    assert_bitwise(got["x_sf"].numpy(), ref.x_sf, "x_sf")
    if ref.x_scales is not None:
        assert_bitwise(got["x_scales"].numpy(), ref.x_scales, "x_scales")


@cuda_only
@pytest.mark.parametrize("name", ALL_SCHEMES)
@pytest.mark.parametrize("T", [0, 1, 65, 4096, 20000])
@pytest.mark.parametrize("option", ["full_buffer", "scaled", "both"])
@pytest.mark.parametrize("layout", ["aligned", "misaligned"])
def test_every_format_cuda_full_buffer_and_scaling(name, T, option, layout):
    """Full-buffer mode and the routed scaling factor on CUDA: the CPU backend's bytes. T
    and the layout span the plans: split-topk (T = 1, 65, 4096: the tail in the staging
    launch's own top-k blocks), the loop shape (T = 20000 at H = 7168) and the generic
    kernel (hidden rows 2 bytes off alignment), both followed by a routing-only launch for
    the tail; the row kernel for NVFP4 per-token; T = 0 (only the tail). The scaling factor
    in every kernel's repack; padded rows carry NaN weights, bf16 weights on odd T."""
    if layout == "misaligned" and T > 4096:
        pytest.skip("the generic kernel's shapes are covered at T <= 4096")
    if option == "scaled" and T == 0:
        pytest.skip("without a tail T = 0 launches nothing")
    s = ALL_SCHEMES[name]
    H, K = 7168, 8
    h = hidden(max(T, 1), H, seed=3)[:T]
    if layout == "misaligned":
        wide = torch.empty(T, H + 1, dtype=h.dtype, device=h.device)
        wide[:, 1:] = h
        h = wide[:, 1:]  # rows 2 bytes past 16-byte alignment
    g = gen(T + 7)
    w = torch.rand(T, K, generator=g, device=DEVICE)
    pad = torch.arange(T, device=DEVICE) % 5 == 4
    w[pad] = float("nan")
    if T % 2:
        w = w.to(torch.bfloat16)
    ids = torch.randint(0, 384, (T, K), generator=g, device=DEVICE, dtype=torch.int32)
    kw = {}
    if option in ("full_buffer", "both"):
        kw.update(full_buffer=True, rows=T + 63)
    if option in ("scaled", "both"):
        kw.update(routed_scaling_factor=2.5)
    got = stage_on("cuda", h, w, ids, s, pad, **kw)
    want = stage_on("cpu", h.cpu(), w.cpu(), ids.cpu(), s, pad.cpu(), **kw)
    same_all(got, want, f"{name} T={T} {option} {layout}")


def per_token_cast_to_fp4(x: torch.Tensor, gran_k: int = 32):
    """DeepGEMM's per_token_cast_to_fp4(x, use_ue8m0=True, gran_k, use_packed_ue8m0=True),
    written as PyTorch ops (x: [T, H], H a multiple of gran_k): (packed e2m1 bytes [T, H/2]
    uint8, packed UE8M0 words [T, H/(4 gran_k)] int32). Ties toward zero (bucketize of the
    midpoints), the sign only on nonzero codes. Finite inputs (torch's clamp and bucketize
    propagate NaN differently from the hardware rule)."""
    T, H = x.shape
    xv = x.view(T, H // gran_k, gran_k)
    amax = xv.abs().float().amax(dim=2).clamp_min(1e-4)
    bits = (amax / 6.0).view(torch.int32)
    e = (((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(torch.int32)).clamp(1, 254)
    sf = (e << 23).view(torch.float32)
    scaled = xv * (1.0 / sf.unsqueeze(2))  # bf16 * fp32 -> fp32, as in DeepGEMM
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], device=x.device, dtype=torch.float32)
    idx = torch.bucketize(scaled.abs().clamp_max(6.0), mids)
    code = idx.to(torch.uint8) | (((scaled < 0) & (idx != 0)).to(torch.uint8) << 3)
    code = code.view(T, H)
    packed = (code[:, 0::2] & 0x0F) | ((code[:, 1::2] & 0x0F) << 4)
    return packed.contiguous(), e.to(torch.uint8).contiguous().view(torch.int32)


@pytest.mark.parametrize("T", [1, 7, 64, 135, 4096])
@pytest.mark.parametrize("H", [256, 4096, 7168])
@pytest.mark.parametrize("xdtype", [torch.uint8, torch.int8])
def test_mxfp4_matches_deepgemm_per_token_cast_to_fp4(T, H, xdtype):
    """vLLM's MXFP4 drop-in (default scheme, uint8/int8 x_fp8 of width H/2): bit-exact with
    DeepGEMM's reference fp4 cast run by torch on the same GPU."""
    h = hidden(T, H, seed=T + H)
    w, ids = routing(T)
    x = torch.full((T, H // 2), 0xA5, dtype=torch.uint8, device=DEVICE).view(xdtype)
    sf = torch.full((T, H // 128), 7, dtype=torch.int32, device=DEVICE)
    idx, wo = torch.zeros(T, 8, dtype=torch.int64, device=DEVICE), torch.zeros(T, 8, device=DEVICE)
    megamoe.prepare_megamoe_inputs(h, w, ids, x, sf, idx, wo)
    sync()
    q, s = per_token_cast_to_fp4(h)
    same_bits(x.view(torch.uint8), q, "x_fp8 (packed e2m1)")
    same_bits(sf, s, "x_sf (packed UE8M0)")


def captured(step) -> "torch.cuda.CUDAGraph":
    """@p step run once on a side stream (warm-up), then captured into a CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


@cuda_only
@pytest.mark.parametrize("name", ALL_SCHEMES)
def test_every_format_under_cuda_graph_capture(name):
    """Captured once, replayed on new inputs (and a new global scale for NVFP4 static): the
    CPU backend's bytes every time."""
    s = ALL_SCHEMES[name]
    T, H = 64, 7168
    h = hidden(T, H, seed=1)
    w, ids = routing(T)
    out, gs = outputs_any(T, H, 8, s, DEVICE)
    count = torch.zeros(1, dtype=torch.int64, device=DEVICE)

    def step():
        megamoe.prepare_megamoe_inputs(h * 2, w, ids, **out, hidden_quant=s, global_scale=gs, nonfinite_count=count)

    graph = captured(step)
    for seed in (11, 12):
        h.copy_(hidden(T, H, seed=seed))
        if gs is not None:
            gs.fill_(0.05 * seed)
        count.zero_()
        graph.replay()
        torch.cuda.synchronize()
        want_out, _ = outputs_any(T, H, 8, s, "cpu")
        g_cpu = None if gs is None else gs.cpu()
        megamoe.prepare_megamoe_inputs((h * 2).cpu(), w.cpu(), ids.cpu(), **want_out, hidden_quant=s, global_scale=g_cpu)
        same_all({k: v.cpu() for k, v in out.items()}, want_out, f"{name} replay {seed}")
        assert int(count.item()) == 0


@cuda_only
def test_mxfp4_under_cuda_graph_matches_deepgemm():
    T, H = 135, 7168
    h = hidden(T, H, seed=2)
    w, ids = routing(T)
    x = torch.zeros(T, H // 2, dtype=torch.int8, device=DEVICE)
    sf = torch.zeros(T, H // 128, dtype=torch.int32, device=DEVICE)
    idx, wo = torch.zeros(T, 8, dtype=torch.int64, device=DEVICE), torch.zeros(T, 8, device=DEVICE)
    megamoe.prepare_megamoe_inputs(h, w, ids, x, sf, idx, wo)  # warm-up
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        megamoe.prepare_megamoe_inputs(h, w, ids, x, sf, idx, wo)
    h.copy_(hidden(T, H, seed=9))
    g.replay()
    torch.cuda.synchronize()
    q, s = per_token_cast_to_fp4(h)
    same_bits(x.view(torch.uint8), q, "x_fp8")
    same_bits(sf, s, "x_sf")


@cuda_only
@pytest.mark.parametrize("name", ["MXFP8", "NVFP4_PER_TOKEN"])
def test_element_misaligned_cuda_tensors(name):
    """CUDA tensors one byte past their element alignment (DLPack capsules over device
    bytes: no torch tensor can be): an input (topk_weights) and two outputs (x_sf, the
    top-k weights out) staged through the library's dense aligned copies: the same bytes
    as the aligned call, and the bytes around them untouched."""
    s = ALL_SCHEMES[name]
    T, H, K = 37, 512, 8
    h = hidden(T, H, seed=12)
    w, ids = routing(T, K, seed=13)
    want = stage_on(DEVICE, h, w, ids, s)
    out, gs = outputs_any(T, H, K, s, DEVICE)

    def odd(t: torch.Tensor, fill: int):
        raw = torch.full((t.numel() * t.element_size() + 8,), fill, dtype=torch.uint8, device=DEVICE)
        raw[1:1 + t.numel() * t.element_size()].copy_(t.contiguous().view(torch.uint8).view(-1))
        npdt = {torch.float32: np.float32, torch.int32: np.int32}[t.dtype]
        return raw, dlpack_capsule(np.empty(tuple(t.shape), npdt), device=2, data=raw.data_ptr() + 1)

    raw_w, cap_w = odd(w, 0)
    raw_w_before = raw_w.clone()
    raw_sf, cap_sf = odd(out["x_sf"], 0xA5)
    raw_wo, cap_wo = odd(out["topk_weights_out"], 0xA5)
    rest = {k: v for k, v in out.items() if k not in ("x_sf", "topk_weights_out")}
    megamoe.prepare_megamoe_inputs(h, cap_w, ids, x_sf=cap_sf, topk_weights_out=cap_wo, hidden_quant=s, global_scale=gs,
                                   **rest)  # fmt: skip
    sync()
    for k, v in rest.items():
        same_bits(v.cpu(), want[k], k)
    for k, raw in (("x_sf", raw_sf), ("topk_weights_out", raw_wo)):
        b = raw.cpu().numpy()
        n = want[k].numel() * want[k].element_size()
        assert_bitwise(b[1:1 + n], want[k].contiguous().view(torch.uint8).view(-1).numpy(), k)
        assert b[0] == 0xA5 and (b[1 + n:] == 0xA5).all(), f"{k}: bytes around the tensor written"
    assert torch.equal(raw_w, raw_w_before), "an input written"


# fp32 bit patterns of top-k weights: +-Inf, NaNs (quiet, signed, with a payload, signalling),
# the smallest and a large subnormal, the largest finite of both signs, zeros, ordinary values.
SPECIAL_WEIGHT_BITS = [0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7FC12345, 0x7F800001, 0x00000001,
                       0x807FFFFF, 0x7F7FFFFF, 0xFF7FFFFF, 0x00000000, 0x80000000, 0x3F800000, 0x3E99999A,
                       0xC2F6E979, 0x0DA24260]  # fmt: skip


def scaled_weight_bits(w: torch.Tensor, alpha: float) -> torch.Tensor:
    """The contract's weight scaling, written independently: one fp32 rounding of w * alpha
    (torch, on the host); a NaN weight keeps its bits; a NaN the product makes (+-Inf
    times +-0) is 0x7FC00000."""
    w = w.cpu()
    r = (w * torch.tensor(alpha, dtype=torch.float32)).view(torch.int32).clone()
    r[torch.isnan(w * alpha) & ~torch.isnan(w)] = 0x7FC00000
    r[torch.isnan(w)] = w.view(torch.int32)[torch.isnan(w)]
    return r


@pytest.mark.parametrize("alpha", [0.0, -0.0, 2.5, -1.0, 3.0e38, 1.0e-30])
def test_weight_scaling_special_values(alpha):
    """Every special top-k weight times the routed scaling factor, through staging (the
    fused top-k path) and routing-only staging, on the test device: the bits of the
    independent rule above in every slot, the ids widened."""
    T, K, H = 37, 8, 256
    n = len(SPECIAL_WEIGHT_BITS)
    sel = (torch.arange(T).unsqueeze(1) * 3 + torch.arange(K).unsqueeze(0)) % n  # every pattern in every column
    w = torch.tensor(SPECIAL_WEIGHT_BITS, dtype=torch.int64).to(torch.int32)[sel].view(torch.float32)
    ids = torch.randint(0, 384, (T, K), generator=torch.Generator().manual_seed(5), dtype=torch.int32)
    want_w, want_i = scaled_weight_bits(w, alpha), ids.to(torch.int64)
    h = torch.randn(T, H, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    got = stage_on(DEVICE, h, w, ids, ALL_SCHEMES["MXFP8"], routed_scaling_factor=alpha)
    assert_bitwise(got["topk_weights_out"].view(torch.int32).numpy(), want_w.numpy(), f"staged weights, alpha {alpha}")
    assert_bitwise(got["topk_idx_out"].numpy(), want_i.numpy(), "staged ids")
    idx = torch.full((T, K), -7, dtype=torch.int64, device=DEVICE)
    wo = torch.full((T, K), -7.0, device=DEVICE)
    megamoe.stage_megamoe_routing(w.to(DEVICE), ids.to(DEVICE), idx, wo, routed_scaling_factor=alpha)
    sync()
    assert_bitwise(wo.cpu().view(torch.int32).numpy(), want_w.numpy(), f"routing-only weights, alpha {alpha}")
    assert_bitwise(idx.cpu().numpy(), want_i.numpy(), "routing-only ids")


@pytest.mark.parametrize("T,H", [(1, 256), (37, 4096), (3000, 7168)])
@pytest.mark.parametrize("alpha", [None, 2.5])
def test_expert_scales_on_device(T, H, alpha):
    """Per-expert scales through staging (every top-k path of the kernels: split top-k at
    decode, the loop and tile shapes at larger T, full-buffer tail) and routing-only staging,
    on the test device: the independent NumPy rule's bits; a strided table with zero, NaN,
    Inf scales, ids past it and negative ones."""
    K, E = 8, 200
    g = torch.Generator().manual_seed(T + 11)
    h = torch.randn(T, H, generator=g).to(torch.bfloat16)
    ids = torch.randint(-2, 260, (T, K), generator=g, dtype=torch.int32)
    w = torch.rand(T, K, generator=g) * 4 - 1
    w[0, 0], w[0, 1] = float("inf"), float("nan")
    ids[0, 0], ids[0, 1] = 5, 6
    table = torch.rand(2 * E, generator=g) * 6 - 3
    table[10], table[6], table[8] = 0.0, float("nan"), float("inf")  # es[5] = 0: Inf * 0
    es = table[::2]
    pad = (torch.arange(T) % 5 == 4).to(torch.uint8)
    want_i, want_w = npref.topk(w.numpy(), ids.numpy(), pad.numpy(), alpha, rows=T + 3, expert_scales=es.numpy())
    got = stage_on(DEVICE, h, w, ids, SCHEMES["MXFP8"], pad=pad, rows=T + 3, full_buffer=True,
                   routed_scaling_factor=alpha, expert_scales=table.to(DEVICE)[::2])  # fmt: skip
    assert_bitwise(got["topk_idx_out"].numpy(), want_i, "staged ids")
    assert_bitwise(got["topk_weights_out"].numpy(), want_w, "staged weights times expert scales")
    idx = torch.full((T + 3, K), -7, dtype=torch.int64, device=DEVICE)
    wo = torch.full((T + 3, K), -7.0, device=DEVICE)
    megamoe.stage_megamoe_routing(w.to(DEVICE), ids.to(DEVICE), idx, wo, pad.to(DEVICE), full_buffer=True,
                                  routed_scaling_factor=alpha, expert_scales=table.to(DEVICE)[::2])  # fmt: skip
    sync()
    assert_bitwise(idx.cpu().numpy(), want_i, "routing-only ids")
    assert_bitwise(wo.cpu().numpy(), want_w, "routing-only weights times expert scales")


@cuda_only
@pytest.mark.parametrize("T,H", [(1, 7168), (64, 4096), (2000, 7168)])
@pytest.mark.parametrize("name", ["MXFP8", "FP8_FP32_G128", "NVFP4_PER_TOKEN"])
def test_rmsnorm_and_stage_cuda_matches_cpu(T, H, name):
    """rmsnorm_and_stage on the GPU: y, residual_out and every staged byte equal the CPU
    backend's (which tests/python/test_norm.py holds to the contract's formulas), with the
    residual in place, and without y (rows to scratch)."""
    K, s = 8, getattr(megamoe, name)
    g = torch.Generator().manual_seed(T + H)
    x = (torch.randn(T, H, generator=g) * 3).to(torch.bfloat16)
    res = torch.randn(T, H, generator=g).to(torch.bfloat16)
    w = (torch.rand(H, generator=g) + 0.5).to(torch.bfloat16)
    tw, ti = torch.rand(T, K, generator=g), torch.randint(0, 256, (T, K), generator=g, dtype=torch.int32)
    got = {}
    for dev in ("cpu", "cuda"):
        for want_y in (True, False):
            out, gs = outputs_any(T, H, K, s, dev)
            xr, rr = x.to(dev).clone(), res.to(dev).clone()
            y = torch.empty(T, H, dtype=torch.bfloat16, device=dev) if want_y else None
            megamoe.rmsnorm_and_stage(xr, rr, w.to(dev), tw.to(dev), ti.to(dev), **out, hidden_quant=s, eps=1e-6,
                                      y=y, residual_out=rr, global_scale=gs)  # fmt: skip
            sync()
            got[(dev, want_y)] = {k: v.cpu() for k, v in out.items()} | {"residual": rr.cpu()} | (
                {"y": y.cpu()} if want_y else {})  # fmt: skip
    for want_y in (True, False):
        same_all(got[("cuda", want_y)], got[("cpu", want_y)], f"rmsnorm_and_stage y={want_y}")
    same_all({k: v for k, v in got[("cpu", True)].items() if k != "y"}, got[("cpu", False)], "with and without y")


@cuda_only
def test_routing_only_and_sglang_drop_ins_on_cuda():
    T, P, H, K = 40, 64, 7168, 8
    h = hidden(T, H, seed=4)
    w, ids = routing(T)
    idx, wo = torch.zeros(P, K, dtype=torch.int64, device=DEVICE), torch.zeros(P, K, device=DEVICE)
    megamoe.stage_megamoe_routing(w, ids, idx, wo, full_buffer=True, routed_scaling_factor=1.5)
    idx_c, wo_c = torch.zeros(P, K, dtype=torch.int64), torch.zeros(P, K)
    megamoe.stage_megamoe_routing(w.cpu(), ids.cpu(), idx_c, wo_c, full_buffer=True, routed_scaling_factor=1.5)
    sync()
    same_bits(idx.cpu(), idx_c, "routing idx")
    same_bits(wo.cpu(), wo_c, "routing weights")
    for dev in ("cuda", "cpu"):  # DeepGEMM's SM100 (fp8, MXFP4, NVFP4) and SM90 pre-dispatch
        bufs = {}
        for mma, G, fp4, cols in (("fp8xfp4", 32, False, H // 128), ("mxf4xmxf4", 32, True, H // 128), ("nvfp4xnvfp4", 16, True, H // 64)):
            b = [torch.zeros(P, H // 2 if fp4 else H, dtype=torch.int8 if fp4 else torch.float8_e4m3fn, device=dev),
                 torch.zeros(P, cols, dtype=torch.int32, device=dev), torch.zeros(P, K, dtype=torch.int64, device=dev),
                 torch.zeros(P, K, device=dev)]  # fmt: skip
            xs = torch.zeros(P, device=dev) if mma == "nvfp4xnvfp4" else None
            megamoe.mega_moe_pre_dispatch(h.to(dev), ids.to(dev), w.to(dev), *b, num_tokens=T, group_size=G, mma_type=mma,
                                          buf_x_scales=xs)  # fmt: skip
            bufs[mma] = b + ([xs] if xs is not None else [])
        b90 = [torch.zeros(P, H, dtype=torch.float8_e4m3fn, device=dev), torch.zeros(P, H // 128, device=dev),
               torch.zeros(P, K, dtype=torch.int64, device=dev), torch.zeros(P, K, device=dev)]  # fmt: skip
        megamoe.mega_moe_pre_dispatch_sm90(h.to(dev), ids.to(dev), w.to(dev), *b90, T, 128, 2.5)
        bufs["sm90"] = b90
        sync()
        if dev == "cuda":
            on_cuda = {k: [t.cpu() for t in v] for k, v in bufs.items()}
        else:
            for k, v in bufs.items():
                for i, (a, c) in enumerate(zip(on_cuda[k], v)):
                    same_bits(a, c, f"{k} buffer {i}")


# ---------------------------------------------------------------------------------------
# The router on CUDA against vLLM's torch rendering run by torch on the same GPU.


def _ordered_ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    def ordered(v):
        i = np.asarray(v, np.float32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    return np.abs(ordered(a) - ordered(b))


@cuda_only
@pytest.mark.parametrize("E,K,dtype", [(256, 6, "float32"), (384, 6, "bfloat16"), (512, 16, "bfloat16")])
def test_router_against_vllm_torch_on_cuda(E, K, dtype):
    """Ids as vLLM's but for near-ties (the chosen biased scores, sorted, within 2 ulp);
    weights where the ids agree within 8 eps |w| (eps = 2^-23): torch's CUDA expf / log1pf
    are not correctly rounded and torch.sum adds in another order than k order
    (docs/ROUTER.md, "Against vLLM's torch router"). Our weights are exactly vLLM's formula
    on the correctly rounded scores summed in k order."""
    T, alpha = 4096, 1.5
    g = torch.Generator(device="cuda").manual_seed(E + K)
    logits = (torch.randn(T, E, device="cuda", generator=g) * 4).to(getattr(torch, dtype))
    bias = (torch.randn(E, device="cuda", generator=g) * 0.05 + 8.0).to(getattr(torch, dtype))
    w = torch.full((T, K), float("nan"), device="cuda")
    ids = torch.full((T, K), -7, device="cuda", dtype=torch.int32)
    megamoe.route(logits, bias, w, ids, routed_scaling_factor=alpha)
    s = torch.sqrt(torch.nn.functional.softplus(logits.float()))
    _, vids = torch.topk(s + bias.float(), k=K, dim=-1)
    vw = s.gather(1, vids)
    vw = vw / vw.sum(dim=-1, keepdim=True).clamp(min=1e-20) * alpha
    b = s + bias.float()
    ours_b = b.gather(1, ids.long()).sort(dim=1, descending=True).values.cpu().numpy()
    theirs_b = b.gather(1, vids).sort(dim=1, descending=True).values.cpu().numpy()
    assert _ordered_ulps(ours_b, theirs_b).max() <= 2, "a selection that is no near-tie"
    same = (ids.long() == vids).all(dim=1)
    rel = (w[same].double() - vw[same].double()).abs() / vw[same].double().abs()
    assert rel.max().item() <= 8 * 2.0**-23
    # The formula on correctly rounded scores (exp / log1p in double, rounded once), k order.
    x = logits.float().cpu().numpy()
    with np.errstate(all="ignore"):
        e = np.exp(x.astype(np.float64)).astype(np.float32)
        sp = np.where(x > 20, x, np.log1p(e.astype(np.float64)).astype(np.float32))
        exact = torch.from_numpy(np.sqrt(sp.astype(np.float32))).gather(1, ids.long().cpu())
    total = torch.zeros(T)
    for k in range(K):
        total = total + exact[:, k]
    want = exact / total.clamp(min=1e-20)[:, None] * alpha
    assert_bitwise(w.cpu().numpy().view(np.uint32), want.numpy().view(np.uint32), "weights")


# ---------------------------------------------------------------------------------------
# BF16 pass-through (FlashInfer's Bf16InputStage): x_fp8 is x.to(torch.bfloat16).


def random_bits(T: int, H: int, dtype, seed: int) -> torch.Tensor:
    """Every bit pattern of ``dtype`` (NaN payloads, Inf, subnormals, -0 included), with
    fp32 round-to-even ties planted in every third column."""
    g = gen(seed)
    if dtype == torch.float32:
        b = torch.randint(-(2**31), 2**31, (T, H), generator=g, device=DEVICE, dtype=torch.int64).to(torch.int32)
        b[:, ::3] = (b[:, ::3] & ~0xFFFF) | 0x8000
        return b.view(torch.float32)
    return torch.randint(-(2**15), 2**15, (T, H), generator=g, device=DEVICE, dtype=torch.int32).to(torch.int16).view(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("T", [1, 64, 4096, 16384])
def test_bf16_matches_torch_cast(T, dtype):
    """BF16 staging against ``h.to(torch.bfloat16)`` bit for bit: on the CPU torch's cast
    is the contract's rule everywhere (every NaN 0x7FC0); on CUDA torch's NaN is 0x7FFF, so
    there the NaN positions are compared with 0x7FC0 and the rest with torch's bits. bf16
    input keeps every bit. One launch fills the full-buffer tail; x_fp8's tail rows stay."""
    H, K, M = 7168, 8, T + 3
    h = random_bits(T, H, dtype, seed=T)
    w, ids = routing(T)
    pad = torch.arange(T, device=DEVICE) % 5 == 4
    x = torch.full((M, H), -23131, dtype=torch.int16, device=DEVICE).view(torch.bfloat16)  # 0xA5A5
    idx = torch.full((M, K), -7, dtype=torch.int64, device=DEVICE)
    wo = torch.full((M, K), -7.0, dtype=torch.float32, device=DEVICE)
    nf = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    megamoe.prepare_megamoe_inputs(h, w, ids, x, None, idx, wo, is_padding=pad, hidden_quant=megamoe.BF16,
                                   nonfinite_count=nf, full_buffer=True)  # fmt: skip
    sync()
    got = x[:T].view(torch.int16)
    nan = torch.isnan(h)
    want = h.to(torch.bfloat16).view(torch.int16)
    want = torch.where(nan, torch.full_like(want, 0x7FC0), want) if dtype != torch.bfloat16 else h.view(torch.int16)
    same_bits(got, want, f"x_fp8 bf16 bits of {dtype}")
    if dtype != torch.bfloat16:  # torch's CPU cast on the values (its vectorized path keeps NaN bits its own way)
        fin = ~nan.cpu()
        same_bits(got.cpu()[fin], h.cpu().to(torch.bfloat16).view(torch.int16)[fin], f"x_fp8 against torch's CPU cast of {dtype}")
    assert torch.all(x[T:].view(torch.int16) == -23131), "x_fp8 tail rows written"
    assert int(nf.item()) == int((~torch.isfinite(h)).sum().item())
    # The routing part is every format's: the same bytes as an MXFP8 call, tail -1 / +0.
    s = megamoe.MXFP8
    outs = outputs(T, H, K, s)
    megamoe.prepare_megamoe_inputs(h.float().nan_to_num(0.0, 0.0, 0.0), w, ids, *outs, is_padding=pad, hidden_quant=s)
    sync()
    same_bits(idx[:T], outs[2], "topk_idx_out")
    same_bits(wo[:T].view(torch.int32), outs[3].view(torch.int32), "topk_weights_out")
    assert torch.all(idx[T:] == -1) and torch.all(wo[T:].view(torch.int32) == 0)


def test_bf16_x_sf_empty_or_none_and_rejections():
    T, H, K = 5, 256, 4
    h = random_bits(T, H, torch.float32, seed=3)
    w, ids = routing(T, K)
    for sf in (None, torch.empty((T, 0), dtype=torch.float32, device=DEVICE)):
        x = torch.empty((T, H), dtype=torch.bfloat16, device=DEVICE)
        idx = torch.empty((T, K), dtype=torch.int64, device=DEVICE)
        wo = torch.empty((T, K), dtype=torch.float32, device=DEVICE)
        megamoe.prepare_megamoe_inputs(h, w, ids, x, sf, idx, wo, hidden_quant=megamoe.BF16)
        sync()
        nan = torch.isnan(h)
        want = torch.where(nan, torch.full((T, H), 0x7FC0, dtype=torch.int16, device=DEVICE),
                           h.to(torch.bfloat16).view(torch.int16))  # fmt: skip
        same_bits(x.view(torch.int16), want, "x_fp8")
    bad = torch.empty((T, 1), dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="x_sf"):
        megamoe.prepare_megamoe_inputs(h, w, ids, x, bad, idx, wo, hidden_quant=megamoe.BF16)
    with pytest.raises(ValueError, match="x_sf"):  # MXFP8 writes scales: an absent x_sf is named
        megamoe.prepare_megamoe_inputs(h, w, ids, torch.empty((T, H), dtype=torch.float8_e4m3fn, device=DEVICE), None,
                                       idx, wo, hidden_quant=megamoe.MXFP8)  # fmt: skip
    with pytest.raises(ValueError, match="x_q|x_fp8"):
        megamoe.prepare_megamoe_inputs(h, w, ids, x.view(torch.float16), None, idx, wo, hidden_quant=megamoe.BF16)


# ---------------------------------------------------------------------------------------
# NVFP4 online: a PyTorch rendering of the contract, run by torch on the same device


def nvfp4_online_torch(x: torch.Tensor, floor: float):
    """NVFP4 online as PyTorch ops: gs = fl(max(A, floor) / 2688) over the whole tensor
    (NaN ignored, Inf counts; floor 0: 1 where A < 2^-100), then per group of 16 the static
    recipe: sf = e4m3(clamp(fl(amax / fl(6 gs)), 2^-9, 448)) (NaN -> 2^-9), v = fl(x / fl(sf
    gs)), ties toward zero. Returns (packed e2m1 bytes, packed e4m3 words as int32, gs [1])."""
    T, H = x.shape
    f = x.float()
    inf = float("inf")
    a = f.abs().nan_to_num(nan=0.0, posinf=inf).max() if f.numel() else torch.zeros((), device=x.device)
    two = torch.tensor
    m = torch.maximum(a, two(floor, device=x.device))
    gs = m / two(2688.0, device=x.device)  # tensor / tensor: a true division
    if floor == 0.0:
        gs = torch.where(m < 2.0**-100, two(1.0, device=x.device), gs)
    g = f.view(T, H // 16, 16)
    amax = g.abs().nan_to_num(nan=0.0, posinf=inf).amax(dim=2)
    q = (amax / (two(6.0, device=x.device) * gs)).nan_to_num(nan=2.0**-9, posinf=inf)
    sf = q.clamp(2.0**-9, 448.0).to(torch.float8_e4m3fn)
    d = sf.float() * gs
    v = g / d.unsqueeze(2)
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], device=x.device)
    code = torch.bucketize(v.abs().nan_to_num(nan=0.0, posinf=inf).clamp_max(6.0), mids).to(torch.uint8)
    code = (code | (((v < 0) & (code != 0)).to(torch.uint8) << 3)).view(T, H)
    packed = (code[:, 0::2] & 0x0F) | ((code[:, 1::2] & 0x0F) << 4)
    return packed.contiguous(), sf.view(torch.uint8).contiguous().view(torch.int32), gs.reshape(1)


@pytest.mark.parametrize("T", [1, 7, 135, 4096])
@pytest.mark.parametrize("H", [256, 7168])
@pytest.mark.parametrize("floor", [1e-4, 0.0])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_nvfp4_online_matches_torch_rendering(T, H, floor, dtype):
    """Bytes and the global scale bit-exact with the PyTorch rendering; a NaN and the max
    on a padded row; floor 0 also on inputs below 2^-100 (the unit scale)."""
    for tiny in (False, True) if floor == 0.0 else (False,):
        h = hidden(T, H, dtype=dtype, seed=T + H)
        if tiny:
            h = h * 2.0**-120 if dtype == torch.float32 else torch.zeros_like(h)
        h[T - 1, 3] = float("nan")
        h[T - 1, 5] = h.float().abs().nan_to_num(nan=0.0).max() * 3
        pad = torch.arange(T, device=DEVICE) == T - 1
        w, ids = routing(T)
        s = megamoe.NVFP4_ONLINE.with_amax_floor(floor)
        out, _ = outputs_any(T, H, 8, s, DEVICE)
        gs = torch.full((1,), float("nan"), device=DEVICE)
        megamoe.prepare_megamoe_inputs(h, w, ids, **out, is_padding=pad, hidden_quant=s, global_scale=gs)
        sync()
        q, sf, g = nvfp4_online_torch(h, floor)
        same_bits(gs, g, "global_scale")
        same_bits(out["x_fp8"].view(torch.uint8), q, "x_fp8 (packed e2m1)")
        same_bits(out["x_sf"], sf, "x_sf (packed e4m3)")
        # The same bytes as NVFP4 static under that gs.
        st, _ = outputs_any(T, H, 8, megamoe.NVFP4_STATIC, DEVICE)
        megamoe.prepare_megamoe_inputs(h, w, ids, **st, is_padding=pad, hidden_quant=megamoe.NVFP4_STATIC,
                                       global_scale=gs.clone())  # fmt: skip
        sync()
        same_all({k: v.cpu() for k, v in out.items()}, {k: v.cpu() for k, v in st.items()}, "online vs static(gs)")


@cuda_only
@pytest.mark.parametrize("T", [1, 4096])
@pytest.mark.parametrize("floor", [1e-4, 0.0])
def test_nvfp4_online_under_cuda_graph_gs_follows_inputs(T, floor):
    """Captured once, replayed on new inputs (one replay below 2^-100 for floor 0): the
    global scale and the bytes follow the inputs every time."""
    H = 7168
    h = hidden(T, H, seed=3)
    w, ids = routing(T)
    s = megamoe.NVFP4_ONLINE.with_amax_floor(floor)
    out, _ = outputs_any(T, H, 8, s, DEVICE)
    gs = torch.zeros(1, device=DEVICE)

    def step():
        megamoe.prepare_megamoe_inputs(h, w, ids, **out, hidden_quant=s, global_scale=gs, enable_pdl=True)

    graph = captured(step)
    for seed, scale in ((11, 1.0), (12, 1e3), (13, 2.0**-120)):
        h.copy_(hidden(T, H, seed=seed) * scale)
        gs.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        q, sf, g = nvfp4_online_torch(h, floor)
        same_bits(gs, g, f"global_scale replay {seed}")
        same_bits(out["x_fp8"].view(torch.uint8), q, f"x_fp8 replay {seed}")
        same_bits(out["x_sf"], sf, f"x_sf replay {seed}")
