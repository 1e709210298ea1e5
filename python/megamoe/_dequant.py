"""megamoe.dequantize: staged values and scales back to float32, for every format.

The argument checks are framework-neutral (shapes and dtype names); the arithmetic is
NumPy here and PyTorch in megamoe._torch. Per group of G columns the value is
``fl(element * scale)`` with ``scale`` the group's scale: 2**(e - 127) for UE8M0 byte e
(0xFF: NaN), the fp32 scale, or for NVFP4 ``fl(e4m3(byte) * s2)`` with s2 the static
global scale or the token's x_scales entry. e2m1, e4m3 and e5m2 values times a power of two
are exact, so fp8 / MXFP4 results are exact; NVFP4 rounds once, in the second-level product.
"""

from __future__ import annotations

import math
import sys
from typing import Any, NamedTuple

from . import _C
from ._C import QuantElem, QuantScheme, Scale2, ScaleType

__all__ = ["Format", "dequantize"]


class Format(NamedTuple):
    fp4: bool  # two e2m1 values per byte
    sf: str  # "ue8m0" (packed words), "e4m3" (packed words) or "fp32"
    G: int  # columns per scale
    scale2: Scale2
    e5m2: bool = False  # fp8 bytes are e5m2 (MXFP8 e5m2), else e4m3fn


def format_of(s: QuantScheme) -> Format:
    """The layout of an accepted scheme (check_scheme has passed)."""
    sf = {ScaleType.UE8M0: "ue8m0", ScaleType.FLOAT8_E4M3: "e4m3"}.get(s.scale, "fp32")
    return Format(s.elem == QuantElem.FLOAT4_E2M1, sf, int(s.group_k), s.scale2, s.elem == QuantElem.FLOAT8_E5M2)


def _fail(name: str, expected: str, got: str) -> None:
    raise ValueError(f"megamoe.dequantize: {name}: expected {expected}, got {got}")


def _dtype_name(x: Any) -> str:
    return str(x.dtype).rsplit(".", 1)[-1]


def _is_torch(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _as_numpy(x: Any, name: str) -> Any:
    """``x`` as a NumPy array without a copy where NumPy can view it; TypeError for
    objects that are no array."""
    import numpy as np

    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "__array_interface__") or hasattr(x, "__array__"):
        return np.asarray(x)
    if hasattr(x, "__dlpack__"):
        return np.from_dlpack(x)
    raise TypeError(
        f"megamoe.dequantize: {name}: expected a torch.Tensor or numpy.ndarray, got {type(x).__name__}"
    )


_BYTES = ("uint8", "int8")
_FP8_BYTES = _BYTES + ("float8_e4m3fn",)
_E5M2_BYTES = _BYTES + ("float8_e5m2",)
_FP4_BYTES = _BYTES + ("float4_e2m1fn_x2",)
_WORDS = ("int32", "uint32")


def _check(q: Any, sf: Any, s: QuantScheme, x_scales: Any, global_scale: Any) -> Format:
    """Shapes and dtypes of a dequantize call; the format meant (MXFP4 for the default
    scheme with packed bytes and MXFP4's scale width, as staging reads it)."""
    if len(q.shape) != 2:
        _fail("x_q", "a 2-D array", f"shape {tuple(q.shape)}")
    T, W = (int(n) for n in q.shape)
    sf_shape = tuple(int(n) for n in sf.shape)
    if (
        s == QuantScheme.mxfp8().with_amax_floor(s.amax_floor)
        and _dtype_name(q) in _FP4_BYTES
        and W % 64 == 0
        and len(sf_shape) == 2
        and sf_shape[1] == W // 64
        and W > 0
    ):
        s = QuantScheme.mxfp4().with_amax_floor(s.amax_floor)  # vLLM's MXFP4 drop-in rule
    fmt = format_of(s)
    # Staging's H is a multiple of 128 and, for packed scales, of 4G (whole scale words).
    cols = math.lcm(128, 4 * fmt.G if fmt.sf != "fp32" else fmt.G)
    step = cols // 2 if fmt.fp4 else cols
    if W % step != 0:
        _fail("x_q", f"a width that is a multiple of {step}", f"shape {tuple(q.shape)}")
    H = 2 * W if fmt.fp4 else W
    want = _C.output_shapes(T, H, 0, s)
    if sf_shape != tuple(want["x_sf"][0]):
        _fail("x_sf", f"shape {tuple(want['x_sf'][0])}", f"shape {sf_shape}")
    # Raw bytes are read as the scheme's codec; a typed fp8 array must be that codec.
    ok = _FP4_BYTES if fmt.fp4 else _E5M2_BYTES if fmt.e5m2 else _FP8_BYTES
    if _dtype_name(q) not in ok:
        _fail("x_q", "dtype " + " or ".join(ok), f"dtype {_dtype_name(q)}")
    if fmt.sf != "fp32" and _dtype_name(sf) not in _WORDS:
        kind = "packed UE8M0" if fmt.sf == "ue8m0" else "packed e4m3 bytes"
        _fail("x_sf", f"dtype int32 ({kind})", f"dtype {_dtype_name(sf)}")
    if fmt.sf == "fp32" and not _dtype_name(sf).startswith(("float", "bfloat")):
        _fail("x_sf", "dtype float32", f"dtype {_dtype_name(sf)}")
    for name, arr, needed, want_shape in (
        ("x_scales", x_scales, fmt.scale2 == Scale2.PER_TOKEN, (T,)),
        ("global_scale", global_scale, fmt.scale2 in (Scale2.STATIC, Scale2.ONLINE), None),
    ):
        if arr is None:
            if needed:
                _fail(name, f"an array ({s.name} needs one)", "none")
            continue
        if not needed:
            _fail(name, f"none ({s.name} has no {name})", "an array")
        shape = tuple(int(n) for n in arr.shape)
        if want_shape is not None and shape != want_shape:
            _fail(name, f"shape {want_shape}", f"shape {shape}")
        if want_shape is None and (len(shape) > 2 or any(n != 1 for n in shape)):
            _fail(name, "a one-element array", f"shape {shape}")
        if not _dtype_name(arr).startswith("float"):
            _fail(name, "dtype float32", f"dtype {_dtype_name(arr)}")
    return fmt


