"""PyTorch integration, loaded only when torch is installed.

Registers the custom op ``torch.ops.megamoe.prepare_inputs`` (CPU and CUDA kernels, a
fake implementation for FakeTensor / torch.compile tracing) and provides the torch paths
of :func:`megamoe.prepare_megamoe_inputs`, :func:`megamoe.stage` and
:func:`megamoe.dequantize`. Tensors reach the library as DLPack capsules
(``torch.utils.dlpack.to_dlpack``: no stream synchronization, so it is safe inside CUDA
graph capture); CUDA work goes to the current torch stream of the tensors' device.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch.utils.dlpack import to_dlpack as _to_dlpack

from . import _C
from ._args import optional_int
from ._scheme import as_scheme, key_fields, scheme_fields

__all__ = ["prepare", "prepare_inputs_op", "allocate", "dequantize"]

_Tensor = torch.Tensor
_FP8 = torch.float8_e4m3fn


def _fp8_exports_through_dlpack() -> bool:
    try:
        _to_dlpack(torch.empty(1, dtype=_FP8))
        return True
    except Exception:  # older torch: float8 has no DLPack code
        return False


_FP8_DLPACK = _fp8_exports_through_dlpack()

try:
    _raw_stream = torch._C._cuda_getCurrentRawStream  # what Inductor's generated code calls
except AttributeError:  # pragma: no cover - other torch builds

    def _raw_stream(index: int) -> int:
        return torch.cuda.current_stream(index).cuda_stream


def _stream_of(t: _Tensor) -> int:
    """cudaStream_t (as int) of the current torch stream of ``t``'s device; 0 on CPU."""
    return _raw_stream(t.device.index) if t.is_cuda else 0


def _cap(t: Any, name: str) -> Any:
    """A DLPack capsule for a tensor (None and non-tensors pass through: the binding names
    what is wrong with them)."""
    if not isinstance(t, _Tensor):
        return t
    if t.dtype == _FP8 and not _FP8_DLPACK:
        t = t.view(torch.uint8)
    try:
        return _to_dlpack(t)
    except Exception as e:  # a dtype, layout or device DLPack has no code for
        raise ValueError(
            f"megamoe: {name}: expected a tensor DLPack can export, got a {t.dtype} "
            f"{t.layout} tensor on {t.device} ({type(e).__name__}: {e})"
        ) from None


def _no_tokens(t: Any) -> bool:
    """``t`` (hidden_states) is a 2-D tensor of 0 rows: the reference returns before reading
    any other argument. Only a row count known now counts; a symbolic one (torch.compile
    with dynamic shapes) is decided when the op runs."""
    if not isinstance(t, _Tensor) or t.dim() != 2:
        return False
    rows = t.shape[0]
    return isinstance(rows, int) and rows == 0


def _run(
    hidden_states: Any, topk_weights: Any, topk_ids: Any, x_fp8: Any, x_sf: Any,
    topk_idx_out: Any, topk_weights_out: Any, is_padding: Any, shared_x_sf: Any,
    shared_block_m: Optional[int], scheme: _C.QuantScheme, stream: int, enable_pdl: bool,
) -> None:  # fmt: skip
    if _no_tokens(hidden_states):
        return
    _C.prepare_inputs(
        _cap(hidden_states, "hidden_states"), _cap(topk_weights, "topk_weights"),
        _cap(topk_ids, "topk_ids"), _cap(x_fp8, "x_fp8"), _cap(x_sf, "x_sf"),
        _cap(topk_idx_out, "topk_idx_out"), _cap(topk_weights_out, "topk_weights_out"),
        _cap(is_padding, "is_padding"), _cap(shared_x_sf, "shared_x_sf"),
        shared_block_m, scheme, stream, enable_pdl,
    )  # fmt: skip


# QuantScheme objects are compile-time constants for torch.compile: Dynamo guards on them
# with __eq__ and reads their fields at trace time (it cannot trace the native getters).
# (Mutating a scheme in place after compiling is not noticed; build a new one instead.)
def _plain(f: tuple) -> tuple:
    return (f[0].value, f[1].value, f[2], f[3], f[4], f[5], f[6])


def _scheme_ints(scheme: _C.QuantScheme) -> tuple:
    return _plain(scheme_fields(scheme))


try:
    torch.utils._pytree.register_constant(_C.QuantScheme)
    _scheme_ints = torch.compiler.assume_constant_result(_scheme_ints)
except (AttributeError, ValueError):  # pragma: no cover - older torch
    pass


def _op_scheme_args(hidden_quant: Any) -> tuple:
    """The scheme as the op's plain arguments (its schema cannot take a QuantScheme)."""
    if isinstance(hidden_quant, _C.QuantScheme):
        return _scheme_ints(hidden_quant)
    return _plain(key_fields(hidden_quant))


