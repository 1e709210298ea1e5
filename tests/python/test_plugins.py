"""Engine plug-ins (megamoe.plugins): the vLLM general plug-in and the SGLang REPLACE hook.

Against the real engines where they import (neither is installed in CI: those tests skip),
and always against stand-in modules built here at the recorded module paths: rebinding in
the defining module and every recorded importer when the opt-in variable is set, nothing
when it is unset, nothing (and one warning naming the function) on a signature difference or
an import failure, and the rebound names calling megamoe's drop-ins (NumPy arrays on the
CPU backend). Plus the entry points pyproject.toml declares.

Where the recorded signatures come from (read, not copied; docs/PLUGINS.md has the same):

- vLLM ``prepare_megamoe_inputs(hidden_states, topk_weights, topk_ids, x_fp8, x_sf,
  topk_idx_out, topk_weights_out, is_padding=None, shared_x_sf=None, shared_block_m=None)``:
  vllm-project/vllm main at 91a893de64722019ea2faf852e06cabe143b3490 (2026-08-20),
  vllm/models/deepseek_v4/nvidia/ops/prepare_megamoe.py. Importers (``from ... import
  prepare_megamoe_inputs``) at that commit: vllm/models/deepseek_v4/nvidia/model.py and
  vllm/models/kimi_k3/nvidia/model.py (git grep over vllm/).
- vLLM ``dsv4_topk_prepare_megamoe(hidden_states, gating_output, correction_bias,
  routed_scaling_factor, indices_dtype, x_fp8, x_sf, topk_idx_out, topk_weights_out,
  is_padding=None, shared_x_sf=None, shared_block_m=None)``: not defined on vLLM main at
  91a893de64722019ea2faf852e06cabe143b3490 (nor in any branch of the snapshot read); recorded
  from the DeepSeek-V4 variant of the same module (same path) in the public source index,
  whose commit the index does not give; it matches docs/ROUTER.md.
- vLLM ``stage_megamoe_routing(topk_weights, topk_ids, topk_idx_out, topk_weights_out,
  is_padding=None)``: not on vLLM main at 91a893de64722019ea2faf852e06cabe143b3490 either; its
  definition was not found in any source read. Recorded from its callers (vLLM's DeepSeek-V4.1
  tests in the index import it from the same module and pass four outputs positionally) and
  megamoe's ROUTING table. A vLLM whose definition differs is left untouched (the check's
  point).
- SGLang ``mega_moe_pre_dispatch(x, topk_idx, topk_weights, buf_x, buf_x_sf, buf_topk_idx,
  buf_topk_weights, quant_group_size=32)``: sgl-project/sglang main at
  30cb848d4b455a288a37cfeb6a45aff34f5634a6 (2026-08-11),
  python/sglang/kernels/ops/attention/dsv4/moe.py (re-exported by its package, imported by
  python/sglang/srt/layers/moe/mega_moe.py and, inside a function,
  python/sglang/srt/models/kimi_k3.py); the same signature at
  71fe649d68878f28e9e49e8a134f0f37c93dc67d in python/sglang/jit_kernel/dsv4/moe.py (the
  layout before #32045) and at 2332decfd53aef0be3084d8b2a84cce35e822dc1 in
  python/sglang/kernels/ops/moe/dsv4.py. HookRegistry / HookType.REPLACE and the entry point
  group: python/sglang/srt/plugins/{__init__,hook_registry}.py at
  30cb848d4b455a288a37cfeb6a45aff34f5634a6.
"""

from __future__ import annotations

import enum
import functools
import importlib
import importlib.util
import inspect
import logging
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import megamoe
import megamoe.plugins.sglang as sgl_plugin
import megamoe.plugins.vllm as vllm_plugin
from megamoe.plugins._common import recorded, replacement_difference, signature_difference

ROOT = Path(__file__).resolve().parents[2]
VLLM_NAMES = tuple(vllm_plugin.SIGNATURES)


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


class Records(logging.Handler):
    """The plug-in logger's records (attached to the logger itself: vLLM's ``vllm`` logger
    does not propagate to the root logger pytest watches)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def at(self, level: int) -> list:
        return [r.getMessage() for r in self.records if r.levelno == level]


def _attach(logger: logging.Logger):
    handler = Records()
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    return handler, lambda: (logger.removeHandler(handler), logger.setLevel(level))


def _hide(monkeypatch, top: str) -> None:
    """Take an engine's modules out of sys.modules for the test (monkeypatch restores them)."""
    for name in list(sys.modules):
        if name == top or name.startswith(top + "."):
            monkeypatch.delitem(sys.modules, name)


def _package(monkeypatch, name: str, path=()) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = list(path)
    monkeypatch.setitem(sys.modules, name, module)
    return module


def stand_in(name: str, params: str) -> types.FunctionType:
    """An engine function ``name(params)`` that fails if it is ever called (the plug-in must
    route calls to megamoe)."""
    namespace: dict = {}
    exec(f"def {name}({params}):\n    raise AssertionError('the engine kernel ran')\n", namespace)  # noqa: S102
    return namespace[name]


def params_of(sig: inspect.Signature) -> str:
    return str(sig)[1:-1]


# ---------------------------------------------------------------------------------------
# The signature check itself


