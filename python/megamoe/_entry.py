"""The staging entry points, generated from megamoe._signature (their argument lists are
written down there once; _entry.pyi, generated from the same table, gives their types)."""

from __future__ import annotations

from . import _ops
from ._signature import (
    GATE_AND_ROUTE,
    GATE_ROUTE_AND_STAGE,
    MHC_AND_STAGE,
    NORM_AND_STAGE,
    PREPARE,
    ROUTE,
    ROUTE_AND_STAGE,
    ROUTING,
)

__all__ = [
    "prepare_megamoe_inputs",
    "explain",
    "stage_megamoe_routing",
    "explain_routing",
    "route",
    "explain_route",
    "route_and_stage",
    "explain_route_and_stage",
    "rmsnorm_and_stage",
    "explain_rmsnorm_and_stage",
    "gate_route_and_stage",
    "explain_gate_route_and_stage",
    "gate_and_route",
    "explain_gate_and_route",
    "mhc_pre_and_stage",
    "explain_mhc_pre_and_stage",
]

_PREPARE_ARGS = """
    Args:
        hidden_states: ``[T, H]`` activations, bf16/fp16/fp32, any strides, H % 128 == 0.
        topk_weights: ``[T, K]`` router weights, fp32/bf16/fp16.
        topk_ids: ``[T, K]`` router expert ids, int32/int64.
        x_fp8: out quantized values: fp8 schemes ``[T, H]`` float8_e4m3fn (MXFP8_E5M2:
            float8_e5m2; or uint8 bytes); fp4 schemes ``[T, H/2]`` uint8 / int8 (torch.float4_e2m1fn_x2 too), two
            e2m1 values per byte, low nibble = even column. With the default scheme a
            uint8 / int8 ``x_fp8`` of width H/2 selects MXFP4 (vLLM's MXFP4 path). BF16:
            ``[T, H]`` bfloat16, the input as bf16.
        x_sf: out scales: UE8M0 and NVFP4 schemes ``[T, H/(4G)]`` int32 (four scale bytes
            per word, little-endian in group order); fp32 schemes ``[T, H/G]`` float32
            (a transposed / MN-major view is fine); BF16 (no scales): None or ``[T, 0]``.
        topk_idx_out: out ``[T, K]`` int64 ids, -1 for padded tokens.
        topk_weights_out: out ``[T, K]`` float32 weights, +0.0 for padded tokens.
        is_padding: optional ``[T]`` bool/uint8 mask, nonzero = padded token.
        shared_x_sf: optional out ``[R, H/(4G)]`` int32, the shared expert's permuted copy
            of the UE8M0 scales; given exactly when ``shared_block_m`` is.
        shared_block_m: block M of the MoE scheduler used to lay out ``shared_x_sf``.
        hidden_quant: a :class:`QuantScheme` (``MXFP8`` default, ``FP8_UE8M0_G128``,
            ``FP8_FP32_G128``, ``FP8_FP32_G32``, ``MXFP8_E5M2``, ``MXFP4``, ``MXFP4_RNE``,
            ``NVFP4_STATIC``, ``NVFP4_PER_TOKEN``, ``NVFP4_ONLINE``, ``BF16``, any with ``.with_amax_floor(f)``) or a
            vLLM ``QuantKey``.
        global_scale: NVFP4 static and online only (required there): ``[1]`` float32 on the
            tensors' device; static: read by the kernel (it may change between CUDA graph
            replays); online: written, fl(max(amax, floor) / 2688) of the whole tensor.
        x_scales: NVFP4 per-token only (required there): out ``[T]`` float32 per-token
            second-level scales.
        nonfinite_count: optional in/out ``[1]`` int64 on the tensors' device: the number
            of NaN / +-Inf elements of hidden_states is added to it (device atomics on
            CUDA, no host synchronization).
        full_buffer: symmetric-memory mode: every output has ``M >= T`` rows (M =
            topk_idx_out.shape[0]); rows T..M-1 of topk_idx_out / topk_weights_out become
            -1 / +0.0 in the same call (also when T == 0); those rows of x_fp8 / x_sf /
            x_scales are left untouched.
        routed_scaling_factor: optional finite alpha: kept weights become fl(w * alpha)
            (padded and tail rows stay +0.0).
        expert_scales: optional ``[E]`` float32 per-expert scales on the tensors' device
            (SGLang's DeepGEMM ``expert_scales``): a kept entry whose id is in [0, E) gets
            fl(w' * expert_scales[id]), w' the weight after routed_scaling_factor; other
            ids keep w'.
        stream: CUDA stream as an int (``cudaStream_t``). Default: for torch tensors the
            current torch stream of their device, otherwise 0 (legacy default stream).
            Leave it None inside torch.compile regions.
        enable_pdl: launch with programmatic dependent launch (sm_90+, CUDA only).
"""

