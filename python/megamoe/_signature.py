"""The one description of every staging entry point's arguments.

``PREPARE`` (prepare_megamoe_inputs, explain, torch.ops.megamoe.prepare_inputs,
megamoe._C.prepare_inputs), ``ROUTING`` (stage_megamoe_routing, explain_routing,
torch.ops.megamoe.stage_routing, megamoe._C.stage_routing), ``ROUTE`` (route,
explain_route, torch.ops.megamoe.route, megamoe._C.route) and ``ROUTE_AND_STAGE``
(route_and_stage, explain_route_and_stage, torch.ops.megamoe.route_and_stage,
megamoe._C.route_and_stage), ``NORM_AND_STAGE`` (rmsnorm_and_stage, explain_rmsnorm_and_stage,
torch.ops.megamoe.rmsnorm_and_stage, megamoe._C.rmsnorm_and_stage) and ``GATE_ROUTE_AND_STAGE``
(gate_route_and_stage, explain_gate_route_and_stage, torch.ops.megamoe.gate_route_and_stage,
megamoe._C.gate_route_and_stage) and ``GATE_AND_ROUTE`` (gate_and_route, explain_gate_and_route,
torch.ops.megamoe.gate_and_route, megamoe._C.gate_and_route) list each argument once:
name, kind, default, whether the call writes it, whether it is keyword-only (the pieces
several tables share are written once, as tuples spliced into them). Everything that
spells an argument list is derived from them here:

* the public functions (generated with their real signatures, like dataclasses'
  ``__init__``, so ``help()``, ``inspect`` and keyword calls behave as hand-written ones),
* the argument conversion for the native module (whose parameter order is this order),
* the custom op's schema string, its ``mutates_args``, kernel and fake,
* the type stub ``_entry.pyi`` (``stub_text()`` returns it; a test checks that the
  committed file is that text).

Kinds: ``tensor`` (required array), ``tensor?`` (optional array), ``int?``, ``float?``,
``float`` (a number, never None), ``int`` (an int, never None), ``bool``, ``scheme`` (a QuantScheme or a vLLM QuantKey;
the custom op spells it out as ``SCHEME_FIELDS``) and ``stream`` (a cudaStream_t as int;
not an op argument: the op runs on the current stream).
"""

from __future__ import annotations

import inspect
import operator
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

__all__ = [
    "Param", "Spec", "PREPARE", "ROUTING", "ROUTE", "ROUTE_AND_STAGE", "NORM_AND_STAGE", "GATE_ROUTE_AND_STAGE",
    "GATE_AND_ROUTE", "MHC_AND_STAGE", "SCHEME_FIELDS", "stub_text",
]  # fmt: skip


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


@dataclass(frozen=True)
class Param:
    name: str
    kind: str
    default: Any = REQUIRED
    mutable: bool = False  # the call writes it (an output)
    keyword_only: bool = False


# How the custom op spells a QuantScheme: (field, schema type). Enum fields travel as their
# integer values, the floor as a float (a double that holds the fp32 value exactly).
SCHEME_FIELDS = (
    ("quant_elem", "int"),
    ("quant_scale", "int"),
    ("group_m", "int"),
    ("group_k", "int"),
    ("is_static", "bool"),
    ("symmetric", "bool"),
    ("scale2", "int"),
    ("rounding", "int"),
    ("amax_floor", "float"),
)

_SCHEMA_TYPES = {
    "tensor": "Tensor", "tensor?": "Tensor?", "int?": "int?", "int": "int", "float?": "float?", "float": "float",
    "bool": "bool",
}  # fmt: skip
_STUB_TYPES = {
    "tensor": "Any",
    "tensor?": "Optional[Any]",
    "int?": "Optional[int]",
    "int": "int",
    "float?": "Optional[float]",
    "float": "float",
    "bool": "bool",
    "scheme": "Any",
    "stream": "Optional[int]",
}
_TENSOR_KINDS = ("tensor", "tensor?")


def _as_bool(value: Any, name: str) -> bool:
    """A bool argument: Python or NumPy bools, the ints 0 and 1, one-element tensors."""
    if value is True or value is False:
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if hasattr(value, "dtype"):
        try:
            return bool(value)
        except Exception:  # several elements, or no truth value: reported below
            pass
    raise TypeError(f"megamoe: {name}: expected a bool, got {type(value).__name__}")