def test_recorded_signatures_are_as_read():
    s = vllm_plugin.SIGNATURES
    assert params_of(s["prepare_megamoe_inputs"]) == (
        "hidden_states, topk_weights, topk_ids, x_fp8, x_sf, topk_idx_out, topk_weights_out, "
        "is_padding=None, shared_x_sf=None, shared_block_m=None"
    )
    assert params_of(s["stage_megamoe_routing"]) == "topk_weights, topk_ids, topk_idx_out, topk_weights_out, is_padding=None"
    assert params_of(s["dsv4_topk_prepare_megamoe"]) == (
        "hidden_states, gating_output, correction_bias, routed_scaling_factor, indices_dtype, x_fp8, x_sf, "
        "topk_idx_out, topk_weights_out, is_padding=None, shared_x_sf=None, shared_block_m=None"
    )
    assert params_of(sgl_plugin.SIGNATURE) == (
        "x, topk_idx, topk_weights, buf_x, buf_x_sf, buf_topk_idx, buf_topk_weights, quant_group_size=32"
    )
    assert vllm_plugin.DEFINING_MODULE == "vllm.models.deepseek_v4.nvidia.ops.prepare_megamoe"
    assert vllm_plugin.IMPORTERS == ("vllm.models.deepseek_v4.nvidia.model", "vllm.models.kimi_k3.nvidia.model")
    assert sgl_plugin.LOCATIONS[0] == "sglang.kernels.ops.attention.dsv4.moe"


@pytest.mark.parametrize("name", VLLM_NAMES)
def test_megamoe_drop_ins_take_the_recorded_calls(name):
    sig = vllm_plugin.SIGNATURES[name]
    assert replacement_difference(getattr(megamoe, name), sig) is None
    assert signature_difference(stand_in(name, params_of(sig)), sig) is None
    # megamoe's additions make its drop-ins differ from the recorded signatures where it has any
    assert (signature_difference(getattr(megamoe, name), sig) is None) == (name == "dsv4_topk_prepare_megamoe")


def test_sglang_drop_in_has_the_recorded_signature():
    assert signature_difference(sgl_plugin.mega_moe_pre_dispatch_jit, sgl_plugin.SIGNATURE) is None
    assert replacement_difference(sgl_plugin.mega_moe_pre_dispatch_jit, sgl_plugin.SIGNATURE) is None


def test_signature_difference_in_words():
    sig = recorded("a", "b", c=None, d=1)
    check = functools.partial(signature_difference, expected=sig)
    assert check(stand_in("f", "a, b, c=None, d=1")) is None
    assert check(stand_in("f", "a, b, x=None, d=1")) == "parameter 2 is named 'x', recorded 'c'"
    assert check(stand_in("f", "b, a, c=None, d=1")) == "parameter 'a' is at position 1, recorded at position 0"
    assert check(stand_in("f", "a, b, d=1")) == "parameter 'c' (position 2) is missing"
    assert check(stand_in("f", "a, b, c=None")) == "parameter 'd' (position 3) is missing"
    assert check(stand_in("f", "a, b, c=None, d=2")) == "parameter 'd' has default 2, recorded 1"
    assert check(stand_in("f", "a, b, c=None, d=True")) == "parameter 'd' has default True, recorded 1"
    assert check(stand_in("f", "a, b=0, c=None, d=1")) == "parameter 'b' has default 0, recorded none (required)"
    assert check(stand_in("f", "a, b, *, c=None, d=1")) == (
        "parameter 'c' is keyword-only, recorded positional or keyword"
    )
    assert check(stand_in("f", "a, b, c=None, d=1, e=0")) == "parameter 'e' (position 4) is not in the recorded signature"
    unreadable = stand_in("f", "a")
    unreadable.__signature__ = "not a signature"
    assert check(unreadable).startswith("its signature cannot be read")
    # megamoe's drop-in may add parameters with defaults, never required ones
    assert replacement_difference(stand_in("f", "a, b, c=None, d=1, *, e=0"), sig) is None
    assert replacement_difference(stand_in("f", "a, b, c=None, d=1, e=0"), sig) is None
    assert "requires 'e'" in replacement_difference(stand_in("f", "a, b, c=None, d=1, *, e"), sig)
    assert "does not take 'd'" in replacement_difference(stand_in("f", "a, b, c=None"), sig)


# ---------------------------------------------------------------------------------------
# vLLM: stand-in modules at the recorded paths

VLLM_PACKAGES = (
    "vllm", "vllm.models", "vllm.models.deepseek_v4", "vllm.models.deepseek_v4.nvidia",
    "vllm.models.deepseek_v4.nvidia.ops", "vllm.models.kimi_k3", "vllm.models.kimi_k3.nvidia",
)  # fmt: skip


class FakeVllm:
    """vLLM's defining module and its importers as stand-ins, each function with the
    recorded signature (or one changed by a test)."""

    def __init__(self, monkeypatch, names=VLLM_NAMES, params=None, define=True) -> None:
        _hide(monkeypatch, "vllm")
        for pkg in VLLM_PACKAGES:
            _package(monkeypatch, pkg)
        self.originals = {
            n: stand_in(n, (params or {}).get(n, params_of(vllm_plugin.SIGNATURES[n]))) for n in names
        }
        self.defining = types.ModuleType(vllm_plugin.DEFINING_MODULE)
        for n, fn in self.originals.items():
            fn.__module__ = vllm_plugin.DEFINING_MODULE
            setattr(self.defining, n, fn)
        if define:
            monkeypatch.setitem(sys.modules, vllm_plugin.DEFINING_MODULE, self.defining)
        self.importers = []
        for imp in vllm_plugin.IMPORTERS:  # ``from <defining module> import <names>``
            module = types.ModuleType(imp)
            for n, fn in self.originals.items():
                setattr(module, n, fn)
            monkeypatch.setitem(sys.modules, imp, module)
            self.importers.append(module)

    def modules(self):
        return [self.defining, *self.importers]

    def untouched(self) -> bool:
        return all(getattr(m, n) is fn for m in self.modules() for n, fn in self.originals.items())

    def rebound(self) -> bool:
        return all(getattr(m, n) is getattr(megamoe, n) for m in self.modules() for n in self.originals)


