"""PyTorch integration, loaded only when torch is installed.

Registers the custom ops ``torch.ops.megamoe.prepare_inputs``,
``torch.ops.megamoe.stage_routing``, ``torch.ops.megamoe.route``,
``torch.ops.megamoe.route_and_stage``, ``torch.ops.megamoe.rmsnorm_and_stage`` and
``torch.ops.megamoe.mhc_pre_and_stage`` (CPU and
CUDA kernels, fake implementations for FakeTensor / torch.compile tracing; schema, mutated
arguments, kernel and fake all derived from megamoe._signature) and provides the torch
paths of the public functions. Tensors reach the library as DLPack capsules
(``torch.utils.dlpack.to_dlpack``: no stream synchronization, so it is safe inside CUDA
graph capture); CUDA work goes to the current torch stream of the tensors' device.

The ops are registered with the low-level ``torch.library`` API (``Library.define`` /
``Library.impl`` on the CPU and CUDA keys / ``torch.library.register_fake``), not with
``torch.library.custom_op``, whose Python autograd, ADInplaceOrView and backend wrappers
make an empty op of these schemas cost more per eager call than the direct call does
(``bench/bench_op_overhead.py`` measures both styles, each next to an empty op of its own;
docs/PERFORMANCE.md).

Importing this module costs no more than ``import torch``: neither ``torch.library`` nor
anything here loads torch._dynamo (see ``_scheme_ints``).
"""

from __future__ import annotations

import functools
from typing import Any, Optional, Sequence

import torch
from torch.utils.dlpack import to_dlpack as _to_dlpack

from . import _C
from ._scheme import as_scheme, plain_key_fields, scheme_fields, scheme_from_plain
from ._signature import (
    GATE_AND_ROUTE,
    GATE_ROUTE_AND_STAGE,
    MHC_AND_STAGE,
    NORM_AND_STAGE,
    PREPARE,
    ROUTE,
    ROUTE_AND_STAGE,
    ROUTING,
    SCHEME_FIELDS,
    _as_bool,
)

__all__ = [
    "prepare",
    "explain",
    "explain_call",
    "stage_routing",
    "route",
    "route_and_stage",
    "rmsnorm_and_stage",
    "mhc_pre_and_stage",
    "prepare_inputs_op",
    "stage_routing_op",
    "route_op",
    "route_and_stage_op",
    "rmsnorm_and_stage_op",
    "mhc_pre_and_stage_op",
    "allocate",
    "index_dtype",
    "dequantize",
]

_Tensor = torch.Tensor
_FP8 = torch.float8_e4m3fn
_E5M2 = torch.float8_e5m2  # MXFP8 e5m2's values
# Packed fp4 pairs: the library calls the same bytes uint8.
_FP4X2 = getattr(torch, "float4_e2m1fn_x2", None)

_P_FULL = PREPARE.index("full_buffer")
_P_STREAM = PREPARE.index("stream")
_R_FULL = ROUTING.index("full_buffer")
_RS_FULL = ROUTE_AND_STAGE.index("full_buffer")
_N_FULL = NORM_AND_STAGE.index("full_buffer")
_G_FULL = GATE_ROUTE_AND_STAGE.index("full_buffer")
_M_FULL = MHC_AND_STAGE.index("full_buffer")


def _exports_through_dlpack(dtype: Any) -> bool:
    try:
        _to_dlpack(torch.empty(1, dtype=dtype))
        return True
    except Exception:  # older torch: float8 has no DLPack code
        return False


_FP8_DLPACK = _exports_through_dlpack(_FP8)
_E5M2_DLPACK = _exports_through_dlpack(_E5M2)

try:
    _raw_stream = torch._C._cuda_getCurrentRawStream  # what Inductor's generated code calls
except AttributeError:  # pragma: no cover - other torch builds

    def _raw_stream(index: int) -> int:
        return torch.cuda.current_stream(index).cuda_stream


def _stream_of(t: Any) -> int:
    """cudaStream_t (as int) of the current torch stream of ``t``'s device; 0 on CPU."""
    return _raw_stream(t.device.index) if isinstance(t, _Tensor) and t.is_cuda else 0


# dtypes handed over as their bytes: float4_e2m1fn_x2 (the library calls packed fp4 uint8)
# and each float8 this torch's DLPack has no code for (the library takes x_q as uint8 too).
_AS_BYTES = frozenset(
    d for d in (_FP4X2, None if _FP8_DLPACK else _FP8, None if _E5M2_DLPACK else _E5M2) if d is not None
)