# The native module's integer arguments are int64 (sizes, counts, block sizes) and the
# stream a uintptr_t. An int outside them would reach nanobind as "incompatible function
# arguments", naming neither the argument nor the value; it is a ValueError here instead, as
# any other value the library rejects (an int is the right type, just not a possible value).
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_UINTPTR_MAX = 2**64 - 1


def int_text(value: int) -> str:
    """``value`` for an error message: its digits, or its size when they would flood the
    message (and would exceed Python's int-to-str digit limit past 4300 digits)."""
    bits = value.bit_length()
    return str(value) if bits <= 128 else f"a{' negative' if value < 0 else 'n'} int of {bits} bits"


def out_of_range(value: int, name: str, ctype: str = "int64") -> ValueError:
    """The ValueError for an int argument ``name`` that the native ``ctype`` cannot hold."""
    return ValueError(f"megamoe: {name}: {int_text(value)} does not fit in {ctype}")


def optional_int(value: Any, name: str, what: str = "an int") -> Optional[int]:
    """``value`` as an int (anything with ``__index__``), or None; TypeError naming ``name``
    otherwise (no ``int()``: it would turn "12" or 3.7 into a number), ValueError naming it
    for an int outside int64 (what the native module takes)."""
    if value is None:
        return None
    if type(value) is not int:
        try:
            value = operator.index(value)
        except TypeError:
            raise TypeError(f"megamoe: {name}: expected {what} or None, got {type(value).__name__}") from None
    if _INT64_MIN <= value <= _INT64_MAX:
        return value
    raise out_of_range(value, name)


def optional_float(value: Any, name: str) -> Optional[float]:
    """``value`` as a Python float (ints and NumPy / 0-D tensor reals too), or None; an int
    too large for a double is a ValueError naming ``name``, as the library's for a value
    beyond float32's range (float() would raise a bare OverflowError)."""
    if value is None or type(value) is float:
        return value
    if isinstance(value, (str, bytes, bool)) or not hasattr(value, "__float__"):
        raise TypeError(f"megamoe: {name}: expected a float or None, got {type(value).__name__}")
    try:
        return float(value)
    except OverflowError:
        got = int_text(value) if isinstance(value, int) else repr(value)
        raise ValueError(f"megamoe: {name}: expected a value within float32's range, got {got}") from None


def required_int(value: Any, name: str) -> int:
    """``value`` as :func:`optional_int` takes it but None and bools, a TypeError naming
    ``name`` (the argument has a default, so None can only be a mistake; a bool is no count)."""
    if value is None or isinstance(value, bool):
        raise TypeError(f"megamoe: {name}: expected an int, got {type(value).__name__}")
    return optional_int(value, name)


def required_float(value: Any, name: str) -> float:
    """``value`` as :func:`optional_float` takes it but None, a TypeError naming ``name``
    (the argument has a default, so None can only be a mistake)."""
    if value is None or isinstance(value, (str, bytes, bool)) or not hasattr(value, "__float__"):
        raise TypeError(f"megamoe: {name}: expected a float, got {type(value).__name__}")
    return optional_float(value, name)


def stream_int(value: Any) -> int:
    """The ``stream`` argument as the native module's int (None: 0, the legacy default
    stream); ValueError outside a cudaStream_t's range, [0, 2**64)."""
    if value is None:
        return 0
    if type(value) is not int:
        try:
            value = operator.index(value)
        except TypeError:
            raise TypeError(
                f"megamoe: stream: expected an int (a cudaStream_t) or None, got {type(value).__name__}"
            ) from None
    if 0 <= value <= _UINTPTR_MAX:
        return value
    raise out_of_range(value, "stream", "a cudaStream_t (0 <= stream < 2**64)")


