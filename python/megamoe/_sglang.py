"""SGLang drop-ins: DeepGEMM's ``mega_moe_pre_dispatch`` and ``mega_moe_pre_dispatch_sm90``
(what SGLang's MegaMoE layer calls through ``deep_gemm``) with their names, parameters and
defaults, staged by megamoe.

Both write DeepGEMM's symmetric-buffer slots: the first ``num_tokens`` rows of ``x`` are
quantized into ``buf_x`` / ``buf_x_sf`` (and ``buf_x_scales``), their routing into
``buf_topk_idx`` / ``buf_topk_weights``, whose rows from ``num_tokens`` to the buffer's end
become -1 / 0 (megamoe's full-buffer mode); other rows of ``buf_x`` / ``buf_x_sf`` are not
touched. python/README-python.md ("SGLang drop-ins") lists where the results or the
accepted arguments differ from DeepGEMM's kernels, and why.
"""

from __future__ import annotations

import operator
import sys
from typing import Any, Optional

from ._args import shape_of
from ._entry import prepare_megamoe_inputs, stage_megamoe_routing
from ._scheme import FP8_FP32_G32, FP8_FP32_G128, FP8_UE8M0_G128, MXFP4, MXFP8, NVFP4_PER_TOKEN, QuantScheme
from ._signature import optional_float

__all__ = ["mega_moe_pre_dispatch", "mega_moe_pre_dispatch_sm90"]

_SM90_FLOOR = 1e-10  # DeepGEMM's SM90 pre-dispatch (and SGLang's own kernel) floor amax here


def _num_tokens(num_tokens: Any, x: Any) -> int:
    try:
        n = operator.index(num_tokens)
    except TypeError:
        raise TypeError(f"megamoe: num_tokens: expected an int, got {type(num_tokens).__name__}") from None
    rows = shape_of(x)[:1]
    if n < 0 or (rows and n > rows[0]):
        raise ValueError(f"megamoe: num_tokens: expected 0 <= num_tokens <= x.shape[0] = {rows[0] if rows else '?'}, got {n}")
    return n


# The schemes of DeepGEMM's (mma_type, group_size), built once: torch.compile traces the
# drop-ins, and a QuantScheme is a constant to it (it cannot trace building or reading one).
# Values: (scheme, packed fp4, per-token scales).
_SCHEMES = {
    ("fp8xfp4", 32): (MXFP8, False, False),  # e4m3 + UE8M0, DeepGEMM's floor 1e-4
    ("fp8xfp4", 64): (QuantScheme(group_k=64), False, False),
    ("fp8xfp4", 128): (FP8_UE8M0_G128, False, False),
    ("mxf4xmxf4", 32): (MXFP4, True, False),
    ("nvfp4xnvfp4", 16): (NVFP4_PER_TOKEN, True, True),
}
_GROUPS = {"fp8xfp4": "32, 64 or 128", "mxf4xmxf4": "32 (megamoe stages MXFP4 in groups of 32)", "nvfp4xnvfp4": "16"}
_SM90_SCHEMES = {G: s.with_amax_floor(_SM90_FLOOR) for G, s in ((128, FP8_FP32_G128), (32, FP8_FP32_G32))}


def _scheme_of(mma_type: Any, group_size: int) -> tuple:
    """(scheme, fp4, per_token) of DeepGEMM's (mma_type, group_size). A bool is the older
    API's ``use_fp4_acts`` in the same position."""
    if mma_type is True or mma_type is False:
        mma_type = "mxf4xmxf4" if mma_type else "fp8xfp4"
    G = operator.index(group_size)
    if mma_type not in _GROUPS:
        raise ValueError(
            f"megamoe: mma_type: expected 'fp8xfp4', 'mxf4xmxf4' or 'nvfp4xnvfp4' (or the older use_fp4_acts bool), got {mma_type!r}"
        )
    found = _SCHEMES.get((mma_type, G))
    if found is None:
        raise ValueError(f"megamoe: group_size: expected {_GROUPS[mma_type]} for mma_type {mma_type!r}, got {G}")
    return found


def _as_bytes(buf: Any) -> Any:
    """Packed-fp4 buffers as their bytes: DeepGEMM accepts any 1-byte view of the slot
    (int8, uint8, float8_e4m3fn, float4_e2m1fn_x2), megamoe takes uint8 / int8."""
    name = str(getattr(buf, "dtype", "")).rsplit(".", 1)[-1]
    if name in ("float8_e4m3fn", "float4_e2m1fn_x2"):
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(buf, torch.Tensor):
            return buf.view(torch.uint8)
        return buf.view("u1")
    return buf


