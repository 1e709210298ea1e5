"""Framework-neutral entry points: prepare_megamoe_inputs, stage, dequantize."""

from __future__ import annotations

import sys
from typing import Any, NamedTuple, Optional

from . import _C
from ._args import no_tokens, optional_int
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

    Like the reference, a call whose ``hidden_states`` is a 2-D array with no rows returns
    at once, whatever the other arguments are.

    Raises:
        TypeError: an array argument that is no array (a list, a number, None, ...), a
            ``hidden_quant`` that is no scheme, or a non-integer ``shared_block_m`` /
            ``stream``.
        ValueError: an invalid argument (shape, dtype, device, overlap, scheme, ...;
            also arrays megamoe cannot take: big-endian, structured or object dtypes,
            byte strides that are not whole elements); nothing was written.
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
    if no_tokens(hidden_states):
        return
    scheme = as_scheme(hidden_quant)
    _C.prepare_inputs(
        hidden_states, topk_weights, topk_ids, x_fp8, x_sf, topk_idx_out, topk_weights_out,
        is_padding, shared_x_sf, optional_int(shared_block_m, "shared_block_m"), scheme,
        _stream_int(stream), bool(enable_pdl),
    )  # fmt: skip


def _stream_int(stream: Any) -> int:
    """The ``stream`` argument as the binding's int (None: 0, the legacy default stream)."""
    s = optional_int(stream, "stream", "an int (a cudaStream_t)")
    return 0 if s is None else s


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
    """Size ``i`` of a 2-D array; 0 for other ranks and non-arrays (the library reports them)."""
    try:
        shape = tuple(x.shape)
        return int(shape[i]) if len(shape) == 2 else 0
    except Exception:
        return 0


def _sf_cols(H: int, scheme: _C.QuantScheme) -> int:
    G = scheme.group_k
    return H // (4 * G) if scheme.ue8m0 else H // G


def _is_ndarray(x: Any) -> bool:
    np = sys.modules.get("numpy")  # an ndarray exists only once NumPy is imported
    return np is not None and isinstance(x, np.ndarray)


def _allocate(
    glue: Any, hidden_states: Any, T: int, H: int, K: int, sf_cols: int, ue8m0: bool, rows: int
) -> tuple:
    """stage()'s outputs, in the framework and on the device of ``hidden_states``."""
    if glue is not None:
        return glue.allocate(hidden_states, T, H, K, sf_cols, ue8m0, rows)
    import numpy as np

    return (
        np.empty((T, H), np.uint8),
        np.empty((T, sf_cols), np.int32 if ue8m0 else np.float32),
        np.empty((T, K), np.int64),
        np.empty((T, K), np.float32),
        np.zeros((rows, sf_cols), np.int32),
    )