class Spec:
    """One entry point's argument table and what derives from it."""

    def __init__(self, name: str, params: Sequence[Param]) -> None:
        self.name = name
        self.params = tuple(params)
        self.names = tuple(p.name for p in self.params)
        self._index = {n: i for i, n in enumerate(self.names)}
        kinds = [(i, p.name, p.kind) for i, p in enumerate(self.params)]
        self._tensors = [(i, n) for i, n, k in kinds if k in _TENSOR_KINDS]
        self._ints = [(i, n) for i, n, k in kinds if k == "int?"]
        self._required_ints = [(i, n) for i, n, k in kinds if k == "int"]
        self._floats = [(i, n) for i, n, k in kinds if k == "float?"]
        self._required_floats = [(i, n) for i, n, k in kinds if k == "float"]
        self._bools = [(i, n) for i, n, k in kinds if k == "bool"]
        self._schemes = [i for i, _, k in kinds if k == "scheme"]
        self._streams = [i for i, _, k in kinds if k == "stream"]
        # from_op_values' steps: n > 0 copies n op values as they are, 0 rebuilds the scheme
        # from its SCHEME_FIELDS values, -1 inserts the stream.
        steps, run = [], 0
        for _, _, k in kinds:
            if k in ("scheme", "stream"):
                steps += [run] if run else []
                steps.append(0 if k == "scheme" else -1)
                run = 0
            else:
                run += 1
        self._from_op_steps = tuple(steps + ([run] if run else []))
        self._n_op = sum(len(SCHEME_FIELDS) if k == "scheme" else k != "stream" for _, _, k in kinds)

    def index(self, name: str) -> int:
        return self._index[name]

    def values(self, **given: Any) -> list:
        """Arguments in table order: those ``given`` by name, the defaults for the rest (for
        wrappers that call an entry point with a few of its arguments)."""
        unknown = set(given) - set(self.names)
        if unknown:
            raise TypeError(f"megamoe: {self.name}: no argument named {sorted(unknown)[0]}")
        out = []
        for p in self.params:
            if p.name in given:
                out.append(given[p.name])
            elif p.default is REQUIRED:
                raise TypeError(f"megamoe: {self.name}: missing argument {p.name}")
            else:
                out.append(p.default)
        return out

    # -- Python signatures ---------------------------------------------------------------

    def signature(self) -> inspect.Signature:
        """The public function's signature (what ``inspect.signature`` of it returns)."""
        out = []
        for p in self.params:
            kind = inspect.Parameter.KEYWORD_ONLY if p.keyword_only else inspect.Parameter.POSITIONAL_OR_KEYWORD
            default = inspect.Parameter.empty if p.default is REQUIRED else p.default
            out.append(inspect.Parameter(p.name, kind, default=default))
        return inspect.Signature(out)

    def make_function(self, name: str, impl: Callable[..., Any], doc: str, module: str = "megamoe") -> Callable[..., Any]:
        """A function called ``name`` with exactly this signature that passes its arguments,
        in table order, to ``impl`` (generated source, as dataclasses do: a real signature at
        the cost of one call)."""
        return _generate(name, self.params, impl, doc, module, keyword_only=True)

    # -- The native module -----------------------------------------------------------------

    def native_args(self, values: Sequence[Any], scheme: Callable[[Any], Any], tensor: Callable[[Any, str], Any] = None) -> list:
        """``values`` (table order) converted for megamoe._C: ints (int64), floats, bools and
        the stream checked, the scheme through ``scheme``, arrays through ``tensor`` (or as they
        are: the binding names what is wrong with them). On every call's path: index lists
        made once, no per-argument dispatch on the kind."""
        out = list(values)
        if tensor is not None:
            for i, name in self._tensors:
                v = out[i]
                if v is not None:
                    out[i] = tensor(v, name)
        for i, name in self._ints:
            v = out[i]
            if v is not None and (type(v) is not int or not _INT64_MIN <= v <= _INT64_MAX):
                out[i] = optional_int(v, name)
        for i, name in self._required_ints:
            v = out[i]
            if type(v) is not int or not _INT64_MIN <= v <= _INT64_MAX:
                out[i] = required_int(v, name)
        for i, name in self._floats:
            v = out[i]
            if v is not None and type(v) is not float:
                out[i] = optional_float(v, name)
        for i, name in self._required_floats:
            if type(out[i]) is not float:
                out[i] = required_float(out[i], name)
        for i, name in self._bools:
            v = out[i]
            if v is not True and v is not False:
                out[i] = _as_bool(v, name)
        for i in self._schemes:
            out[i] = scheme(out[i])
        for i in self._streams:
            out[i] = stream_int(out[i])
        return out

    # -- The custom op ----------------------------------------------------------------------

    def op_params(self) -> list:
        """(name, schema type) of the op's arguments, in order: the stream dropped, the
        scheme spelled out, mutable tensors given alias annotations."""
        out, alias = [], iter("abcdefghijklmnopqrstuvwxyz")
        for p in self.params:
            if p.kind == "stream":
                continue
            if p.kind == "scheme":
                out.extend(SCHEME_FIELDS)
                continue
            t = _SCHEMA_TYPES[p.kind]
            if p.mutable:
                t = f"Tensor({next(alias)}!)" + ("?" if p.kind == "tensor?" else "")
            out.append((p.name, t))
        return out

    def op_schema(self) -> str:
        """The schema of ``torch.ops.megamoe.<name>`` (every argument positional, returns
        nothing: the outputs are written in place)."""
        return "(" + ", ".join(f"{t} {n}" for n, t in self.op_params()) + ") -> ()"

    def mutates_args(self) -> tuple:
        return tuple(p.name for p in self.params if p.mutable)

    def op_names(self) -> tuple:
        return tuple(n for n, _ in self.op_params())

    def make_op_function(self, name: str, impl: Callable[..., Any], doc: str) -> Callable[..., Any]:
        """A function of the op's arguments (positional) passing them on to ``impl``."""
        params = [Param(n, "op") for n in self.op_names()]
        return _generate(name, params, impl, doc, "megamoe._torch", keyword_only=False)

    def op_values(self, values: Sequence[Any], scheme_fields: Callable[[Any], tuple], convert: bool = True) -> list:
        """``values`` (table order) as the op's arguments."""
        out = []
        for p, v in zip(self.params, values):
            if p.kind == "stream":
                continue
            if p.kind == "scheme":
                out.extend(scheme_fields(v))
            elif not convert or p.kind in _TENSOR_KINDS:
                out.append(v)
            elif p.kind == "int?":
                out.append(optional_int(v, p.name))
            elif p.kind == "int":
                out.append(required_int(v, p.name))
            elif p.kind == "float?":
                out.append(optional_float(v, p.name))
            elif p.kind == "float":
                out.append(required_float(v, p.name))
            elif p.kind == "bool":
                out.append(_as_bool(v, p.name))
        return out

    def from_op_values(self, values: Sequence[Any], scheme: Callable[[tuple], Any], stream: int) -> list:
        """The op's arguments back in table order (the scheme rebuilt, the given stream). On
        every op call's path: runs of plain arguments copied as slices, not one by one."""
        if len(values) != self._n_op:
            raise TypeError(f"megamoe: {self.name}: expected {self._n_op} op arguments, got {len(values)}")
        out, pos, n = [], 0, len(SCHEME_FIELDS)
        for step in self._from_op_steps:
            if step > 0:
                out.extend(values[pos : pos + step])
                pos += step
            elif step == 0:
                out.append(scheme(tuple(values[pos : pos + n])))
                pos += n
            else:
                out.append(stream)
        return out

    # -- The stub -------------------------------------------------------------------------------

    def stub(self, name: str, doc: str) -> str:
        parts, star = [], False
        for p in self.params:
            if p.keyword_only and not star:
                parts.append("*")
                star = True
            ann = _STUB_TYPES[p.kind]
            if p.default is REQUIRED:
                parts.append(f"{p.name}: {ann}")
            else:
                default = "..." if p.kind == "scheme" else repr(p.default)
                parts.append(f"{p.name}: {ann} = {default}")
        returns = "str" if name.startswith("explain") else "None"  # explain*: the plan as text
        head = f"def {name}(\n" + "".join(f"    {a},\n" for a in parts) + f") -> {returns}:"
        return head + f'\n    """{doc}"""\n'


