"""Hostile and odd arguments at the Python boundary: every one gets a TypeError or a
ValueError that says what is wrong, nothing is written, and the interpreter survives.

Covers: T = 0 returning before any other argument is read; non-array arguments; NumPy
arrays DLPack cannot carry (big-endian, structured, object, ...); ml_dtypes' bfloat16,
float8_e4m3fn and float8_e5m2 (MXFP8_E5M2's x_fp8); DLPack devices other than CPU and CUDA; hand-built DLPack capsules and NumPy
views with absurd strides (run in a child interpreter, so that a crash fails one test
instead of ending the run). NumPy only; the torch cases skip without torch.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import megamoe
from megamoe import _C
from megamoe_testutil import assert_bitwise, dlpack_capsule, valid_kwargs

OUTPUTS = ("x_fp8", "x_sf", "topk_idx_out", "topk_weights_out")
ARRAYS = ("hidden_states", "topk_weights", "topk_ids") + OUTPUTS
# The whole-binding dtype list the messages used to claim for every tensor.
UNIVERSAL = "bfloat16, float16, float32, float8_e4m3fn, uint8, bool, int32 or int64"


def rejected(kw: dict, exc: type, msg: str) -> str:
    """Call with ``kw``; assert ``exc`` whose message contains ``msg`` and that no output
    changed. Returns the message."""
    before = {n: kw[n].tobytes() for n in OUTPUTS if isinstance(kw.get(n), np.ndarray)}
    with pytest.raises(exc, match=re.escape(msg)) as info:
        megamoe.prepare_megamoe_inputs(**kw)
    for n, b in before.items():
        assert kw[n].tobytes() == b, f"a rejected call wrote {n}"
    return str(info.value)


def with_(**over) -> dict:
    kw = valid_kwargs()
    kw.update(over)
    return kw


# ---------------------------------------------------------------------------------------
# 1. T = 0: the reference reads hidden_states.shape[0] and returns; nothing else is read

JUNK = dict(
    topk_weights=None, topk_ids=3, x_fp8="junk", x_sf=[[1]], topk_idx_out=object(),
    topk_weights_out=None, is_padding="no", shared_x_sf=7,
)  # fmt: skip


@pytest.mark.parametrize(
    "hidden",
    [
        np.empty((0, 256), np.float32),
        np.empty((0, 100), np.float16),  # a bad H too
        np.empty((0, 256), ">f4"),  # a dtype nothing accepts
        np.empty((0, 3), object),
        np.empty((0, 256), np.float64),
        np.empty((256, 0), np.float32).T,  # a transposed view
    ],
    ids=["f32", "H100", "big-endian", "object", "f64", "view"],
)
def test_zero_tokens_returns_before_reading_other_arguments(hidden):
    assert megamoe.prepare_megamoe_inputs(
        hidden, **JUNK, shared_block_m="x", hidden_quant=object(), stream="junk"
    ) is None  # fmt: skip
    assert _C.prepare_inputs(hidden, *(JUNK[n] for n in ("topk_weights", "topk_ids") + OUTPUTS)) is None
    assert _C.prepare_inputs(dlpack_capsule(np.empty((0, 256), np.float32)), None, None, None, None, None, None) is None


def test_zero_tokens_stage_allocates_empty_outputs_whatever_the_rest():
    out = megamoe.stage(np.empty((0, 256), np.float32), None, "junk", hidden_quant="junk",
                        shared_block_m="junk", stream="junk", is_padding=5)  # fmt: skip
    assert [a.shape for a in out[:4]] == [(0, 256), (0, 0), (0, 0), (0, 0)]
    assert out.shared_x_sf is not None and out.shared_x_sf.shape[0] == 0
    out = megamoe.stage(np.empty((0, 512), np.float32), None, np.empty((0, 6), np.int32),
                        hidden_quant=megamoe.FP8_FP32_G128)  # fmt: skip
    assert [(a.shape, a.dtype) for a in out[:4]] == [
        ((0, 512), np.uint8), ((0, 4), np.float32), ((0, 6), np.int64), ((0, 6), np.float32),
    ]  # fmt: skip
    assert out.shared_x_sf is None


@pytest.mark.parametrize(
    "hidden,exc,msg",
    [
        (np.empty((0,), np.float32), ValueError, "megamoe: hidden_states: expected 2-D tensor, got 1-D tensor"),
        (np.empty((0, 2, 128), np.float32), ValueError, "megamoe: hidden_states: expected a tensor of rank <= 2"),
        ([], TypeError, "megamoe: hidden_states: expected an array (DLPack or buffer protocol), got list"),
        (None, TypeError, "megamoe: hidden_states: expected an array (DLPack or buffer protocol), got None"),
    ],
    ids=["rank1", "rank3", "list", "None"],
)  # fmt: skip
def test_zero_rows_of_the_wrong_rank_or_no_array_is_still_an_error(hidden, exc, msg):
    kw = valid_kwargs(T=0)
    kw["hidden_states"] = hidden
    rejected(kw, exc, msg)


# ---------------------------------------------------------------------------------------
# 2. Arguments that are no array: TypeError naming them


@pytest.mark.parametrize("name", ARRAYS + ("is_padding", "shared_x_sf"))
@pytest.mark.parametrize("junk", [[[1.0] * 4] * 8, 3, "abc", None], ids=["list", "int", "str", "None"])
def test_non_array_argument_is_a_type_error(name, junk):
    if junk is None and name in ("is_padding", "shared_x_sf"):
        pytest.skip("None means absent for the optional arrays")
    if junk is None and name == "x_sf":  # None: no scales, which only BF16 takes
        rejected(with_(x_sf=None), ValueError, "megamoe: x_sf: expected a (")
        return
    kw = with_(**{name: junk})
    if name == "shared_x_sf":
        kw["shared_block_m"] = 64
    got = "None" if junk is None else type(junk).__name__
    rejected(kw, TypeError, f"megamoe: {name}: expected an array (DLPack or buffer protocol), got {got}")


@pytest.mark.parametrize(
    "over,msg",
    [
        (dict(hidden_states=[[1.0] * 128]), "megamoe.stage: hidden_states: expected a torch.Tensor or numpy.ndarray, got list"),
        (dict(hidden_states=None), "megamoe.stage: hidden_states: expected a torch.Tensor or numpy.ndarray, got NoneType"),
        (dict(topk_ids=[[1, 2, 3, 4]]), "megamoe: topk_ids: expected an array (DLPack or buffer protocol), got list"),
        (dict(topk_ids=None), "megamoe: topk_ids: expected an array (DLPack or buffer protocol), got None"),
        (dict(topk_weights=7), "megamoe: topk_weights: expected an array (DLPack or buffer protocol), got int"),
        (dict(is_padding=[0]), "megamoe: is_padding: expected an array (DLPack or buffer protocol), got list"),
        (dict(shared_block_m="64"), "megamoe: shared_block_m: expected an int or None, got str"),
        (dict(shared_block_m=64.0), "megamoe: shared_block_m: expected an int or None, got float"),
        (dict(stream="0"), "megamoe: stream: expected an int (a cudaStream_t) or None, got str"),
        (dict(hidden_quant="mxfp8"), "megamoe: hidden_quant: expected a megamoe.QuantScheme or a vLLM-style QuantKey"),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else "",
)  # fmt: skip
def test_stage_type_errors_name_the_argument(over, msg):
    kw = dict(hidden_states=np.ones((1, 128), np.float32), topk_weights=np.ones((1, 4), np.float32),
              topk_ids=np.zeros((1, 4), np.int32))  # fmt: skip
    kw.update(over)
    with pytest.raises(TypeError, match=re.escape(msg)):
        megamoe.stage(**kw)


def test_prepare_integer_arguments_are_not_coerced():
    rejected(with_(stream="0"), TypeError, "megamoe: stream: expected an int (a cudaStream_t) or None, got str")
    rejected(with_(stream=0.0), TypeError, "megamoe: stream: expected an int (a cudaStream_t) or None, got float")
    kw = with_(shared_x_sf=np.zeros((128, 2), np.int32), shared_block_m="64")
    rejected(kw, TypeError, "megamoe: shared_block_m: expected an int or None, got str")
    megamoe.prepare_megamoe_inputs(**with_(stream=np.int64(0), shared_x_sf=np.zeros((128, 2), np.int32),
                                           shared_block_m=np.int32(64)))  # fmt: skip


def test_floats_beyond_float32_are_value_errors():
    """A finite Python float beyond fp32's range is refused with its value (its conversion to
    fp32 would be undefined), nothing written; NaN / Inf reach the validator as they are."""
    msg = "megamoe: routed_scaling_factor: expected a value within float32's range, got 1.0000000000000001e+300"
    rejected(with_(routed_scaling_factor=1e300), ValueError, msg)
    rejected(with_(routed_scaling_factor=-1e39), ValueError, "got -9.9999999999999994e+38")
    rejected(with_(routed_scaling_factor=float("inf")), ValueError, "routed_scaling_factor")
    with pytest.raises(ValueError, match=re.escape("megamoe: amax_floor: expected a value within float32's range, got 1.0000000000000001e+300")):
        megamoe.QuantScheme(amax_floor=1e300)
    with pytest.raises(ValueError, match="amax_floor: expected a value within float32's range"):
        megamoe.MXFP8.with_amax_floor(-3.5e38)
    q = megamoe.QuantScheme()
    with pytest.raises(ValueError, match="amax_floor: expected a value within float32's range"):
        q.amax_floor = 4e38
    assert q == megamoe.MXFP8


def test_dequantize_errors_name_the_argument():
    out = megamoe.stage(np.ones((2, 256), np.float32), np.ones((2, 4), np.float32), np.zeros((2, 4), np.int32))
    cases = [
        ((out.x_fp8, [1]), TypeError, "megamoe.dequantize: x_sf: expected a torch.Tensor or numpy.ndarray, got list"),
        (([[1]], out.x_sf), TypeError, "megamoe.dequantize: x_q: expected a torch.Tensor or numpy.ndarray, got list"),
        ((out.x_fp8, None), TypeError, "megamoe.dequantize: x_sf: expected a torch.Tensor or numpy.ndarray, got NoneType"),
        ((3, out.x_sf), TypeError, "megamoe.dequantize: x_q: expected a torch.Tensor or numpy.ndarray, got int"),
        ((out.x_fp8[0], out.x_sf), ValueError, "megamoe.dequantize: x_q: expected a 2-D array, got shape (256,)"),
        ((out.x_fp8.astype(np.float32), out.x_sf), ValueError, "megamoe.dequantize: x_q: expected dtype uint8 or int8 or float8_e4m3fn, got dtype float32"),
        ((out.x_fp8, out.x_sf[:, :1]), ValueError, "megamoe.dequantize: x_sf: expected shape (2, 2), got shape (2, 1)"),
        ((out.x_fp8, out.x_sf.astype(np.float32)), ValueError, "megamoe.dequantize: x_sf: expected dtype int32 (packed UE8M0), got dtype float32"),
        ((out.x_fp8[:, :200], out.x_sf), ValueError, "megamoe.dequantize: x_q: expected a width that is a multiple of 128"),
        ((out.x_fp8, out.x_sf.astype(object)), ValueError, "megamoe.dequantize: x_sf: expected dtype int32 (packed UE8M0), got dtype object"),
        ((out.x_fp8, out.x_sf, megamoe.QuantScheme(group_k=48)), ValueError, "DeepSeek V4 MegaMoE input staging requires"),
        ((out.x_fp8, out.x_sf, "mxfp8"), TypeError, "megamoe: hidden_quant: expected a megamoe.QuantScheme or a vLLM-style QuantKey"),
    ]  # fmt: skip
    for args, exc, msg in cases:
        with pytest.raises(exc, match=re.escape(msg)):
            megamoe.dequantize(*args)
    # fp4 and NVFP4: packed bytes half as wide, second-level scales named when missing or extra
    fp4 = megamoe.stage(np.ones((2, 256), np.float32), np.ones((2, 4), np.float32), np.zeros((2, 4), np.int32),
                        scheme=megamoe.MXFP4)  # fmt: skip
    nv = megamoe.stage(np.ones((2, 256), np.float32), np.ones((2, 4), np.float32), np.zeros((2, 4), np.int32),
                       scheme=megamoe.NVFP4_PER_TOKEN)  # fmt: skip
    cases = [
        ((fp4.x_fp8, fp4.x_sf[:, :1], megamoe.MXFP4), {}, "megamoe.dequantize: x_sf: expected shape (2, 2), got shape (2, 1)"),
        ((fp4.x_fp8[:, :100], fp4.x_sf, megamoe.MXFP4), {}, "megamoe.dequantize: x_q: expected a width that is a multiple of 64"),
        ((fp4.x_fp8.astype(np.float32), fp4.x_sf, megamoe.MXFP4), {}, "megamoe.dequantize: x_q: expected dtype uint8 or int8 or float4_e2m1fn_x2, got dtype float32"),
        ((nv.x_fp8, nv.x_sf, megamoe.NVFP4_PER_TOKEN), {}, "megamoe.dequantize: x_scales: expected an array (nvfp4_per_token needs one), got none"),
        ((nv.x_fp8, nv.x_sf, megamoe.NVFP4_PER_TOKEN), dict(x_scales=nv.x_scales[:1]), "megamoe.dequantize: x_scales: expected shape (2,), got shape (1,)"),
        ((nv.x_fp8, nv.x_sf, megamoe.NVFP4_PER_TOKEN), dict(x_scales=nv.x_scales, global_scale=np.ones(1, np.float32)),
         "megamoe.dequantize: global_scale: expected none (nvfp4_per_token has no global_scale), got an array"),
        ((nv.x_fp8, nv.x_sf, megamoe.NVFP4_STATIC), dict(global_scale=np.ones(2, np.float32)), "megamoe.dequantize: global_scale: expected a one-element array, got shape (2,)"),
        ((nv.x_fp8, nv.x_sf, megamoe.NVFP4_STATIC), dict(global_scale=np.ones(1, np.int32)), "megamoe.dequantize: global_scale: expected dtype float32, got dtype int32"),
        ((out.x_fp8, out.x_sf), dict(x_scales=np.ones(2, np.float32)), "megamoe.dequantize: x_scales: expected none (mxfp8 has no x_scales), got an array"),
    ]  # fmt: skip
    for args, kw, msg in cases:
        with pytest.raises(ValueError, match=re.escape(msg)):
            megamoe.dequantize(*args, **kw)
    with pytest.raises(TypeError, match=re.escape("megamoe.dequantize: x_scales: expected a torch.Tensor or numpy.ndarray, got list")):
        megamoe.dequantize(nv.x_fp8, nv.x_sf, megamoe.NVFP4_PER_TOKEN, x_scales=[1.0, 2.0])
    assert_bitwise(megamoe.dequantize(out.x_fp8.view(np.int8), out.x_sf), megamoe.dequantize(out.x_fp8, out.x_sf), "int8 bytes")
    # MXFP8_E5M2: its own typed dtype in the list, the layout of MXFP8
    e5 = megamoe.MXFP8_E5M2
    with pytest.raises(ValueError, match=re.escape("megamoe.dequantize: x_q: expected dtype uint8 or int8 or float8_e5m2, got dtype float32")):
        megamoe.dequantize(out.x_fp8.astype(np.float32), out.x_sf, e5)
    with pytest.raises(ValueError, match=re.escape("megamoe.dequantize: x_sf: expected shape (2, 2), got shape (2, 1)")):
        megamoe.dequantize(out.x_fp8, out.x_sf[:, :1], e5)
    with pytest.raises(ValueError, match=re.escape("megamoe.dequantize: x_scales: expected none (mxfp8_e5m2 has no x_scales), got an array")):
        megamoe.dequantize(out.x_fp8, out.x_sf, e5, x_scales=np.ones(2, np.float32))


# ---------------------------------------------------------------------------------------
# 3. Arrays megamoe cannot take: ValueError naming the dtype, and only this tensor's list


@pytest.mark.parametrize(
    "name,bad,expected,got",
    [
        ("hidden_states", np.ones((8, 256), ">f4"), "bfloat16 or float16 or float32", "big-endian float32"),
        ("hidden_states", np.zeros((8, 256), [("a", "<f4"), ("b", "<i4")]), "bfloat16 or float16 or float32",
         "structured dtype [('a', '<f4'), ('b', '<i4')]"),
        ("hidden_states", np.zeros((8, 256), object), "bfloat16 or float16 or float32", "object array"),
        ("hidden_states", np.zeros((8, 256), np.complex64), "bfloat16 or float16 or float32", "dtype complex64"),
        ("hidden_states", np.zeros((8, 256), np.float64), "bfloat16 or float16 or float32", "dtype float64"),
        ("hidden_states", np.zeros((8, 256), np.longdouble), "bfloat16 or float16 or float32",
         f"dtype {np.dtype(np.longdouble)}"),
        ("hidden_states", np.zeros((8, 256), "M8[ns]"), "bfloat16 or float16 or float32", "dtype datetime64[ns]"),
        ("topk_weights", np.zeros((8, 4), ">f2"), "float32 or bfloat16 or float16", "big-endian float16"),
        ("topk_ids", np.zeros((8, 4), ">i8"), "int32 or int64", "big-endian int64"),
        ("topk_ids", np.zeros((8, 4), np.int16), "int32 or int64", "dtype int16"),
        ("topk_ids", np.zeros((8, 4), np.uint64), "int32 or int64", "dtype uint64"),
        ("x_fp8", np.zeros((8, 256), object), "float8_e4m3fn or uint8", "object array"),
        ("x_fp8", np.zeros((8, 256), "V1"), "float8_e4m3fn or uint8", "dtype |V1"),
        ("x_sf", np.zeros((8, 2), ">i4"), "int32", "big-endian int32"),
        ("topk_idx_out", np.zeros((8, 4), ">i8"), "int64", "big-endian int64"),
        ("topk_weights_out", np.zeros((8, 4), ">f4"), "float32", "big-endian float32"),
        ("is_padding", np.zeros((8,), "U1"), "bool or uint8", "dtype <U1"),
        ("is_padding", np.zeros((8,), np.int16), "bool or uint8", "dtype int16"),
    ],
)  # fmt: skip
def test_unsupported_ndarray_is_a_value_error_with_the_tensors_own_dtypes(name, bad, expected, got):
    msg = rejected(with_(**{name: bad}), ValueError, f"megamoe: {name}: expected dtype {expected}, got {got}")
    assert UNIVERSAL not in msg and "DLPack or buffer protocol" not in msg


def test_unsupported_dtype_when_an_earlier_problem_hides_the_tensors_list():
    # H = 200 is the first thing the library rejects; the dtype is still what is reported
    # for the array that could not be handed over.
    kw = valid_kwargs(H=256)
    kw["hidden_states"] = np.zeros((8, 200), np.float32)
    kw["topk_ids"] = np.zeros((8, 4), ">i8")
    rejected(kw, ValueError, "megamoe: topk_ids: unsupported big-endian int64")


def test_fp32_scales_list_comes_from_the_scheme():
    kw = with_(x_sf=np.zeros((8, 2), ">f4"), hidden_quant=megamoe.FP8_FP32_G128)
    rejected(kw, ValueError, "megamoe: x_sf: expected dtype float32, got big-endian float32")


def test_byte_strides_that_are_not_whole_elements():
    h = np.lib.stride_tricks.as_strided(np.zeros((8, 256), np.float32), strides=(1024, 2))
    rejected(with_(hidden_states=h), ValueError,
             "megamoe: hidden_states: expected byte strides that are whole multiples of the element "
             "size (4 bytes), got byte strides (1024, 2)")  # fmt: skip


def test_buffer_protocol_objects_of_foreign_formats():
    rejected(with_(x_sf=memoryview(np.zeros((8, 2), ">i4"))), ValueError,
             "megamoe: x_sf: expected a buffer of native-endian numbers, got buffer format '>i'")  # fmt: skip


def test_read_only_output_of_a_refused_dtype_still_says_dtype():
    x = np.zeros((8, 2), ">i4")
    x.flags.writeable = False
    rejected(with_(x_sf=x), ValueError, "megamoe: x_sf: expected dtype int32, got big-endian int32")


def test_ml_dtypes_bfloat16_and_float8_are_taken_as_what_they_are():
    ml = pytest.importorskip("ml_dtypes")
    kw = valid_kwargs()
    h32 = kw["hidden_states"].astype(ml.bfloat16).astype(np.float32)  # values bf16 can hold
    want = megamoe.stage(h32, kw["topk_weights"], kw["topk_ids"])
    kw["hidden_states"] = h32.astype(ml.bfloat16)
    kw["x_fp8"] = np.zeros(kw["x_fp8"].shape, ml.float8_e4m3fn)
    megamoe.prepare_megamoe_inputs(**kw)
    assert_bitwise(kw["x_fp8"].view(np.uint8), want.x_fp8, "x_fp8")
    assert_bitwise(kw["x_sf"], want.x_sf, "x_sf")
    ro = np.zeros(kw["x_fp8"].shape, ml.float8_e4m3fn)
    ro.flags.writeable = False
    rejected(with_(x_fp8=ro), ValueError, "megamoe: x_fp8: expected a writable array, got a read-only array")
    rejected(with_(x_fp8=np.zeros((8, 256), ml.float8_e5m2)), ValueError,
             "megamoe: x_fp8: expected dtype float8_e4m3fn or uint8, got dtype float8_e5m2")  # fmt: skip
    # MXFP8_E5M2 takes float8_e5m2 (and uint8) and refuses float8_e4m3fn
    e5 = megamoe.MXFP8_E5M2
    want = megamoe.stage(h32, kw["topk_weights"], kw["topk_ids"], scheme=e5)
    kw["x_fp8"] = np.zeros(kw["x_fp8"].shape, ml.float8_e5m2)
    megamoe.prepare_megamoe_inputs(**kw, hidden_quant=e5)
    assert_bitwise(kw["x_fp8"].view(np.uint8), want.x_fp8, "x_fp8 e5m2")
    assert_bitwise(kw["x_sf"], want.x_sf, "x_sf e5m2")
    rejected(with_(x_fp8=np.zeros((8, 256), ml.float8_e4m3fn), hidden_quant=e5), ValueError,
             "megamoe: x_fp8: expected dtype float8_e5m2 or uint8, got dtype float8_e4m3fn")  # fmt: skip


# ---------------------------------------------------------------------------------------
# 4. DLPack devices: CPU and CUDA (and host-addressable CUDA pinned memory) only


@pytest.mark.parametrize(
    "device,label",
    [(4, "OpenCL"), (7, "Vulkan"), (8, "Metal"), (10, "ROCm"), (11, "ROCm pinned host"), (14, "oneAPI"), (99, None)],
)
@pytest.mark.parametrize("name", ["topk_weights", "x_sf"])
def test_foreign_dlpack_device_is_rejected_before_any_backend(name, device, label):
    kw = valid_kwargs()
    kw[name] = dlpack_capsule(kw[name].copy(), device=device)
    tail = f" ({label})" if label else ""
    rejected(kw, ValueError, f"megamoe: {name}: expected a CPU or CUDA tensor, got DLPack device type {device}{tail}")


@pytest.mark.parametrize("device", [2, 13], ids=["cuda", "cuda_managed"])
def test_cuda_and_managed_memory_are_cuda_devices(device):
    # Checked against the CPU hidden_states before any launch (the data is host memory).
    kw = valid_kwargs()
    kw["topk_weights"] = dlpack_capsule(kw["topk_weights"].copy(), device=device)
    rejected(kw, ValueError, "megamoe: topk_weights: expected device cpu, got device cuda:0")
    kw = valid_kwargs()
    kw["x_sf"] = dlpack_capsule(kw["x_sf"].copy(), device=device, device_id=-1)
    rejected(kw, ValueError, "megamoe: x_sf: expected a CUDA device ordinal >= 0, got device id -1")


@pytest.mark.skipif(megamoe.has_cuda_backend(), reason="host memory labelled CUDA would reach the kernels")
def test_cuda_tensor_off_its_element_size_is_valid():
    """A CUDA tensor whose data pointer is not a multiple of its element size passes the
    validator (the CUDA backend stages it through an aligned copy): in a build without the
    CUDA backend the call fails only at the dispatch, naming the device, and writes nothing."""
    kw = valid_kwargs()
    spare = np.zeros(kw["topk_weights"].nbytes + 8, np.uint8)
    before = {n: a.copy() for n, a in kw.items() if isinstance(a, np.ndarray)}
    caps = {n: dlpack_capsule(a, device=2) for n, a in kw.items() if isinstance(a, np.ndarray)}
    caps["topk_weights"] = dlpack_capsule(kw["topk_weights"].copy(), device=2, data=spare.ctypes.data + 1)
    with pytest.raises(megamoe.UnsupportedError, match=re.escape(
            "megamoe: hidden_states: expected a CPU tensor (this build has no CUDA backend), got device cuda:0")):  # fmt: skip
        megamoe.prepare_megamoe_inputs(**{**kw, **caps})
    for n, a in before.items():
        assert np.array_equal(kw[n].view(np.uint8), a.view(np.uint8)), n


def test_cuda_pinned_host_memory_runs_on_the_cpu():
    kw = valid_kwargs()
    want = megamoe.stage(kw["hidden_states"], kw["topk_weights"], kw["topk_ids"])
    kw["hidden_states"] = dlpack_capsule(kw["hidden_states"], device=3)
    x_sf = kw["x_sf"]
    kw["x_sf"] = dlpack_capsule(x_sf, device=3)
    megamoe.prepare_megamoe_inputs(**kw)
    assert_bitwise(kw["x_fp8"], want.x_fp8, "x_fp8")
    assert_bitwise(x_sf, want.x_sf, "x_sf through a pinned-host capsule")


# ---------------------------------------------------------------------------------------
# 5. Absurd strides and hand-built capsules: ValueError, never a dead interpreter

HOSTILE = textwrap.dedent(
    """
    import numpy as np, megamoe
    from megamoe_testutil import dlpack_capsule, valid_kwargs
    strided = np.lib.stride_tricks.as_strided

    def case(label, **over):
        kw = valid_kwargs()
        kw.update({k: (v(kw[k]) if callable(v) else v) for k, v in over.items()})
        try:
            megamoe.prepare_megamoe_inputs(**kw)
            print(label, "| returned", flush=True)
        except Exception as e:
            print(label, "|", type(e).__name__, "|", e, flush=True)

    case("np uint8 (2**62, 1)", x_fp8=lambda a: strided(a, strides=(2**62, 1)))
    case("np f32 (2**62, 4)", hidden_states=lambda a: strided(a, strides=(2**62, 4)))
    case("np f32 (-2**62, 4)", hidden_states=lambda a: strided(a, strides=(-(2**62), 4)))
    case("np f32 (2**60, 2**60)", topk_weights_out=lambda a: strided(a, strides=(2**60, 2**60)))
    case("np i64 (2**59, 8)", topk_idx_out=lambda a: strided(a, strides=(2**59, 8)))
    case("cap (2**62, 1)", hidden_states=lambda a: dlpack_capsule(a, strides=(2**62, 1)))
    case("cap (2**62, 2**62)", x_sf=lambda a: dlpack_capsule(a, strides=(2**62, 2**62)))
    case("cap (1-2**63, 1)", topk_idx_out=lambda a: dlpack_capsule(a, strides=(1 - 2**63, 1)))
    case("cap (2**61, -2**61)", topk_ids=lambda a: dlpack_capsule(a, strides=(2**61, -(2**61))))
    case("cap shape (-1, 256)", hidden_states=lambda a: dlpack_capsule(a, shape=(-1, 256)))
    case("cap shape (2**40, 256)", hidden_states=lambda a: dlpack_capsule(a, shape=(2**40, 256)))
    case("cap shape (8, 2**62)", x_fp8=lambda a: dlpack_capsule(a, shape=(8, 2**62)))
    case("cap rank 3", hidden_states=lambda a: dlpack_capsule(a, shape=(8, 256, 1), strides=(256, 1, 1)))
    case("cap rank 200", hidden_states=lambda a: dlpack_capsule(a, ndim=200))
    case("cap rank -1", hidden_states=lambda a: dlpack_capsule(a, ndim=-1))
    case("cap null data", hidden_states=lambda a: dlpack_capsule(a, data=None))
    case("cap lanes 4", hidden_states=lambda a: dlpack_capsule(a, dtype=(2, 32, 4)))
    case("cap opaque dtype", hidden_states=lambda a: dlpack_capsule(a, dtype=(3, 64, 1)))
    case("cap float8_e5m2", x_fp8=lambda a: dlpack_capsule(a, dtype=(12, 8, 1)))
    case("cap float8_e5m2 for mxfp8_e5m2", x_fp8=lambda a: dlpack_capsule(a, dtype=(12, 8, 1)),
         hidden_quant=megamoe.MXFP8_E5M2)
    case("cap float8_e4m3fn for mxfp8_e5m2", x_fp8=lambda a: dlpack_capsule(a, dtype=(10, 8, 1)),
         hidden_quant=megamoe.MXFP8_E5M2)
    cap = dlpack_capsule(np.ones((8, 4), np.float32))
    case("cap first use", topk_weights=cap)
    case("cap reused", topk_weights=cap)
    """
)

WANT = {
    "np uint8 (2**62, 1)": "megamoe: x_fp8: expected strides whose element offsets fit in int64",
    "np f32 (2**62, 4)": "megamoe: hidden_states: expected a byte span inside the address space",
    "np f32 (-2**62, 4)": "megamoe: hidden_states: expected a byte span inside the address space",
    "np f32 (2**60, 2**60)": "megamoe: topk_weights_out: expected a byte span inside the address space",
    "np i64 (2**59, 8)": "megamoe: topk_idx_out: expected a byte span inside the address space",
    "cap (2**62, 1)": "megamoe: hidden_states: expected strides whose element offsets fit in int64",
    "cap (2**62, 2**62)": "megamoe: x_sf: expected strides whose element offsets fit in int64",
    "cap (1-2**63, 1)": "megamoe: topk_idx_out: expected strides whose element offsets fit in int64",
    "cap (2**61, -2**61)": "megamoe: topk_ids: expected",
    "cap shape (-1, 256)": "megamoe: hidden_states: expected non-negative sizes, got (-1, 256)",
    "cap shape (2**40, 256)": "megamoe: topk_ids: expected shape (1099511627776, 4), got shape (8, 4)",
    "cap shape (8, 2**62)": "megamoe: x_fp8: expected shape (8, 256)",
    "cap rank 3": "megamoe: hidden_states: expected a tensor of rank <= 2, got 3-D tensor of shape (8, 256, 1)",
    "cap rank 200": "megamoe: hidden_states: expected a tensor of rank <= 2, got 200-D DLPack tensor",
    "cap rank -1": "megamoe: hidden_states: expected a tensor of rank <= 2, got -1-D DLPack tensor",
    "cap null data": "megamoe: hidden_states: expected a non-null data pointer, got nullptr",
    "cap lanes 4": "megamoe: hidden_states: expected dtype bfloat16 or float16 or float32, got dtype float32x4",
    "cap opaque dtype": "megamoe: hidden_states: expected dtype bfloat16 or float16 or float32, got dtype DLPack type code 3 of 64 bits",
    "cap float8_e5m2": "megamoe: x_fp8: expected dtype float8_e4m3fn or uint8, got dtype float8_e5m2",
    "cap float8_e4m3fn for mxfp8_e5m2": "megamoe: x_fp8: expected dtype float8_e5m2 or uint8, got dtype float8_e4m3fn",
    "cap reused": "megamoe: topk_weights: expected a DLPack capsule not imported before, got one already consumed",
}  # fmt: skip


def test_absurd_strides_and_hostile_capsules_are_value_errors_in_a_child_interpreter():
    here = Path(__file__).resolve().parent
    r = subprocess.run([sys.executable, "-c", HOSTILE], cwd=here, capture_output=True, text=True, timeout=120)
    lines = dict(line.split(" | ", 1) for line in r.stdout.splitlines() if " | " in line)
    assert r.returncode == 0, (
        f"the interpreter died (rc {r.returncode}) after {list(lines)[-1:] or 'no case'}:\n{r.stderr[-2000:]}"
    )
    assert lines.pop("cap first use") == "returned"
    assert lines.pop("cap float8_e5m2 for mxfp8_e5m2") == "returned"  # DLPack's e5m2 code is MXFP8_E5M2's x_fp8
    assert set(lines) == set(WANT), set(lines) ^ set(WANT)
    for label, want in WANT.items():
        exc, msg = lines[label].split(" | ", 1)
        assert exc == "ValueError" and msg.startswith(want), f"{label}: got {lines[label]!r}"


# ---------------------------------------------------------------------------------------
# The torch paths (skip without torch)


def test_torch_zero_tokens_and_undlpackable_tensors():
    torch = pytest.importorskip("torch")
    h = torch.empty(0, 256)
    assert megamoe.prepare_megamoe_inputs(h, **JUNK, shared_block_m="x", hidden_quant=object(), stream="x") is None
    out = megamoe.stage(h, None, "junk", hidden_quant="junk")
    assert out.x_fp8.shape == (0, 256) and out.x_fp8.dtype == torch.float8_e4m3fn
    out = megamoe.stage(h, None, "junk", hidden_quant=megamoe.MXFP8_E5M2)
    assert out.x_fp8.shape == (0, 256) and out.x_fp8.dtype == torch.float8_e5m2
    T, H, K = 8, 256, 4
    args = [torch.ones(T, H), torch.ones(T, K), torch.zeros(T, K, dtype=torch.int32),
            torch.zeros(T, H, dtype=torch.uint8), torch.zeros(T, 2, dtype=torch.int32),
            torch.zeros(T, K, dtype=torch.int64), torch.zeros(T, K)]  # fmt: skip
    megamoe.prepare_megamoe_inputs(*args)
    bad = list(args)
    bad[0] = args[0].double()
    with pytest.raises(ValueError, match=re.escape("megamoe: hidden_states: expected dtype bfloat16 or float16 or float32, got dtype float64")):
        megamoe.prepare_megamoe_inputs(*bad)
    bad = list(args)
    bad[1] = args[1].to_sparse()
    with pytest.raises(ValueError, match=re.escape("megamoe: topk_weights: expected a tensor DLPack can export")):
        megamoe.prepare_megamoe_inputs(*bad)
    with pytest.raises(TypeError, match=re.escape("megamoe: topk_ids: expected an array (DLPack or buffer protocol), got list")):
        megamoe.prepare_megamoe_inputs(args[0], args[1], [[0] * K] * T, *args[3:])
    with pytest.raises(TypeError, match=re.escape("megamoe: stream: expected an int (a cudaStream_t) or None, got str")):
        megamoe.prepare_megamoe_inputs(*args, stream="0")
    x = torch.zeros(T, H, dtype=torch.float8_e4m3fn)
    with pytest.raises(TypeError, match=re.escape("megamoe.dequantize: x_sf: expected a torch.Tensor, got list")):
        megamoe.dequantize(x, [[0]])
    with pytest.raises(ValueError, match=re.escape("megamoe.dequantize: x_q: expected dtype uint8 or int8 or float8_e4m3fn, got dtype float32")):
        megamoe.dequantize(x.float(), args[4])
