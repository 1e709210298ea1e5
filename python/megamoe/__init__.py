"""megamoe: MegaMoE input staging for DeepSeek-V4-style MoE inference.

Quantizes hidden states (fp8 e4m3 with UE8M0 or fp32 group scales, MXFP8 e5m2, MXFP4,
NVFP4 static or per-token) and repacks the router's top-k ids/weights into the buffers
DeepGEMM's MegaMoE kernels read, in one call (CPU backend always; CUDA backend when built
with nvcc).
Bit-exact with DeepGEMM's ``per_token_cast_to_fp8`` / ``per_token_cast_to_fp4`` run by
PyTorch on the GPU. The fused DeepSeek-V4 router (``route``, ``route_and_stage``: router
logits to the top-k, and to the staged buffers in the same call). The RMSNorm producer
(``rmsnorm_and_stage``: residual add, RMSNorm and the staging of its rows in one call), the
mHC producer (``mhc_pre_and_stage``: DeepSeek-V4's hyper-connection pre step, RMSNorm and
staging; CPU backend) and the gate producer (``gate_route_and_stage``, ``gate_and_route``:
the router logits computed in the call from the gate weight in a fixed fp32 order, then
route_and_stage or route; CPU and CUDA backends). Drop-ins: vLLM's ``prepare_megamoe_inputs``, ``stage_megamoe_routing`` and
``dsv4_topk_prepare_megamoe``, DeepGEMM's ``mega_moe_pre_dispatch`` /
``mega_moe_pre_dispatch_sm90`` as SGLang calls them.

Works with PyTorch tensors (custom ops ``torch.ops.megamoe.prepare_inputs``,
``torch.ops.megamoe.stage_routing``, ``torch.ops.megamoe.route``,
``torch.ops.megamoe.route_and_stage``, ``torch.ops.megamoe.rmsnorm_and_stage``,
``torch.ops.megamoe.gate_route_and_stage``, ``torch.ops.megamoe.gate_and_route`` and
``torch.ops.megamoe.mhc_pre_and_stage``,
registered on import when torch is installed; torch.compile and CUDA graph capture safe),
NumPy arrays and any DLPack / buffer-protocol array. Importing megamoe never requires
torch, and with torch costs little more than ``import torch``.
"""

from __future__ import annotations

import importlib.util as _importlib_util

from . import _C
from ._C import (
    QuantElem,
    QuantScheme,
    Rounding,
    Scale2,
    ScaleType,
    UnsupportedError,
    check_scheme,
    has_cuda_backend,
)
from ._entry import (
    explain,
    explain_gate_and_route,
    explain_gate_route_and_stage,
    explain_mhc_pre_and_stage,
    explain_route,
    explain_rmsnorm_and_stage,
    explain_route_and_stage,
    explain_routing,
    gate_and_route,
    gate_route_and_stage,
    mhc_pre_and_stage,
    prepare_megamoe_inputs,
    rmsnorm_and_stage,
    route,
    route_and_stage,
    stage_megamoe_routing,
)
from ._ops import (
    OutputShapes,
    StagedInputs,
    TensorSpec,
    dequantize,
    dsv4_topk_prepare_megamoe,
    output_shapes,
    stage,
)
from ._scheme import (
    FP8_FP32_G32,
    FP8_FP32_G128,
    FP8_UE8M0_G128,
    MXFP4,
    MXFP4_RNE,
    MXFP8,
    MXFP8_E5M2,
    BF16,
    NVFP4_ONLINE,
    NVFP4_PER_TOKEN,
    NVFP4_STATIC,
    as_scheme,
)
from ._sglang import mega_moe_pre_dispatch, mega_moe_pre_dispatch_sm90

__version__: str = _C.version()


def version() -> str:
    """Version of the megamoe library, "MAJOR.MINOR.PATCH"."""
    return _C.version()


__all__ = [
    "prepare_megamoe_inputs",
    "stage_megamoe_routing",
    "route",
    "route_and_stage",
    "rmsnorm_and_stage",
    "gate_route_and_stage",
    "gate_and_route",
    "mhc_pre_and_stage",
    "dsv4_topk_prepare_megamoe",
    "mega_moe_pre_dispatch",
    "mega_moe_pre_dispatch_sm90",
    "stage",
    "dequantize",
    "output_shapes",
    "explain",
    "explain_routing",
    "explain_route",
    "explain_route_and_stage",
    "explain_rmsnorm_and_stage",
    "explain_gate_route_and_stage",
    "explain_gate_and_route",
    "explain_mhc_pre_and_stage",
    "StagedInputs",
    "OutputShapes",
    "TensorSpec",
    "QuantScheme",
    "QuantElem",
    "ScaleType",
    "Scale2",
    "Rounding",
    "MXFP8",
    "FP8_UE8M0_G128",
    "FP8_FP32_G128",
    "FP8_FP32_G32",
    "MXFP8_E5M2",
    "BF16",
    "MXFP4",
    "MXFP4_RNE",
    "NVFP4_STATIC",
    "NVFP4_PER_TOKEN",
    "NVFP4_ONLINE",
    "as_scheme",
    "check_scheme",
    "UnsupportedError",
    "has_cuda_backend",
    "version",
    "__version__",
]

# The CPU backend's thread count (megamoe::set_cpu_threads / cpu_threads), where the
# library has it; set_cpu_threads is the Python wrapper, which names an out-of-range count.
if hasattr(_C, "set_cpu_threads"):
    from ._C import cpu_threads  # noqa: F401
    from ._ops import set_cpu_threads  # noqa: F401

    __all__ += ["set_cpu_threads", "cpu_threads"]

# With torch installed, register the custom ops now so that code calling them directly (or
# tracing them) finds them. Without torch nothing is imported.
if _importlib_util.find_spec("torch") is not None:
    from . import _torch  # noqa: F401
