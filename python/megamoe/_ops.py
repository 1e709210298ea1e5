"""Framework-neutral implementations: the staging calls behind the generated entry points
(megamoe._entry), output_shapes, stage and dequantize."""

from __future__ import annotations

import math
import operator
import sys
from typing import Any, NamedTuple, Optional

from . import _C, _dequant
from ._args import allocate, no_tokens, optional_int, shape_of
from ._scheme import MXFP8, as_scheme
from ._signature import (
    GATE_AND_ROUTE,
    GATE_ROUTE_AND_STAGE,
    MHC_AND_STAGE,
    NORM_AND_STAGE,
    PREPARE,
    ROUTE,
    ROUTE_AND_STAGE,
    ROUTING,
    _as_bool,
    out_of_range,
)

__all__ = [
    "output_shapes",
    "OutputShapes",
    "TensorSpec",
    "stage",
    "StagedInputs",
    "dequantize",
    "dsv4_topk_prepare_megamoe",
]

_torch_glue: Any = None  # megamoe._torch once loaded

_P_FULL = PREPARE.index("full_buffer")
_R_FULL = ROUTING.index("full_buffer")
_RS_FULL = ROUTE_AND_STAGE.index("full_buffer")
_N_FULL = NORM_AND_STAGE.index("full_buffer")
_G_FULL = GATE_ROUTE_AND_STAGE.index("full_buffer")
_M_FULL = MHC_AND_STAGE.index("full_buffer")
# mhc_pre_and_stage's arrays that vLLM shapes 3-D: (index, name, written).
_M_3D = tuple((MHC_AND_STAGE.index(n), n, out) for n, out in (("residual", False), ("post_mix", True), ("comb_mix", True)))


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


# ---------------------------------------------------------------------------------------
# Behind the generated entry points (arguments in the order of megamoe._signature)


def prepare_impl(*a: Any) -> None:
    glue = _torch_for(a[0])
    if glue is not None:  # the scheme is converted there (traceable by torch.compile)
        glue.prepare(a)
        return
    if not _as_bool(a[_P_FULL], "full_buffer") and no_tokens(a[0]):
        return
    _C.prepare_inputs(*PREPARE.native_args(a, as_scheme))


def _at_once(a: Any, rows: int, full: Optional[int]) -> bool:
    """A call (``a``: its arguments in table order) returns at once: its argument ``rows``
    is an array without rows, outside full-buffer mode (argument ``full``, if it has one)."""
    return (full is None or not _as_bool(a[full], "full_buffer")) and no_tokens(a[rows])


def _explain(name: str, spec: Any, a: Any, rows: int, full: Optional[int], scheme: Any) -> str:
    """megamoe.<name> (``a``: the arguments of ``spec``'s call in table order): "nothing to
    do" without the native module for a call that would return at once, else the text of
    megamoe._C.<name> (the same name), torch tensors through megamoe._torch's glue."""
    if _at_once(a, rows, full):
        return f"nothing to do: {spec.names[rows]} has no rows (T == 0)"
    native = getattr(_C, name, None)
    if native is None:  # pragma: no cover - a library without plan.h
        raise NotImplementedError(f"megamoe.{name}: this build of megamoe has no megamoe::explain for it")
    glue = _torch_for(a[rows]) or _torch_for(a[0])
    if glue is not None:
        return glue.explain_call(spec, native, a, scheme)
    return native(*spec.native_args(a, scheme))


def explain_impl(*a: Any) -> str:
    return _explain("explain", PREPARE, a, 0, _P_FULL, as_scheme)


def explain_routing_impl(*a: Any) -> str:  # T is topk_ids.shape[0]
    return _explain("explain_routing", ROUTING, a, 1, _R_FULL, None)


def explain_route_impl(*a: Any) -> str:  # T is router_logits.shape[0]
    return _explain("explain_route", ROUTE, a, 0, None, None)


def explain_route_and_stage_impl(*a: Any) -> str:
    return _explain("explain_route_and_stage", ROUTE_AND_STAGE, a, 1, _RS_FULL, as_scheme)


