"""The one argument table (megamoe/_signature.py) and everything derived from it agree: the
public functions' signatures (vLLM's positional order unchanged), the native module's
parameters (from the binding's own tables: names, order, types, defaults), the committed
stub _entry.pyi, the custom ops' schemas, mutated
arguments and fakes (torch parts skip without torch); packaging: the CLI launcher and the
cost of `import megamoe` next to `import torch`."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import megamoe
from megamoe import _C, _signature
from megamoe._signature import (
    GATE_AND_ROUTE,
    GATE_ROUTE_AND_STAGE,
    MHC_AND_STAGE,
    NORM_AND_STAGE,
    PREPARE,
    REQUIRED,
    ROUTE,
    ROUTE_AND_STAGE,
    ROUTING,
)

STUB = Path(megamoe.__file__).resolve().parent / "_entry.pyi"

# vLLM's prepare_megamoe_inputs (positional order and defaults) and stage_megamoe_routing.
VLLM_PREPARE = [
    "hidden_states", "topk_weights", "topk_ids", "x_fp8", "x_sf", "topk_idx_out", "topk_weights_out",
    "is_padding", "shared_x_sf", "shared_block_m", "hidden_quant",
]  # fmt: skip
VLLM_ROUTING = ["topk_weights", "topk_ids", "topk_idx_out", "topk_weights_out", "is_padding"]


# The native module's annotation of each kind of table argument (nanobind's signature text).
NATIVE_TYPES = {
    "tensor": "object | None", "tensor?": "object | None", "int?": "int | None", "float?": "float | None",
    "float": "float", "int": "int", "bool": "bool", "scheme": "megamoe._C.QuantScheme", "stream": "int",
}  # fmt: skip


def native_params(fn) -> list:
    """(name, annotation, default or REQUIRED) of each parameter of a nanobind function, from
    its live signature (the text with default placeholders \\0, \\1, ... and their values)."""
    text, _, defaults = fn.__nb_signature__[0]
    inside = text[text.index("(") + 1 : text.rindex(")")]
    out = []
    for p in inside.split(", "):
        m = re.fullmatch(r"(\w+): (.+?)(?: = \\(\d+))?", p.strip())
        assert m, p
        out.append((m[1], m[2], REQUIRED if m[3] is None else defaults[int(m[3])]))
    return out


@pytest.mark.parametrize(
    "fn,spec,vllm",
    [
        (megamoe.prepare_megamoe_inputs, PREPARE, VLLM_PREPARE),
        (megamoe.explain, PREPARE, VLLM_PREPARE),
        (megamoe.stage_megamoe_routing, ROUTING, VLLM_ROUTING),
    ],
    ids=["prepare_megamoe_inputs", "explain", "stage_megamoe_routing"],
)
def test_public_signatures_are_the_table(fn, spec, vllm):
    sig = inspect.signature(fn)
    assert sig == spec.signature()
    names = list(sig.parameters)
    assert names[: len(vllm)] == vllm
    for name, p in sig.parameters.items():
        positional = name in vllm
        assert (p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD) == positional, name
        assert (p.default is inspect.Parameter.empty) == (spec.params[spec.index(name)].default is REQUIRED)
    assert sig.parameters["hidden_quant" if spec is PREPARE else "is_padding"].default in (megamoe.MXFP8, None)
    assert fn.__doc__ and fn.__module__ == "megamoe"


def test_router_signatures_are_the_table():
    # the bias is required (None allowed), so that a forgotten one cannot change the selection
    for fn, spec, positional in (
        (megamoe.route, ROUTE, ["router_logits", "e_score_correction_bias", "topk_weights", "topk_ids", "is_padding"]),
        (megamoe.route_and_stage, ROUTE_AND_STAGE, ["hidden_states", "router_logits", "e_score_correction_bias",
                                                    "topk_weights", "topk_ids", *VLLM_PREPARE[3:]]),
    ):  # fmt: skip
        sig = inspect.signature(fn)
        assert sig == spec.signature() and fn.__doc__ and fn.__module__ == "megamoe"
        kinds = {n: p.kind for n, p in sig.parameters.items()}
        assert [n for n, k in kinds.items() if k == inspect.Parameter.POSITIONAL_OR_KEYWORD] == positional
        assert sig.parameters["e_score_correction_bias"].default is inspect.Parameter.empty
    # the norm: prepare_megamoe_inputs' positional order with x, residual (required, None
    # allowed) and weight in place of hidden_states; eps and the norm's outputs keyword-only
    sig = inspect.signature(megamoe.rmsnorm_and_stage)
    assert sig == NORM_AND_STAGE.signature() and megamoe.rmsnorm_and_stage.__module__ == "megamoe"
    positional = [n for n, p in sig.parameters.items() if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert positional == ["x", "residual", "weight", *VLLM_PREPARE[1:]]
    assert sig.parameters["residual"].default is inspect.Parameter.empty and sig.parameters["eps"].default == 1e-6
    assert [n for n in sig.parameters if n not in positional][:3] == ["eps", "y", "residual_out"]
    # the gate: route_and_stage's positional order with the gate weight in place of
    # router_logits; y (None: hidden_states), logits_out and the logits' counter keyword-only
    sig = inspect.signature(megamoe.gate_route_and_stage)
    assert sig == GATE_ROUTE_AND_STAGE.signature() and megamoe.gate_route_and_stage.__module__ == "megamoe"
    positional = [n for n, p in sig.parameters.items() if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert positional == ["hidden_states", "weight", "e_score_correction_bias", "topk_weights", "topk_ids",
                          *VLLM_PREPARE[3:]]  # fmt: skip
    assert sig.parameters["e_score_correction_bias"].default is inspect.Parameter.empty
    assert sig.parameters["y"].default is None and sig.parameters["y"].kind == inspect.Parameter.KEYWORD_ONLY
    assert inspect.signature(megamoe.explain_gate_route_and_stage) == GATE_ROUTE_AND_STAGE.signature()
    # without staging: route's positional order with y and the weight in place of router_logits
    sig = inspect.signature(megamoe.gate_and_route)
    assert sig == GATE_AND_ROUTE.signature() == inspect.signature(megamoe.explain_gate_and_route)
    positional = [n for n, p in sig.parameters.items() if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert positional == ["y", "weight", "e_score_correction_bias", "topk_weights", "topk_ids", "is_padding"]
    # mHC: vLLM's mhc_pre inputs, the norm weight and the mHC outputs in place of
    # hidden_states, then prepare_megamoe_inputs' order; the scalars keyword-only with
    # DeepSeek-V4's values as defaults
    for fn in (megamoe.mhc_pre_and_stage, megamoe.explain_mhc_pre_and_stage):
        sig = inspect.signature(fn)
        assert sig == MHC_AND_STAGE.signature() and fn.__module__ == "megamoe" and fn.__doc__
    positional = [n for n, p in sig.parameters.items() if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert positional == ["residual", "fn", "hc_scale", "hc_base", "norm_weight", "post_mix", "comb_mix",
                          *VLLM_PREPARE[1:]]  # fmt: skip
    assert {n: sig.parameters[n].default for n in ("rms_eps", "hc_pre_eps", "hc_sinkhorn_eps", "hc_post_mult_value",
                                                   "sinkhorn_repeat", "norm_eps")} == {
        "rms_eps": 1e-6, "hc_pre_eps": 1e-6, "hc_sinkhorn_eps": 1e-6, "hc_post_mult_value": 2.0,
        "sinkhorn_repeat": 20, "norm_eps": 1e-6}  # fmt: skip
    # the drop-in has vLLM's dsv4_topk_prepare_megamoe parameters, in its order
    assert list(inspect.signature(megamoe.dsv4_topk_prepare_megamoe).parameters) == [
        "hidden_states", "gating_output", "correction_bias", "routed_scaling_factor", "indices_dtype", "x_fp8", "x_sf",
        "topk_idx_out", "topk_weights_out", "is_padding", "shared_x_sf", "shared_block_m"]  # fmt: skip


@pytest.mark.parametrize(
    "name,spec",
    [("prepare_inputs", PREPARE), ("explain", PREPARE), ("stage_routing", ROUTING), ("route", ROUTE),
     ("route_and_stage", ROUTE_AND_STAGE), ("explain_routing", ROUTING), ("explain_route", ROUTE),
     ("explain_route_and_stage", ROUTE_AND_STAGE), ("rmsnorm_and_stage", NORM_AND_STAGE),
     ("explain_rmsnorm_and_stage", NORM_AND_STAGE), ("gate_route_and_stage", GATE_ROUTE_AND_STAGE),
     ("explain_gate_route_and_stage", GATE_ROUTE_AND_STAGE), ("gate_and_route", GATE_AND_ROUTE),
     ("explain_gate_and_route", GATE_AND_ROUTE), ("mhc_pre_and_stage", MHC_AND_STAGE),
     ("explain_mhc_pre_and_stage", MHC_AND_STAGE)],
)  # fmt: skip
def test_native_parameters_are_the_table(name, spec):
    # The binding's own argument tables (python/src/binding.cpp) give the native module its
    # parameters: names, order, types and defaults must be this table's.
    params = native_params(getattr(_C, name))
    assert [n for n, _, _ in params] == list(spec.names)
    for (n, annotation, default), p in zip(params, spec.params):
        assert annotation == NATIVE_TYPES[p.kind], n
        if p.default is REQUIRED:
            assert default is REQUIRED, n
        elif p.kind == "stream":
            assert default == 0 and type(default) is int, n  # Spec.native_args passes None as 0
        else:
            assert default == p.default and type(default) is type(p.default), n


def test_native_stub_parameter_order_is_the_table():
    import ast

    tree = ast.parse((STUB.parent / "_C.pyi").read_text())
    funcs = {n.name: [a.arg for a in n.args.args] for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert funcs["prepare_inputs"] == funcs["explain"] == list(PREPARE.names)
    assert funcs["stage_routing"] == funcs["explain_routing"] == list(ROUTING.names)
    assert funcs["route"] == funcs["explain_route"] == list(ROUTE.names)
    assert funcs["route_and_stage"] == funcs["explain_route_and_stage"] == list(ROUTE_AND_STAGE.names)
    assert funcs["rmsnorm_and_stage"] == funcs["explain_rmsnorm_and_stage"] == list(NORM_AND_STAGE.names)
    assert funcs["gate_route_and_stage"] == funcs["explain_gate_route_and_stage"] == list(GATE_ROUTE_AND_STAGE.names)
    assert funcs["gate_and_route"] == funcs["explain_gate_and_route"] == list(GATE_AND_ROUTE.names)
    assert funcs["mhc_pre_and_stage"] == funcs["explain_mhc_pre_and_stage"] == list(MHC_AND_STAGE.names)


def test_committed_stub_is_the_generated_one():
    assert STUB.read_text() == _signature.stub_text(), (
        "python/megamoe/_entry.pyi is stale; regenerate it (see its first lines)"
    )
    ns: dict = {}
    exec(compile(STUB.read_text(), str(STUB), "exec"), ns)  # the stub is valid Python with these signatures
    for name, spec, _ in _signature.ENTRY_POINTS:
        stub_sig = inspect.signature(ns[name])
        assert list(stub_sig.parameters) == list(spec.names)
        for p, q in zip(stub_sig.parameters.values(), spec.signature().parameters.values()):
            assert p.kind == q.kind, name
            assert (p.default is inspect.Parameter.empty) == (q.default is inspect.Parameter.empty), name


def test_op_schema_text():
    schema = PREPARE.op_schema()
    assert schema.startswith("(Tensor hidden_states, Tensor topk_weights, Tensor topk_ids, Tensor(a!) x_fp8, ")
    assert "int quant_elem, int quant_scale, int group_m, int group_k, bool is_static, bool symmetric, " \
           "int scale2, int rounding, float amax_floor" in schema  # fmt: skip
    # global_scale is written by NVFP4 online (read by NVFP4 static): declared mutable.
    assert "Tensor(e!)? shared_x_sf" in schema and "Tensor(f!)? global_scale" in schema
    assert "Tensor(g!)? x_scales, Tensor(h!)? nonfinite_count, bool full_buffer, float? routed_scaling_factor, Tensor? expert_scales, bool enable_pdl" in schema
    assert "stream" not in schema and schema.endswith(") -> ()")
    assert PREPARE.mutates_args() == ("x_fp8", "x_sf", "topk_idx_out", "topk_weights_out", "shared_x_sf", "global_scale",
                                      "x_scales", "nonfinite_count")  # fmt: skip
    assert ROUTING.op_schema() == (
        "(Tensor topk_weights, Tensor topk_ids, Tensor(a!) topk_idx_out, Tensor(b!) topk_weights_out, "
        "Tensor? is_padding, bool full_buffer, float? routed_scaling_factor, Tensor? expert_scales, bool enable_pdl) -> ()"
    )
    assert ROUTE.op_schema() == (
        "(Tensor router_logits, Tensor? e_score_correction_bias, Tensor(a!) topk_weights, Tensor(b!) topk_ids, "
        "Tensor? is_padding, int? top_k, float? routed_scaling_factor, Tensor? tid2eid, Tensor? input_ids, "
        "Tensor? logical_to_physical_map, Tensor? logical_replica_count, Tensor(c!)? expert_load_view, "
        "Tensor? record_enabled, Tensor(d!)? nonfinite_count, bool enable_pdl) -> ()"
    )
    rs = ROUTE_AND_STAGE.op_schema()
    assert rs.startswith("(Tensor hidden_states, Tensor router_logits, Tensor? e_score_correction_bias, "
                         "Tensor(a!) topk_weights, Tensor(b!) topk_ids, Tensor(c!) x_fp8, ")  # fmt: skip
    assert ROUTE_AND_STAGE.mutates_args() == ("topk_weights", "topk_ids", "x_fp8", "x_sf", "topk_idx_out",
                                              "topk_weights_out", "shared_x_sf", "expert_load_view",
                                              "logits_nonfinite_count", "global_scale", "x_scales",
                                              "nonfinite_count")  # fmt: skip
    ns = NORM_AND_STAGE.op_schema()
    assert ns.startswith("(Tensor x, Tensor? residual, Tensor weight, Tensor topk_weights, Tensor topk_ids, "
                         "Tensor(a!) x_fp8, ")  # fmt: skip
    assert "float amax_floor, float eps, Tensor(f!)? y, Tensor(g!)? residual_out, Tensor(h!)? global_scale" in ns
    assert NORM_AND_STAGE.mutates_args() == ("x_fp8", "x_sf", "topk_idx_out", "topk_weights_out", "shared_x_sf", "y",
                                             "residual_out", "global_scale", "x_scales", "nonfinite_count")  # fmt: skip
    gs = GATE_ROUTE_AND_STAGE.op_schema()
    assert gs.startswith("(Tensor hidden_states, Tensor weight, Tensor? e_score_correction_bias, "
                         "Tensor(a!) topk_weights, Tensor(b!) topk_ids, Tensor(c!) x_fp8, ")  # fmt: skip
    assert GATE_ROUTE_AND_STAGE.mutates_args() == ("topk_weights", "topk_ids", "x_fp8", "x_sf", "topk_idx_out",
                                                   "topk_weights_out", "shared_x_sf", "expert_load_view",
                                                   "logits_out", "logits_nonfinite_count", "global_scale",
                                                   "x_scales", "nonfinite_count")  # fmt: skip
    assert GATE_AND_ROUTE.op_schema().startswith("(Tensor y, Tensor weight, Tensor? e_score_correction_bias, "
                                                 "Tensor(a!) topk_weights, Tensor(b!) topk_ids, ")  # fmt: skip
    assert GATE_AND_ROUTE.mutates_args() == ("topk_weights", "topk_ids", "expert_load_view", "logits_out",
                                             "nonfinite_count")  # fmt: skip
    ms = MHC_AND_STAGE.op_schema()
    assert ms.startswith("(Tensor residual, Tensor fn, Tensor hc_scale, Tensor hc_base, Tensor norm_weight, "
                         "Tensor(a!) post_mix, Tensor(b!) comb_mix, Tensor topk_weights, Tensor topk_ids, ")  # fmt: skip
    assert "float hc_post_mult_value, int sinkhorn_repeat, float norm_eps, Tensor? pre_mix_in, Tensor(h!)? pre_mix" in ms
    assert MHC_AND_STAGE.mutates_args() == ("post_mix", "comb_mix", "x_fp8", "x_sf", "topk_idx_out",
                                            "topk_weights_out", "shared_x_sf", "pre_mix", "layer_input", "y",
                                            "global_scale", "x_scales", "nonfinite_count")  # fmt: skip
    # every table argument but the stream reaches the op (the scheme as its fields)
    for spec in (PREPARE, ROUTE_AND_STAGE, NORM_AND_STAGE, GATE_ROUTE_AND_STAGE, GATE_AND_ROUTE, MHC_AND_STAGE):
        op = spec.op_names()
        for p in spec.params:
            if p.kind == "scheme":
                assert all(f in op for f, _ in _signature.SCHEME_FIELDS)
            elif p.kind != "stream":
                assert p.name in op


def test_values_fills_defaults_by_name():
    v = ROUTE.values(router_logits=1, e_score_correction_bias=None, topk_weights=2, topk_ids=3, top_k=6)
    assert v[ROUTE.index("top_k")] == 6 and v[ROUTE.index("enable_pdl")] is False and len(v) == len(ROUTE.names)
    with pytest.raises(TypeError, match="missing argument e_score_correction_bias"):
        ROUTE.values(router_logits=1, topk_weights=2, topk_ids=3)
    with pytest.raises(TypeError, match="no argument named bogus"):
        ROUTE.values(router_logits=1, e_score_correction_bias=None, topk_weights=2, topk_ids=3, bogus=4)


def test_op_values_round_trip():
    args = [f"a{i}" for i in range(len(PREPARE.names))]
    args[PREPARE.index("hidden_quant")] = megamoe.NVFP4_PER_TOKEN.with_amax_floor(3.0)
    for i, p in enumerate(PREPARE.params):
        if p.kind in ("bool",):
            args[i] = True
        elif p.kind in ("int?", "float?", "stream"):
            args[i] = None
    from megamoe._scheme import scheme_fields, scheme_from_plain

    def plain(s):
        f = scheme_fields(s)
        return (f[0].value, f[1].value, f[2], f[3], f[4], f[5], f[6].value, f[7].value, f[8])

    op = PREPARE.op_values(args, plain)
    assert len(op) == len(PREPARE.op_names())
    back = PREPARE.from_op_values(op, scheme_from_plain, stream=7)
    args[PREPARE.index("stream")] = 7
    assert back == args
    with pytest.raises(TypeError, match="expected 26 op arguments, got 25"):
        PREPARE.from_op_values(op[:-1], scheme_from_plain, stream=7)


def test_required_float_kind():
    """eps (kind "float"): numbers become floats, None and non-numbers are TypeErrors, ints
    too large for a double ValueErrors; the op spells it "float"."""
    i = NORM_AND_STAGE.index("eps")
    args = NORM_AND_STAGE.values(x=1, residual=None, weight=2, topk_weights=3, topk_ids=4, x_fp8=5, x_sf=6,
                                 topk_idx_out=7, topk_weights_out=8)  # fmt: skip
    assert args[i] == 1e-6
    for given, want in ((0, 0.0), (2, 2.0), (1e-5, 1e-5)):
        got = NORM_AND_STAGE.native_args([*args[:i], given, *args[i + 1 :]], lambda s: s)[i]
        assert got == want and type(got) is float
    for bad, exc, msg in ((None, TypeError, "megamoe: eps: expected a float, got NoneType"),
                          ("1", TypeError, "megamoe: eps: expected a float, got str"),
                          (True, TypeError, "megamoe: eps: expected a float, got bool"),
                          (10**400, ValueError, "megamoe: eps: expected a value within float32's range")):  # fmt: skip
        with pytest.raises(exc, match=re.escape(msg)):
            NORM_AND_STAGE.native_args([*args[:i], bad, *args[i + 1 :]], lambda s: s)
        with pytest.raises(exc, match=re.escape(msg)):
            NORM_AND_STAGE.op_values([*args[:i], bad, *args[i + 1 :]], lambda s: ())
    assert ("eps", "float") in NORM_AND_STAGE.op_params()


def test_required_int_kind():
    """sinkhorn_repeat (kind "int"): ints and index-likes pass, None, bools and non-ints are
    TypeErrors, ints outside int64 ValueErrors; the op spells it "int"."""
    i = MHC_AND_STAGE.index("sinkhorn_repeat")
    args = MHC_AND_STAGE.values(residual=1, fn=2, hc_scale=3, hc_base=4, norm_weight=5, post_mix=6, comb_mix=7,
                                topk_weights=8, topk_ids=9, x_fp8=10, x_sf=11, topk_idx_out=12,
                                topk_weights_out=13)  # fmt: skip
    assert args[i] == 20
    class Seven:  # an index-like (NumPy integers are ones)
        def __index__(self) -> int:
            return 7

    for given, want in ((1, 1), (Seven(), 7), (65536, 65536)):
        got = MHC_AND_STAGE.native_args([*args[:i], given, *args[i + 1 :]], lambda s: s)[i]
        assert got == want and type(got) is int
    for bad, exc, msg in ((None, TypeError, "megamoe: sinkhorn_repeat: expected an int, got NoneType"),
                          (True, TypeError, "megamoe: sinkhorn_repeat: expected an int, got bool"),
                          (2.0, TypeError, "megamoe: sinkhorn_repeat: expected an int or None, got float"),
                          (2**70, ValueError, "megamoe: sinkhorn_repeat: 1180591620717411303424 does not fit in int64")):  # fmt: skip
        with pytest.raises(exc, match=re.escape(msg)):
            MHC_AND_STAGE.native_args([*args[:i], bad, *args[i + 1 :]], lambda s: s)
        with pytest.raises(exc, match=re.escape(msg)):
            MHC_AND_STAGE.op_values([*args[:i], bad, *args[i + 1 :]], lambda s: ())
    assert ("sinkhorn_repeat", "int") in MHC_AND_STAGE.op_params()


# ---------------------------------------------------------------------------------------
# Packaging


def test_cli_launcher():
    from megamoe.__main__ import cli_path

    exe = cli_path()
    if exe is None:
        r = subprocess.run([sys.executable, "-m", "megamoe", "--version"], capture_output=True, text=True)
        assert r.returncode == 2 and "no megamoe-stage CLI" in r.stderr
        pytest.skip("this installation was built without the megamoe-stage CLI")
    r = subprocess.run([sys.executable, "-m", "megamoe", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == megamoe.__version__, r.stderr
    r = subprocess.run([sys.executable, "-m", "megamoe", "--tokens", "4", "--hidden", "256", "--iters", "1", "--device", "cpu"],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0 and "reference: bit-exact match" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "megamoe", "--no-such-flag"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    script = Path(sys.executable).parent / "megamoe-stage"
    if script.exists():  # the console script pip installs beside this interpreter
        r = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and r.stdout.strip() == megamoe.__version__


IMPORT_TIME = textwrap.dedent(
    """
    import sys, time
    t0 = time.perf_counter()
    import torch
    t1 = time.perf_counter()
    import megamoe
    t2 = time.perf_counter()
    assert 'megamoe._torch' in sys.modules, 'the custom ops are registered on import'
    assert all(hasattr(torch.ops.megamoe, n) for n in ('prepare_inputs', 'stage_routing', 'route', 'route_and_stage',
                                                       'rmsnorm_and_stage', 'gate_route_and_stage', 'gate_and_route',
                                                       'mhc_pre_and_stage'))
    print(t1 - t0, t2 - t1, 'torch._dynamo' in sys.modules)
    """
)


def test_import_megamoe_costs_little_more_than_torch():
    pytest.importorskip("torch")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    runs = []
    for _ in range(2):  # the first run may pay for cold caches
        r = subprocess.run([sys.executable, "-c", IMPORT_TIME], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        t_torch, t_megamoe, dynamo = r.stdout.split()
        runs.append((float(t_torch), float(t_megamoe), dynamo == "True"))
    assert not any(d for _, _, d in runs), "import megamoe loaded torch._dynamo"
    t_torch, t_megamoe = min(r[0] for r in runs), min(r[1] for r in runs)
    assert t_megamoe < max(0.5, 0.25 * t_torch), f"import megamoe took {t_megamoe:.3f} s after torch's {t_torch:.3f} s"
