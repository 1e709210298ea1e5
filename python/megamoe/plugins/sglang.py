"""SGLang plug-in: a REPLACE hook on SGLang's MegaMoE pre-dispatch wrapper, staged by
megamoe.

SGLang calls every entry point of the group ``sglang.srt.plugins`` in every process
(``sglang.srt.plugins.load_plugins``) and then applies the hooks registered with its
``HookRegistry``. This one (``megamoe = megamoe.plugins.sglang:register``) does nothing
unless ``MEGAMOE_SGLANG_PLUGIN=1`` is set. Then it finds SGLang's ``mega_moe_pre_dispatch``
(the JIT kernel wrapper that SGLang's MegaMoE layer calls on its FP8 path; its module moved
between SGLang versions, :data:`LOCATIONS` lists the known homes, newest first), checks that
its signature is the one recorded from SGLang's sources (parameter names, order, kinds,
defaults) and registers :func:`mega_moe_pre_dispatch_jit` as its REPLACE hook. SGLang's
registry then rebinds the name in the defining module and in every module holding it from
``from ... import mega_moe_pre_dispatch``. On any difference or import failure, or with a
megamoe built without its CUDA backend, no hook is registered and one warning names the
function and the difference. docs/PLUGINS.md names the SGLang commits the signature comes
from.

:func:`mega_moe_pre_dispatch_jit` takes SGLang's wrapper's parameters (not DeepGEMM's, which
:func:`megamoe.mega_moe_pre_dispatch` takes): e4m3 values with UE8M0 scales over
``quant_group_size`` (32, 64 or 128) columns, amax floored at 1e-10 as SGLang's kernel does,
the rows of ``x`` staged into the first rows of the buffers and the top-k rows past them
set to -1 / 0 (megamoe's full-buffer mode). Log lines go to the logger
``sglang.srt.plugins.megamoe``.
"""

from __future__ import annotations

import importlib
import logging
import operator
import types
from typing import Any, Dict, Optional, Tuple

from ._common import enabled, recorded, replacement_difference, signature_difference

__all__ = ["register", "activate", "mega_moe_pre_dispatch_jit", "ENV", "LOCATIONS", "NAME", "SIGNATURE"]

ENV = "MEGAMOE_SGLANG_PLUGIN"

# Modules that define SGLang's wrapper, newest layout first; the first one that imports and
# has it is hooked.
LOCATIONS: Tuple[str, ...] = (
    "sglang.kernels.ops.attention.dsv4.moe",
    "sglang.kernels.ops.moe.dsv4",
    "sglang.jit_kernel.dsv4.moe",
)
NAME = "mega_moe_pre_dispatch"
# SGLang's signature as recorded from its sources (the same in every location above).
SIGNATURE = recorded(
    "x", "topk_idx", "topk_weights", "buf_x", "buf_x_sf", "buf_topk_idx", "buf_topk_weights", quant_group_size=32
)  # fmt: skip

logger = logging.getLogger("sglang.srt.plugins.megamoe")

_FLOOR = 1e-10  # SGLang's kernel floors each group's amax here
_schemes: Dict[int, Any] = {}  # quant_group_size -> QuantScheme, built once (torch.compile constants)


def _scheme(quant_group_size: Any) -> Any:
    try:
        G = operator.index(quant_group_size)
    except TypeError:
        raise TypeError(f"megamoe: quant_group_size: expected an int, got {type(quant_group_size).__name__}") from None
    scheme = _schemes.get(G)
    if scheme is None:
        if G not in (32, 64, 128) or isinstance(quant_group_size, bool):
            raise ValueError(f"megamoe: quant_group_size: expected 32, 64 or 128 (SGLang's kernel), got {quant_group_size!r}")
        from .._scheme import QuantScheme

        scheme = _schemes[G] = QuantScheme(group_k=G).with_amax_floor(_FLOOR)
    return scheme


