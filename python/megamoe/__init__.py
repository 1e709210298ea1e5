"""megamoe: MegaMoE input staging for DeepSeek-V4-style MoE inference.

Quantizes hidden states to fp8 e4m3 with UE8M0 or fp32 group scales and repacks the
router's top-k ids/weights into the buffers DeepGEMM's MegaMoE kernels read, in one call
(CPU backend always; CUDA backend when built with nvcc). Bit-exact with DeepGEMM's
``per_token_cast_to_fp8`` run by PyTorch on the GPU.

Works with PyTorch tensors (custom op ``torch.ops.megamoe.prepare_inputs``, registered on
import when torch is installed; torch.compile and CUDA graph capture safe), NumPy arrays
and any DLPack / buffer-protocol array. Importing megamoe never requires torch.
"""

from __future__ import annotations

import importlib.util as _importlib_util

from . import _C
from ._C import QuantElem, QuantScheme, ScaleType, check_scheme, has_cuda_backend
from ._ops import StagedInputs, dequantize, prepare_megamoe_inputs, stage
from ._scheme import FP8_FP32_G32, FP8_FP32_G128, FP8_UE8M0_G128, MXFP8, as_scheme

__version__: str = _C.version()


def version() -> str:
    """Version of the megamoe library, "MAJOR.MINOR.PATCH"."""
    return _C.version()


__all__ = [
    "prepare_megamoe_inputs",
    "stage",
    "dequantize",
    "StagedInputs",
    "QuantScheme",
    "QuantElem",
    "ScaleType",
    "MXFP8",
    "FP8_UE8M0_G128",
    "FP8_FP32_G128",
    "FP8_FP32_G32",
    "as_scheme",
    "check_scheme",
    "has_cuda_backend",
    "version",
    "__version__",
]

# With torch installed, register torch.ops.megamoe.prepare_inputs now so that code calling
# the op directly (or tracing it) finds it. Without torch nothing is imported.
if _importlib_util.find_spec("torch") is not None:
    from . import _torch  # noqa: F401