def _dispatch(a: Any, rows: int, full: Optional[int], torch_path: str, native: Any) -> None:
    """An entry point's call (``a``: its arguments in table order): torch tensors take the
    torch path (megamoe._torch.<torch_path>), a call whose argument ``rows`` has no rows
    returns (outside full-buffer mode, argument ``full``), the rest goes to ``native``."""
    glue = _torch_for(a[rows]) or _torch_for(a[0])
    if glue is not None:
        getattr(glue, torch_path)(a)
        return
    if _at_once(a, rows, full):
        return
    native(a)


def routing_impl(*a: Any) -> None:
    _dispatch(a, 1, _R_FULL, "stage_routing", lambda v: _C.stage_routing(*ROUTING.native_args(v, None)))


def route_impl(*a: Any) -> None:  # T is router_logits.shape[0]
    _dispatch(a, 0, None, "route", lambda v: _C.route(*ROUTE.native_args(v, None)))


def route_and_stage_impl(*a: Any) -> None:
    _dispatch(a, 1, _RS_FULL, "route_and_stage", lambda v: _C.route_and_stage(*ROUTE_AND_STAGE.native_args(v, as_scheme)))


def explain_rmsnorm_and_stage_impl(*a: Any) -> str:
    return _explain("explain_rmsnorm_and_stage", NORM_AND_STAGE, a, 0, _N_FULL, as_scheme)


def rmsnorm_and_stage_impl(*a: Any) -> None:  # T is x.shape[0]
    _dispatch(a, 0, _N_FULL, "rmsnorm_and_stage",
              lambda v: _C.rmsnorm_and_stage(*NORM_AND_STAGE.native_args(v, as_scheme)))  # fmt: skip


def explain_gate_route_and_stage_impl(*a: Any) -> str:  # T is hidden_states.shape[0]
    return _explain("explain_gate_route_and_stage", GATE_ROUTE_AND_STAGE, a, 0, _G_FULL, as_scheme)


def gate_route_and_stage_impl(*a: Any) -> None:  # T is hidden_states.shape[0] (y must match)
    _dispatch(a, 0, _G_FULL, "gate_route_and_stage",
              lambda v: _C.gate_route_and_stage(*GATE_ROUTE_AND_STAGE.native_args(v, as_scheme)))  # fmt: skip


def explain_gate_and_route_impl(*a: Any) -> str:  # T is y.shape[0]
    return _explain("explain_gate_and_route", GATE_AND_ROUTE, a, 0, None, None)


def gate_and_route_impl(*a: Any) -> None:  # T is y.shape[0]
    _dispatch(a, 0, None, "gate_and_route", lambda v: _C.gate_and_route(*GATE_AND_ROUTE.native_args(v, None)))