@pytest.fixture
def vllm_env(monkeypatch):
    """The plug-in on (MEGAMOE_VLLM_PLUGIN=1) with a megamoe that counts as CUDA-capable,
    its log records, and a clean state afterwards."""
    monkeypatch.setenv(vllm_plugin.ENV, "1")
    monkeypatch.setattr(megamoe, "has_cuda_backend", lambda: True)
    log, detach = _attach(vllm_plugin.logger)
    yield log
    vllm_plugin.deactivate()
    detach()


def finders():
    return [f for f in sys.meta_path if type(f).__name__ == "_AfterImport"]


def test_vllm_rebinds_in_the_defining_module_and_every_importer(monkeypatch, vllm_env):
    fake = FakeVllm(monkeypatch)
    assert fake.untouched()
    vllm_plugin.register()
    assert fake.rebound()
    assert vllm_env.at(logging.WARNING) == []
    (info,) = vllm_env.at(logging.INFO)
    assert f"megamoe {megamoe.__version__}: vLLM plug-in rebound" in info
    for n in VLLM_NAMES:
        assert n in info
    for imp in vllm_plugin.IMPORTERS:
        assert imp in info
    # again: nothing more to do, nothing more logged
    vllm_plugin.register()
    assert fake.rebound() and len(vllm_env.at(logging.INFO)) == 1
    # deactivate gives vLLM's functions back everywhere
    vllm_plugin.deactivate()
    assert fake.untouched()


def test_vllm_does_nothing_when_the_variable_is_unset(monkeypatch, vllm_env):
    monkeypatch.delenv(vllm_plugin.ENV)
    fake = FakeVllm(monkeypatch)
    vllm_plugin.register()
    assert fake.untouched() and finders() == [] and vllm_env.records == []
    _hide(monkeypatch, "vllm")  # nor does it wait for vLLM
    vllm_plugin.register()
    assert finders() == [] and vllm_env.records == []


@pytest.mark.parametrize("value,warns", [("0", False), ("false", False), ("", False), ("Off", False), ("no", False),
                                         ("maybe", True), ("2", True)])  # fmt: skip
def test_vllm_off_values(monkeypatch, vllm_env, value, warns):
    monkeypatch.setenv(vllm_plugin.ENV, value)
    fake = FakeVllm(monkeypatch)
    vllm_plugin.register()
    assert fake.untouched() and finders() == []
    assert len(vllm_env.at(logging.WARNING)) == warns
    if warns:
        assert vllm_plugin.ENV in vllm_env.at(logging.WARNING)[0]


@pytest.mark.parametrize("value", ["1", "true", "YES", " on "])
def test_vllm_on_values(monkeypatch, vllm_env, value):
    monkeypatch.setenv(vllm_plugin.ENV, value)
    fake = FakeVllm(monkeypatch)
    vllm_plugin.register()
    assert fake.rebound()


PREPARE_HEAD = "hidden_states, topk_weights, topk_ids, x_fp8, x_sf, topk_idx_out, topk_weights_out"
DSV4_HEAD = "hidden_states, gating_output, correction_bias, routed_scaling_factor, indices_dtype, x_fp8, x_sf, topk_idx_out, topk_weights_out"  # noqa: E501
MISMATCHES = [
    # (function, its parameters in a vLLM that changed them, words of the warning)
    ("prepare_megamoe_inputs", PREPARE_HEAD + ", padding=None, shared_x_sf=None, shared_block_m=None",
     "parameter 7 is named 'padding', recorded 'is_padding'"),
    ("prepare_megamoe_inputs",
     "hidden_states, topk_weights, topk_ids, x_sf, x_fp8, topk_idx_out, topk_weights_out, is_padding=None, shared_x_sf=None, shared_block_m=None",  # noqa: E501
     "parameter 'x_fp8' is at position 4, recorded at position 3"),
    ("prepare_megamoe_inputs", PREPARE_HEAD + ", is_padding=None, shared_x_sf=None",
     "parameter 'shared_block_m' (position 9) is missing"),
    ("prepare_megamoe_inputs", PREPARE_HEAD + ", is_padding=None, shared_x_sf=None, shared_block_m=0",
     "parameter 'shared_block_m' has default 0, recorded None"),
    ("prepare_megamoe_inputs", PREPARE_HEAD + ", is_padding=None, shared_x_sf=None, shared_block_m=None, hidden_quant=None",  # noqa: E501
     "parameter 'hidden_quant' (position 10) is not in the recorded signature"),
    ("prepare_megamoe_inputs", PREPARE_HEAD + ", *, is_padding=None, shared_x_sf=None, shared_block_m=None",
     "parameter 'is_padding' is keyword-only"),
    ("stage_megamoe_routing", "topk_weights, topk_ids, topk_idx_out, topk_weights_out",
     "parameter 'is_padding' (position 4) is missing"),
    ("stage_megamoe_routing", "topk_weights, ids, topk_idx_out, topk_weights_out, is_padding=None",
     "parameter 1 is named 'ids', recorded 'topk_ids'"),
    ("dsv4_topk_prepare_megamoe",
     "hidden_states, gating_output, correction_bias, routed_scaling_factor=1.0, indices_dtype=None, x_fp8=None, "
     "x_sf=None, topk_idx_out=None, topk_weights_out=None, is_padding=None, shared_x_sf=None, shared_block_m=None",
     "parameter 'routed_scaling_factor' has default 1.0, recorded none (required)"),
    ("dsv4_topk_prepare_megamoe", DSV4_HEAD + ", is_padding=None, shared_block_m=None, shared_x_sf=None",
     "parameter 'shared_x_sf' is at position 11, recorded at position 10"),
]  # fmt: skip