def _cap(t: Any, name: str) -> Any:
    """A DLPack capsule for a tensor (None and non-tensors pass through: the binding names
    what is wrong with them)."""
    if t is None or not isinstance(t, _Tensor):
        return t
    if t.dtype in _AS_BYTES:
        # Bytes of the quantized output only: any other argument of such a dtype would be
        # read as uint8 (a float8 is_padding as a mask), where the library rejects it.
        if name != "x_fp8":
            raise ValueError(f"megamoe: {name}: got dtype {t.dtype}, which only x_fp8 (the quantized output) may have")
        t = t.view(torch.uint8)
    try:
        return _to_dlpack(t)
    except Exception as e:  # a dtype, layout or device DLPack has no code for
        raise ValueError(
            f"megamoe: {name}: expected a tensor DLPack can export, got a {t.dtype} "
            f"{t.layout} tensor on {t.device} ({type(e).__name__}: {e})"
        ) from None


def _no_tokens(t: Any) -> bool:
    """``t`` is a 2-D tensor of 0 rows: the reference returns before reading any other
    argument. Only a row count known now counts; a symbolic one (torch.compile with dynamic
    shapes) is decided when the op runs."""
    if not isinstance(t, _Tensor):
        return False
    shape = t.shape
    return len(shape) == 2 and isinstance(shape[0], int) and shape[0] == 0


# QuantScheme objects are compile-time constants for torch.compile: Dynamo guards on them
# with __eq__ and runs _scheme_ints at trace time (it cannot trace the native getters).
# (Mutating a scheme in place after compiling is not noticed; build a new one instead.)
def _scheme_ints(scheme: _C.QuantScheme) -> tuple:
    f = scheme_fields(scheme)
    return (f[0].value, f[1].value, f[2], f[3], f[4], f[5], f[6].value, f[7].value, f[8])


# torch.compiler.assume_constant_result(fn) imports torch._dynamo (a second or more) and
# then only sets this attribute, which Dynamo reads when it meets the call; setting it here
# keeps `import megamoe` as cheap as `import torch` (test_torch_cpu.py checks that the two
# agree).
_scheme_ints._dynamo_marked_constant = True  # type: ignore[attr-defined]
try:
    torch.utils._pytree.register_constant(_C.QuantScheme)
except (AttributeError, ValueError, TypeError):  # pragma: no cover - older torch
    pass


def _op_scheme_args(hidden_quant: Any) -> tuple:
    """The scheme as the op's plain arguments (its schema cannot take a QuantScheme)."""
    if isinstance(hidden_quant, _C.QuantScheme):
        return _scheme_ints(hidden_quant)
    return plain_key_fields(hidden_quant)


# ---------------------------------------------------------------------------------------
# Direct calls


def _run_prepare(a: Sequence[Any], checked: bool = False) -> None:
    """Call the library with the arguments of prepare_megamoe_inputs (table order; the
    stream already resolved; ``checked``: the caller has done the T == 0 test)."""
    if not checked and not _as_bool(a[_P_FULL], "full_buffer") and _no_tokens(a[0]):
        return
    _C.prepare_inputs(*PREPARE.native_args(a, as_scheme, _cap))


def _run_routing(a: Sequence[Any]) -> None:
    if not _as_bool(a[_R_FULL], "full_buffer") and _no_tokens(a[1]):
        return
    _C.stage_routing(*ROUTING.native_args(a, None, _cap))


def _run_route(a: Sequence[Any]) -> None:
    if _no_tokens(a[0]):
        return
    _C.route(*ROUTE.native_args(a, None, _cap))


def _run_route_and_stage(a: Sequence[Any]) -> None:
    if not _as_bool(a[_RS_FULL], "full_buffer") and _no_tokens(a[1]):
        return
    _C.route_and_stage(*ROUTE_AND_STAGE.native_args(a, as_scheme, _cap))


def _run_rmsnorm_and_stage(a: Sequence[Any]) -> None:
    if not _as_bool(a[_N_FULL], "full_buffer") and _no_tokens(a[0]):
        return
    _C.rmsnorm_and_stage(*NORM_AND_STAGE.native_args(a, as_scheme, _cap))


def _run_gate_route_and_stage(a: Sequence[Any]) -> None:
    if not _as_bool(a[_G_FULL], "full_buffer") and _no_tokens(a[0]):
        return
    _C.gate_route_and_stage(*GATE_ROUTE_AND_STAGE.native_args(a, as_scheme, _cap))


