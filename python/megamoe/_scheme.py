"""Quantization schemes: the presets and the conversion of vLLM-style QuantKeys."""

from __future__ import annotations

from typing import Any

from ._C import QuantElem, QuantScheme, ScaleType

__all__ = [
    "MXFP8",
    "FP8_UE8M0_G128",
    "FP8_FP32_G128",
    "FP8_FP32_G32",
    "as_scheme",
]

#: fp8 e4m3 values with UE8M0 (power-of-two) scales, groups of 32: the default.
MXFP8: QuantScheme = QuantScheme.mxfp8()
#: fp8 e4m3 values with UE8M0 scales, groups of 128.
FP8_UE8M0_G128: QuantScheme = QuantScheme.fp8_ue8m0_g128()
#: fp8 e4m3 values with fp32 scales, groups of 128 (Hopper / DeepGEMM SM90 flavour).
FP8_FP32_G128: QuantScheme = QuantScheme.fp8_fp32_g128()
#: fp8 e4m3 values with fp32 scales, groups of 32.
FP8_FP32_G32: QuantScheme = QuantScheme.fp8_fp32_g32()

# dtype name -> element type. Anything not listed is not fp8 e4m3fn; it becomes INT8, a
# rejected element type, so that the library's check raises the reference's ValueError.
_ELEMS = {
    "float8_e4m3fn": QuantElem.FLOAT8_E4M3,
    "float8_e5m2": QuantElem.FLOAT8_E5M2,
    "int8": QuantElem.INT8,
    "float4_e2m1fn_x2": QuantElem.FLOAT4_E2M1,
    "uint8": QuantElem.FLOAT4_E2M1,  # vLLM's packed-fp4 dtype
}
# scale dtype name -> scale type; unknown names become FLOAT16, a rejected scale type.
_SCALES = {
    "float8_e8m0fnu": ScaleType.UE8M0,
    "uint8": ScaleType.UE8M0,  # E8M0 exponents stored as raw bytes
    "float32": ScaleType.FLOAT32,
    "float16": ScaleType.FLOAT16,
}


def _dtype_name(dtype: Any) -> str:
    """'float8_e4m3fn' for torch.float8_e4m3fn, numpy/ml_dtypes dtypes, types or strings."""
    if isinstance(dtype, str):
        name = dtype
    elif isinstance(dtype, type):
        name = dtype.__name__
    else:
        name = str(dtype)
    return name.rsplit(".", 1)[-1]


def key_fields(key: Any) -> tuple:
    """The QuantScheme fields (elem, scale, group_m, group_k, is_static, symmetric,
    has_scale2) of a vLLM-style ``QuantKey`` (plain Python, so torch.compile traces it)."""
    try:
        scale = key.scale
        group_shape = scale.group_shape
        row, col = int(group_shape.row), int(group_shape.col)
        elem_name = _dtype_name(key.dtype)
        scale_name = _dtype_name(scale.dtype)
        is_static = bool(scale.static)
    except AttributeError as e:
        raise TypeError(
            "megamoe: hidden_quant: expected a megamoe.QuantScheme or a vLLM-style QuantKey "
            f"(dtype, scale.dtype, scale.group_shape, scale.static, symmetric, scale2), "
            f"got {type(key).__name__}: {e}"
        ) from None
    is_per_group = getattr(group_shape, "is_per_group", None)
    if is_per_group is not None and not is_per_group() and row == 1 and col >= 1:
        col = -1  # the key says "not per group": make the scheme say so too
    return (
        _ELEMS.get(elem_name, QuantElem.INT8),
        _SCALES.get(scale_name, ScaleType.FLOAT16),
        row,
        col,
        is_static,
        bool(getattr(key, "symmetric", True)),
        getattr(key, "scale2", None) is not None,
    )


def scheme_fields(scheme: QuantScheme) -> tuple:
    """The fields of a QuantScheme, in constructor order."""
    return (
        scheme.elem, scheme.scale, scheme.group_m, scheme.group_k, scheme.is_static,
        scheme.symmetric, scheme.has_scale2,
    )  # fmt: skip


def as_scheme(hidden_quant: Any) -> QuantScheme:
    """Return ``hidden_quant`` as a :class:`QuantScheme`.

    A :class:`QuantScheme` is returned as is. Anything shaped like vLLM's ``QuantKey``
    (attributes ``dtype``, ``scale`` with ``dtype``, ``group_shape`` (``row``/``col``,
    optionally ``is_per_group()``) and ``static``, plus ``symmetric`` and ``scale2``) is
    converted field by field; dtypes are matched by name (``float8_e4m3fn`` elements;
    ``float8_e8m0fnu`` or ``uint8`` scales are UE8M0, ``float32`` fp32), so torch, NumPy
    and ml_dtypes dtypes all work. Anything else becomes a rejected element / scale type.
    The result is not checked here: staging rejects an unsupported scheme with the
    reference's ``ValueError`` (see :func:`megamoe.check_scheme`).

    Raises:
        TypeError: ``hidden_quant`` is neither a QuantScheme nor QuantKey-like.
    """
    if isinstance(hidden_quant, QuantScheme):
        return hidden_quant
    return QuantScheme(*key_fields(hidden_quant))