@pytest.mark.parametrize("name,params,words", MISMATCHES)
def test_vllm_signature_mismatch_leaves_everything_untouched(monkeypatch, vllm_env, name, params, words):
    fake = FakeVllm(monkeypatch, params={name: params})
    vllm_plugin.register()
    assert fake.untouched()  # not one of the three functions, in no module
    (warning,) = vllm_env.at(logging.WARNING)
    assert vllm_env.at(logging.INFO) == []
    assert f"{name}: {words}" in warning
    assert "left vLLM untouched" in warning and "docs/PLUGINS.md" in warning


def test_vllm_megamoe_drop_in_must_take_the_recorded_call(monkeypatch, vllm_env):
    fake = FakeVllm(monkeypatch)
    monkeypatch.setattr(megamoe, "stage_megamoe_routing", stand_in("stage_megamoe_routing", "topk_weights, topk_ids"))
    vllm_plugin.register()
    assert fake.untouched()
    (warning,) = vllm_env.at(logging.WARNING)
    assert "stage_megamoe_routing: megamoe's drop-in: it does not take 'topk_idx_out'" in warning


def test_vllm_import_failure_leaves_vllm_untouched(monkeypatch, vllm_env):
    fake = FakeVllm(monkeypatch, define=False)  # the importers exist, the defining module cannot be imported
    assert vllm_plugin.activate(import_now=True) is False
    assert fake.untouched()
    (warning,) = vllm_env.at(logging.WARNING)
    assert f"importing {vllm_plugin.DEFINING_MODULE} failed (ModuleNotFoundError" in warning


def test_vllm_megamoe_import_failure_leaves_vllm_untouched(monkeypatch, vllm_env):
    fake = FakeVllm(monkeypatch)
    monkeypatch.setitem(sys.modules, "megamoe", None)  # `import megamoe` raises
    vllm_plugin.register()
    monkeypatch.setitem(sys.modules, "megamoe", megamoe)
    assert fake.untouched()
    (warning,) = vllm_env.at(logging.WARNING)
    assert "importing megamoe failed" in warning


def test_vllm_only_what_this_vllm_defines(monkeypatch, vllm_env):
    # vLLM main as read defines prepare_megamoe_inputs only
    fake = FakeVllm(monkeypatch, names=("prepare_megamoe_inputs",))
    vllm_plugin.register()
    assert fake.rebound()
    assert not hasattr(fake.defining, "stage_megamoe_routing")
    assert vllm_env.at(logging.WARNING) == []
    (info,) = vllm_env.at(logging.INFO)
    assert "not defined by this vLLM: stage_megamoe_routing, dsv4_topk_prepare_megamoe" in info


def test_vllm_defining_none_warns(monkeypatch, vllm_env):
    FakeVllm(monkeypatch, names=())
    vllm_plugin.register()
    (warning,) = vllm_env.at(logging.WARNING)
    assert "defines none of prepare_megamoe_inputs, stage_megamoe_routing, dsv4_topk_prepare_megamoe" in warning


def test_vllm_needs_megamoe_cuda_backend(monkeypatch, vllm_env):
    fake = FakeVllm(monkeypatch)
    monkeypatch.setattr(megamoe, "has_cuda_backend", lambda: False)
    vllm_plugin.register()
    assert fake.untouched()
    (warning,) = vllm_env.at(logging.WARNING)
    assert "built without its CUDA backend" in warning


def test_vllm_importer_with_its_own_binding_keeps_it(monkeypatch, vllm_env):
    fake = FakeVllm(monkeypatch)
    own = stand_in("prepare_megamoe_inputs", params_of(vllm_plugin.SIGNATURES["prepare_megamoe_inputs"]))
    fake.importers[1].prepare_megamoe_inputs = own
    vllm_plugin.register()
    assert fake.defining.prepare_megamoe_inputs is megamoe.prepare_megamoe_inputs
    assert fake.importers[0].prepare_megamoe_inputs is megamoe.prepare_megamoe_inputs
    assert fake.importers[1].prepare_megamoe_inputs is own