def _run_gate_and_route(a: Sequence[Any]) -> None:
    if _no_tokens(a[0]):
        return
    _C.gate_and_route(*GATE_AND_ROUTE.native_args(a, None, _cap))


def _run_mhc_pre_and_stage(a: Sequence[Any]) -> None:
    if not _as_bool(a[_M_FULL], "full_buffer") and _no_tokens(a[0]):
        return
    _C.mhc_pre_and_stage(*MHC_AND_STAGE.native_args(a, as_scheme, _cap))


def _with_stream(a: Sequence[Any], i: int, device_of: Any) -> list:
    a = list(a)
    if a[i] is None:
        a[i] = _stream_of(device_of)
    return a


def _eager_ok(t: Any) -> bool:
    """True when a direct call is equivalent to dispatching the op (plain tensor, eager,
    no dispatch or function mode that would want to see the op)."""
    return (
        type(t) is _Tensor
        and not torch.compiler.is_compiling()
        and torch._C._len_torch_dispatch_stack() == 0
        and not torch._C._is_torch_function_mode_enabled()
    )


def prepare(a: Sequence[Any]) -> None:
    """Torch path of prepare_megamoe_inputs (``a``: its arguments in table order): a direct
    library call in plain eager mode (lowest host overhead), the custom op when tracing
    (torch.compile, FakeTensor, modes). An explicit ``stream`` always takes the direct path."""
    if not _as_bool(a[_P_FULL], "full_buffer") and _no_tokens(a[0]):
        return
    if a[_P_STREAM] is not None or _eager_ok(a[0]):
        _run_prepare(_with_stream(a, _P_STREAM, a[0]), checked=True)
        return
    torch.ops.megamoe.prepare_inputs(*PREPARE.op_values(a, _op_scheme_args))


def explain_call(spec: Any, native: Any, a: Sequence[Any], scheme: Any) -> str:
    """Torch path of megamoe.explain and its siblings (explain_routing, explain_route,
    explain_route_and_stage): ``native`` (megamoe._C's function of the same name) on the
    arguments of ``spec``'s call (``a``, table order), tensors as DLPack capsules. No custom
    op: nothing is written, so there is nothing for torch to track; the stream is ignored."""
    return native(*spec.native_args(a, scheme, _cap))


def explain(a: Sequence[Any]) -> str:
    """Torch path of megamoe.explain."""
    return explain_call(PREPARE, _C.explain, a, as_scheme)


def _direct_or_op(spec: Any, a: Sequence[Any], t: Any, run: Any, op_name: str) -> None:
    """A direct library call (``run``) in plain eager mode or with an explicit stream (the
    current stream of ``t``'s device otherwise), else torch.ops.megamoe.<op_name>."""
    i = spec.index("stream")
    if a[i] is not None or _eager_ok(t):
        run(_with_stream(a, i, t))
        return
    getattr(torch.ops.megamoe, op_name)(*spec.op_values(a, _op_scheme_args))


def stage_routing(a: Sequence[Any]) -> None:
    """Torch path of stage_megamoe_routing (``a``: its arguments in table order)."""
    if not _as_bool(a[_R_FULL], "full_buffer") and _no_tokens(a[1]):
        return
    _direct_or_op(ROUTING, a, a[1], _run_routing, "stage_routing")


def route(a: Sequence[Any]) -> None:
    """Torch path of megamoe.route (``a``: its arguments in table order)."""
    if not _no_tokens(a[0]):
        _direct_or_op(ROUTE, a, a[0], _run_route, "route")


def route_and_stage(a: Sequence[Any]) -> None:
    """Torch path of megamoe.route_and_stage (``a``: its arguments in table order)."""
    if _as_bool(a[_RS_FULL], "full_buffer") or not _no_tokens(a[1]):
        _direct_or_op(ROUTE_AND_STAGE, a, a[1], _run_route_and_stage, "route_and_stage")


def rmsnorm_and_stage(a: Sequence[Any]) -> None:
    """Torch path of megamoe.rmsnorm_and_stage (``a``: its arguments in table order)."""
    if _as_bool(a[_N_FULL], "full_buffer") or not _no_tokens(a[0]):
        _direct_or_op(NORM_AND_STAGE, a, a[0], _run_rmsnorm_and_stage, "rmsnorm_and_stage")