@torch.library.custom_op(
    "megamoe::prepare_inputs",
    mutates_args=("x_fp8", "x_sf", "topk_idx_out", "topk_weights_out", "shared_x_sf"),
    device_types=("cuda", "cpu"),
)
def prepare_inputs_op(
    hidden_states: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    x_fp8: torch.Tensor,
    x_sf: torch.Tensor,
    topk_idx_out: torch.Tensor,
    topk_weights_out: torch.Tensor,
    is_padding: Optional[torch.Tensor],
    shared_x_sf: Optional[torch.Tensor],
    shared_block_m: Optional[int],
    quant_elem: int,
    quant_scale: int,
    group_m: int,
    group_k: int,
    is_static: bool,
    symmetric: bool,
    has_scale2: bool,
    enable_pdl: bool,
) -> None:
    """``torch.ops.megamoe.prepare_inputs``: MegaMoE input staging as a PyTorch op.

    Same tensors as :func:`megamoe.prepare_megamoe_inputs`; the scheme is spelled out as
    ``QuantElem``/``ScaleType`` values and the remaining QuantScheme fields. Runs on the
    current stream of the tensors' CUDA device (or on the CPU for CPU tensors).
    """
    scheme = _C.QuantScheme(
        _C.QuantElem(quant_elem), _C.ScaleType(quant_scale), group_m, group_k, is_static,
        symmetric, has_scale2,
    )  # fmt: skip
    _run(
        hidden_states, topk_weights, topk_ids, x_fp8, x_sf, topk_idx_out, topk_weights_out,
        is_padding, shared_x_sf, shared_block_m, scheme, _stream_of(hidden_states), enable_pdl,
    )  # fmt: skip


@prepare_inputs_op.register_fake
def _prepare_inputs_fake(*args: Any, **kwargs: Any) -> None:
    """Nothing to compute: the op only writes its (already allocated) outputs."""
    return None


def _eager_ok(t: Any) -> bool:
    """True when a direct call is equivalent to dispatching the op (plain tensor, eager,
    no dispatch or function mode that would want to see the op)."""
    return (
        type(t) is _Tensor
        and not torch.compiler.is_compiling()
        and torch._C._len_torch_dispatch_stack() == 0
        and not torch._C._is_torch_function_mode_enabled()
    )


def prepare(
    hidden_states: Any, topk_weights: Any, topk_ids: Any, x_fp8: Any, x_sf: Any,
    topk_idx_out: Any, topk_weights_out: Any, is_padding: Any, shared_x_sf: Any,
    shared_block_m: Optional[int], hidden_quant: Any, stream: Optional[int],
    enable_pdl: bool,
) -> None:  # fmt: skip
    """Torch path of prepare_megamoe_inputs: a direct library call in plain eager mode
    (lowest host overhead), the custom op when tracing (torch.compile, FakeTensor, modes).
    An explicit ``stream`` always takes the direct path."""
    if _no_tokens(hidden_states):
        return
    bm = optional_int(shared_block_m, "shared_block_m")
    if stream is not None or _eager_ok(hidden_states):
        s = optional_int(stream, "stream", "an int (a cudaStream_t)")
        _run(
            hidden_states, topk_weights, topk_ids, x_fp8, x_sf, topk_idx_out,
            topk_weights_out, is_padding, shared_x_sf, bm, as_scheme(hidden_quant),
            _stream_of(hidden_states) if s is None else s, bool(enable_pdl),
        )  # fmt: skip
        return
    torch.ops.megamoe.prepare_inputs(
        hidden_states, topk_weights, topk_ids, x_fp8, x_sf, topk_idx_out, topk_weights_out,
        is_padding, shared_x_sf, bm, *_op_scheme_args(hidden_quant), bool(enable_pdl),
    )  # fmt: skip


def allocate(
    hidden_states: _Tensor, T: int, H: int, K: int, sf_cols: int, ue8m0: bool, rows: int
) -> tuple:
    """Outputs of megamoe.stage on the device of ``hidden_states``."""
    dev = hidden_states.device
    return (
        torch.empty((T, H), dtype=_FP8, device=dev),
        torch.empty((T, sf_cols), dtype=torch.int32 if ue8m0 else torch.float32, device=dev),
        torch.empty((T, K), dtype=torch.int64, device=dev),
        torch.empty((T, K), dtype=torch.float32, device=dev),
        torch.zeros((rows, sf_cols), dtype=torch.int32, device=dev),
    )


def dequantize(x_fp8: _Tensor, x_sf: _Tensor, group_k: int, ue8m0: bool) -> _Tensor:
    """Torch path of megamoe.dequantize (float32 on the device of ``x_fp8``); shapes are
    already checked."""
    if x_fp8.dtype not in (_FP8, torch.uint8, torch.int8):
        raise ValueError(
            f"megamoe.dequantize: x_fp8: expected dtype float8_e4m3fn or uint8, got {x_fp8.dtype}"
        )
    integral = not (x_sf.is_floating_point() or x_sf.is_complex())
    if ue8m0 and not (integral and x_sf.element_size() == 4):
        raise ValueError(
            f"megamoe.dequantize: x_sf: expected dtype int32 (packed UE8M0), got {x_sf.dtype}"
        )
    if not ue8m0 and not x_sf.is_floating_point():
        raise ValueError(f"megamoe.dequantize: x_sf: expected dtype float32, got {x_sf.dtype}")
    q = x_fp8 if x_fp8.dtype == _FP8 else x_fp8.view(_FP8)
    values = q.float()
    T, H = values.shape
    if ue8m0:
        shifts = torch.tensor([0, 8, 16, 24], dtype=torch.int32, device=x_sf.device)
        exps = ((x_sf.to(torch.int32).unsqueeze(-1) >> shifts) & 0xFF).reshape(T, -1)
        bits = torch.where(exps == 0, 0x400000, exps << 23)  # 2**(e-127); e=0: 2**-127
        bits = torch.where(exps == 255, 0x7FC00000, bits)  # E8M0 0xFF is NaN
        scales = bits.to(torch.int32).view(torch.float32)
    else:
        scales = x_sf.float()
    return (values.reshape(T, H // group_k, group_k) * scales.unsqueeze(-1)).reshape(T, H)