def _table_fp8() -> Any:
    """float32 value of each of the 256 fp8 e4m3fn bytes."""
    import numpy as np

    b = np.arange(256, dtype=np.int64)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp, man = (b >> 3) & 0xF, b & 0x7
    mag = np.where(exp == 0, man * 2.0**-9, (1.0 + man / 8.0) * 2.0 ** (exp - 7.0))
    mag = np.where((exp == 15) & (man == 7), np.nan, mag)
    return (sign * mag).astype(np.float32)


def _table_e5m2() -> Any:
    """float32 value of each of the 256 fp8 e5m2 bytes (0x7C / 0xFC: +-Inf, 0x7D-0x7F and
    0xFD-0xFF: NaN of the byte's sign, as torch's conversion gives it; subnormals
    m * 2**-16)."""
    import numpy as np

    b = np.arange(256, dtype=np.int64)
    exp, man = (b >> 2) & 0x1F, b & 0x3
    mag = np.where(exp == 0, man * 2.0**-16, (1.0 + man / 4.0) * 2.0 ** (exp - 15.0))
    mag = np.where(exp == 31, np.where(man == 0, np.inf, np.nan), mag)
    return np.where(b & 0x80, -mag, mag).astype(np.float32)  # negation flips a NaN's sign too


def _table_fp4() -> Any:
    """float32 value of each of the 16 e2m1 nibbles (0x8 is -0.0)."""
    import numpy as np

    mag = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)
    return np.concatenate([mag, -mag]).astype(np.float32)


def _numpy(q: Any, sf: Any, fmt: Format, x_scales: Any, global_scale: Any) -> Any:
    import numpy as np

    b = q.view(np.uint8)
    if fmt.fp4:
        values = _table_fp4()[np.stack([b & 0xF, b >> 4], axis=-1).reshape(b.shape[0], -1)]
    else:
        values = (_table_e5m2() if fmt.e5m2 else _table_fp8())[b]
    T, H = values.shape
    if fmt.sf == "fp32":
        scales = sf.astype(np.float32)
    else:
        words = sf.astype(np.int64) & 0xFFFFFFFF
        codes = ((words[:, :, None] >> np.array([0, 8, 16, 24])) & 0xFF).reshape(T, -1)
        if fmt.sf == "ue8m0":
            with np.errstate(over="ignore"):  # 0xFF overflows here; it is NaN just below
                scales = np.ldexp(1.0, codes - 127).astype(np.float32)  # exact, 2**-127 included
            scales[codes == 255] = np.nan  # E8M0 0xFF is NaN
        else:
            scales = _table_fp8()[codes]
    with np.errstate(over="ignore", invalid="ignore"):
        if global_scale is not None:
            scales = (scales * np.float32(np.asarray(global_scale, np.float32).reshape(()))).astype(np.float32)
        if x_scales is not None:
            scales = (scales * np.asarray(x_scales, np.float32)[:, None]).astype(np.float32)
        G = fmt.G
        return (values.reshape(T, H // G, G) * scales[:, :, None]).reshape(T, H).astype(np.float32)


def _bf16_values(x_q: Any, x_sf: Any, s: QuantScheme) -> Any:
    """BF16 (no scales): the float32 values of the bf16 x_q; x_sf None or ``[T, 0]``."""
    if len(x_q.shape) != 2:
        _fail("x_q", "a 2-D array", f"shape {tuple(x_q.shape)}")
    T = int(x_q.shape[0])
    if x_sf is not None and tuple(int(n) for n in x_sf.shape) != (T, 0):
        _fail("x_sf", f"None or shape {(T, 0)} ({s.name} has no scales)", f"shape {tuple(x_sf.shape)}")
    if _dtype_name(x_q) != "bfloat16":
        _fail("x_q", "dtype bfloat16", f"dtype {_dtype_name(x_q)}")
    if _is_torch(x_q):
        return x_q.float()
    import numpy as np

    bits = np.asarray(x_q).view(np.uint16).astype(np.uint32) << 16
    return bits.view(np.float32)


def dequantize(x_q: Any, x_sf: Any, scheme: Any, x_scales: Any, global_scale: Any) -> Any:
    from ._scheme import as_scheme

    s = as_scheme(scheme)
    _C.check_scheme(s)
    if s.elem == QuantElem.BFLOAT16:
        return _bf16_values(x_q, x_sf, s)
    if _is_torch(x_q):
        import torch

        for name, v in (("x_sf", x_sf), ("x_scales", x_scales), ("global_scale", global_scale)):
            if (v is not None or name == "x_sf") and not isinstance(v, torch.Tensor):
                raise TypeError(
                    f"megamoe.dequantize: {name}: expected a torch.Tensor, got {type(v).__name__}"
                )
        fmt = _check(x_q, x_sf, s, x_scales, global_scale)
        from . import _torch

        return _torch.dequantize(x_q, x_sf, fmt, x_scales, global_scale)
    q, sf = _as_numpy(x_q, "x_q"), _as_numpy(x_sf, "x_sf")
    xs = None if x_scales is None else _as_numpy(x_scales, "x_scales")
    gs = None if global_scale is None else _as_numpy(global_scale, "global_scale")
    fmt = _check(q, sf, s, xs, gs)
    return _numpy(q, sf, fmt, xs, gs)

