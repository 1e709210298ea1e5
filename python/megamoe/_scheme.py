"""Quantization schemes: the presets and the conversion of vLLM-style QuantKeys."""

from __future__ import annotations

from typing import Any

from ._C import QuantElem, QuantScheme, Rounding, Scale2, ScaleType

__all__ = [
    "MXFP8",
    "FP8_UE8M0_G128",
    "FP8_FP32_G128",
    "FP8_FP32_G32",
    "MXFP8_E5M2",
    "MXFP4",
    "MXFP4_RNE",
    "NVFP4_STATIC",
    "NVFP4_PER_TOKEN",
    "BF16",
    "NVFP4_ONLINE",
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
#: fp8 e5m2 values with UE8M0 scales from amax / 57344, groups of 32 (FlashInfer's
#: mxfp8_e5m2): more range, one mantissa bit less than MXFP8.
MXFP8_E5M2: QuantScheme = QuantScheme.mxfp8_e5m2()
#: fp4 e2m1 values (two per byte) with UE8M0 scales, groups of 32, ties toward zero
#: (DeepGEMM's per_token_cast_to_fp4).
MXFP4: QuantScheme = QuantScheme.mxfp4()
#: MXFP4 with ties to the even code (PTX cvt.rn.satfinite.e2m1x2.f32).
MXFP4_RNE: QuantScheme = QuantScheme.mxfp4(Rounding.NEAREST_EVEN)
#: NVFP4: e2m1 values, e4m3 scales over 16 columns, a static fp32 global scale (global_scale=).
NVFP4_STATIC: QuantScheme = QuantScheme.nvfp4_static()
#: NVFP4 with a per-token fp32 second-level scale written to x_scales= (SGLang nvfp4xnvfp4).
NVFP4_PER_TOKEN: QuantScheme = QuantScheme.nvfp4_per_token()
#: bf16 pass-through (FlashInfer's Bf16InputStage): x_fp8 is the input as bfloat16 [T, H]
#: (bf16 bits copied, fp16 / fp32 nearest even, NaN 0x7FC0), no scales: x_sf None or [T, 0].
BF16: QuantScheme = QuantScheme.bf16()
#: NVFP4 whose global scale the call computes, fl(max(amax, floor) / 2688) over the whole
#: tensor, and writes to global_scale= (a [1] float32 output); the groups are NVFP4_STATIC's.
NVFP4_ONLINE: QuantScheme = QuantScheme.nvfp4_online()

# dtype name -> element type. Anything not listed becomes INT8, a rejected element type, so
# that the library's check raises the reference's ValueError. vLLM stores packed fp4 as
# uint8 (two e2m1 values per byte); PyTorch has float4_e2m1fn_x2 for the same bytes.
_ELEMS = {
    "float8_e4m3fn": QuantElem.FLOAT8_E4M3,
    "float8_e5m2": QuantElem.FLOAT8_E5M2,
    "int8": QuantElem.INT8,
    "float4_e2m1fn_x2": QuantElem.FLOAT4_E2M1,
    "float4_e2m1fn": QuantElem.FLOAT4_E2M1,
    "uint8": QuantElem.FLOAT4_E2M1,
}
# scale dtype name -> scale type; unknown names become FLOAT16, a rejected scale type.
# NVFP4's block scales are e4m3 bytes (vLLM: scale dtype float8_e4m3fn).
_SCALES = {
    "float8_e8m0fnu": ScaleType.UE8M0,
    "uint8": ScaleType.UE8M0,  # E8M0 exponents stored as raw bytes
    "float32": ScaleType.FLOAT32,
    "float16": ScaleType.FLOAT16,
    "float8_e4m3fn": ScaleType.FLOAT8_E4M3,
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


def key_fields(key: Any) -> dict:
    """The QuantScheme fields of a vLLM-style ``QuantKey`` as constructor keywords (plain
    Python, so torch.compile traces it)."""
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
    elem = _ELEMS.get(elem_name, QuantElem.INT8)
    # A second-level scale (vLLM: scale2) is static when its ScaleDesc says so (NVFP4's
    # global scale), otherwise computed per token. A scale2 without `static` is static.
    scale2 = getattr(key, "scale2", None)
    if scale2 is None:
        s2 = Scale2.NONE
    else:
        s2 = Scale2.STATIC if bool(getattr(scale2, "static", True)) else Scale2.PER_TOKEN
    return dict(
        elem=elem,
        scale=_SCALES.get(scale_name, ScaleType.FLOAT16),
        group_m=row,
        group_k=col,
        is_static=is_static,
        symmetric=bool(getattr(key, "symmetric", True)),
        scale2=s2,
        # fp4 keys mean DeepGEMM's rule (the presets say it explicitly, so that
        # as_scheme(key) == MXFP4 / NVFP4_*); fp8 keys the codec's own.
        rounding=Rounding.TIES_TOWARD_ZERO if elem == QuantElem.FLOAT4_E2M1 else Rounding.DEFAULT,
    )


def scheme_fields(scheme: QuantScheme) -> tuple:
    """Every field of a QuantScheme, in the order of megamoe._signature.SCHEME_FIELDS."""
    return (
        scheme.elem, scheme.scale, scheme.group_m, scheme.group_k, scheme.is_static,
        scheme.symmetric, scheme.scale2, scheme.rounding, scheme.amax_floor,
    )  # fmt: skip


def scheme_from_plain(f: tuple) -> QuantScheme:
    """The QuantScheme of the plain values the custom op carries (enums as ints)."""
    return QuantScheme(
        QuantElem(f[0]), ScaleType(f[1]), f[2], f[3], f[4], f[5],
        scale2=Scale2(f[6]), rounding=Rounding(f[7]), amax_floor=f[8],
    )  # fmt: skip


def plain_key_fields(key: Any) -> tuple:
    """A QuantKey's scheme as the custom op's plain values (no QuantScheme built, so that
    torch.compile can trace it)."""
    k = key_fields(key)
    return (
        k["elem"].value, k["scale"].value, k["group_m"], k["group_k"], k["is_static"],
        k["symmetric"], k["scale2"].value, k["rounding"].value, 1e-4,
    )  # fmt: skip


def as_scheme(hidden_quant: Any) -> QuantScheme:
    """Return ``hidden_quant`` as a :class:`QuantScheme`.

    A :class:`QuantScheme` is returned as is. Anything shaped like vLLM's ``QuantKey``
    (attributes ``dtype``, ``scale`` with ``dtype``, ``group_shape`` (``row``/``col``,
    optionally ``is_per_group()``) and ``static``, plus ``symmetric`` and ``scale2``) is
    converted field by field; dtypes are matched by name, so torch, NumPy and ml_dtypes
    dtypes all work:

    * elements: ``float8_e4m3fn`` is fp8 e4m3, ``float8_e5m2`` fp8 e5m2; ``float4_e2m1fn_x2``
      and ``uint8`` (vLLM's packed-fp4 dtype) are fp4 e2m1 (ties toward zero, DeepGEMM's
      rule);
    * scales: ``float8_e8m0fnu`` or ``uint8`` are UE8M0, ``float32`` fp32,
      ``float8_e4m3fn`` e4m3 bytes (NVFP4);
    * ``scale2``: a static one is ``Scale2.STATIC`` (NVFP4's global scale, global_scale=),
      a dynamic one ``Scale2.PER_TOKEN`` (x_scales=).

    So vLLM's MXFP8 / fp8 block keys give MXFP8 / FP8_*, a ``float8_e5m2`` key with UE8M0
    scales over groups of 32 MXFP8_E5M2, vLLM's MXFP4 key (uint8 elements, uint8 scales,
    groups of 32) MXFP4 and its NVFP4 key (uint8, float8_e4m3fn scales of 16, static
    float32 scale2) NVFP4_STATIC. Anything else becomes a rejected element / scale
    type. The result is not checked here: staging rejects an unsupported scheme with the
    reference's ``ValueError`` (see :func:`megamoe.check_scheme`).

    Raises:
        TypeError: ``hidden_quant`` is neither a QuantScheme nor QuantKey-like.
    """
    if isinstance(hidden_quant, QuantScheme):
        return hidden_quant
    return QuantScheme(**key_fields(hidden_quant))