def gate_route_and_stage(a: Sequence[Any]) -> None:
    """Torch path of megamoe.gate_route_and_stage (``a``: its arguments in table order)."""
    if _as_bool(a[_G_FULL], "full_buffer") or not _no_tokens(a[0]):
        _direct_or_op(GATE_ROUTE_AND_STAGE, a, a[0], _run_gate_route_and_stage, "gate_route_and_stage")


def gate_and_route(a: Sequence[Any]) -> None:
    """Torch path of megamoe.gate_and_route (``a``: its arguments in table order)."""
    if not _no_tokens(a[0]):
        _direct_or_op(GATE_AND_ROUTE, a, a[0], _run_gate_and_route, "gate_and_route")


def mhc_pre_and_stage(a: Sequence[Any]) -> None:
    """Torch path of megamoe.mhc_pre_and_stage (``a``: its arguments in table order, the 3-D
    shapes already flattened by megamoe._ops.mhc_views)."""
    if _as_bool(a[_M_FULL], "full_buffer") or not _no_tokens(a[0]):
        _direct_or_op(MHC_AND_STAGE, a, a[0], _run_mhc_pre_and_stage, "mhc_pre_and_stage")


# ---------------------------------------------------------------------------------------
# The custom ops: schema, mutated arguments, kernel and fake from the one table


@functools.lru_cache(maxsize=64, typed=True)
def _cached_scheme(*fields: Any) -> _C.QuantScheme:
    return scheme_from_plain(fields)


_FLOOR = [name for name, _ in SCHEME_FIELDS].index("amax_floor")


def _op_scheme(fields: tuple) -> _C.QuantScheme:
    """scheme_from_plain of the op's scheme values, built once per distinct scheme (building
    a QuantScheme is most of what the kernel adds to the direct call); the objects stay
    inside the kernel call, no caller sees or mutates one. A zero floor is built afresh:
    +0.0 and -0.0 are one key but not one floor."""
    return scheme_from_plain(fields) if fields[_FLOOR] == 0 else _cached_scheme(*fields)


def _prepare_kernel(*op_args: Any) -> None:
    _run_prepare(PREPARE.from_op_values(op_args, _op_scheme, _stream_of(op_args[0])))


def _routing_kernel(*op_args: Any) -> None:
    _run_routing(ROUTING.from_op_values(op_args, None, _stream_of(op_args[1])))


def _route_kernel(*op_args: Any) -> None:
    _run_route(ROUTE.from_op_values(op_args, None, _stream_of(op_args[0])))


def _route_and_stage_kernel(*op_args: Any) -> None:
    _run_route_and_stage(ROUTE_AND_STAGE.from_op_values(op_args, _op_scheme, _stream_of(op_args[1])))


def _rmsnorm_and_stage_kernel(*op_args: Any) -> None:
    _run_rmsnorm_and_stage(NORM_AND_STAGE.from_op_values(op_args, _op_scheme, _stream_of(op_args[0])))


def _gate_route_and_stage_kernel(*op_args: Any) -> None:
    _run_gate_route_and_stage(GATE_ROUTE_AND_STAGE.from_op_values(op_args, _op_scheme, _stream_of(op_args[0])))


def _gate_and_route_kernel(*op_args: Any) -> None:
    _run_gate_and_route(GATE_AND_ROUTE.from_op_values(op_args, None, _stream_of(op_args[0])))


def _mhc_pre_and_stage_kernel(*op_args: Any) -> None:
    _run_mhc_pre_and_stage(MHC_AND_STAGE.from_op_values(op_args, _op_scheme, _stream_of(op_args[0])))


def _fake(*op_args: Any) -> None:
    """Nothing to compute: the ops only write their (already allocated) outputs, whose
    shapes, dtypes and devices do not change; argument errors surface when the op runs."""
    return None


_PREPARE_DOC = """``torch.ops.megamoe.prepare_inputs``: MegaMoE input staging as a PyTorch op.

Same tensors and options as :func:`megamoe.prepare_megamoe_inputs` (no stream: it runs on
the current stream of the tensors' CUDA device, or on the CPU); the scheme is spelled out
as the QuantScheme fields (enums as their integer values)."""

_ROUTING_DOC = """``torch.ops.megamoe.stage_routing``: routing-only staging as a PyTorch op
(the arguments of :func:`megamoe.stage_megamoe_routing` but the stream)."""

