"""vLLM general plug-in: vLLM's MegaMoE staging functions rebound to megamoe's drop-ins.

vLLM calls every entry point of the group ``vllm.general_plugins`` in every process it
starts (API server, engine core, workers); this one (``megamoe =
megamoe.plugins.vllm:register``) does nothing unless ``MEGAMOE_VLLM_PLUGIN=1`` is set.
Then it rebinds, in vLLM's defining module and in every recorded module that did ``from
<defining module> import <name>``:

- ``prepare_megamoe_inputs`` -> :func:`megamoe.prepare_megamoe_inputs`
- ``stage_megamoe_routing`` -> :func:`megamoe.stage_megamoe_routing`
- ``dsv4_topk_prepare_megamoe`` -> :func:`megamoe.dsv4_topk_prepare_megamoe`

after checking that each of vLLM's functions has the signature recorded from vLLM's
sources (parameter names, order, kinds, defaults) and that megamoe's drop-in takes every
call that signature allows. A function this vLLM does not define is skipped (not every vLLM
has all three). On any difference, on a failed import, or with a megamoe built without its
CUDA backend (vLLM's MegaMoE path runs on CUDA tensors) nothing is rebound and one warning
names the function and the difference. docs/PLUGINS.md names the vLLM commit the
signatures come from.

Nothing of vLLM is imported at plug-in time: importing the defining module pulls in vLLM's
DeepSeek-V4 model package, which plug-in loading must not (it runs in every process, early).
A finder on ``sys.meta_path`` runs the rebinding right after vLLM itself imports the
defining module, before the ``from ... import`` statement that imported it completes, so the
importers bind megamoe's drop-ins from the start; where the module is already imported the
rebinding happens at once. Log lines go to the logger ``vllm.plugins.megamoe``, a child of
vLLM's ``vllm`` logger, so they appear with vLLM's own.
"""

from __future__ import annotations

import importlib
import importlib.abc
import logging
import sys
import types
from typing import Any, Callable, Dict, List, Optional, Tuple

from ._common import enabled, recorded, replacement_difference, signature_difference

__all__ = ["register", "activate", "deactivate", "ENV", "DEFINING_MODULE", "IMPORTERS", "SIGNATURES"]

ENV = "MEGAMOE_VLLM_PLUGIN"

# Where vLLM defines the three functions, and the modules that bind them with ``from
# DEFINING_MODULE import name`` at import time (recorded from vLLM's sources).
DEFINING_MODULE = "vllm.models.deepseek_v4.nvidia.ops.prepare_megamoe"
IMPORTERS: Tuple[str, ...] = (
    "vllm.models.deepseek_v4.nvidia.model",
    "vllm.models.kimi_k3.nvidia.model",
)

# vLLM's signatures as recorded from its sources; vLLM's functions must match them exactly.
SIGNATURES = {
    "prepare_megamoe_inputs": recorded(
        "hidden_states", "topk_weights", "topk_ids", "x_fp8", "x_sf", "topk_idx_out", "topk_weights_out",
        is_padding=None, shared_x_sf=None, shared_block_m=None,
    ),  # fmt: skip
    "stage_megamoe_routing": recorded("topk_weights", "topk_ids", "topk_idx_out", "topk_weights_out", is_padding=None),
    "dsv4_topk_prepare_megamoe": recorded(
        "hidden_states", "gating_output", "correction_bias", "routed_scaling_factor", "indices_dtype",
        "x_fp8", "x_sf", "topk_idx_out", "topk_weights_out",
        is_padding=None, shared_x_sf=None, shared_block_m=None,
    ),  # fmt: skip
}

logger = logging.getLogger("vllm.plugins.megamoe")

# (module name, attribute) -> vLLM's original object, for deactivate().
_originals: Dict[Tuple[str, str], Any] = {}


def register() -> None:
    """vLLM's entry point (group ``vllm.general_plugins``): :func:`activate` when
    ``MEGAMOE_VLLM_PLUGIN`` is on, nothing otherwise. Never raises (a plug-in that raises
    is only logged by vLLM, and the engine must start either way)."""
    if not enabled(ENV, logger):
        return
    try:
        activate()
    except Exception as e:  # noqa: BLE001 - vLLM must start whatever happens here
        logger.warning("megamoe: vLLM plug-in failed (%s: %s); vLLM left untouched", type(e).__name__, e)


def activate(*, import_now: bool = False) -> bool:
    """Rebind vLLM's functions to megamoe's drop-ins: at once where vLLM's defining module
    is imported (or ``import_now`` imports it here), else right after vLLM imports it.
    Returns True when the functions were rebound by this call. Safe to call again."""
    module = sys.modules.get(DEFINING_MODULE)
    if module is None and import_now:
        try:
            module = importlib.import_module(DEFINING_MODULE)
        except Exception as e:  # noqa: BLE001 - any failure leaves vLLM as it is
            _untouched(f"importing {DEFINING_MODULE} failed ({type(e).__name__}: {e})")
            return False
    if module is not None:
        _remove_finder()
        return _rebind(module)
    if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(DEFINING_MODULE, _rebind_after_import))
        logger.debug("megamoe: vLLM plug-in waits for %s to be imported", DEFINING_MODULE)
    return False