_PREPARE_DOC = (
    """Quantize hidden states and repack top-k routing for DeepGEMM MegaMoE.

    Drop-in replacement of vLLM's ``prepare_megamoe_inputs`` (same positional parameters,
    defaults and ``ValueError`` messages; megamoe's additions are keyword-only). Works on
    PyTorch tensors (CPU or CUDA; through the custom op ``torch.ops.megamoe.prepare_inputs``
    under ``torch.compile``), NumPy arrays and any other DLPack / buffer-protocol array.
    Nothing is allocated; outputs are written in place; the host never synchronizes with
    the device. Formats: fp8 e4m3 with UE8M0 or fp32 group scales, MXFP8 e5m2, MXFP4
    (either tie rule), NVFP4 static and per-token (docs/CONTRACT.md has the bit-exact
    recipes).
"""
    + _PREPARE_ARGS
    + """
    Like the reference, a call whose ``hidden_states`` is a 2-D array with no rows returns
    at once, whatever the other arguments are (except in full-buffer mode, which fills the
    top-k tail then).

    Raises:
        TypeError: an array argument that is no array (a list, a number, None, ...), a
            ``hidden_quant`` that is no scheme, or a non-integer ``shared_block_m`` /
            ``stream``, a non-float ``routed_scaling_factor``, a non-bool flag.
        ValueError: an invalid argument (shape, dtype, device, overlap, scheme, ...;
            also arrays megamoe cannot take: big-endian, structured or object dtypes,
            byte strides that are not whole elements; an int ``shared_block_m`` outside
            int64, a ``stream`` outside [0, 2**64), an int ``routed_scaling_factor`` too
            large for a float, each named in the message); nothing was written.
        RuntimeError: a CUDA failure, or CUDA tensors given to a build without CUDA (or
            to a CUDA backend that does not stage that request yet).
    """
)

_EXPLAIN_DOC = """What :func:`prepare_megamoe_inputs` would launch for these arguments, as text.

    Validates the arguments exactly as staging would (same errors) and describes the plan
    without running it: for CUDA tensors the kernel, grid, stores and vectorization the
    CUDA backend would pick for them on their device, for CPU tensors the CPU backend's
    loop; "nothing to do" for T == 0. For logs and bug reports: the wording may change
    between versions. ``stream`` is ignored.
"""

_ROUTING_DOC = """Routing-only staging: vLLM's ``stage_megamoe_routing`` (same name and
    argument order; megamoe's additions are keyword-only).

    For activations that were already quantized by their producer (e.g. a fused mHC or
    norm kernel wrote x_fp8 / x_sf): repacks the router's top-k into the buffers DeepGEMM's
    MegaMoE kernels read. ``topk_idx_out[t]`` = the ids widened to int64, -1 for padded
    tokens; ``topk_weights_out[t]`` = the weights as fp32 (times ``routed_scaling_factor``
    when given), +0.0 for padded tokens. ``full_buffer``: the outputs have M >= T rows and
    rows T..M-1 become -1 / +0.0 (also when T == 0). ``topk_ids`` without rows returns at
    once outside full-buffer mode. Torch tensors under torch.compile go through
    ``torch.ops.megamoe.stage_routing``.

    Args:
        topk_weights: ``[T, K]`` fp32 / bf16 / fp16.
        topk_ids: ``[T, K]`` int32 / int64.
        topk_idx_out: out ``[T, K]`` (full buffer: ``[M, K]``) int64.
        topk_weights_out: out ``[T, K]`` (full buffer: ``[M, K]``) float32.
        is_padding: optional ``[T]`` bool / uint8, nonzero = padded.
        full_buffer, routed_scaling_factor, stream, enable_pdl: as for
            :func:`prepare_megamoe_inputs`.

    Raises:
        TypeError / ValueError: as :func:`prepare_megamoe_inputs`; nothing was written.
"""

