"""Helpers shared by the Python test files (schemes, the reference's messages, bitwise
comparison, vLLM QuantKey look-alikes, a valid call, hand-built DLPack capsules)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

import megamoe

# The fp8 presets (one byte a value): e4m3 with UE8M0 or fp32 scales, and MXFP8 e5m2.
SCHEMES = {
    "MXFP8": megamoe.MXFP8,
    "FP8_UE8M0_G128": megamoe.FP8_UE8M0_G128,
    "FP8_FP32_G128": megamoe.FP8_FP32_G128,
    "FP8_FP32_G32": megamoe.FP8_FP32_G32,
    "MXFP8_E5M2": megamoe.MXFP8_E5M2,
}
# Every preset: the fp8 ones above plus MXFP4 (both tie rules) and NVFP4 (both second-level
# scales).
ALL_SCHEMES = {
    **SCHEMES,
    "MXFP4": megamoe.MXFP4,
    "MXFP4_RNE": megamoe.MXFP4_RNE,
    "NVFP4_STATIC": megamoe.NVFP4_STATIC,
    "NVFP4_PER_TOKEN": megamoe.NVFP4_PER_TOKEN,
}

def is_e5m2(scheme: Any) -> bool:
    """The scheme's fp8 values are e5m2 (MXFP8_E5M2), not e4m3fn."""
    return scheme.elem == megamoe.QuantElem.FLOAT8_E5M2


def fp8_dtype_name(scheme: Any) -> str:
    """The dtype name of an fp8 scheme's x_q (as torch and output_shapes spell it)."""
    return "float8_e5m2" if is_e5m2(scheme) else "float8_e4m3fn"


SEED_SCHEME = (
    "DeepSeek V4 MegaMoE input staging requires symmetric dynamic fp8 per-group "
    "quantization with a group size dividing 128 and E8M0 or fp32 scales, got "
)
SEED_H128 = "DeepSeek V4 MegaMoE input staging requires hidden_size to be a multiple of 128."
SEED_TOPK = (
    "DeepSeek V4 MegaMoE input staging requires topk_weights and topk_ids to have the same shape."
)
SEED_PAIR = (
    "DeepSeek V4 MegaMoE shared input staging requires both shared_x_sf and shared_block_m."
)
SEED_UE8M0 = (
    "DeepSeek V4 MegaMoE shared input staging currently requires UE8M0-packed hidden scales."
)
SEED_BM = "MegaMoE shared_block_m must be positive."


def bits(a: np.ndarray) -> np.ndarray:
    """Raw bits of an array (so NaN payloads and -0.0 compare exactly)."""
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.itemsize])


def assert_bitwise(got: np.ndarray, want: np.ndarray, what: str) -> None:
    g, w = bits(got), bits(want)
    assert g.shape == w.shape, f"{what}: shape {g.shape} != {w.shape}"
    bad = np.argwhere(g != w)
    assert bad.size == 0, (
        f"{what}: {len(bad)} mismatches, first at {tuple(bad[0])}: "
        f"got {g[tuple(bad[0])]:#x}, want {w[tuple(bad[0])]:#x}"
    )


@dataclass(frozen=True)
class GroupShape:
    row: int
    col: int

    def is_per_group(self) -> bool:
        return self.row == 1 and self.col >= 1


@dataclass(frozen=True)
class ScaleDesc:
    dtype: Any
    static: bool
    group_shape: GroupShape


@dataclass(frozen=True)
class QuantKey:
    dtype: Any
    scale: ScaleDesc
    scale2: Optional[ScaleDesc] = None
    symmetric: bool = True

    def __str__(self) -> str:
        return f"QuantKey({self.dtype},{self.scale})"


def key(elem="float8_e4m3fn", sdtype="float8_e8m0fnu", G=32, row=1, static=False, sym=True, scale2=False,
        scale2_static=None):  # fmt: skip
    """A vLLM QuantKey look-alike; ``scale2`` adds a second-level ScaleDesc (the group scale's
    own unless ``scale2_static`` says static (per tensor, float32) or not (per token))."""
    sc = ScaleDesc(sdtype, static, GroupShape(row, G))
    s2 = None
    if scale2:
        s2 = sc if scale2_static is None else ScaleDesc("float32", scale2_static, GroupShape(1 if not scale2_static else -1, -1))
    return QuantKey(elem, sc, s2, sym)


# ---------------------------------------------------------------------------------------
# Hand-built DLPack capsules (what a buggy or hostile producer could hand over)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    # No deleter: the memory belongs to the NumPy array kept alive below.
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

# DLPack (code, bits) of the NumPy dtypes the tests hand over.
_DL_CODES = {"int": 0, "uint": 1, "float": 2, "bool": 6}

# Everything a capsule points into lives as long as the test session: a capsule has no
# owner once the library has imported it.
_KEEP: list = []


