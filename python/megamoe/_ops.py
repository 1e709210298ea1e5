"""Framework-neutral entry points: prepare_megamoe_inputs, stage, dequantize."""

from __future__ import annotations

import sys
from typing import Any, NamedTuple, Optional

from . import _C
from ._scheme import MXFP8, as_scheme

__all__ = ["prepare_megamoe_inputs", "stage", "dequantize", "StagedInputs"]

_torch_glue: Any = None  # megamoe._torch once loaded


def _torch_for(x: Any) -> Any:
    """megamoe._torch if ``x`` is a torch.Tensor, else None (never imports torch itself)."""
    global _torch_glue
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(x, torch.Tensor):
        return None
    if _torch_glue is None:
        from . import _torch as glue

        _torch_glue = glue
    return _torch_glue


def prepare_megamoe_inputs(
    hidden_states: Any,
    topk_weights: Any,
    topk_ids: Any,
    x_fp8: Any,
    x_sf: Any,
    topk_idx_out: Any,
    topk_weights_out: Any,
    is_padding: Any = None,
    shared_x_sf: Any = None,
    shared_block_m: Optional[int] = None,
    hidden_quant: Any = MXFP8,
    *,
    stream: Optional[int] = None,
    enable_pdl: bool = False,
) -> None:
    """Quantize hidden states and repack top-k routing for DeepGEMM MegaMoE.

    Drop-in replacement of vLLM's ``prepare_megamoe_inputs`` (same parameters, defaults
    and ``ValueError`` messages). Works on PyTorch tensors (CPU or CUDA; through the
    custom op ``torch.ops.megamoe.prepare_inputs`` under ``torch.compile``), NumPy arrays
    and any other DLPack / buffer-protocol array. Nothing is allocated; outputs are
    written in place; the host never synchronizes with the device.

    Args:
        hidden_states: ``[T, H]`` activations, bf16/fp16/fp32, any strides, H % 128 == 0.
        topk_weights: ``[T, K]`` router weights, fp32/bf16/fp16.
        topk_ids: ``[T, K]`` router expert ids, int32/int64.
        x_fp8: out ``[T, H]`` fp8 e4m3fn values (torch.float8_e4m3fn, or uint8 bytes).
        x_sf: out scales: UE8M0 schemes ``[T, H/(4G)]`` int32 (four exponent bytes per
            word, little-endian in group order); fp32 schemes ``[T, H/G]`` float32
            (a transposed / MN-major view is fine).
        topk_idx_out: out ``[T, K]`` int64 ids, -1 for padded tokens.
        topk_weights_out: out ``[T, K]`` float32 weights, +0.0 for padded tokens.
        is_padding: optional ``[T]`` bool/uint8 mask, nonzero = padded token.
        shared_x_sf: optional out ``[R, H/128]`` int32, the shared expert's permuted copy
            of the UE8M0 scales; given exactly when ``shared_block_m`` is.
        shared_block_m: block M of the MoE scheduler used to lay out ``shared_x_sf``.
        hidden_quant: a :class:`QuantScheme` (``MXFP8`` default, ``FP8_UE8M0_G128``,
            ``FP8_FP32_G128``, ``FP8_FP32_G32``) or a vLLM ``QuantKey``.
        stream: CUDA stream as an int (``cudaStream_t``). Default: for torch tensors the
            current torch stream of their device, otherwise 0 (legacy default stream).
            Leave it None inside torch.compile regions.
        enable_pdl: launch with programmatic dependent launch (sm_90+, CUDA only).

    Raises:
        ValueError: an invalid argument (shape, dtype, device, overlap, scheme, ...);
            nothing was written.
        RuntimeError: a CUDA failure, or CUDA tensors given to a build without CUDA.
    """
    glue = _torch_for(hidden_states)
    if glue is not None:  # the scheme is converted there (traceable by torch.compile)
        glue.prepare(
            hidden_states, topk_weights, topk_ids, x_fp8, x_sf, topk_idx_out,
            topk_weights_out, is_padding, shared_x_sf, shared_block_m, hidden_quant,
            stream, enable_pdl,
        )  # fmt: skip
        return
    scheme = as_scheme(hidden_quant)
    _C.prepare_inputs(
        hidden_states, topk_weights, topk_ids, x_fp8, x_sf, topk_idx_out, topk_weights_out,
        is_padding, shared_x_sf, shared_block_m, scheme,
        0 if stream is None else int(stream), bool(enable_pdl),
    )  # fmt: skip


class StagedInputs(NamedTuple):
    """The outputs of :func:`stage`, allocated in the input's framework and device."""

    x_fp8: Any
    """``[T, H]`` fp8 values (torch.float8_e4m3fn; uint8 bytes for NumPy)."""
    x_sf: Any
    """Scales: ``[T, H/(4G)]`` int32 packed UE8M0, or ``[T, H/G]`` float32."""
    topk_idx: Any
    """``[T, K]`` int64 expert ids, -1 for padded tokens."""
    topk_weights: Any
    """``[T, K]`` float32 weights, 0 for padded tokens."""
    shared_x_sf: Any
    """``[ceil(T/bm)*align(bm,128), H/128]`` int32 permuted scales (zero where no token
    maps), or None when ``shared_block_m`` was not given."""


