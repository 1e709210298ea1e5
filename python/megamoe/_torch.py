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


def _cap(t: Any) -> Any:
    """A DLPack capsule for a tensor (None and non-tensors pass through)."""
    if isinstance(t, _Tensor):
        if t.dtype == _FP8 and not _FP8_DLPACK:
            t = t.view(torch.uint8)
        return _to_dlpack(t)
    return t


def _run(
    hidden_states: Any, topk_weights: Any, topk_ids: Any, x_fp8: Any, x_sf: Any,
    topk_idx_out: Any, topk_weights_out: Any, is_padding: Any, shared_x_sf: Any,
    shared_block_m: Optional[int], scheme: _C.QuantScheme, stream: int, enable_pdl: bool,
) -> None:  # fmt: skip
    _C.prepare_inputs(
        _cap(hidden_states), _cap(topk_weights), _cap(topk_ids), _cap(x_fp8), _cap(x_sf),
        _cap(topk_idx_out), _cap(topk_weights_out), _cap(is_padding), _cap(shared_x_sf),
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
    if stream is not None or _eager_ok(hidden_states):
        _run(
            hidden_states, topk_weights, topk_ids, x_fp8, x_sf, topk_idx_out,
            topk_weights_out, is_padding, shared_x_sf, shared_block_m, as_scheme(hidden_quant),
            _stream_of(hidden_states) if stream is None else int(stream), bool(enable_pdl),
        )  # fmt: skip
        return
    torch.ops.megamoe.prepare_inputs(
        hidden_states, topk_weights, topk_ids, x_fp8, x_sf, topk_idx_out, topk_weights_out,
        is_padding, shared_x_sf, shared_block_m, *_op_scheme_args(hidden_quant),
        bool(enable_pdl),
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
    """Torch path of megamoe.dequantize (float32 on the device of ``x_fp8``)."""
    q = x_fp8.view(_FP8) if x_fp8.dtype == torch.uint8 else x_fp8
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