def _generate(name: str, params: Sequence[Param], impl: Callable[..., Any], doc: str, module: str,
              keyword_only: bool) -> Callable[..., Any]:  # fmt: skip
    namespace: dict = {"__impl": impl}
    args, star = [], False
    for p in params:
        if keyword_only and p.keyword_only and not star:
            args.append("*")
            star = True
        if p.default is REQUIRED:
            args.append(p.name)
        else:
            namespace[f"__default_{p.name}"] = p.default
            args.append(f"{p.name}=__default_{p.name}")
    call = ", ".join(p.name for p in params)
    source = f"def {name}({', '.join(args)}):\n    return __impl({call})\n"
    exec(compile(source, f"<megamoe {name}>", "exec"), namespace)  # noqa: S102 - our own text
    fn = namespace[name]
    fn.__doc__ = doc
    fn.__module__ = module
    fn.__qualname__ = name
    return fn


def _scheme_default() -> Any:
    from ._C import QuantScheme

    return QuantScheme.mxfp8()


# The staging outputs and options of prepare_megamoe_inputs from x_fp8 on (positional, in
# vLLM's order), which route_and_stage takes as well.
_STAGED = (
    Param("x_fp8", "tensor", mutable=True),
    # Required, but None for a scheme without scales (BF16: x_sf may be None or [T, 0]).
    Param("x_sf", "tensor?", mutable=True),
    Param("topk_idx_out", "tensor", mutable=True),
    Param("topk_weights_out", "tensor", mutable=True),
    Param("is_padding", "tensor?", None),
    Param("shared_x_sf", "tensor?", None, mutable=True),
    Param("shared_block_m", "int?", None),
    Param("hidden_quant", "scheme", _scheme_default()),
)
# The staging's keyword-only additions (megamoe's, not vLLM's).
_STAGE_OPTIONS = (
    # NVFP4 static reads it, NVFP4 online writes it: declared written for the torch op.
    Param("global_scale", "tensor?", None, mutable=True, keyword_only=True),
    Param("x_scales", "tensor?", None, mutable=True, keyword_only=True),
    Param("nonfinite_count", "tensor?", None, mutable=True, keyword_only=True),
    Param("full_buffer", "bool", False, keyword_only=True),
)
_LAUNCH = (
    Param("stream", "stream", None, keyword_only=True),
    Param("enable_pdl", "bool", False, keyword_only=True),
)