prepare_megamoe_inputs = PREPARE.make_function("prepare_megamoe_inputs", _ops.prepare_impl, _PREPARE_DOC)
explain = PREPARE.make_function("explain", _ops.explain_impl, _EXPLAIN_DOC)
stage_megamoe_routing = ROUTING.make_function("stage_megamoe_routing", _ops.routing_impl, _ROUTING_DOC)

_ROUTER_ARGS = """
        router_logits: ``[T, E]`` float32 / bfloat16 gate logits, any strides, 1 <= E <= 512.
        e_score_correction_bias: ``[E]`` float32 / bfloat16 selection bias
            (DeepSeek's ``e_score_correction_bias``), or None (no bias; hash layers must
            pass None). Required, so that a forgotten bias cannot change the selection.
        topk_weights: out ``[T, K]`` float32: the weights, +0.0 on padded tokens.
        topk_ids: out ``[T, K]`` int32 (what vLLM's routers produce) or int64: the
            chosen experts (physical ids with EPLB), -1 on padded tokens.
"""

_ROUTER_OPTIONS = """
        top_k: K, 1..16 and <= E; None: ``topk_ids.shape[1]`` (hash layers:
            ``tid2eid.shape[1]`` must equal it).
        routed_scaling_factor: finite alpha multiplying every kept weight (one fp32
            rounding; DeepSeek-V4: 1.5); None: no scaling.
        tid2eid: hash layers: ``[V, K]`` int32 table, with ``input_ids``: the ids are
            ``tid2eid[input_ids[t]]`` (no selection), the weights come from the logits.
        input_ids: hash layers: ``[T]`` int32 / int64 token ids.
        logical_to_physical_map: EPLB (all four or none): ``[E, R]`` int32 physical
            replicas of each logical expert; the entry at flat position p = t*K + k maps
            to ``map[l, p % c]``, c = ``logical_replica_count[l]`` clamped to [1, R].
        logical_replica_count: EPLB: ``[E]`` int32.
        expert_load_view: EPLB: in/out ``[P]`` int32 / int64: +1 per routed entry whose
            physical id is in [0, P) while recording (never for padded tokens).
        record_enabled: EPLB: one-element int32 flag read on the device at every call
            (nonzero: record into expert_load_view; may change between CUDA graph replays).
"""

_ROUTER_RAISES = """
    Raises:
        TypeError: an array argument that is no array, a non-integer ``top_k`` /
            ``shared_block_m`` / ``stream``, a non-float ``routed_scaling_factor``, a
            non-bool flag (or, for route_and_stage, a ``hidden_quant`` that is no scheme).
        ValueError: an invalid argument (shape, dtype, device, overlap, E or K out of
            range, a non-finite ``routed_scaling_factor``, hash-layer or EPLB tensors
            given partly, a bias with ``tid2eid``, an int ``top_k`` / ``shared_block_m``
            outside int64 or a ``stream`` outside [0, 2**64), ...; the message names the
            argument); nothing was written.
        RuntimeError: a CUDA failure, or CUDA tensors given to a build without CUDA.
    """

_ROUTE_DOC = (
    """The fused DeepSeek-V4 router alone: router logits to the public top-k.

    Per token: scores ``s_e = sqrt(softplus(logit_e))`` in fp32 (exp and log1p correctly
    rounded), the K largest ``fl(s_e + bias_e)`` (ties to the lower expert id, NaN never
    chosen while a number remains), weights ``fl(fl(s_k / max(sum, 1e-20)) * alpha)`` over
    the unbiased scores (sum in k order; NaN written as 0x7FC00000); then hash layers, EPLB
    and padding as below (docs/ROUTER.md has every rule). Works on PyTorch tensors (CPU or
    CUDA; ``torch.ops.megamoe.route`` under torch.compile), NumPy arrays and any DLPack /
    buffer-protocol array; nothing is allocated, the outputs are written in place, the
    host never synchronizes with the device. A ``router_logits`` without rows returns at
    once, whatever the other arguments are.

    Args:"""
    + _ROUTER_ARGS
    + """        is_padding: optional ``[T]`` bool / uint8, nonzero = padded: ids -1, weights +0.0,
            not mapped, not recorded (their logits are still counted)."""
    + _ROUTER_OPTIONS
    + """        nonfinite_count: optional in/out one-element int64: the number of NaN / +-Inf
            logits (all T x E, padded tokens included) is added to it.
        stream, enable_pdl: as for :func:`prepare_megamoe_inputs`.
"""
    + _ROUTER_RAISES
)