def _flat_view(v: Any, shape: tuple, name: str) -> Any:
    """A view of the written array ``v`` with ``shape`` (never a copy: the library writes
    through it); ValueError naming ``name`` when its strides have none."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and isinstance(v, torch.Tensor):
            return v.view(shape)
        w = v.view()
        w.shape = shape  # NumPy refuses (AttributeError) where a copy would be needed
        return w
    except (RuntimeError, AttributeError, ValueError, TypeError):
        raise ValueError(
            f"megamoe: {name}: expected strides that allow a view of shape {tuple(shape)} "
            f"(shape {tuple(v.shape)}): pass it 2-D"
        ) from None


def mhc_views(a: Any) -> list:
    """mhc_pre_and_stage's arguments (table order) with vLLM's 3-D shapes accepted: a
    ``[T, hc, H]`` residual as ``[T, hc * H]`` (reshaped: a copy where no view exists, it is
    only read), a ``[T, hc, 1]`` post_mix and a ``[T, hc, hc]`` comb_mix as 2-D views (never
    copies). Arrays without ``reshape`` / ``view`` go on as they are (the binding names
    what is wrong with them)."""
    a = list(a)
    for i, name, written in _M_3D:
        v = a[i]
        shape = getattr(v, "shape", None)
        if shape is None or len(shape) != 3 or not hasattr(v, "reshape"):
            continue
        flat = (shape[0], shape[1] * shape[2])
        a[i] = _flat_view(v, flat, name) if written else v.reshape(flat)
    return a


def mhc_pre_and_stage_impl(*a: Any) -> None:  # T is residual.shape[0]
    _dispatch(mhc_views(a), 0, _M_FULL, "mhc_pre_and_stage",
              lambda v: _C.mhc_pre_and_stage(*MHC_AND_STAGE.native_args(v, as_scheme)))  # fmt: skip


def explain_mhc_pre_and_stage_impl(*a: Any) -> str:
    return _explain("explain_mhc_pre_and_stage", MHC_AND_STAGE, mhc_views(a), 0, _M_FULL, as_scheme)


# ---------------------------------------------------------------------------------------
# vLLM's fused router + staging (dsv4_topk_prepare_megamoe)

# vLLM's DeepSeek-V4 router has six experts per token, fixed.
_DSV4_TOPK = 6


def _index_dtype(glue: Any, indices_dtype: Any) -> str:
    """The name ("int32" or "int64") of ``indices_dtype``, a torch dtype for torch logits
    or a NumPy one (ValueError for another dtype, TypeError for what is no dtype)."""
    name = "megamoe.dsv4_topk_prepare_megamoe: indices_dtype"
    if glue is not None:
        return glue.index_dtype(indices_dtype, name)
    import numpy as np

    try:
        dt = np.dtype(indices_dtype)
    except TypeError:
        raise TypeError(f"{name}: expected a dtype (int32 or int64), got {type(indices_dtype).__name__}") from None
    if dt not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise ValueError(f"{name}: expected int32 or int64, got {dt}")
    return dt.name


def dsv4_topk_prepare_megamoe(
    hidden_states: Any,
    gating_output: Any,
    correction_bias: Any,
    routed_scaling_factor: float,
    indices_dtype: Any,
    x_fp8: Any,
    x_sf: Any,
    topk_idx_out: Any,
    topk_weights_out: Any,
    is_padding: Any = None,
    shared_x_sf: Any = None,
    shared_block_m: Optional[int] = None,
) -> tuple:
    """Drop-in for vLLM's ``dsv4_topk_prepare_megamoe`` (DeepSeek-V4's fused router top-k
    and MegaMoE input staging): same parameters, order and return value.

    Allocates the public ``topk_weights`` ``[T, K]`` float32 and ``topk_ids`` ``[T, K]``
    of ``indices_dtype`` (int32 or int64) on the device of ``gating_output``, routes
    ``gating_output`` ``[T, E]`` (``sqrt(softplus)`` scores, the top-k of scores +
    ``correction_bias``, renormalized unbiased scores times ``routed_scaling_factor``)
    and stages ``hidden_states`` as MXFP8 (MXFP4 with ties toward zero when ``x_fp8`` is an
    int8 / uint8 ``[T, H/2]`` buffer: :func:`prepare_megamoe_inputs`' drop-in rule, which
    vLLM's MXFP4 path relies on) into ``x_fp8`` / ``x_sf`` / ``topk_idx_out`` /
    ``topk_weights_out`` (and ``shared_x_sf``) in one call, as :func:`route_and_stage`
    does; returns ``(topk_weights, topk_ids)``. K is ``topk_idx_out.shape[1]`` (vLLM's:
    always 6). For every other option (hash layers, EPLB, other formats, full buffer,
    counters) call :func:`route_and_stage`.

    Differences from vLLM's Triton kernel (docs/ROUTER.md, "Python"): padded tokens get ids
    -1 and weights +0.0 in the returned tensors too (vLLM masks only the staged ones);
    ``correction_bias`` may be None (no bias); exp and log1p are correctly rounded where
    vLLM's kernel computes ``log(1 + exp(x))`` in fp32 (which is 0 below x of about -17,
    where the scores here stay positive), and the scaling is ``fl(fl(s / sum) * alpha)``
    instead of ``s * fl(alpha / sum)`` (weights may differ by an ulp or two); the logits
    may have any strides but must be float32 or bfloat16. Raises as
    :func:`route_and_stage` (a ``[0, E]`` ``gating_output`` returns empty tensors at once),
    and a ValueError naming the bytes of a returned tensor that cannot be allocated.
    """
    glue = _torch_for(gating_output)  # the returned tensors live where the logits do
    if glue is None and not _is_ndarray(gating_output):
        raise TypeError(
            "megamoe.dsv4_topk_prepare_megamoe: gating_output: expected a torch.Tensor or "
            f"numpy.ndarray, got {type(gating_output).__name__} (allocate the outputs yourself "
            "and call route_and_stage)"
        )
    dtype = _index_dtype(glue, indices_dtype)
    g, idx = shape_of(gating_output), shape_of(topk_idx_out)
    T = g[0] if len(g) == 2 else 0
    K = idx[1] if len(idx) == 2 else _DSV4_TOPK
    where = "megamoe.dsv4_topk_prepare_megamoe"
    weights = _alloc(glue, gating_output, TensorSpec((T, K), "float32"), where=where)
    ids = _alloc(glue, gating_output, TensorSpec((T, K), dtype), where=where)
    if len(g) == 2 and T == 0:
        return weights, ids
    route_and_stage_impl(
        *ROUTE_AND_STAGE.values(
            hidden_states=hidden_states, router_logits=gating_output, e_score_correction_bias=correction_bias,
            topk_weights=weights, topk_ids=ids, x_fp8=x_fp8, x_sf=x_sf, topk_idx_out=topk_idx_out,
            topk_weights_out=topk_weights_out, is_padding=is_padding, shared_x_sf=shared_x_sf,
            shared_block_m=shared_block_m, routed_scaling_factor=routed_scaling_factor,
        )
    )  # fmt: skip
    return weights, ids


# ---------------------------------------------------------------------------------------
# output_shapes


class TensorSpec(NamedTuple):
    """Shape and dtype name (as torch and NumPy spell it) of one staging tensor."""

    shape: tuple
    dtype: str


class OutputShapes(NamedTuple):
    """What a staging call with given sizes and scheme writes (megamoe::output_shapes).
    Absent tensors are None; ``global_scale`` is the input NVFP4 static needs (NVFP4
    online's output)."""

    x_fp8: TensorSpec
    """``[T, H]`` float8_e4m3fn (float8_e5m2 for MXFP8_E5M2; uint8 also accepted),
    ``[T, H/2]`` uint8 packed fp4, or ``[T, H]`` bfloat16 (BF16)."""
    x_sf: TensorSpec
    """``[T, H/(4G)]`` int32 packed scale bytes, ``[T, H/G]`` float32, or ``[T, 0]`` (BF16:
    no scales; the calls also take None)."""
    topk_idx_out: TensorSpec
    topk_weights_out: TensorSpec
    shared_x_sf: Optional[TensorSpec]
    """The minimum ``[ceil(T/bm)*align(bm, 128), H/(4G)]`` int32, when shared_block_m is given."""
    x_scales: Optional[TensorSpec]
    """``[T]`` float32 per-token scales (NVFP4 per-token)."""
    global_scale: Optional[TensorSpec]
    """``[1]`` float32: NVFP4 static's input, NVFP4 online's output."""


def _int(v: Any, name: str) -> int:
    i = optional_int(v, name)
    if i is None:
        raise TypeError(f"megamoe.output_shapes: {name}: expected an int, got None")
    return i


def output_shapes(T: int, H: int, K: int, scheme: Any = MXFP8, shared_block_m: Optional[int] = None) -> OutputShapes:
    """Shapes and dtypes of every output (and of NVFP4 static's ``global_scale`` input) of
    staging ``T`` tokens of hidden size ``H`` with top-``K`` routing under ``scheme`` (a
    QuantScheme or a vLLM QuantKey), and of the shared-expert scale copy for
    ``shared_block_m``. It is the rule the library's validator applies (C++
    ``megamoe::output_shapes``). In full-buffer mode pass the buffers' row count as ``T``.

    Raises:
        ValueError: a rejected scheme, H not a multiple of 128, whole scale words missing,
            negative sizes, sizes whose products overflow int64, an int argument outside
            int64 (the message names it), shared staging without UE8M0 scales or with
            shared_block_m <= 0.
        TypeError: a size that is no int, or a scheme that is no scheme.
    """
    d = _C.output_shapes(_int(T, "T"), _int(H, "H"), _int(K, "K"), as_scheme(scheme),
                         optional_int(shared_block_m, "shared_block_m"))  # fmt: skip
    return OutputShapes(**{k: None if v is None else TensorSpec(tuple(v[0]), v[1]) for k, v in d.items()})


# ---------------------------------------------------------------------------------------
# stage()


class StagedInputs(NamedTuple):
    """The outputs of :func:`stage`, allocated in the input's framework and device."""

    x_fp8: Any
    """``[T, H]`` fp8 values (torch.float8_e4m3fn, torch.float8_e5m2 for MXFP8_E5M2; uint8
    bytes for NumPy), or ``[T, H/2]`` uint8 packed fp4 (low nibble = even column)."""
    x_sf: Any
    """Scales: ``[T, H/(4G)]`` int32 packed UE8M0 / e4m3 bytes, or ``[T, H/G]`` float32."""
    topk_idx: Any
    """``[T, K]`` int64 expert ids, -1 for padded tokens (and the full-buffer tail)."""
    topk_weights: Any
    """``[T, K]`` float32 weights, 0 for padded tokens (and the full-buffer tail)."""
    shared_x_sf: Any = None
    """``[ceil(T/bm)*align(bm,128), H/(4G)]`` int32 permuted scales (zero where no token
    maps), or None when ``shared_block_m`` was not given."""
    x_scales: Any = None
    """``[T]`` float32 per-token second-level scales (NVFP4 per-token), else None."""
    global_scale: Any = None
    """``[1]`` float32 global scale the call computed (NVFP4 online), else None."""


def _is_ndarray(x: Any) -> bool:
    np = sys.modules.get("numpy")  # an ndarray exists only once NumPy is imported
    return np is not None and isinstance(x, np.ndarray)


def _numpy_dtype(name: str) -> Any:
    import numpy as np

    if name == "bfloat16":  # BF16's x_fp8: NumPy has no bf16; ml_dtypes' is what the binding takes
        try:
            import ml_dtypes
        except ImportError:
            raise ValueError("megamoe: x_fp8: a bfloat16 NumPy output needs ml_dtypes (pip install ml-dtypes)") from None
        return ml_dtypes.bfloat16
    return np.uint8 if name.startswith("float8_") else np.dtype(name)  # NumPy has no fp8


#: Bytes per element of each output dtype name.
ITEMSIZE = {"float8_e4m3fn": 1, "float8_e5m2": 1, "uint8": 1, "bfloat16": 2, "int32": 4, "float32": 4, "int64": 8}


def _alloc(glue: Any, like: Any, spec: TensorSpec, zero: bool = False, where: str = "megamoe.stage") -> Any:
    """One output of ``spec`` in the framework of ``like`` (torch through ``glue``, else
    NumPy); a size that cannot be allocated is a ValueError naming its bytes."""
    nbytes = math.prod(spec.shape) * ITEMSIZE[spec.dtype]
    what = f"a {tuple(spec.shape)} {spec.dtype} output"
    if glue is not None:
        return allocate(where, what, nbytes, lambda: glue.allocate(like, spec, zero))
    import numpy as np

    make = np.zeros if zero else np.empty
    return allocate(where, what, nbytes, lambda: make(spec.shape, _numpy_dtype(spec.dtype)))


def _dims(x: Any) -> tuple:
    s = shape_of(x)
    return s if len(s) == 2 else (0, 0)


def _empty_stage(glue: Any, hidden: Any, topk_ids: Any, scheme: Any, shared_block_m: Any) -> StagedInputs:
    """stage() for T == 0 outside full-buffer mode: empty outputs, as wide as the other
    arguments say where they say it (the reference reads none of them then, so none of
    them may fail the call)."""
    H, K = _dims(hidden)[1], _dims(topk_ids)[1]
    try:
        shapes = output_shapes(0, H, K, scheme)
    except (TypeError, ValueError):
        shapes = OutputShapes(TensorSpec((0, H), "float8_e4m3fn"), TensorSpec((0, 0), "int32"),
                              TensorSpec((0, K), "int64"), TensorSpec((0, K), "float32"), None, None, None)  # fmt: skip
    out = [_alloc(glue, hidden, spec) for spec in shapes[:4]]
    shared = None if shared_block_m is None else _alloc(glue, hidden, TensorSpec((0, shapes.x_sf.shape[1]), "int32"))
    x_scales = None if shapes.x_scales is None else _alloc(glue, hidden, shapes.x_scales)
    return StagedInputs(*out, shared, x_scales)


def stage(
    hidden_states: Any,
    topk_weights: Any,
    topk_ids: Any,
    is_padding: Any = None,
    *,
    scheme: Any = MXFP8,
    shared_block_m: Optional[int] = None,
    max_tokens: Optional[int] = None,
    global_scale: Any = None,
    routed_scaling_factor: Optional[float] = None,
    nonfinite_count: Any = None,
    hidden_quant: Any = None,
    expert_scales: Any = None,
    stream: Optional[int] = None,
    enable_pdl: bool = False,
) -> StagedInputs:
    """Allocate the outputs (shapes from :func:`output_shapes`) and stage into them.

    Every format: ``scheme`` is a QuantScheme (``MXFP8`` default, ``FP8_*``, ``MXFP8_E5M2``,
    ``MXFP4``, ``MXFP4_RNE``, ``NVFP4_STATIC`` with ``global_scale=`` a [1] float32 array,
    ``NVFP4_PER_TOKEN``, whose per-token scales come back as ``x_scales``, ``NVFP4_ONLINE``,
    whose computed global scale comes back as ``global_scale``, written to the given
    ``global_scale=`` array or a new one) or a vLLM
    QuantKey; ``hidden_quant=`` is the same argument under prepare_megamoe_inputs' name.
    Outputs are created with the framework of ``hidden_states`` (torch: same device, fp8
    as torch.float8_e4m3fn or, for MXFP8_E5M2, torch.float8_e5m2, packed fp4 as uint8;
    NumPy: uint8 bytes). ``shared_x_sf`` is allocated (zero-filled) only when
    ``shared_block_m`` is given. With ``max_tokens`` (>= T) the outputs have ``max_tokens``
    rows in full-buffer mode: rows T.. of the top-k outputs become -1 / 0, those of x_fp8 /
    x_sf / x_scales are allocated but not written.
    ``routed_scaling_factor`` multiplies the kept weights, then ``expert_scales`` (``[E]``
    float32) those whose id is in [0, E); ``nonfinite_count`` (a [1] int64 array on the same
    device) gets the count of NaN / Inf inputs added.

    Same errors as :func:`prepare_megamoe_inputs`, and a ValueError naming the bytes of an
    output that cannot be allocated (e.g. for a ``max_tokens`` no memory holds; the
    allocator's MemoryError / RuntimeError is chained), or for a ``max_tokens`` outside
    int64. An eager-mode convenience (not for torch.compile regions or CUDA graph capture,
    since it allocates). A ``hidden_states`` without rows gives empty outputs at once,
    whatever the other arguments are (unless ``max_tokens`` asks for the full-buffer tail).
    """
    glue = _torch_for(hidden_states)
    if glue is None and not _is_ndarray(hidden_states):
        raise TypeError(
            "megamoe.stage: hidden_states: expected a torch.Tensor or numpy.ndarray, "
            f"got {type(hidden_states).__name__} (allocate the outputs yourself and "
            "call prepare_megamoe_inputs)"
        )
    if hidden_quant is not None:
        if scheme is not MXFP8:
            raise TypeError("megamoe.stage: give scheme= or hidden_quant= (the same argument), not both")
        scheme = hidden_quant
    M = optional_int(max_tokens, "max_tokens")
    full = M is not None
    if not full and no_tokens(hidden_states):
        return _empty_stage(glue, hidden_states, topk_ids, scheme, shared_block_m)
    s = as_scheme(scheme)
    _C.check_scheme(s)
    bm = optional_int(shared_block_m, "shared_block_m")
    h_shape, ids_shape = shape_of(hidden_states), shape_of(topk_ids)
    if len(h_shape) != 2 or len(ids_shape) != 2:
        # No shapes to allocate: the library says what is wrong with the ranks.
        dummy = [_alloc(glue, hidden_states, TensorSpec((0, 0), d)) for d in ("uint8", "int32", "int64", "float32")]
        prepare_impl(hidden_states, topk_weights, topk_ids, *dummy, is_padding, None, None, s,
                     None, None, None, False, None, None, stream, enable_pdl)  # fmt: skip
        raise AssertionError("unreachable: the library rejects these ranks")  # pragma: no cover
    T, H = h_shape
    K = ids_shape[1]
    shapes = output_shapes(M if full else T, H, K, s)
    out = [_alloc(glue, hidden_states, spec) for spec in shapes[:4]]
    shared = None
    if bm is not None:
        shared = _alloc(glue, hidden_states, output_shapes(T, H, K, s, bm).shared_x_sf, zero=True)
    x_scales = None if shapes.x_scales is None else _alloc(glue, hidden_states, shapes.x_scales)
    online = s.scale2 == _C.Scale2.ONLINE
    if online and global_scale is None:
        global_scale = _alloc(glue, hidden_states, shapes.global_scale)
    prepare_impl(
        hidden_states, topk_weights, topk_ids, *out, is_padding, shared, bm, s, global_scale,
        x_scales, nonfinite_count, full, routed_scaling_factor, expert_scales, stream, enable_pdl,
    )  # fmt: skip
    return StagedInputs(*out, shared, x_scales, global_scale if online else None)


# ---------------------------------------------------------------------------------------
# set_cpu_threads()


def set_cpu_threads(n: int) -> None:
    """Threads one CPU staging call may use, the caller included (0 = one per CPU).

    Raises:
        TypeError: ``n`` is no int.
        ValueError: a thread count the library refuses (negative, above its maximum, or
            beyond the native int32).
    """
    if type(n) is not int:
        try:
            n = operator.index(n)
        except TypeError:
            raise TypeError(f"megamoe: set_cpu_threads: n: expected an int, got {type(n).__name__}") from None
    # The native argument is an int32; nanobind would refuse a larger one with its
    # "incompatible function arguments", naming neither the argument nor the value.
    if not -(2**31) <= n < 2**31:
        raise out_of_range(n, "set_cpu_threads: n", "int32")
    _C.set_cpu_threads(n)


# ---------------------------------------------------------------------------------------
# dequantize()


def dequantize(x_q: Any, x_sf: Any, scheme: Any = MXFP8, *, x_scales: Any = None, global_scale: Any = None) -> Any:
    """Expand staged values and scales back to float32 (for checks and debugging).

    Every format: fp8 (``x_q`` [T, H] fp8 / uint8 / int8 bytes, e4m3fn or, for
    MXFP8_E5M2, e5m2: 0x7C is Inf, 0x7D-0x7F NaN) and packed fp4 (``x_q``
    [T, H/2] uint8 / int8 / torch.float4_e2m1fn_x2, low nibble = even column); scales as
    staged: packed UE8M0 (2**(e-127), 0xFF NaN), fp32, or NVFP4's packed e4m3 bytes times
    the second-level scale (``global_scale`` for NVFP4_STATIC and NVFP4_ONLINE, ``x_scales`` [T] for
    NVFP4_PER_TOKEN). With the default scheme, packed bytes whose x_sf is as wide as MXFP4's
    are read as MXFP4 (staging's drop-in rule). Returns ``[T, H]`` float32 in the framework
    of ``x_q`` (torch tensor on its device, or a NumPy array). Each value is
    ``fl(element * scale)`` of its group (exact but for NVFP4's second-level product).

    Raises:
        TypeError: an argument that is no array (or, for torch ``x_q``, no torch.Tensor), or
            ``scheme`` no scheme.
        ValueError: a scheme staging rejects, or arrays of the wrong rank, shape or dtype
            for it, or a second-level scale missing or given where the format has none.
    """
    return _dequant.dequantize(x_q, x_sf, scheme, x_scales, global_scale)