def mega_moe_pre_dispatch_jit(
    x: Any,
    topk_idx: Any,
    topk_weights: Any,
    buf_x: Any,
    buf_x_sf: Any,
    buf_topk_idx: Any,
    buf_topk_weights: Any,
    quant_group_size: int = 32,
) -> None:
    """megamoe's drop-in for SGLang's ``mega_moe_pre_dispatch`` JIT wrapper (same
    parameters and defaults): rows ``0..T-1`` (T = ``x.shape[0]``) of ``buf_x`` (e4m3) and
    ``buf_x_sf`` (``[P, H/(4G)]`` int32, four UE8M0 bytes per word) hold ``x`` quantized
    over groups of ``quant_group_size`` columns with amax floored at 1e-10; rows
    ``0..T-1`` of ``buf_topk_idx`` / ``buf_topk_weights`` hold ``topk_idx`` widened to int64
    and ``topk_weights``, rows ``T..P-1`` become -1 / 0; other rows of ``buf_x`` /
    ``buf_x_sf`` are not touched. Accepts what :func:`megamoe.prepare_megamoe_inputs`
    accepts (a superset of the kernel's bf16 / int32 / fp32 contiguous inputs)."""
    from .._entry import prepare_megamoe_inputs

    prepare_megamoe_inputs(
        x, topk_weights, topk_idx, buf_x, buf_x_sf, buf_topk_idx, buf_topk_weights,
        hidden_quant=_scheme(quant_group_size), full_buffer=True,
    )  # fmt: skip


def register() -> None:
    """SGLang's entry point (group ``sglang.srt.plugins``): :func:`activate` when
    ``MEGAMOE_SGLANG_PLUGIN`` is on, nothing otherwise. Never raises (SGLang must start
    whatever happens here)."""
    if not enabled(ENV, logger):
        return
    try:
        activate()
    except Exception as e:  # noqa: BLE001
        logger.warning("megamoe: SGLang plug-in failed (%s: %s); SGLang left untouched", type(e).__name__, e)


def activate() -> bool:
    """Register the REPLACE hook after the checks (SGLang applies it once every plug-in has
    run). Returns True when the hook was registered."""
    try:
        import megamoe
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    except Exception as e:  # noqa: BLE001 - an SGLang without the hook registry, or a broken install
        _untouched(f"importing the hook registry failed ({type(e).__name__}: {e})")
        return False
    found = _locate()
    if found is None:
        return False
    location, target = found
    diff = signature_difference(target, SIGNATURE)
    if diff is None:
        mine = replacement_difference(mega_moe_pre_dispatch_jit, SIGNATURE)
        diff = None if mine is None else f"megamoe's drop-in: {mine}"
    if diff is not None:
        _untouched(f"{location}.{NAME}: {diff} (the signature recorded from SGLang's sources: docs/PLUGINS.md)")
        return False
    if not megamoe.has_cuda_backend():
        _untouched(f"megamoe {megamoe.__version__} was built without its CUDA backend")
        return False
    HookRegistry.register(f"{location}.{NAME}", mega_moe_pre_dispatch_jit, HookType.REPLACE)
    logger.info(
        "megamoe %s: SGLang plug-in registered a REPLACE hook on %s.%s "
        "(megamoe.plugins.sglang.mega_moe_pre_dispatch_jit); SGLang applies it with its other hooks",
        megamoe.__version__,
        location,
        NAME,
    )
    return True


def _untouched(reason: str) -> None:
    logger.warning("megamoe: SGLang plug-in left SGLang untouched: %s", reason)


def _locate() -> Optional[Tuple[str, Any]]:
    """(module name, function) of the first location that imports and defines NAME; None
    (after one warning) when none does or a location exists but fails to import."""
    for location in LOCATIONS:
        try:
            module: types.ModuleType = importlib.import_module(location)
        except ModuleNotFoundError as e:
            # This SGLang has another layout: try the next one. A missing dependency of an
            # existing module is a failure like any other.
            if e.name and (location == e.name or location.startswith(e.name + ".")):
                continue
            _untouched(f"importing {location} failed ({type(e).__name__}: {e})")
            return None
        except Exception as e:  # noqa: BLE001
            _untouched(f"importing {location} failed ({type(e).__name__}: {e})")
            return None
        if hasattr(module, NAME):
            return location, getattr(module, NAME)
    _untouched(f"no {NAME} found in {', '.join(LOCATIONS)}")
    return None