_ROUTE_AND_STAGE_DOC = (
    """Route (DeepSeek-V4 router) and stage for DeepGEMM MegaMoE in one call.

    The router of :func:`route` writes the public ``topk_weights`` / ``topk_ids`` and, in
    the same call (on CUDA one kernel launch for the usual contiguous layouts), the
    staging of :func:`prepare_megamoe_inputs` takes them as its top-k: ``topk_idx_out`` =
    the (physical) ids widened to int64, ``topk_weights_out`` = the weights. The bytes are
    those of :func:`route` followed by :func:`prepare_megamoe_inputs` (every format,
    ``shared_x_sf``, full-buffer mode, the counters). T is ``router_logits.shape[0]``;
    ``hidden_states`` must have as many rows. Without rows the call returns at once
    (except in full-buffer mode, which fills the staged top-k tail then). Torch tensors
    under torch.compile go through ``torch.ops.megamoe.route_and_stage``.

    Args:
        hidden_states: ``[T, H]`` activations, as for :func:`prepare_megamoe_inputs`."""
    + _ROUTER_ARGS
    + """        x_fp8, x_sf, topk_idx_out, topk_weights_out, shared_x_sf, shared_block_m,
            hidden_quant: the staging outputs and scheme, as for
            :func:`prepare_megamoe_inputs` (full buffer: the staged outputs have M >= T rows,
            the public top-k T).
        is_padding: optional ``[T]`` bool / uint8 mask of both halves (the router's
            padded rows and the staged ones)."""
    + _ROUTER_OPTIONS
    + """        logits_nonfinite_count: optional in/out one-element int64: NaN / +-Inf logits
            are added to it (the router's counter).
        global_scale, x_scales, full_buffer, stream, enable_pdl: as for
            :func:`prepare_megamoe_inputs`.
        nonfinite_count: optional in/out one-element int64: NaN / +-Inf hidden-state
            elements are added to it (the staging's counter, as for
            :func:`prepare_megamoe_inputs`).
"""
    + _ROUTER_RAISES
)

route = ROUTE.make_function("route", _ops.route_impl, _ROUTE_DOC)
route_and_stage = ROUTE_AND_STAGE.make_function("route_and_stage", _ops.route_and_stage_impl, _ROUTE_AND_STAGE_DOC)

# The explain twins of the other calls: the same arguments, the plan as text.
_EXPLAIN_CALL_DOC = """What :func:`{call}` would launch for these arguments, as text.

    Takes exactly the arguments of :func:`{call}`, validates them as it does (the same
    ``TypeError`` / ``ValueError``; nothing is written) and describes the plan without
    running it: for CUDA tensors the kernel launch the CUDA backend would pick for them on
    their device, for CPU tensors the CPU backend's work. A call that {call} would return
    at once ({rows} without rows{full}) gives "nothing to do: {rows} has no rows (T == 0)".
    For logs and bug reports: the wording may change between versions. ``stream`` is
    ignored.
"""


def _explain_doc(call: str, rows: str, full: bool) -> str:
    return _EXPLAIN_CALL_DOC.format(call=call, rows=rows, full=", outside full-buffer mode" if full else "")


explain_routing = ROUTING.make_function(
    "explain_routing", _ops.explain_routing_impl, _explain_doc("stage_megamoe_routing", "topk_ids", True)
)
explain_route = ROUTE.make_function(
    "explain_route", _ops.explain_route_impl, _explain_doc("route", "router_logits", False)
)
explain_route_and_stage = ROUTE_AND_STAGE.make_function(
    "explain_route_and_stage", _ops.explain_route_and_stage_impl, _explain_doc("route_and_stage", "router_logits", True)
)