_ROUTE_DOC = """``torch.ops.megamoe.route``: the fused DeepSeek-V4 router as a PyTorch op (the
arguments of :func:`megamoe.route` but the stream)."""

_ROUTE_AND_STAGE_DOC = """``torch.ops.megamoe.route_and_stage``: route and stage in one call as a
PyTorch op (the arguments of :func:`megamoe.route_and_stage` but the stream; the scheme
spelled out as for prepare_inputs)."""

_NORM_AND_STAGE_DOC = """``torch.ops.megamoe.rmsnorm_and_stage``: RMSNorm and stage in one call as a
PyTorch op (the arguments of :func:`megamoe.rmsnorm_and_stage` but the stream; the scheme
spelled out as for prepare_inputs). ``y`` may be ``x`` and ``residual_out`` ``residual``
(in place); both are declared mutated, as every staging output."""

_MHC_AND_STAGE_DOC = """``torch.ops.megamoe.mhc_pre_and_stage``: mHC pre, RMSNorm and staging in one call
as a PyTorch op (the arguments of :func:`megamoe.mhc_pre_and_stage` but the stream, with a
2-D residual, post_mix and comb_mix; the scheme spelled out as for prepare_inputs)."""


_GATE_ROUTE_AND_STAGE_DOC = """``torch.ops.megamoe.gate_route_and_stage``: gate, route and stage in one
call as a PyTorch op (the arguments of :func:`megamoe.gate_route_and_stage` but the stream;
the scheme spelled out as for prepare_inputs). ``logits_out`` is declared mutated, as every
output."""

_GATE_AND_ROUTE_DOC = """``torch.ops.megamoe.gate_and_route``: gate and route in one call as a PyTorch
op (the arguments of :func:`megamoe.gate_and_route` but the stream)."""


# What the ops are registered with: the dispatch keys of their kernel (the backends the
# library has; a tensor of another device gets the dispatcher's "no kernel" error) and their
# tags (pt2_compliant_tag, as torch.library.custom_op sets it: opcheck passes for them).
DISPATCH_KEYS = ("CPU", "CUDA")
TAGS = (torch.Tag.pt2_compliant_tag,)

# The namespace's one DEF library. It must stay referenced: a Library that is garbage
# collected takes its definitions and kernels with it.
_LIB = torch.library.Library("megamoe", "DEF")


def _define(lib: Any, spec: Any, name: str, kernel: Any, doc: str, keys: Sequence[str] = DISPATCH_KEYS) -> Any:
    """Define ``<lib.ns>::<name>`` (schema from ``spec``, TAGS), its kernel on ``keys`` and
    its fake in ``lib`` (a DEF Library); returns the OpOverloadPacket. (The benchmark
    registers its empty ops through this too, so that their floor is this style's.)

    No Autograd kernel: the ops return nothing and write only their declared outputs, so
    the dispatcher's autograd fallback (C++) passes them through (opcheck's
    test_autograd_registration passes, tests/python/test_torch_cpu.py). No ADInplaceOrView
    kernel either: like the direct call, the op does not bump the version counters of the
    tensors it writes."""
    lib.define(name + spec.op_schema(), tags=TAGS)
    fn = spec.make_op_function(name, kernel, doc)
    for key in keys:
        lib.impl(name, fn, key)
    fake = spec.make_op_function(f"{name}_fake", _fake, _fake.__doc__)
    torch.library.register_fake(f"{lib.ns}::{name}", fake, lib=lib)
    return getattr(getattr(torch.ops, lib.ns), name)


# The OpOverloadPackets torch.ops.megamoe.<name>.
prepare_inputs_op = _define(_LIB, PREPARE, "prepare_inputs", _prepare_kernel, _PREPARE_DOC)
stage_routing_op = _define(_LIB, ROUTING, "stage_routing", _routing_kernel, _ROUTING_DOC)
route_op = _define(_LIB, ROUTE, "route", _route_kernel, _ROUTE_DOC)
route_and_stage_op = _define(_LIB, ROUTE_AND_STAGE, "route_and_stage", _route_and_stage_kernel, _ROUTE_AND_STAGE_DOC)
rmsnorm_and_stage_op = _define(_LIB, NORM_AND_STAGE, "rmsnorm_and_stage", _rmsnorm_and_stage_kernel, _NORM_AND_STAGE_DOC)
gate_route_and_stage_op = _define(
    _LIB, GATE_ROUTE_AND_STAGE, "gate_route_and_stage", _gate_route_and_stage_kernel, _GATE_ROUTE_AND_STAGE_DOC
)
gate_and_route_op = _define(_LIB, GATE_AND_ROUTE, "gate_and_route", _gate_and_route_kernel, _GATE_AND_ROUTE_DOC)
mhc_pre_and_stage_op = _define(_LIB, MHC_AND_STAGE, "mhc_pre_and_stage", _mhc_pre_and_stage_kernel, _MHC_AND_STAGE_DOC)


