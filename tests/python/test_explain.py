"""megamoe.explain_routing / explain_route / explain_route_and_stage: the plan of
stage_megamoe_routing / route / route_and_stage as text (megamoe::explain of RoutingArgs,
RouterArgs and RouterArgs + StageArgs), generated from the same argument tables.

- each takes exactly its call's arguments (inspect) and is exported;
- the CPU backend's text for valid calls, which write nothing;
- an invalid argument raises the call's own error (type and message), nothing written;
- a call that would return at once (T == 0 outside full-buffer mode) gives "nothing to do"
  without the native module; the native functions give the same answer; full-buffer mode
  is explained by the library;
- torch tensors (skipped without torch) give the NumPy arrays' text and errors.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import megamoe
from megamoe import _C, _ops
from megamoe._signature import REQUIRED, ROUTE, ROUTE_AND_STAGE, ROUTING

try:
    import torch
except ImportError:  # CI: NumPy only
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

POISON32 = 0x5A5A5A5A
POISON64 = 0x5A5A5A5A5A5A5A5A


def routing_kwargs(T: int = 3, K: int = 2, M: int = None) -> dict:
    """A valid stage_megamoe_routing call (M: the outputs' rows, T by default)."""
    rng = np.random.default_rng(1)
    M = T if M is None else M
    return dict(
        topk_weights=rng.random((T, K)).astype(np.float32),
        topk_ids=rng.integers(0, 9, (T, K)).astype(np.int32),
        topk_idx_out=np.full((M, K), POISON64, np.int64),
        topk_weights_out=np.full((M, K), POISON32, np.int32).view(np.float32),
    )


def route_kwargs(T: int = 5, E: int = 16, K: int = 4) -> dict:
    """A valid route call."""
    rng = np.random.default_rng(2)
    return dict(
        router_logits=rng.standard_normal((T, E)).astype(np.float32),
        e_score_correction_bias=rng.standard_normal(E).astype(np.float32),
        topk_weights=np.full((T, K), POISON32, np.int32).view(np.float32),
        topk_ids=np.full((T, K), POISON32, np.int32),
    )


def route_and_stage_kwargs(T: int = 5, E: int = 16, K: int = 4, H: int = 256, scheme=megamoe.MXFP8, M: int = None) -> dict:
    """A valid route_and_stage call under ``scheme`` (M: the staged outputs' rows)."""
    kw = route_kwargs(T, E, K)
    kw["hidden_states"] = np.random.default_rng(3).standard_normal((T, H)).astype(np.float32)
    shapes = megamoe.output_shapes(T if M is None else M, H, K, scheme)
    for name in ("x_fp8", "x_sf", "topk_idx_out", "topk_weights_out", "x_scales"):
        spec = getattr(shapes, name)
        if spec is not None:
            dtype = np.dtype(np.uint8 if spec.dtype.startswith("float8") else spec.dtype)
            kw[name] = np.full(int(np.prod(spec.shape)) * dtype.itemsize, 0x5A, np.uint8).view(dtype).reshape(spec.shape)
    if shapes.global_scale is not None:
        kw["global_scale"] = np.ones(1, np.float32)
    kw["hidden_quant"] = scheme
    return kw


# (explain function, the call it explains, its argument table, a valid call's arguments)
PAIRS = {
    "routing": (megamoe.explain_routing, megamoe.stage_megamoe_routing, ROUTING, routing_kwargs),
    "route": (megamoe.explain_route, megamoe.route, ROUTE, route_kwargs),
    "route_and_stage": (megamoe.explain_route_and_stage, megamoe.route_and_stage, ROUTE_AND_STAGE, route_and_stage_kwargs),
}


def written(spec, kw: dict) -> dict:
    """Copies of the arrays of ``kw`` that the call of ``spec`` writes."""
    return {p.name: kw[p.name].copy() for p in spec.params if p.mutable and isinstance(kw.get(p.name), np.ndarray)}


def assert_unwritten(before: dict, kw: dict) -> None:
    for name, b in before.items():
        assert kw[name].tobytes() == b.tobytes(), f"{name} was written"


# ---------------------------------------------------------------------------------------
# Signatures and exports


@pytest.mark.parametrize("which", PAIRS)
def test_signature_is_the_calls(which):
    explain, call, spec, _ = PAIRS[which]
    assert inspect.signature(explain) == inspect.signature(call) == spec.signature()
    assert explain.__module__ == "megamoe" and explain.__name__ in megamoe.__all__
    assert call.__name__ in explain.__doc__ and "nothing to do" in explain.__doc__
    assert getattr(_C, explain.__name__), "the native module has it under the same name"


# ---------------------------------------------------------------------------------------
# CPU text; nothing written


def test_routing_cpu_text():
    kw = routing_kwargs(T=3, K=2)
    before = written(ROUTING, kw)
    assert megamoe.explain_routing(**kw) == "cpu backend: top-k repack of 3 x 2 entries on the calling thread"
    pad = np.array([0, 1, 0], bool)
    assert megamoe.explain_routing(**kw, is_padding=pad, routed_scaling_factor=1.5, stream=123, enable_pdl=True) == (
        "cpu backend: top-k repack of 3 x 2 entries on the calling thread"
    )
    # positionally, as vLLM passes stage_megamoe_routing's arguments
    assert megamoe.explain_routing(*kw.values(), pad).startswith("cpu backend: top-k repack of 3 x 2")
    full = routing_kwargs(T=3, K=2, M=5)
    assert megamoe.explain_routing(**full, full_buffer=True) == "cpu backend: top-k repack of 5 x 2 entries on the calling thread"
    assert_unwritten(before, kw)


def test_route_cpu_text():
    kw = route_kwargs(T=5, E=16, K=4)
    before = written(ROUTE, kw)
    text = "cpu backend: route T=5 E=16 K=4: the router over token rows (worker threads for large calls)"
    assert megamoe.explain_route(**kw) == text
    count = np.zeros(1, np.int64)
    assert megamoe.explain_route(**kw, routed_scaling_factor=1.5, nonfinite_count=count, stream=7) == text
    assert count[0] == 0
    assert megamoe.explain_route(*kw.values()) == text  # positionally
    assert_unwritten(before, kw)


@pytest.mark.parametrize("scheme", [megamoe.MXFP8, megamoe.FP8_FP32_G128, megamoe.MXFP4, megamoe.NVFP4_PER_TOKEN],
                         ids=lambda s: s.name)  # fmt: skip
def test_route_and_stage_cpu_text(scheme):
    kw = route_and_stage_kwargs(T=5, E=16, K=4, H=256, scheme=scheme)
    before = written(ROUTE_AND_STAGE, kw)
    assert megamoe.explain_route_and_stage(**kw) == (
        "cpu backend: route_and_stage T=5 E=16 K=4: the router over token rows (worker threads for large "
        f"calls), then the staging of its outputs ({scheme.name})"
    )
    assert_unwritten(before, kw)


# ---------------------------------------------------------------------------------------
# Invalid arguments: the call's error, nothing written


def _bad_routing():
    yield "idx dtype", dict(topk_idx_out=np.zeros((3, 2), np.int32))
    yield "weights rows", dict(topk_weights=np.zeros((4, 2), np.float32))
    yield "padding length", dict(is_padding=np.zeros(2, bool))
    yield "ids dtype without DType", dict(topk_ids=np.zeros((3, 2), np.uint16))
    yield "too few rows in full buffer", dict(full_buffer=True, topk_idx_out=np.zeros((2, 2), np.int64))
    yield "scaling not finite", dict(routed_scaling_factor=float("inf"))
    yield "not an array", dict(topk_weights=[[1.0, 2.0]])
    yield "stream beyond cudaStream_t", dict(stream=2**64)


def _bad_route():
    yield "bias length", dict(e_score_correction_bias=np.zeros(15, np.float32))
    yield "too many experts", dict(router_logits=np.zeros((5, 513), np.float32), e_score_correction_bias=None)
    yield "top_k zero", dict(top_k=0)
    yield "EPLB given partly", dict(logical_to_physical_map=np.zeros((16, 1), np.int32))
    yield "logits dtype without DType", dict(router_logits=np.zeros((5, 16), np.float64))
    yield "ids dtype", dict(topk_ids=np.zeros((5, 4), np.float32))
    yield "top_k no int", dict(top_k="4")
    yield "top_k beyond int64", dict(top_k=2**63)
    yield "counter dtype (the library's 'nonfinite_count (router)')", dict(nonfinite_count=np.zeros(1, np.int32))


def _bad_route_and_stage():
    yield "x_sf shape", dict(x_sf=np.zeros((5, 3), np.int32))
    yield "x_fp8 dtype (the library's x_q)", dict(x_fp8=np.zeros((5, 256), np.int32))
    yield "logits counter dtype", dict(logits_nonfinite_count=np.zeros(1, np.int32))
    yield "hidden rows", dict(hidden_states=np.zeros((4, 256), np.float32))
    yield "hidden dtype without DType", dict(hidden_states=np.zeros((5, 256), np.float64))
    yield "shared_x_sf without block", dict(shared_x_sf=np.zeros((128, 2), np.int32))
    yield "scheme", dict(hidden_quant=megamoe.QuantScheme(group_k=48))
    yield "bias length", dict(e_score_correction_bias=np.zeros(3, np.float32))
    yield "x_fp8 read-only", dict(x_fp8=np.broadcast_to(np.zeros(256, np.uint8), (5, 256)))
    yield "hidden_quant no scheme", dict(hidden_quant="mxfp8")


BAD = [(which, name, over) for which, cases in (("routing", _bad_routing), ("route", _bad_route),
                                                ("route_and_stage", _bad_route_and_stage))
       for name, over in cases()]  # fmt: skip


def _raised(fn, kw: dict) -> BaseException:
    with pytest.raises((TypeError, ValueError)) as info:
        fn(**kw)
    return info.value


def assert_same_error(explain, call, kw: dict, check=lambda: None) -> None:
    """``explain`` and ``call`` both reject ``kw`` with one error; ``check()`` runs after each
    (it asserts that nothing was written)."""
    got = _raised(explain, kw)
    check()
    want = _raised(call, kw)
    check()
    assert type(got) is type(want) and str(got) == str(want) != ""


@pytest.mark.parametrize("which,name,over", BAD, ids=[f"{w}-{n}" for w, n, _ in BAD])
def test_invalid_arguments_raise_the_calls_error(which, name, over):
    explain, call, spec, make = PAIRS[which]
    kw = make()
    kw.update(over)
    before = written(spec, kw)
    assert_same_error(explain, call, kw, lambda: assert_unwritten(before, kw))


# ---------------------------------------------------------------------------------------
# T == 0


def _no_rows(which: str) -> dict:
    """A call whose T has no rows; every other required argument is None (the calls return
    before reading them)."""
    spec = PAIRS[which][2]
    kw = {p.name: None for p in spec.params if p.default is REQUIRED}
    if which == "routing":
        kw["topk_ids"] = np.zeros((0, 2), np.int32)
    else:
        kw["router_logits"] = np.zeros((0, 16), np.float32)
    return kw


NO_ROWS = {
    "routing": "nothing to do: topk_ids has no rows (T == 0)",
    "route": "nothing to do: router_logits has no rows (T == 0)",
    "route_and_stage": "nothing to do: router_logits has no rows (T == 0)",
}


class _NoNative:
    def __getattr__(self, name):
        raise AssertionError(f"megamoe._C.{name} was used")


@pytest.mark.parametrize("which", PAIRS)
def test_no_rows_is_nothing_to_do_without_the_native_module(which, monkeypatch):
    explain, call, _, _ = PAIRS[which]
    kw = _no_rows(which)
    with monkeypatch.context() as m:
        m.setattr(_ops, "_C", _NoNative())
        assert explain(**kw) == NO_ROWS[which]
        assert call(**kw) is None  # the call returns at once too
    # the native function answers alike when called directly
    assert getattr(_C, explain.__name__)(**kw) == NO_ROWS[which]


def test_no_rows_in_full_buffer_mode_is_the_librarys():
    kw = routing_kwargs(T=0, K=2, M=4)
    before = written(ROUTING, kw)
    assert megamoe.explain_routing(**kw, full_buffer=True) == "cpu backend: top-k repack of 4 x 2 entries on the calling thread"
    kw = route_and_stage_kwargs(T=0, M=4)
    before.update(written(ROUTE_AND_STAGE, kw))
    assert megamoe.explain_route_and_stage(**kw, full_buffer=True).startswith("cpu backend: route_and_stage T=0 E=16 K=4")
    assert megamoe.explain_route_and_stage(**kw) == NO_ROWS["route_and_stage"]
    assert_unwritten(before, kw)


# ---------------------------------------------------------------------------------------
# torch


def _as_torch(kw: dict) -> dict:
    return {n: torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v for n, v in kw.items()}


@needs_torch
@pytest.mark.parametrize("which", PAIRS)
def test_torch_tensors_give_the_numpy_text(which):
    explain, _, spec, make = PAIRS[which]
    kw = make()
    tkw = _as_torch(kw)
    before = {n: t.clone() for n, t in tkw.items() if spec.params[spec.index(n)].mutable and isinstance(t, torch.Tensor)}
    assert explain(**tkw) == explain(**kw)
    for n, b in before.items():
        assert torch.equal(tkw[n], b), f"{n} was written"
    assert explain(**_as_torch(_no_rows(which))) == NO_ROWS[which]


@needs_torch
def test_torch_fp8_output_and_errors():
    kw = _as_torch(route_and_stage_kwargs())
    kw["x_fp8"] = kw["x_fp8"].view(torch.float8_e4m3fn)
    assert megamoe.explain_route_and_stage(**kw).endswith("then the staging of its outputs (mxfp8)")
    kw["x_sf"] = torch.zeros(5, 3, dtype=torch.int32)
    assert_same_error(megamoe.explain_route_and_stage, megamoe.route_and_stage, kw)
    kw = _as_torch(route_kwargs())
    kw["topk_ids"] = torch.zeros(5, 4, dtype=torch.float32)
    assert_same_error(megamoe.explain_route, megamoe.route, kw)
    kw = _as_torch(routing_kwargs())
    kw["topk_idx_out"] = torch.zeros(3, 2, dtype=torch.int32)
    assert_same_error(megamoe.explain_routing, megamoe.stage_megamoe_routing, kw)