_NORM_AND_STAGE_DOC = """RMSNorm (optional residual add) and stage the normalized rows in one call.

    vLLM's ``rms_norm`` / ``fused_add_rms_norm`` with every rounding point fixed
    (docs/CONTRACT.md, "RMSNorm and stage"), then the staging of
    :func:`prepare_megamoe_inputs` with the normalized rows y as ``hidden_states``, bit for
    bit (every format, the top-k repack, padding, ``shared_x_sf``, full-buffer mode, the
    counter of y's non-finite values). Per row: z = x, or with a residual
    z = bf16(fl(x + residual)); S = the sum of fl(z^2) in 16-column chunks folded by halves;
    s = fl(1 / sqrt(fl(fl(S / H) + eps))) (correctly rounded); y = bf16(fl(bf16(fl(z * s)) * w)).
    T is ``x.shape[0]``; without rows the call returns at once (except in full-buffer
    mode, which fills the staged top-k tail then). Nothing is allocated, the host never
    synchronizes with the device; torch tensors under torch.compile go through
    ``torch.ops.megamoe.rmsnorm_and_stage``. Both backends run it (CUDA: a norm kernel,
    then the staging launch; without ``y`` the rows go to stream-ordered scratch);
    :func:`explain_rmsnorm_and_stage` prints what it would launch.

    Args:
        x: ``[T, H]`` bfloat16 rows (vLLM's ``input``), any strides, H % 128 == 0, H <= 2**24.
        residual: ``[T, H]`` bfloat16 added to x first, or None (no residual add). Required,
            so that a forgotten residual cannot change the result silently.
        weight: ``[H]`` bfloat16 or float32 norm weight.
        topk_weights, topk_ids, x_fp8, x_sf, topk_idx_out, topk_weights_out, is_padding,
            shared_x_sf, shared_block_m, hidden_quant: as for
            :func:`prepare_megamoe_inputs`, with y as its hidden states.
        eps: the norm's epsilon, finite and >= 0 (rounded to float32).
        y: optional out ``[T, H]`` bfloat16: the normalized rows (may be ``x`` itself, the
            same view: in place). Without it they are staged only.
        residual_out: optional out ``[T, H]`` bfloat16: z, the sum x + residual as bf16
            (only with a residual; may be ``residual`` itself, the same view: vLLM's
            ``fused_add_rms_norm`` writes it there).
        global_scale, x_scales, full_buffer, routed_scaling_factor, expert_scales, stream,
            enable_pdl: as for :func:`prepare_megamoe_inputs`.
        nonfinite_count: optional in/out one-element int64: NaN / +-Inf elements of y (not
            of x) are added to it.

    Raises:
        TypeError: an array argument that is no array, a ``hidden_quant`` that is no
            scheme, a non-float ``eps`` / ``routed_scaling_factor``, a non-integer
            ``shared_block_m`` / ``stream``, a non-bool flag.
        ValueError: an invalid argument (shape, dtype, device, overlap other than the
            in-place pairs, a negative or non-finite ``eps``, a ``residual_out`` without a
            residual, an int ``shared_block_m`` outside int64, a ``stream`` outside
            [0, 2**64), ...; the message names the argument; the staging's name the rows
            ``y``, or ``x`` when no y is given); nothing was written.
        RuntimeError: a CUDA failure; :class:`UnsupportedError` (a RuntimeError) for CUDA
            tensors, which this version does not normalize.
    """

rmsnorm_and_stage = NORM_AND_STAGE.make_function("rmsnorm_and_stage", _ops.rmsnorm_and_stage_impl, _NORM_AND_STAGE_DOC)
explain_rmsnorm_and_stage = NORM_AND_STAGE.make_function(
    "explain_rmsnorm_and_stage", _ops.explain_rmsnorm_and_stage_impl, _explain_doc("rmsnorm_and_stage", "x", True)
)

