# Generated from megamoe/_signature.py; do not edit. Regenerate with
#   python -c 'import megamoe._signature as s; print(s.stub_text(), end="")' > python/megamoe/_entry.pyi
# (tests/python/test_signature.py checks that this file is that text).
from typing import Any, Optional


def prepare_megamoe_inputs(
    hidden_states: Any,
    topk_weights: Any,
    topk_ids: Any,
    x_fp8: Any,
    x_sf: Optional[Any],
    topk_idx_out: Any,
    topk_weights_out: Any,
    is_padding: Optional[Any] = None,
    shared_x_sf: Optional[Any] = None,
    shared_block_m: Optional[int] = None,
    hidden_quant: Any = ...,
    *,
    global_scale: Optional[Any] = None,
    x_scales: Optional[Any] = None,
    nonfinite_count: Optional[Any] = None,
    full_buffer: bool = False,
    routed_scaling_factor: Optional[float] = None,
    expert_scales: Optional[Any] = None,
    stream: Optional[int] = None,
    enable_pdl: bool = False,
) -> None:
    """Quantize hidden states and repack top-k routing for DeepGEMM MegaMoE."""


def explain(
    hidden_states: Any,
    topk_weights: Any,
    topk_ids: Any,
    x_fp8: Any,
    x_sf: Optional[Any],
    topk_idx_out: Any,
    topk_weights_out: Any,
    is_padding: Optional[Any] = None,
    shared_x_sf: Optional[Any] = None,
    shared_block_m: Optional[int] = None,
    hidden_quant: Any = ...,
    *,
    global_scale: Optional[Any] = None,
    x_scales: Optional[Any] = None,
    nonfinite_count: Optional[Any] = None,
    full_buffer: bool = False,
    routed_scaling_factor: Optional[float] = None,
    expert_scales: Optional[Any] = None,
    stream: Optional[int] = None,
    enable_pdl: bool = False,
) -> str:
    """What prepare_megamoe_inputs would launch for these arguments, as text."""


def stage_megamoe_routing(
    topk_weights: Any,
    topk_ids: Any,
    topk_idx_out: Any,
    topk_weights_out: Any,
    is_padding: Optional[Any] = None,
    *,
    full_buffer: bool = False,
    routed_scaling_factor: Optional[float] = None,
    expert_scales: Optional[Any] = None,
    stream: Optional[int] = None,
    enable_pdl: bool = False,
) -> None:
    """Routing-only staging (vLLM's stage_megamoe_routing)."""


def explain_routing(
    topk_weights: Any,
    topk_ids: Any,
    topk_idx_out: Any,
    topk_weights_out: Any,
    is_padding: Optional[Any] = None,
    *,
    full_buffer: bool = False,
    routed_scaling_factor: Optional[float] = None,
    expert_scales: Optional[Any] = None,
    stream: Optional[int] = None,
    enable_pdl: bool = False,
) -> str:
    """What stage_megamoe_routing would launch for these arguments, as text."""


def route(
    router_logits: Any,
    e_score_correction_bias: Optional[Any],
    topk_weights: Any,
    topk_ids: Any,
    is_padding: Optional[Any] = None,
    *,
    top_k: Optional[int] = None,
    routed_scaling_factor: Optional[float] = None,
    tid2eid: Optional[Any] = None,
    input_ids: Optional[Any] = None,
    logical_to_physical_map: Optional[Any] = None,
    logical_replica_count: Optional[Any] = None,
    expert_load_view: Optional[Any] = None,
    record_enabled: Optional[Any] = None,
    nonfinite_count: Optional[Any] = None,
    stream: Optional[int] = None,
    enable_pdl: bool = False,
) -> None:
    """The fused DeepSeek-V4 router alone: router logits to the public top-k."""


def explain_route(
    router_logits: Any,
    e_score_correction_bias: Optional[Any],
    topk_weights: Any,
    topk_ids: Any,
    is_padding: Optional[Any] = None,
    *,
    top_k: Optional[int] = None,
    routed_scaling_factor: Optional[float] = None,
    tid2eid: Optional[Any] = None,
    input_ids: Optional[Any] = None,
    logical_to_physical_map: Optional[Any] = None,
    logical_replica_count: Optional[Any] = None,
    expert_load_view: Optional[Any] = None,
    record_enabled: Optional[Any] = None,
    nonfinite_count: Optional[Any] = None,
    stream: Optional[int] = None,
    enable_pdl: bool = False,
) -> str:
    """What route would launch for these arguments, as text."""