def _dim(x: Any, i: int) -> int:
    shape = tuple(x.shape)
    return int(shape[i]) if len(shape) == 2 else 0  # bad ranks: the library reports them


def stage(
    hidden_states: Any,
    topk_weights: Any,
    topk_ids: Any,
    *,
    is_padding: Any = None,
    hidden_quant: Any = MXFP8,
    shared_block_m: Optional[int] = None,
    stream: Optional[int] = None,
    enable_pdl: bool = False,
) -> StagedInputs:
    """Allocate the outputs and run :func:`prepare_megamoe_inputs` into them.

    Outputs are created with the framework of ``hidden_states`` (torch: same device,
    ``x_fp8`` as torch.float8_e4m3fn; NumPy: ``x_fp8`` as uint8). ``shared_x_sf`` is
    allocated (zero-filled) only when ``shared_block_m`` is given. Same errors as
    :func:`prepare_megamoe_inputs`. An eager-mode convenience (not for torch.compile
    regions or CUDA graph capture, since it allocates).
    """
    scheme = as_scheme(hidden_quant)
    _C.check_scheme(scheme)
    T, H, K = _dim(hidden_states, 0), _dim(hidden_states, 1), _dim(topk_ids, 1)
    G = scheme.group_k
    sf_cols = H // (4 * G) if scheme.ue8m0 else H // G
    rows = 0
    if shared_block_m is not None and shared_block_m > 0:
        bm = int(shared_block_m)
        rows = -(-T // bm) * (-(-bm // 128) * 128)  # ceil(T / bm) * align(bm, 128)

    glue = _torch_for(hidden_states)
    if glue is not None:
        out = glue.allocate(hidden_states, T, H, K, sf_cols, scheme.ue8m0, rows)
    else:
        import numpy as np

        if not isinstance(hidden_states, np.ndarray):
            raise TypeError(
                "megamoe.stage: hidden_states: expected a torch.Tensor or numpy.ndarray, "
                f"got {type(hidden_states).__name__} (allocate the outputs yourself and "
                "call prepare_megamoe_inputs)"
            )
        out = (
            np.empty((T, H), np.uint8),
            np.empty((T, sf_cols), np.int32 if scheme.ue8m0 else np.float32),
            np.empty((T, K), np.int64),
            np.empty((T, K), np.float32),
            np.zeros((rows, sf_cols), np.int32),
        )
    shared = out[4] if shared_block_m is not None else None
    prepare_megamoe_inputs(
        hidden_states, topk_weights, topk_ids, out[0], out[1], out[2], out[3],
        is_padding, shared, shared_block_m, scheme, stream=stream, enable_pdl=enable_pdl,
    )  # fmt: skip
    return StagedInputs(out[0], out[1], out[2], out[3], shared)


def _fp8_e4m3fn_table() -> Any:
    """float32 value of each of the 256 fp8 e4m3fn bytes (NumPy)."""
    import numpy as np

    b = np.arange(256, dtype=np.int64)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp, man = (b >> 3) & 0xF, b & 0x7
    mag = np.where(exp == 0, man * 2.0**-9, (1.0 + man / 8.0) * 2.0 ** (exp - 7.0))
    mag = np.where((exp == 15) & (man == 7), np.nan, mag)
    return (sign * mag).astype(np.float32)


def dequantize(x_fp8: Any, x_sf: Any, hidden_quant: Any = MXFP8) -> Any:
    """Expand staged fp8 values and scales back to float32 (for checks and debugging).

    Returns ``[T, H]`` float32 in the framework of ``x_fp8`` (torch tensor on its device,
    or a NumPy array): each value is ``fp8_value * scale`` of its group, with UE8M0
    exponent ``e`` meaning ``2**(e - 127)``. ``x_fp8`` may be fp8 or uint8 bytes.
    An eager-mode helper for tests and debugging.
    """
    scheme = as_scheme(hidden_quant)
    _C.check_scheme(scheme)
    glue = _torch_for(x_fp8)
    if glue is not None:
        return glue.dequantize(x_fp8, x_sf, scheme.group_k, scheme.ue8m0)
    import numpy as np

    q = np.asarray(x_fp8)
    if q.dtype != np.uint8:
        q = q.view(np.uint8)  # ml_dtypes float8_e4m3fn and other 1-byte views
    values = _fp8_e4m3fn_table()[q]
    T, H = values.shape
    sf = np.asarray(x_sf)
    if scheme.ue8m0:
        words = sf.astype(np.int64) & 0xFFFFFFFF
        exps = ((words[:, :, None] >> np.array([0, 8, 16, 24])) & 0xFF).reshape(T, -1)
        scales = np.ldexp(1.0, exps - 127).astype(np.float32)  # exact, 2**-127 included
        scales[exps == 255] = np.nan  # E8M0 0xFF is NaN
    else:
        scales = sf.astype(np.float32)
    G = scheme.group_k
    return (values.reshape(T, H // G, G) * scales[:, :, None]).reshape(T, H)