_GATE_ROUTE_AND_STAGE_DOC = (
    """Gate, route and stage in one call: :func:`route_and_stage` with the logits computed here.

    logit[t, e] is the fp32 dot product of ``y[t, :]`` and ``weight[e, :]`` in one fixed
    order (docs/CONTRACT.md, "Gate, route and stage"): the row in 16-column chunks, each a
    chain of fused multiply-adds from +0 in column order (the last chunk may be short), the
    chunk sums folded by halves, highest first (c_j = fl(c_j + c_j+N/2), N the power of two
    >= the chunk count, and so on down to c_0). Every backend and any split of the work gives
    the same bits; a NaN logit is written to ``logits_out`` as 0x7FC00000. The router and the
    staging are then those of :func:`route_and_stage` on these logits, byte for byte. T is
    ``hidden_states.shape[0]`` (``y`` must have as many rows); without rows the call returns
    at once (except in full-buffer mode). Both backends run it with the same bytes (CUDA: H
    <= 65536; decode sizes, T <= 64, are its range: above, a GEMM then
    :func:`route_and_stage` is faster); a build without the CUDA backend raises
    :class:`UnsupportedError` for CUDA tensors. Torch tensors under torch.compile go through
    ``torch.ops.megamoe.gate_route_and_stage``.

    Args:
        hidden_states: ``[T, H]`` activations, as for :func:`prepare_megamoe_inputs`.
        weight: ``[E, H]`` bfloat16 / float32 gate weight (vLLM's ``gate.weight``), any
            strides, 1 <= E <= 512, H = ``y.shape[1]``.
        e_score_correction_bias, topk_weights, topk_ids: as for :func:`route`."""
    + """
        x_fp8, x_sf, topk_idx_out, topk_weights_out, is_padding, shared_x_sf,
            shared_block_m, hidden_quant: as for :func:`route_and_stage`."""
    + _ROUTER_OPTIONS
    + """        y: optional ``[T, H]`` bfloat16 gate input rows, any strides; None: ``hidden_states``
            (which must then be bfloat16), the usual call.
        logits_out: optional out ``[T, E]`` float32: the logits the router used (for EPLB
            statistics or debugging).
        logits_nonfinite_count: optional in/out one-element int64: NaN / +-Inf logits (all
            T x E, padded tokens included) are added to it.
        global_scale, x_scales, nonfinite_count, full_buffer, stream, enable_pdl: as for
            :func:`route_and_stage`.
"""
    + _ROUTER_RAISES
)

gate_route_and_stage = GATE_ROUTE_AND_STAGE.make_function(
    "gate_route_and_stage", _ops.gate_route_and_stage_impl, _GATE_ROUTE_AND_STAGE_DOC
)
explain_gate_route_and_stage = GATE_ROUTE_AND_STAGE.make_function(
    "explain_gate_route_and_stage",
    _ops.explain_gate_route_and_stage_impl,
    _explain_doc("gate_route_and_stage", "hidden_states", True),
)

_GATE_AND_ROUTE_DOC = (
    """Gate and route in one call: :func:`route` with the logits computed here.

    The logits are those of :func:`gate_route_and_stage` (the contract's fixed fp32 order,
    docs/CONTRACT.md "Gate, route and stage"); the router is then :func:`route`'s on them,
    byte for byte, and nothing is staged. T is ``y.shape[0]``; without rows the call returns
    at once. Both backends run it (as :func:`gate_route_and_stage`); a build without the CUDA
    backend raises :class:`UnsupportedError` for CUDA tensors. Torch tensors under
    torch.compile go through ``torch.ops.megamoe.gate_and_route``.

    Args:
        y: ``[T, H]`` bfloat16 gate input rows, any strides.
        weight: ``[E, H]`` bfloat16 / float32 gate weight, any strides, 1 <= E <= 512.
        e_score_correction_bias, topk_weights, topk_ids, is_padding: as for :func:`route`."""
    + _ROUTER_OPTIONS
    + """        logits_out: optional out ``[T, E]`` float32: the logits the router used.
        nonfinite_count: optional in/out one-element int64: NaN / +-Inf logits (all T x E,
            padded tokens included) are added to it.
        stream, enable_pdl: as for :func:`route`.
"""
    + _ROUTER_RAISES
)

gate_and_route = GATE_AND_ROUTE.make_function("gate_and_route", _ops.gate_and_route_impl, _GATE_AND_ROUTE_DOC)
explain_gate_and_route = GATE_AND_ROUTE.make_function(
    "explain_gate_and_route", _ops.explain_gate_and_route_impl, _explain_doc("gate_and_route", "y", False)
)