def deactivate() -> None:
    """Undo :func:`activate`: stop waiting for the import and give back vLLM's original
    functions wherever megamoe's drop-ins are still bound."""
    _remove_finder()
    import megamoe

    for (module_name, name), original in list(_originals.items()):
        module = sys.modules.get(module_name)
        if module is not None and getattr(module, name, None) is getattr(megamoe, name):
            setattr(module, name, original)
        del _originals[(module_name, name)]


# ---------------------------------------------------------------------------------------


def _untouched(reason: str) -> None:
    logger.warning("megamoe: vLLM plug-in left vLLM untouched: %s", reason)


def _rebind_after_import(module: types.ModuleType) -> None:
    try:
        _rebind(module)
    except Exception as e:  # noqa: BLE001 - never break vLLM's own import
        _untouched(f"{type(e).__name__}: {e}")


def _rebind(module: types.ModuleType) -> bool:
    """Check every function ``module`` defines against its recorded signature (and megamoe's
    drop-in against it), then rebind all of them or none."""
    try:
        import megamoe
    except Exception as e:  # noqa: BLE001 - a broken megamoe install leaves vLLM as it is
        _untouched(f"importing megamoe failed ({type(e).__name__}: {e})")
        return False
    present = {name: getattr(module, name) for name in SIGNATURES if hasattr(module, name)}
    if not present:
        _untouched(f"{module.__name__} defines none of {', '.join(SIGNATURES)}")
        return False
    todo = {name: fn for name, fn in present.items() if fn is not getattr(megamoe, name)}
    if not todo:
        return False  # rebound before
    problems = []
    for name, fn in todo.items():
        diff = signature_difference(fn, SIGNATURES[name])
        if diff is None:
            mine = replacement_difference(getattr(megamoe, name), SIGNATURES[name])
            diff = None if mine is None else f"megamoe's drop-in: {mine}"
        if diff is not None:
            problems.append(f"{name}: {diff}")
    if problems:
        _untouched("; ".join(problems) + " (the signatures recorded from vLLM's sources: docs/PLUGINS.md)")
        return False
    if not megamoe.has_cuda_backend():
        _untouched(f"megamoe {megamoe.__version__} was built without its CUDA backend")
        return False
    places: List[str] = []
    for name, original in todo.items():
        drop_in = getattr(megamoe, name)
        where = [module.__name__]
        _bind(module, name, original, drop_in)
        for importer_name in IMPORTERS:
            importer = sys.modules.get(importer_name)
            # Only a binding that is vLLM's very function is replaced: an importer that
            # wrapped or replaced it keeps its own object.
            if importer is not None and getattr(importer, name, None) is original:
                _bind(importer, name, original, drop_in)
                where.append(importer_name)
        places.append(f"{name} (in {', '.join(where)})")
    absent = [name for name in SIGNATURES if name not in present]
    logger.info(
        "megamoe %s: vLLM plug-in rebound %s to megamoe's drop-ins%s",
        megamoe.__version__,
        "; ".join(places),
        f"; not defined by this vLLM: {', '.join(absent)}" if absent else "",
    )
    return True


def _bind(module: types.ModuleType, name: str, original: Any, drop_in: Any) -> None:
    _originals.setdefault((module.__name__, name), original)
    setattr(module, name, drop_in)


def _remove_finder() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AfterImport)]


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds the module ``name`` with the other finders and wraps its loader, so that
    ``callback(module)`` runs right after the module body, inside the import that loads
    it. Removes itself once the module is loaded."""

    def __init__(self, name: str, callback: Callable[[types.ModuleType], None]) -> None:
        self.name = name
        self.callback = callback

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _CallbackLoader(spec.loader, self._loaded)
        return spec

    def _loaded(self, module: types.ModuleType) -> None:
        _remove_finder()
        self.callback(module)


class _CallbackLoader(importlib.abc.Loader):
    """``loader`` followed by a callback; the module keeps ``loader`` as its own (for
    ``importlib.reload``, ``inspect.getsource``, tracebacks)."""

    def __init__(self, loader: Any, callback: Callable[[types.ModuleType], None]) -> None:
        self._loader = loader
        self._callback = callback

    def create_module(self, spec: Any) -> Optional[types.ModuleType]:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        try:
            self._loader.exec_module(module)
        except BaseException as e:
            # vLLM's own import fails and raises as it would without the plug-in.
            _untouched(f"importing {module.__name__} failed ({type(e).__name__}: {e})")
            raise
        self._callback(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