def dlpack_capsule(
    a: np.ndarray,
    *,
    device: int = 1,
    device_id: int = 0,
    shape: Optional[tuple] = None,
    strides: Optional[tuple] = None,
    ndim: Optional[int] = None,
    dtype: Optional[tuple] = None,
    data: Optional[int] = -1,
) -> Any:
    """An unversioned "dltensor" capsule over the memory of ``a``, with any field replaced:
    ``shape``/``strides`` (strides in elements), ``ndim`` (without changing the arrays),
    ``dtype`` as (code, bits, lanes), ``device`` (DLPack device type), ``data`` (None:
    a null pointer)."""
    kind = "bool" if a.dtype == np.bool_ else {"i": "int", "u": "uint", "f": "float"}[a.dtype.kind]
    shape = a.shape if shape is None else shape
    if strides is None:
        strides = tuple(s // a.itemsize for s in a.strides)
    n = len(shape) if ndim is None else ndim
    shape_arr = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    strides_arr = (ctypes.c_int64 * max(len(strides), 1))(*strides)
    code, bits, lanes = (_DL_CODES[kind], a.itemsize * 8, 1) if dtype is None else dtype
    m = _DLManagedTensor()
    m.dl_tensor.data = a.ctypes.data if data == -1 else data
    m.dl_tensor.device = _DLDevice(device, device_id)
    m.dl_tensor.ndim = n
    m.dl_tensor.dtype = _DLDataType(code, bits, lanes)
    m.dl_tensor.shape = ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64))
    m.dl_tensor.strides = ctypes.cast(strides_arr, ctypes.POINTER(ctypes.c_int64))
    _KEEP.append((a, shape_arr, strides_arr, m))
    return _capsule_new(ctypes.addressof(m), b"dltensor", None)


def valid_kwargs(T: int = 8, H: int = 256, K: int = 4) -> dict:
    """The arguments of a valid MXFP8 prepare_megamoe_inputs call on NumPy arrays, the
    outputs filled with 0x5A bytes (no staging result is all 0x5A)."""
    rng = np.random.default_rng(7)
    return dict(
        hidden_states=rng.standard_normal((T, H)).astype(np.float32),
        topk_weights=rng.random((T, K)).astype(np.float32),
        topk_ids=rng.integers(0, 9, (T, K)).astype(np.int32),
        x_fp8=np.full((T, H), 0x5A, np.uint8),
        x_sf=np.full((T, H // 128), 0x5A5A5A5A, np.int32),
        topk_idx_out=np.full((T, K), 0x5A5A5A5A5A5A5A5A, np.int64),
        topk_weights_out=np.full((T, K), 0x5A5A5A5A, np.int32).view(np.float32),
    )


# ---------------------------------------------------------------------------------------
# torch helpers of the custom-op tests (torch is imported only when they run)


def clone_args(a: dict) -> dict:
    """A call's keyword arguments with every torch tensor cloned."""
    import torch

    return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in a.items()}


def tbits(t: Any) -> np.ndarray:
    """The bits of a CPU torch tensor as a NumPy integer array of its element size."""
    import torch

    t = t.detach().contiguous()
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]).numpy()


def same_mutated(spec: Any, a: dict, b: dict, what: str) -> None:
    """Every argument ``spec`` declares written equal, bit for bit, in the calls ``a`` and ``b``."""
    for p in spec.params:
        if p.mutable and a.get(p.name) is not None:
            assert_bitwise(tbits(a[p.name]), tbits(b[p.name]), f"{p.name} {what}")


def spec_op_values(spec: Any, a: dict) -> Any:
    """The custom op's positional values of the call ``a`` (keyword arguments of ``spec``'s function)."""
    from megamoe._torch import _op_scheme_args

    return spec.op_values(spec.values(**a), _op_scheme_args)


def assert_fake_writes_nothing(spec: Any, fn: Any, a: dict) -> None:
    """``fn(**a)`` on FakeTensors (its custom op under the mode: the fake runs, nothing is
    computed) leaves every written argument of the real call ``a`` as it was."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    before = clone_args(a)
    with FakeTensorMode() as mode:
        fn(**{k: (mode.from_tensor(v) if isinstance(v, torch.Tensor) else v) for k, v in a.items()})
    same_mutated(spec, a, before, "untouched by the fake")


def torch_staging_outputs(rows: int, H: int, K: int, scheme: Any) -> dict:
    """Poisoned CPU torch staging outputs of ``rows`` rows (uint8 x_fp8, x_scales where the
    scheme has them)."""
    import torch

    sh = megamoe.output_shapes(rows, H, K, scheme)
    out = dict(
        x_fp8=torch.full(sh.x_fp8.shape, 0x5A, dtype=torch.uint8),
        x_sf=torch.full(sh.x_sf.shape, -7, dtype=getattr(torch, sh.x_sf.dtype)),
        topk_idx_out=torch.full((rows, K), -7, dtype=torch.int64),
        topk_weights_out=torch.full((rows, K), -7.0),
    )
    if sh.x_scales is not None:
        out["x_scales"] = torch.full(sh.x_scales.shape, -7.0)
    return out