def _flat(a: Any) -> Any:
    """A 1-D view of ``a`` (never a copy: the drop-in writes through it)."""
    if len(shape_of(a)) == 1:
        return a
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(a, torch.Tensor):
        return a.view(-1)  # raises for a layout no view can flatten
    v = a.view()
    v.shape = (-1,)  # NumPy raises instead of copying
    return v


def _check_expert_scales(expert_scales: Any, w: Any) -> None:
    """Raises unless ``expert_scales`` is a 1-D float32 array of ``w``'s kind (and device):
    called before anything is staged, so that a bad table writes nothing."""
    torch = sys.modules.get("torch")
    shape = shape_of(expert_scales)
    name = str(getattr(expert_scales, "dtype", "")).rsplit(".", 1)[-1]
    if len(shape) != 1 or name != "float32":
        raise ValueError(
            f"megamoe: expert_scales: expected a 1-D float32 array, got shape {shape} dtype {name or type(expert_scales).__name__}"
        )
    w_torch = torch is not None and isinstance(w, torch.Tensor)
    if w_torch != (torch is not None and isinstance(expert_scales, torch.Tensor)):
        raise TypeError(
            f"megamoe: expert_scales: expected the same kind of array as buf_topk_weights "
            f"({type(w).__name__}), got {type(expert_scales).__name__}"
        )
    if w_torch and expert_scales.device != w.device:
        raise ValueError(f"megamoe: expert_scales: expected device {w.device}, got device {expert_scales.device}")


def mega_moe_pre_dispatch(
    x: Any,
    topk_idx: Any,
    topk_weights: Any,
    buf_x: Any,
    buf_x_sf: Any,
    buf_topk_idx: Any,
    buf_topk_weights: Any,
    num_tokens: int,
    group_size: int = 32,
    mma_type: str = "fp8xfp4",
    buf_x_scales: Optional[Any] = None,
    expert_scales: Optional[Any] = None,
    *,
    enable_pdl: bool = False,
) -> None:
    """DeepGEMM's SM100 ``mega_moe_pre_dispatch`` (as SGLang calls it), staged by megamoe.

    ``mma_type``: ``'fp8xfp4'`` (e4m3 + UE8M0 scales, ``group_size`` 32 / 64 / 128),
    ``'mxf4xmxf4'`` (MXFP4, group_size 32, ties toward zero as DeepGEMM's kernel) or
    ``'nvfp4xnvfp4'`` (NVFP4 with per-token scales into ``buf_x_scales``, group_size 16);
    a bool in that place is the older API's ``use_fp4_acts``. ``buf_x``: ``[P, H]`` fp8 or
    ``[P, H/2]`` packed fp4 bytes; ``buf_x_sf``: ``[P, H/(4G)]`` int32; ``buf_topk_idx`` /
    ``buf_topk_weights``: ``[P, K]`` int64 / float32. Rows ``num_tokens..P-1`` of the top-k
    buffers become -1 / 0. ``expert_scales`` (float32 per expert) multiplies each kept
    weight by its expert's scale in the same launch, as DeepGEMM does (ids outside the table
    keep their weight). ``enable_pdl`` (keyword, megamoe's)
    launches with programmatic dependent launch. Runs on the current torch stream.
    """
    n = _num_tokens(num_tokens, x)
    scheme, fp4, per_token = _scheme_of(mma_type, group_size)
    if per_token and buf_x_scales is None:
        raise ValueError("megamoe: buf_x_scales: expected a float32 buffer (nvfp4xnvfp4 writes per-token scales), got none")
    if not per_token and buf_x_scales is not None:
        raise ValueError(f"megamoe: buf_x_scales: expected none (mma_type {mma_type!r} has no per-token scales), got an array")
    if fp4:
        buf_x = _as_bytes(buf_x)
    else:
        # e4m3 bytes, one per element: a packed-fp4 width would otherwise meet the validator's
        # MXFP4 drop-in rule (a default-scheme x_q of width H/2) and stage MXFP4.
        xs_, bs_ = shape_of(x), shape_of(buf_x)
        if len(xs_) == 2 and len(bs_) == 2 and bs_[1] != xs_[1]:
            raise ValueError(
                f"megamoe: buf_x: expected width {xs_[1]} (one e4m3 byte per element for mma_type "
                f"{mma_type!r}), got shape {tuple(bs_)}; packed fp4 takes mma_type 'mxf4xmxf4' or 'nvfp4xnvfp4'"
            )
    if expert_scales is not None:
        _check_expert_scales(expert_scales, buf_topk_weights)
    rows = (shape_of(buf_topk_idx) or (0,))[0]
    xs = None if buf_x_scales is None else _flat(buf_x_scales)
    x_n, ids_n, w_n = x[:n], topk_idx[:n], topk_weights[:n]
    if xs is not None and shape_of(xs)[0] < rows:
        # DeepGEMM asks only num_tokens scales of buf_x_scales; megamoe's full-buffer mode
        # wants one per buffer row, so a shorter one is staged in two calls: the tokens,
        # then the top-k tail alone.
        if shape_of(xs)[0] < n:
            raise ValueError(f"megamoe: buf_x_scales: expected at least num_tokens = {n} elements, got {shape_of(xs)[0]}")
        # The second call checks the tail of the top-k buffers; their rows must agree
        # before the first writes anything.
        w_rows = (shape_of(buf_topk_weights) or (0,))[0]
        if w_rows != rows:
            raise ValueError(
                f"megamoe: buf_topk_weights: expected {rows} rows (as buf_topk_idx), got shape {tuple(shape_of(buf_topk_weights))}"
            )
        prepare_megamoe_inputs(
            x_n, w_n, ids_n, buf_x[:n], buf_x_sf[:n], buf_topk_idx[:n], buf_topk_weights[:n],
            hidden_quant=scheme, x_scales=xs[:n], expert_scales=expert_scales, enable_pdl=enable_pdl,
        )  # fmt: skip
        stage_megamoe_routing(w_n[:0], ids_n[:0], buf_topk_idx[n:], buf_topk_weights[n:], full_buffer=True,
                              enable_pdl=enable_pdl)  # fmt: skip
    else:
        prepare_megamoe_inputs(
            x_n, w_n, ids_n, buf_x, buf_x_sf, buf_topk_idx, buf_topk_weights, hidden_quant=scheme,
            x_scales=None if xs is None else xs[:rows], full_buffer=True, expert_scales=expert_scales,
            enable_pdl=enable_pdl,
        )  # fmt: skip