PREPARE = Spec(
    "prepare_inputs",
    [
        # vLLM's prepare_megamoe_inputs, positional order and defaults unchanged
        Param("hidden_states", "tensor"),
        Param("topk_weights", "tensor"),
        Param("topk_ids", "tensor"),
        *_STAGED,
        # megamoe's additions, keyword-only
        *_STAGE_OPTIONS,
        Param("routed_scaling_factor", "float?", None, keyword_only=True),
        Param("expert_scales", "tensor?", None, keyword_only=True),
        *_LAUNCH,
    ],
)

ROUTING = Spec(
    "stage_routing",
    [
        Param("topk_weights", "tensor"),
        Param("topk_ids", "tensor"),
        Param("topk_idx_out", "tensor", mutable=True),
        Param("topk_weights_out", "tensor", mutable=True),
        Param("is_padding", "tensor?", None),
        Param("full_buffer", "bool", False, keyword_only=True),
        Param("routed_scaling_factor", "float?", None, keyword_only=True),
        Param("expert_scales", "tensor?", None, keyword_only=True),
        Param("stream", "stream", None, keyword_only=True),
        Param("enable_pdl", "bool", False, keyword_only=True),
    ],
)

# The fused DeepSeek-V4 router (include/megamoe/router.h; names are vLLM's). The logits,
# the bias (required, None for hash layers or no bias: a forgotten bias would change the
# selection silently) and the public top-k it writes come first.
_ROUTER_HEAD = (
    Param("router_logits", "tensor"),
    Param("e_score_correction_bias", "tensor?"),
    Param("topk_weights", "tensor", mutable=True),
    Param("topk_ids", "tensor", mutable=True),
)
# Every other option of megamoe::RouterArgs, keyword-only (top_k None: topk_ids.shape[1];
# routed_scaling_factor None: no scaling).
_ROUTER_OPTIONS = (
    Param("top_k", "int?", None, keyword_only=True),
    Param("routed_scaling_factor", "float?", None, keyword_only=True),
    Param("tid2eid", "tensor?", None, keyword_only=True),
    Param("input_ids", "tensor?", None, keyword_only=True),
    Param("logical_to_physical_map", "tensor?", None, keyword_only=True),
    Param("logical_replica_count", "tensor?", None, keyword_only=True),
    Param("expert_load_view", "tensor?", None, mutable=True, keyword_only=True),
    Param("record_enabled", "tensor?", None, keyword_only=True),
)