_MHC_AND_STAGE_DOC = """DeepSeek-V4's mHC pre step, RMSNorm and staging of the rows in one call.

    vLLM's ``mhc_pre`` (the mix GEMM over the hc_mult streams, the sigmoid gates, Sinkhorn,
    the weighted sum of the streams) followed by the layer's ``rms_norm``, every rounding
    point fixed (docs/CONTRACT.md, "mHC pre and stage": fixed-order fp32 sums, a correctly
    rounded exp), then the staging of :func:`prepare_megamoe_inputs` with the normalized rows
    y as ``hidden_states``, bit for bit (every format, the top-k repack, padding,
    ``shared_x_sf``, full-buffer mode, the counter of y's non-finite values). T is
    ``residual.shape[0]``; without rows the call returns at once (except in full-buffer
    mode). Nothing is allocated; torch tensors under torch.compile go through
    ``torch.ops.megamoe.mhc_pre_and_stage``. The CPU backend runs it, and the CUDA backend
    in one launch (two for NVFP4 online; hc * H <= 65536 on CUDA): the same bytes. CUDA
    tensors in a build without the CUDA backend raise :class:`UnsupportedError`, nothing
    written.

    Args:
        residual: ``[T, hc, H]`` or ``[T, hc * H]`` bfloat16 residual streams (hc = hc_mult,
            1..16), any strides, H % 128 == 0, hc * H <= 2**24.
        fn: ``[hc * (hc + 2), hc * H]`` float32 mix weight (vLLM's ``hc_fn``).
        hc_scale: ``[3]`` float32 scales of the pre, post and comb logits.
        hc_base: ``[hc * (hc + 2)]`` float32 biases.
        norm_weight: ``[H]`` bfloat16 or float32 RMSNorm weight of the layer.
        post_mix: out ``[T, hc]`` (or ``[T, hc, 1]``) float32: the post gates.
        comb_mix: out ``[T, hc * hc]`` (or ``[T, hc, hc]``) float32: the Sinkhorn matrix.
        topk_weights, topk_ids, x_fp8, x_sf, topk_idx_out, topk_weights_out, is_padding,
            shared_x_sf, shared_block_m, hidden_quant: as for
            :func:`prepare_megamoe_inputs`, with y as its hidden states.
        rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value, norm_eps: finite (the eps
            of the RMS, Sinkhorn and the norm also >= 0), rounded to float32.
        sinkhorn_repeat: Sinkhorn rounds, 1..65536.
        pre_mix_in: optional ``[T, hc]`` float32 coefficients of the weighted sum instead of
            this step's pre gates (DeepSeek-V4.1's delayed form).
        pre_mix: optional out ``[T, hc]`` float32: this step's pre gates.
        layer_input: optional out ``[T, H]`` bfloat16: the weighted sum, before the norm.
        y: optional out ``[T, H]`` bfloat16: the normalized rows.
        global_scale, x_scales, full_buffer, routed_scaling_factor, expert_scales, stream,
            enable_pdl: as for :func:`prepare_megamoe_inputs`.
        nonfinite_count: optional in/out one-element int64: NaN / +-Inf elements of y are
            added to it.

    Raises:
        TypeError: an array argument that is no array, a ``hidden_quant`` that is no
            scheme, a non-float eps / multiplier, a non-int ``sinkhorn_repeat``, a non-bool flag.
        ValueError: an invalid argument (shape, dtype, device, overlap, an eps out of range,
            ``sinkhorn_repeat`` out of range, a 3-D output without a 2-D view, ...; the
            message names the argument; the staging's name the rows ``y``, or
            ``residual`` when no y is given); nothing was written.
        RuntimeError: a CUDA failure; :class:`UnsupportedError` (a RuntimeError) for CUDA
            tensors in a build without the CUDA backend, or with hc * H > 65536.
    """

mhc_pre_and_stage = MHC_AND_STAGE.make_function("mhc_pre_and_stage", _ops.mhc_pre_and_stage_impl, _MHC_AND_STAGE_DOC)
explain_mhc_pre_and_stage = MHC_AND_STAGE.make_function(
    "explain_mhc_pre_and_stage", _ops.explain_mhc_pre_and_stage_impl, _explain_doc("mhc_pre_and_stage", "residual", True)
)