# ---------------------------------------------------------------------------------------
# stage() and dequantize()

_TORCH_DTYPES = {
    "float8_e4m3fn": _FP8,
    "float8_e5m2": _E5M2,
    "uint8": torch.uint8,
    "int32": torch.int32,
    "int64": torch.int64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,  # BF16's x_fp8
}


def allocate(hidden_states: _Tensor, spec: Any, zero: bool = False) -> _Tensor:
    """One output of megamoe.stage ((shape, dtype name)) on the device of ``hidden_states``."""
    shape, dtype = spec
    make = torch.zeros if zero else torch.empty
    return make(shape, dtype=_TORCH_DTYPES[dtype], device=hidden_states.device)


def index_dtype(dtype: Any, name: str) -> str:
    """The name of ``dtype`` if it is torch.int32 or torch.int64 (ValueError for another
    dtype, TypeError for what is no torch.dtype)."""
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"{name}: expected torch.int32 or torch.int64, got {type(dtype).__name__}")
    if dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name}: expected torch.int32 or torch.int64, got {dtype}")
    return "int32" if dtype == torch.int32 else "int64"


def _values_fp8(q: _Tensor, dtype: Any = _FP8) -> _Tensor:
    """float32 value of fp8 bytes of ``dtype`` (e4m3fn or e5m2; uint8 / int8 / float8
    tensors): torch's own conversion, exact (e5m2's Inf and NaN bytes included)."""
    return (q if q.dtype == dtype else q.view(torch.uint8).view(dtype)).float()


_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _values_fp4(q: _Tensor) -> _Tensor:
    """[T, 2W] float32 values of [T, W] packed e2m1 bytes (low nibble = even column)."""
    b = q.view(torch.uint8).to(torch.int32)
    mag = torch.tensor(_E2M1 + _E2M1, dtype=torch.float32, device=q.device)
    sign = torch.tensor([1.0] * 8 + [-1.0] * 8, dtype=torch.float32, device=q.device)
    codes = torch.stack([b & 0xF, b >> 4], dim=-1).reshape(b.shape[0], -1).long()
    return mag[codes] * sign[codes]  # -0.0 for the code 0x8


def _bytes_of_words(sf: _Tensor) -> _Tensor:
    """[T, 4W] int32 bytes (little-endian order) of [T, W] 32-bit words."""
    shifts = torch.tensor([0, 8, 16, 24], dtype=torch.int32, device=sf.device)
    return ((sf.to(torch.int32).unsqueeze(-1) >> shifts) & 0xFF).reshape(sf.shape[0], -1)


def dequantize(x_q: _Tensor, x_sf: _Tensor, fmt: Any, x_scales: Optional[_Tensor],
               global_scale: Optional[_Tensor]) -> _Tensor:  # fmt: skip
    """Torch path of megamoe.dequantize (float32 on the device of ``x_q``); dtypes and
    shapes are already checked. ``fmt``: megamoe._dequant.Format."""
    values = _values_fp4(x_q) if fmt.fp4 else _values_fp8(x_q, _E5M2 if fmt.e5m2 else _FP8)
    T, H = values.shape
    if fmt.sf == "ue8m0":
        exps = _bytes_of_words(x_sf)
        bits = torch.where(exps == 0, 0x400000, exps << 23)  # 2**(e-127); e=0: 2**-127
        bits = torch.where(exps == 255, 0x7FC00000, bits)  # E8M0 0xFF is NaN
        scales = bits.to(torch.int32).view(torch.float32)
    elif fmt.sf == "e4m3":
        scales = _bytes_of_words(x_sf).to(torch.uint8).view(_FP8).float()
    else:
        scales = x_sf.float()
    if global_scale is not None:
        scales = scales * global_scale.reshape(()).float()
    if x_scales is not None:
        scales = scales * x_scales.float().unsqueeze(1)
    G = fmt.G
    return (values.reshape(T, H // G, G) * scales.unsqueeze(-1)).reshape(T, H)