ROUTE = Spec(
    "route",
    [
        *_ROUTER_HEAD,
        Param("is_padding", "tensor?", None),
        *_ROUTER_OPTIONS,
        Param("nonfinite_count", "tensor?", None, mutable=True, keyword_only=True),  # of the logits
        *_LAUNCH,
    ],
)

ROUTE_AND_STAGE = Spec(
    "route_and_stage",
    [
        Param("hidden_states", "tensor"),
        *_ROUTER_HEAD,
        *_STAGED,
        *_ROUTER_OPTIONS,
        # two counters: the logits' (the router's) and the hidden states' (the staging's)
        Param("logits_nonfinite_count", "tensor?", None, mutable=True, keyword_only=True),
        *_STAGE_OPTIONS,
        *_LAUNCH,
    ],
)

# RMSNorm then staging (include/megamoe/norm.h): prepare_megamoe_inputs' positional order
# with the norm's inputs in place of hidden_states. The residual is required, None allowed
# (as route's bias: a forgotten residual would change the result silently); the weight is
# positional as in vLLM's rms_norm / fused_add_rms_norm. eps and the norm's optional
# outputs are keyword-only; y may be x and residual_out residual (in place).
NORM_AND_STAGE = Spec(
    "rmsnorm_and_stage",
    [
        Param("x", "tensor"),
        Param("residual", "tensor?"),
        Param("weight", "tensor"),
        Param("topk_weights", "tensor"),
        Param("topk_ids", "tensor"),
        *_STAGED,
        Param("eps", "float", 1e-6, keyword_only=True),
        Param("y", "tensor?", None, mutable=True, keyword_only=True),
        Param("residual_out", "tensor?", None, mutable=True, keyword_only=True),
        *_STAGE_OPTIONS,
        Param("routed_scaling_factor", "float?", None, keyword_only=True),
        Param("expert_scales", "tensor?", None, keyword_only=True),
        *_LAUNCH,
    ],
)

# Gate, route and stage (include/megamoe/gate.h): route_and_stage's arguments with the gate
# weight (vLLM's gate.weight, [E, H]) in place of router_logits: the logits are computed in
# the call. y, the gate's input rows, is keyword-only and defaults to hidden_states (None);
# logits_out optionally receives the logits.
GATE_ROUTE_AND_STAGE = Spec(
    "gate_route_and_stage",
    [
        Param("hidden_states", "tensor"),
        Param("weight", "tensor"),
        *_ROUTER_HEAD[1:],
        *_STAGED,
        *_ROUTER_OPTIONS,
        Param("y", "tensor?", None, keyword_only=True),
        Param("logits_out", "tensor?", None, mutable=True, keyword_only=True),
        Param("logits_nonfinite_count", "tensor?", None, mutable=True, keyword_only=True),
        *_STAGE_OPTIONS,
        *_LAUNCH,
    ],
)

# The gate and the router without staging: route's arguments with the gate's input rows y
# and weight in place of router_logits; logits_out keyword-only.
GATE_AND_ROUTE = Spec(
    "gate_and_route",
    [
        Param("y", "tensor"),
        Param("weight", "tensor"),
        *_ROUTER_HEAD[1:],
        Param("is_padding", "tensor?", None),
        *_ROUTER_OPTIONS,
        Param("logits_out", "tensor?", None, mutable=True, keyword_only=True),
        Param("nonfinite_count", "tensor?", None, mutable=True, keyword_only=True),  # of the logits
        *_LAUNCH,
    ],
)