def mega_moe_pre_dispatch_sm90(
    x: Any,
    topk_idx: Any,
    topk_weights: Any,
    buf_x: Any,
    buf_x_sf: Any,
    buf_topk_idx: Any,
    buf_topk_weights: Any,
    num_tokens: int,
    group_size: int = 128,
    routed_scaling_factor: float = 1.0,
    *,
    enable_pdl: bool = False,
) -> None:
    """DeepGEMM's ``mega_moe_pre_dispatch_sm90`` (Hopper; as SGLang calls it), staged by
    megamoe.

    e4m3 values with fp32 scales per ``group_size`` (32 or 128) columns, amax floored at
    1e-10 as DeepGEMM's SM90 kernel does; ``buf_x``: ``[P, H]`` fp8, ``buf_x_sf``: ``[P,
    H/G]`` float32, top-k buffers ``[P, K]``; kept weights are multiplied by
    ``routed_scaling_factor`` (one fp32 product), rows ``num_tokens..P-1`` of the top-k
    buffers become -1 / 0. ``enable_pdl`` (keyword, megamoe's) launches with programmatic
    dependent launch. Runs on the current torch stream.
    """
    n = _num_tokens(num_tokens, x)
    G = operator.index(group_size)
    if G not in (32, 128):
        raise ValueError(f"megamoe: group_size: expected 32 or 128 (DeepGEMM's SM90 pre-dispatch), got {G}")
    scheme = _SM90_SCHEMES[G]
    alpha = optional_float(routed_scaling_factor, "routed_scaling_factor")
    if alpha is None:
        raise TypeError("megamoe: routed_scaling_factor: expected a float, got None")
    prepare_megamoe_inputs(
        x[:n], topk_weights[:n], topk_idx[:n], buf_x, buf_x_sf, buf_topk_idx, buf_topk_weights,
        hidden_quant=scheme, full_buffer=True,
        # alpha == 1 changes no weight: staged as a plain copy (bit-identical)
        routed_scaling_factor=None if alpha == 1.0 else alpha, enable_pdl=enable_pdl,
    )  # fmt: skip