def route_and_stage(
    hidden_states: Any,
    router_logits: Any,
    e_score_correction_bias: Optional[Any],
    topk_weights: Any,
    topk_ids: Any,
    x_fp8: Any,
    x_sf: Optional[Any],
    topk_idx_out: Any,
    topk_weights_out: Any,
    is_padding: Optional[Any] = None,
    shared_x_sf: Optional[Any] = None,
    shared_block_m: Optional[int] = None,
    hidden_quant: Any = ...,
    *,
    top_k: Optional[int] = None,
    routed_scaling_factor: Optional[float] = None,
    tid2eid: Optional[Any] = None,
    input_ids: Optional[Any] = None,
    logical_to_physical_map: Optional[Any] = None,
    logical_replica_count: Optional[Any] = None,
    expert_load_view: Optional[Any] = None,
    record_enabled: Optional[Any] = None,
    logits_nonfinite_count: Optional[Any] = None,
    global_scale: Optional[Any] = None,
    x_scales: Optional[Any] = None,
    nonfinite_count: Optional[Any] = None,
    full_buffer: bool = False,
    stream: Optional[int] = None,
    enable_pdl: bool = False,
) -> None:
    """Route (DeepSeek-V4 router) and stage for DeepGEMM MegaMoE in one call."""


def explain_route_and_stage(
    hidden_states: Any,
    router_logits: Any,
    e_score_correction_bias: Optional[Any],
    topk_weights: Any,
    topk_ids: Any,
    x_fp8: Any,
    x_sf: Optional[Any],
    topk_idx_out: Any,
    topk_weights_out: Any,
    is_padding: Optional[Any] = None,
    shared_x_sf: Optional[Any] = None,
    shared_block_m: Optional[int] = None,
    hidden_quant: Any = ...,
    *,
    top_k: Optional[int] = None,
    routed_scaling_factor: Optional[float] = None,
    tid2eid: Optional[Any] = None,
    input_ids: Optional[Any] = None,
    logical_to_physical_map: Optional[Any] = None,
    logical_replica_count: Optional[Any] = None,
    expert_load_view: Optional[Any] = None,
    record_enabled: Optional[Any] = None,
    logits_nonfinite_count: Optional[Any] = None,
    global_scale: Optional[Any] = None,
    x_scales: Optional[Any] = None,
    nonfinite_count: Optional[Any] = None,
    full_buffer: bool = False,
    stream: Optional[int] = None,
    enable_pdl: bool = False,
) -> str:
    """What route_and_stage would launch for these arguments, as text."""


def rmsnorm_and_stage(
    x: Any,
    residual: Optional[Any],
    weight: Any,
    topk_weights: Any,
    topk_ids: Any,
    x_fp8: Any,
    x_sf: Optional[Any],
    topk_idx_out: Any,
    topk_weights_out: Any,
    is_padding: Optional[Any] = None,
    shared_x_sf: Optional[Any] = None,
    shared_block_m: Optional[int] = None,
    hidden_quant: Any = ...,
    *,
    eps: float = 1e-06,
    y: Optional[Any] = None,
    residual_out: Optional[Any] = None,
    global_scale: Optional[Any] = None,
    x_scales: Optional[Any] = None,
    nonfinite_count: Optional[Any] = None,
    full_buffer: bool = False,
    routed_scaling_factor: Optional[float] = None,
    expert_scales: Optional[Any] = None,
    stream: Optional[int] = None,
    enable_pdl: bool = False,
) -> None:
    """RMSNorm (optional residual add) and stage the normalized rows in one call."""


def explain_rmsnorm_and_stage(
    x: Any,
    residual: Optional[Any],
    weight: Any,
    topk_weights: Any,
    topk_ids: Any,
    x_fp8: Any,
    x_sf: Optional[Any],
    topk_idx_out: Any,
    topk_weights_out: Any,
    is_padding: Optional[Any] = None,
    shared_x_sf: Optional[Any] = None,
    shared_block_m: Optional[int] = None,
    hidden_quant: Any = ...,
    *,
    eps: float = 1e-06,
    y: Optional[Any] = None,
    residual_out: Optional[Any] = None,
    global_scale: Optional[Any] = None,
    x_scales: Optional[Any] = None,
    nonfinite_count: Optional[Any] = None,
    full_buffer: bool = False,
    routed_scaling_factor: Optional[float] = None,
    expert_scales: Optional[Any] = None,
    stream: Optional[int] = None,
    enable_pdl: bool = False,
) -> str:
    """What rmsnorm_and_stage would launch for these arguments, as text."""