def test_vllm_rebound_names_call_megamoe(monkeypatch, vllm_env):
    """Calls through an importer's rebound names stage exactly what megamoe's drop-ins do
    (NumPy arrays, CPU backend): the stand-ins would raise if they ran."""
    fake = FakeVllm(monkeypatch)
    vllm_plugin.register()
    model = fake.importers[0]
    rng = np.random.default_rng(7)
    T, H, K, E = 5, 256, 6, 64
    h = rng.standard_normal((T, H)).astype(np.float32)
    w = rng.random((T, K)).astype(np.float32)
    ids = rng.integers(0, E, (T, K)).astype(np.int32)
    pad = np.array([0, 1, 0, 0, 1], bool)

    def outs():
        return [np.zeros((T, H), np.uint8), np.zeros((T, H // 128), np.int32), np.zeros((T, K), np.int64),
                np.zeros((T, K), np.float32)]  # fmt: skip

    a, b = outs(), outs()
    model.prepare_megamoe_inputs(h, w, ids, *a, pad)
    megamoe.prepare_megamoe_inputs(h, w, ids, *b, is_padding=pad)
    for x, y in zip(a, b):
        assert np.array_equal(x.view(np.uint8), y.view(np.uint8))
    assert np.array_equal(a[2][~pad], ids[~pad]) and np.all(a[2][pad] == -1) and a[0].any()

    a, b = outs(), outs()
    model.stage_megamoe_routing(w, ids, a[2], a[3], pad)
    megamoe.stage_megamoe_routing(w, ids, b[2], b[3], is_padding=pad)
    assert np.array_equal(a[2], b[2]) and np.array_equal(a[3].view(np.uint32), b[3].view(np.uint32))
    assert not a[0].any()  # routing only

    logits = rng.standard_normal((T, E)).astype(np.float32)
    bias = (rng.standard_normal(E) * 0.3).astype(np.float32)
    a, b = outs(), outs()
    wa, ia = model.dsv4_topk_prepare_megamoe(h, logits, bias, 1.5, np.int32, *a, pad)
    wb, ib = megamoe.dsv4_topk_prepare_megamoe(h, logits, bias, 1.5, np.int32, *b, pad)
    assert ia.dtype == np.int32 and ia.shape == (T, K)
    assert np.array_equal(ia, ib) and np.array_equal(wa.view(np.uint32), wb.view(np.uint32))
    for x, y in zip(a, b):
        assert np.array_equal(x.view(np.uint8), y.view(np.uint8))


# vLLM's import, for real: a package on disk at the recorded paths, imported after the plug-in
# was registered (as vLLM imports its model after loading its plug-ins).

PREPARE_MEGAMOE_PY = "\n".join(
    f"def {n}({params_of(sig)}):\n    raise AssertionError('the engine kernel ran')\n"
    for n, sig in vllm_plugin.SIGNATURES.items()
)
MODEL_PY = (
    "from vllm.models.deepseek_v4.nvidia.ops.prepare_megamoe import (\n"
    "    dsv4_topk_prepare_megamoe, prepare_megamoe_inputs, stage_megamoe_routing)\n"
    "SEEN_AT_IMPORT = prepare_megamoe_inputs\n"
)


@pytest.fixture
def vllm_on_disk(monkeypatch, tmp_path):
    if "vllm" in sys.modules:
        pytest.skip("a vLLM is imported in this process")

    def write(prepare_megamoe_py: str) -> None:
        files = {f"{p.replace('.', '/')}/__init__.py": "" for p in VLLM_PACKAGES}
        files["vllm/models/deepseek_v4/nvidia/ops/prepare_megamoe.py"] = prepare_megamoe_py
        files["vllm/models/deepseek_v4/nvidia/model.py"] = MODEL_PY
        files["vllm/models/kimi_k3/nvidia/model.py"] = MODEL_PY
        for rel, text in files.items():
            path = tmp_path / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)

    monkeypatch.syspath_prepend(str(tmp_path))
    yield write
    for name in list(sys.modules):
        if name == "vllm" or name.startswith("vllm."):
            del sys.modules[name]


def test_vllm_waits_for_vllms_own_import(vllm_env, vllm_on_disk):
    vllm_on_disk(PREPARE_MEGAMOE_PY)
    vllm_plugin.register()
    assert "vllm" not in sys.modules  # the plug-in imports nothing of vLLM
    assert len(finders()) == 1
    model = importlib.import_module("vllm.models.deepseek_v4.nvidia.model")
    kimi = importlib.import_module("vllm.models.kimi_k3.nvidia.model")
    defining = sys.modules[vllm_plugin.DEFINING_MODULE]
    for module in (defining, model, kimi):
        for n in VLLM_NAMES:
            assert getattr(module, n) is getattr(megamoe, n), (module.__name__, n)
    assert model.SEEN_AT_IMPORT is megamoe.prepare_megamoe_inputs  # bound so from the start
    assert finders() == []
    assert defining.__loader__.__class__.__name__ != "_CallbackLoader"
    assert len(vllm_env.at(logging.INFO)) == 1 and vllm_env.at(logging.WARNING) == []


def test_vllm_failing_import_is_vllms_error_and_a_warning(vllm_env, vllm_on_disk):
    vllm_on_disk("raise ImportError('triton is missing')\n")
    vllm_plugin.register()
    with pytest.raises(ImportError, match="triton is missing"):
        importlib.import_module("vllm.models.deepseek_v4.nvidia.model")
    (warning,) = vllm_env.at(logging.WARNING)
    assert f"importing {vllm_plugin.DEFINING_MODULE} failed (ImportError: triton is missing)" in warning
    assert vllm_env.at(logging.INFO) == []


def test_vllm_mismatch_on_import_leaves_the_importers_with_vllms_functions(vllm_env, vllm_on_disk):
    vllm_on_disk(PREPARE_MEGAMOE_PY.replace("shared_block_m=None", "shared_block_m=0", 1))
    vllm_plugin.register()
    model = importlib.import_module("vllm.models.deepseek_v4.nvidia.model")
    assert model.prepare_megamoe_inputs is not megamoe.prepare_megamoe_inputs
    assert model.stage_megamoe_routing is not megamoe.stage_megamoe_routing
    (warning,) = vllm_env.at(logging.WARNING)
    assert "prepare_megamoe_inputs: parameter 'shared_block_m' has default 0, recorded None" in warning


# ---------------------------------------------------------------------------------------
# SGLang: stand-in modules, and a stand-in HookRegistry that applies REPLACE hooks as
# SGLang's does (rebinds the target and every module attribute bound to the original)


class HookType(enum.Enum):
    BEFORE = "before"
    AFTER = "after"
    AROUND = "around"
    REPLACE = "replace"


class HookRegistry:
    hooks: list = []

    @classmethod
    def register(cls, target, hook, hook_type=HookType.AFTER):
        cls.hooks.append((target, hook, hook_type))

    @classmethod
    def apply_hooks(cls):
        for target, hook, hook_type in cls.hooks:
            assert hook_type is HookType.REPLACE
            owner_name, attr = target.rsplit(".", 1)
            original = getattr(sys.modules[owner_name], attr)
            replaced = cls._replace(original, hook)
            for module in list(sys.modules.values()):
                if isinstance(module, types.ModuleType) and getattr(module, attr, None) is original:
                    setattr(module, attr, replaced)

    @staticmethod
    def _replace(original, hook):
        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            return hook(*args, **kwargs)

        return wrapper


SGLANG_PACKAGES = (
    "sglang", "sglang.srt", "sglang.srt.plugins", "sglang.srt.layers", "sglang.srt.layers.moe",
    "sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.attention", "sglang.jit_kernel",
)  # fmt: skip
SGLANG_TARGET = "sglang.kernels.ops.attention.dsv4.moe.mega_moe_pre_dispatch"


class FakeSglang:
    def __init__(self, monkeypatch, params=None, location=sgl_plugin.LOCATIONS[0], registry=True, dsv4_path=()):
        _hide(monkeypatch, "sglang")
        for pkg in SGLANG_PACKAGES:
            _package(monkeypatch, pkg)
        if registry:
            hook_registry = types.ModuleType("sglang.srt.plugins.hook_registry")
            hook_registry.HookRegistry, hook_registry.HookType = HookRegistry, HookType
            monkeypatch.setitem(sys.modules, hook_registry.__name__, hook_registry)
        monkeypatch.setattr(HookRegistry, "hooks", [])
        self.original = stand_in("mega_moe_pre_dispatch", params or params_of(sgl_plugin.SIGNATURE))
        package_name = location.rsplit(".", 1)[0]
        self.package = _package(monkeypatch, package_name, dsv4_path)  # re-exports the wrapper
        self.package.mega_moe_pre_dispatch = self.original
        self.defining = None
        if not dsv4_path:
            self.defining = types.ModuleType(location)
            self.defining.mega_moe_pre_dispatch = self.original
            monkeypatch.setitem(sys.modules, location, self.defining)
        # sglang/srt/layers/moe/mega_moe.py: ``from <package> import mega_moe_pre_dispatch``
        self.layer = types.ModuleType("sglang.srt.layers.moe.mega_moe")
        self.layer.mega_moe_pre_dispatch = self.original
        monkeypatch.setitem(sys.modules, self.layer.__name__, self.layer)

    def modules(self):
        return [m for m in (self.defining, self.package, self.layer) if m is not None]

    def untouched(self) -> bool:
        return HookRegistry.hooks == [] and all(m.mega_moe_pre_dispatch is self.original for m in self.modules())


@pytest.fixture
def sglang_env(monkeypatch):
    monkeypatch.setenv(sgl_plugin.ENV, "1")
    monkeypatch.setattr(megamoe, "has_cuda_backend", lambda: True)
    log, detach = _attach(sgl_plugin.logger)
    yield log
    detach()


def sglang_call_data(rng, T=5, P=8, H=256, K=6, G=32):
    x = rng.standard_normal((T, H)).astype(np.float32)
    idx = rng.integers(0, 64, (T, K)).astype(np.int32)
    w = rng.random((T, K)).astype(np.float32)

    def bufs():
        return [np.full((P, H), 0xA5, np.uint8), np.full((P, H // (4 * G)), 0x5A5A5A5A, np.int32),
                np.full((P, K), 0x4242, np.int64), np.full((P, K), np.nan, np.float32)]  # fmt: skip

    return x, idx, w, bufs


def test_sglang_registers_a_replace_hook_that_stages_with_megamoe(monkeypatch, sglang_env):
    fake = FakeSglang(monkeypatch)
    sgl_plugin.register()
    assert HookRegistry.hooks == [(SGLANG_TARGET, sgl_plugin.mega_moe_pre_dispatch_jit, HookType.REPLACE)]
    assert sglang_env.at(logging.WARNING) == []
    (info,) = sglang_env.at(logging.INFO)
    assert f"megamoe {megamoe.__version__}: SGLang plug-in registered a REPLACE hook on {SGLANG_TARGET}" in info
    HookRegistry.apply_hooks()  # what SGLang's load_plugins() does after the plug-ins ran
    for m in fake.modules():
        assert m.mega_moe_pre_dispatch is not fake.original
        assert m.mega_moe_pre_dispatch.__wrapped__ is fake.original
    rng = np.random.default_rng(3)
    x, idx, w, bufs = sglang_call_data(rng)
    T = x.shape[0]
    a, b = bufs(), bufs()
    fake.layer.mega_moe_pre_dispatch(x, idx, w, *a)  # the stand-in would raise
    megamoe.prepare_megamoe_inputs(x, w, idx, *b, hidden_quant=megamoe.MXFP8.with_amax_floor(1e-10), full_buffer=True)
    for u, v in zip(a, b):
        assert np.array_equal(u.view(np.uint8), v.view(np.uint8))
    assert np.array_equal(a[2][:T], idx) and np.all(a[2][T:] == -1) and np.all(a[3][T:] == 0)
    assert np.all(a[0][T:] == 0xA5) and np.all(a[1][T:] == 0x5A5A5A5A)  # rows past the tokens untouched


@pytest.mark.parametrize("G", [64, 128])
def test_sglang_drop_in_group_sizes(G):
    rng = np.random.default_rng(G)
    x, idx, w, bufs = sglang_call_data(rng, H=512, G=G)
    a, b = bufs(), bufs()
    sgl_plugin.mega_moe_pre_dispatch_jit(x, idx, w, *a, quant_group_size=G)
    scheme = megamoe.QuantScheme(group_k=G).with_amax_floor(1e-10)
    megamoe.prepare_megamoe_inputs(x, w, idx, *b, hidden_quant=scheme, full_buffer=True)
    for u, v in zip(a, b):
        assert np.array_equal(u.view(np.uint8), v.view(np.uint8))
    with pytest.raises(ValueError, match="quant_group_size: expected 32, 64 or 128"):
        sgl_plugin.mega_moe_pre_dispatch_jit(x, idx, w, *bufs(), quant_group_size=16)
    with pytest.raises(ValueError, match="quant_group_size"):
        sgl_plugin.mega_moe_pre_dispatch_jit(x, idx, w, *bufs(), quant_group_size=True)
    with pytest.raises(TypeError, match="quant_group_size: expected an int"):
        sgl_plugin.mega_moe_pre_dispatch_jit(x, idx, w, *bufs(), quant_group_size="32")


def test_sglang_does_nothing_when_the_variable_is_unset(monkeypatch, sglang_env):
    monkeypatch.delenv(sgl_plugin.ENV)
    fake = FakeSglang(monkeypatch)
    sgl_plugin.register()
    assert fake.untouched() and sglang_env.records == []
    monkeypatch.setenv(sgl_plugin.ENV, "0")
    sgl_plugin.register()
    assert fake.untouched() and sglang_env.records == []


SGLANG_HEAD = "x, topk_idx, topk_weights, buf_x, buf_x_sf, buf_topk_idx, buf_topk_weights"
SGLANG_MISMATCHES = [
    (SGLANG_HEAD + ", group_size=32", "parameter 7 is named 'group_size', recorded 'quant_group_size'"),
    (SGLANG_HEAD + ", quant_group_size=128", "parameter 'quant_group_size' has default 128, recorded 32"),
    (SGLANG_HEAD, "parameter 'quant_group_size' (position 7) is missing"),
    # the layout with the shared expert's scales (python/README-python.md names it)
    (SGLANG_HEAD + ", quant_group_size=32, shared_x_sf=None, shared_block_m=0",
     "parameter 'shared_x_sf' (position 8) is not in the recorded signature"),
    # DeepGEMM's API (num_tokens, group_size, mma_type): megamoe.mega_moe_pre_dispatch's
    (SGLANG_HEAD + ", num_tokens, group_size=32, mma_type='fp8xfp4'", "parameter 7 is named 'num_tokens'"),
    ("x, topk_weights, topk_idx, buf_x, buf_x_sf, buf_topk_idx, buf_topk_weights, quant_group_size=32",
     "parameter 'topk_idx' is at position 2, recorded at position 1"),
]  # fmt: skip


@pytest.mark.parametrize("params,words", SGLANG_MISMATCHES)
def test_sglang_signature_mismatch_registers_nothing(monkeypatch, sglang_env, params, words):
    fake = FakeSglang(monkeypatch, params=params)
    sgl_plugin.register()
    assert fake.untouched()
    (warning,) = sglang_env.at(logging.WARNING)
    assert f"{SGLANG_TARGET}: {words}" in warning and "left SGLang untouched" in warning
    assert sglang_env.at(logging.INFO) == []


def test_sglang_without_hook_registry(monkeypatch, sglang_env):
    fake = FakeSglang(monkeypatch, registry=False)
    monkeypatch.setitem(sys.modules, "sglang.srt.plugins.hook_registry", None)
    sgl_plugin.register()
    assert fake.untouched()
    (warning,) = sglang_env.at(logging.WARNING)
    assert "importing the hook registry failed (ModuleNotFoundError" in warning


def test_sglang_wrapper_module_that_fails_to_import(monkeypatch, sglang_env, tmp_path):
    (tmp_path / "moe.py").write_text("raise ImportError('tvm_ffi is missing')\n")
    fake = FakeSglang(monkeypatch, dsv4_path=[str(tmp_path)])
    monkeypatch.delitem(sys.modules, sgl_plugin.LOCATIONS[0], raising=False)
    sgl_plugin.register()
    assert fake.untouched()
    (warning,) = sglang_env.at(logging.WARNING)
    assert f"importing {sgl_plugin.LOCATIONS[0]} failed (ImportError: tvm_ffi is missing)" in warning


def test_sglang_without_the_wrapper(monkeypatch, sglang_env):
    fake = FakeSglang(monkeypatch)
    monkeypatch.setitem(sys.modules, sgl_plugin.LOCATIONS[0], None)  # this SGLang has no such module
    sgl_plugin.register()
    assert HookRegistry.hooks == []
    (warning,) = sglang_env.at(logging.WARNING)
    assert "no mega_moe_pre_dispatch found in " + ", ".join(sgl_plugin.LOCATIONS) in warning
    assert fake.layer.mega_moe_pre_dispatch is fake.original


def test_sglang_older_layout(monkeypatch, sglang_env):
    FakeSglang(monkeypatch, location="sglang.jit_kernel.dsv4.moe")
    sgl_plugin.register()
    assert HookRegistry.hooks == [
        ("sglang.jit_kernel.dsv4.moe.mega_moe_pre_dispatch", sgl_plugin.mega_moe_pre_dispatch_jit, HookType.REPLACE)
    ]


def test_sglang_needs_megamoe_cuda_backend(monkeypatch, sglang_env):
    fake = FakeSglang(monkeypatch)
    monkeypatch.setattr(megamoe, "has_cuda_backend", lambda: False)
    sgl_plugin.register()
    assert fake.untouched()
    (warning,) = sglang_env.at(logging.WARNING)
    assert "built without its CUDA backend" in warning


# ---------------------------------------------------------------------------------------
# The real engines, where installed


@pytest.mark.skipif(not _installed("vllm"), reason="vLLM is not installed")
def test_real_vllm_matches_the_recorded_signatures(monkeypatch):
    try:
        module = importlib.import_module(vllm_plugin.DEFINING_MODULE)
    except Exception as e:  # noqa: BLE001 - e.g. a vLLM without DeepSeek-V4 or without CUDA
        pytest.skip(f"{vllm_plugin.DEFINING_MODULE} does not import here: {type(e).__name__}: {e}")
    present = [n for n in VLLM_NAMES if hasattr(module, n)]
    assert present, f"{vllm_plugin.DEFINING_MODULE} defines none of {VLLM_NAMES}"
    for n in present:
        assert signature_difference(getattr(module, n), vllm_plugin.SIGNATURES[n]) is None, n
    monkeypatch.setattr(megamoe, "has_cuda_backend", lambda: True)
    try:
        assert vllm_plugin.activate() is True
        for n in present:
            assert getattr(module, n) is getattr(megamoe, n)
            for imp in vllm_plugin.IMPORTERS:
                if imp in sys.modules and hasattr(sys.modules[imp], n):
                    assert getattr(sys.modules[imp], n) is getattr(megamoe, n), (imp, n)
    finally:
        vllm_plugin.deactivate()


@pytest.mark.skipif(not _installed("sglang"), reason="SGLang is not installed")
def test_real_sglang_matches_the_recorded_signature():
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry as Registry
        from sglang.srt.plugins.hook_registry import HookType as Types
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"this SGLang has no hook registry: {type(e).__name__}: {e}")
    assert callable(Registry.register) and Types.REPLACE
    found = sgl_plugin._locate()
    if found is None:
        pytest.skip("no mega_moe_pre_dispatch in this SGLang (or it does not import here)")
    location, target = found
    assert signature_difference(target, sgl_plugin.SIGNATURE) is None, location


# ---------------------------------------------------------------------------------------
# The entry points


def _pyproject() -> dict:
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    "group,value",
    [("vllm.general_plugins", "megamoe.plugins.vllm:register"), ("sglang.srt.plugins", "megamoe.plugins.sglang:register")],
)
def test_pyproject_declares_the_entry_points(monkeypatch, group, value):
    assert _pyproject()["project"]["entry-points"][group] == {"megamoe": value}
    module_name, _, attr = value.partition(":")
    fn = getattr(importlib.import_module(module_name), attr)
    assert callable(fn) and inspect.signature(fn).parameters == {}  # engines call it with no arguments
    for env in (vllm_plugin.ENV, sgl_plugin.ENV):
        monkeypatch.delenv(env, raising=False)
    before = list(sys.meta_path)
    assert fn() is None  # off: nothing happens
    assert sys.meta_path == before


def test_plugins_doc_names_what_the_tests_record():
    doc = (ROOT / "docs" / "PLUGINS.md").read_text(encoding="utf-8")
    for words in ("MEGAMOE_VLLM_PLUGIN=1", "MEGAMOE_SGLANG_PLUGIN=1", "91a893de64722019ea2faf852e06cabe143b3490",
                  "30cb848d4b455a288a37cfeb6a45aff34f5634a6", vllm_plugin.DEFINING_MODULE, *vllm_plugin.IMPORTERS,
                  *sgl_plugin.LOCATIONS, "vllm.plugins.megamoe", "sglang.srt.plugins.megamoe"):  # fmt: skip
        assert words in doc, words