# mHC pre, RMSNorm, then staging (include/megamoe/mhc.h): vLLM's mhc_pre inputs (residual,
# fn, hc_scale, hc_base) then the layer's norm weight, the mHC outputs the caller allocates
# (post_mix, comb_mix: the library allocates nothing), then prepare_megamoe_inputs' staging
# in its positional order; mHC's scalars (vLLM's names and DeepSeek-V4's values as defaults)
# and its optional tensors keyword-only.
MHC_AND_STAGE = Spec(
    "mhc_pre_and_stage",
    [
        Param("residual", "tensor"),
        Param("fn", "tensor"),
        Param("hc_scale", "tensor"),
        Param("hc_base", "tensor"),
        Param("norm_weight", "tensor"),
        Param("post_mix", "tensor", mutable=True),
        Param("comb_mix", "tensor", mutable=True),
        Param("topk_weights", "tensor"),
        Param("topk_ids", "tensor"),
        *_STAGED,
        Param("rms_eps", "float", 1e-6, keyword_only=True),
        Param("hc_pre_eps", "float", 1e-6, keyword_only=True),
        Param("hc_sinkhorn_eps", "float", 1e-6, keyword_only=True),
        Param("hc_post_mult_value", "float", 2.0, keyword_only=True),
        Param("sinkhorn_repeat", "int", 20, keyword_only=True),
        Param("norm_eps", "float", 1e-6, keyword_only=True),
        Param("pre_mix_in", "tensor?", None, keyword_only=True),
        Param("pre_mix", "tensor?", None, mutable=True, keyword_only=True),
        Param("layer_input", "tensor?", None, mutable=True, keyword_only=True),
        Param("y", "tensor?", None, mutable=True, keyword_only=True),
        *_STAGE_OPTIONS,
        Param("routed_scaling_factor", "float?", None, keyword_only=True),
        Param("expert_scales", "tensor?", None, keyword_only=True),
        *_LAUNCH,
    ],
)

# (public name, spec, one-line doc) of the generated functions; _entry.pyi describes them.
ENTRY_POINTS = (
    ("prepare_megamoe_inputs", PREPARE, "Quantize hidden states and repack top-k routing for DeepGEMM MegaMoE."),
    ("explain", PREPARE, "What prepare_megamoe_inputs would launch for these arguments, as text."),
    ("stage_megamoe_routing", ROUTING, "Routing-only staging (vLLM's stage_megamoe_routing)."),
    ("explain_routing", ROUTING, "What stage_megamoe_routing would launch for these arguments, as text."),
    ("route", ROUTE, "The fused DeepSeek-V4 router alone: router logits to the public top-k."),
    ("explain_route", ROUTE, "What route would launch for these arguments, as text."),
    ("route_and_stage", ROUTE_AND_STAGE, "Route (DeepSeek-V4 router) and stage for DeepGEMM MegaMoE in one call."),
    ("explain_route_and_stage", ROUTE_AND_STAGE, "What route_and_stage would launch for these arguments, as text."),
    ("rmsnorm_and_stage", NORM_AND_STAGE, "RMSNorm (optional residual add) and stage the normalized rows in one call."),
    ("explain_rmsnorm_and_stage", NORM_AND_STAGE, "What rmsnorm_and_stage would launch for these arguments, as text."),
    ("gate_route_and_stage", GATE_ROUTE_AND_STAGE, "Gate (logits in a fixed fp32 order), route and stage in one call."),
    ("explain_gate_route_and_stage", GATE_ROUTE_AND_STAGE, "What gate_route_and_stage would run for these arguments, as text."),
    ("gate_and_route", GATE_AND_ROUTE, "Gate (logits in a fixed fp32 order) and route in one call, without staging."),
    ("explain_gate_and_route", GATE_AND_ROUTE, "What gate_and_route would run for these arguments, as text."),
    ("mhc_pre_and_stage", MHC_AND_STAGE, "DeepSeek-V4's mHC pre step, RMSNorm and staging of the rows in one call."),
    ("explain_mhc_pre_and_stage", MHC_AND_STAGE, "What mhc_pre_and_stage would run for these arguments, as text."),
)


def stub_text() -> str:
    """The text of python/megamoe/_entry.pyi."""
    head = (
        "# Generated from megamoe/_signature.py; do not edit. Regenerate with\n"
        "#   python -c 'import megamoe._signature as s; print(s.stub_text(), end=\"\")' > python/megamoe/_entry.pyi\n"
        "# (tests/python/test_signature.py checks that this file is that text).\n"
        "from typing import Any, Optional\n"
    )
    return head + "".join("\n\n" + spec.stub(name, doc) for name, spec, doc in ENTRY_POINTS)