def _empty_stage(glue: Any, hidden_states: Any, topk_ids: Any, hidden_quant: Any,
                 shared_block_m: Any) -> StagedInputs:  # fmt: skip
    """stage() for T == 0: empty outputs, as wide as the other arguments say where they say
    it (the reference reads none of them then, so none of them may fail the call)."""
    H, K = _dim(hidden_states, 1), _dim(topk_ids, 1)
    try:
        scheme = as_scheme(hidden_quant)
        _C.check_scheme(scheme)
        ue8m0, sf_cols = scheme.ue8m0, _sf_cols(H, scheme)
    except (TypeError, ValueError):
        ue8m0, sf_cols = True, 0
    out = _allocate(glue, hidden_states, 0, H, K, sf_cols, ue8m0, 0)
    return StagedInputs(out[0], out[1], out[2], out[3], None if shared_block_m is None else out[4])


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
    regions or CUDA graph capture, since it allocates). A ``hidden_states`` without rows
    gives empty outputs at once, whatever the other arguments are.
    """
    glue = _torch_for(hidden_states)
    if glue is None and not _is_ndarray(hidden_states):
        raise TypeError(
            "megamoe.stage: hidden_states: expected a torch.Tensor or numpy.ndarray, "
            f"got {type(hidden_states).__name__} (allocate the outputs yourself and "
            "call prepare_megamoe_inputs)"
        )
    if no_tokens(hidden_states):
        return _empty_stage(glue, hidden_states, topk_ids, hidden_quant, shared_block_m)
    scheme = as_scheme(hidden_quant)
    _C.check_scheme(scheme)
    bm = optional_int(shared_block_m, "shared_block_m")
    T, H, K = _dim(hidden_states, 0), _dim(hidden_states, 1), _dim(topk_ids, 1)
    sf_cols = _sf_cols(H, scheme)
    rows = 0
    if bm is not None and bm > 0:
        rows = -(-T // bm) * (-(-bm // 128) * 128)  # ceil(T / bm) * align(bm, 128)
    out = _allocate(glue, hidden_states, T, H, K, sf_cols, scheme.ue8m0, rows)
    shared = out[4] if bm is not None else None
    prepare_megamoe_inputs(
        hidden_states, topk_weights, topk_ids, out[0], out[1], out[2], out[3],
        is_padding, shared, bm, scheme, stream=stream, enable_pdl=enable_pdl,
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
        f"megamoe.dequantize: {name}: expected a torch.Tensor or numpy.ndarray, "
        f"got {type(x).__name__}"
    )


def _dequantize_shape(q_shape: tuple, sf_shape: tuple, scheme: _C.QuantScheme) -> tuple:
    """(T, H) of a dequantize call; ValueError naming the argument of the wrong shape."""
    if len(q_shape) != 2:
        raise ValueError(f"megamoe.dequantize: x_fp8: expected a 2-D array, got shape {q_shape}")
    T, H = (int(n) for n in q_shape)
    words = 4 * scheme.group_k if scheme.ue8m0 else scheme.group_k  # hidden columns per scale
    if H % words != 0:
        raise ValueError(
            f"megamoe.dequantize: x_fp8: expected a width that is a multiple of {words}, "
            f"got shape {q_shape}"
        )
    want = (T, H // words)
    if sf_shape != want:
        raise ValueError(f"megamoe.dequantize: x_sf: expected shape {want}, got shape {sf_shape}")
    return T, H


def dequantize(x_fp8: Any, x_sf: Any, hidden_quant: Any = MXFP8) -> Any:
    """Expand staged fp8 values and scales back to float32 (for checks and debugging).

    Returns ``[T, H]`` float32 in the framework of ``x_fp8`` (torch tensor on its device,
    or a NumPy array): each value is ``fp8_value * scale`` of its group, with UE8M0
    exponent ``e`` meaning ``2**(e - 127)``. ``x_fp8`` may be fp8 or uint8 (or int8)
    bytes. An eager-mode helper for tests and debugging, for the fp8 schemes.

    Raises:
        TypeError: ``x_fp8`` or ``x_sf`` is no array, or ``hidden_quant`` no scheme.
        ValueError: a scheme that is not an accepted fp8 one, or arrays of the wrong
            rank, shape or dtype for it.
    """
    scheme = as_scheme(hidden_quant)
    _C.check_scheme(scheme)
    if scheme.elem != _C.QuantElem.FLOAT8_E4M3:
        raise ValueError(f"megamoe.dequantize: hidden_quant: expected an fp8 scheme, got {scheme!r}")
    glue = _torch_for(x_fp8)
    if glue is not None:
        if not isinstance(x_sf, sys.modules["torch"].Tensor):
            raise TypeError(
                f"megamoe.dequantize: x_sf: expected a torch.Tensor, got {type(x_sf).__name__}"
            )
        _dequantize_shape(tuple(x_fp8.shape), tuple(x_sf.shape), scheme)
        return glue.dequantize(x_fp8, x_sf, scheme.group_k, scheme.ue8m0)
    import numpy as np

    q, sf = _as_numpy(x_fp8, "x_fp8"), _as_numpy(x_sf, "x_sf")
    T, H = _dequantize_shape(q.shape, sf.shape, scheme)
    plain_bytes = q.dtype in (np.dtype(np.uint8), np.dtype(np.int8))
    if not (plain_bytes or (q.dtype.name == "float8_e4m3fn" and q.dtype.itemsize == 1)):
        raise ValueError(
            f"megamoe.dequantize: x_fp8: expected dtype uint8 or float8_e4m3fn, got dtype {q.dtype}"
        )
    if scheme.ue8m0 and not (sf.dtype.kind in "iu" and sf.dtype.itemsize == 4):
        raise ValueError(
            f"megamoe.dequantize: x_sf: expected dtype int32 (packed UE8M0), got dtype {sf.dtype}"
        )
    if not scheme.ue8m0 and sf.dtype.kind != "f":
        raise ValueError(f"megamoe.dequantize: x_sf: expected dtype float32, got dtype {sf.dtype}")
    values = _fp8_e4m3fn_table()[q.view(np.uint8)]
    if scheme.ue8m0:
        words = sf.astype(np.int64) & 0xFFFFFFFF
        exps = ((words[:, :, None] >> np.array([0, 8, 16, 24])) & 0xFF).reshape(T, -1)
        scales = np.ldexp(1.0, exps - 127).astype(np.float32)  # exact, 2**-127 included
        scales[exps == 255] = np.nan  # E8M0 0xFF is NaN
    else:
        scales = sf.astype(np.float32)
    G = scheme.group_k
    return (values.reshape(T, H // G, G) * scales[:, :, None]).reshape(T, H)
