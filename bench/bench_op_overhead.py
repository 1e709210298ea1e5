#!/usr/bin/env python3
"""Per-call eager host cost of the op torch.ops.megamoe.prepare_inputs against the direct
call, with empty ops of each registration style as that style's floor.

Calls (T = 1, H = 7168, MXFP8, K = 8, eager, no graph; wall time of N back-to-back calls,
the variants interleaved round by round so that host drift hits them alike):
  direct                    megamoe.prepare_megamoe_inputs (plain eager: one nanobind call)
  op                        torch.ops.megamoe.prepare_inputs (the OpOverloadPacket), registered
                            as megamoe._torch registers it: torch.library.Library.define +
                            Library.impl on megamoe._torch.DISPATCH_KEYS + register_fake
  op_default                torch.ops.megamoe.prepare_inputs.default (the OpOverload)
  op_kernel                 the op's kernel function called as a Python function (no dispatcher)
  op_custom_op              the same kernel registered with torch.library.custom_op (+
                            register_fake), the registration megamoe used before
  empty_library             an op of megamoe's registration style (Library, the same keys, tags
                            and fake) with the op's schema, whose kernel does nothing: the floor
                            of the op's registration
  empty_library_composite   the same with its kernel on CompositeExplicitAutograd
  empty_same_schema         a torch.library.custom_op with the op's schema and mutated arguments
                            whose kernel does nothing: the floor of op_custom_op
  empty_one_tensor          a torch.library.custom_op "(Tensor(a!) x) -> ()" doing nothing
  empty_library_one_tensor  the same schema in megamoe's style (Library, its keys and tags)
  empty_library_then_direct empty_library and then direct, one after the other per call: the
                            op's floor plus the library work with nothing between them (what
                            the op would cost if its kernel added nothing to the direct call)
op - empty_library_then_direct is what the op adds to its floor and the direct call (the
argument conversion in its kernel; what the two cost when interleaved counts in both);
op - empty_library is what the library work and argument conversion add inside the op (as
is op_custom_op - empty_same_schema for the custom_op style); empty_same_schema -
empty_library is what custom_op's wrappers cost; empty_library - empty_library_one_tensor
(and empty_same_schema - empty_one_tensor) is what the schema's 25 arguments cost the
dispatcher.

    python3 bench/bench_op_overhead.py --out DIR [--n 3000] [--rounds 7] [--device cuda|cpu]
    python3 bench/bench_op_overhead.py --dry-run | --cpu-check
Writes op_overhead.jsonl to --out (--device cpu: CPU tensors, the CPU backend, full counts;
--cpu-check: CPU tensors and few calls, the code path only, nothing written).
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchutil import Rows, dry_run, header  # noqa: E402

CALLS = ("direct", "op", "op_default", "op_kernel", "op_custom_op", "empty_library", "empty_library_composite",
         "empty_same_schema", "empty_one_tensor", "empty_library_one_tensor", "empty_library_then_direct")
# The calls that write the staging bytes (checked against the direct call before timing).
STAGING = ("direct", "op", "op_default", "op_kernel", "op_custom_op", "empty_library_then_direct")
FLOOR = "empty_library"  # the floor of the op's own registration style

# The benchmark's torch.library.Library objects: a collected Library takes its ops with it.
_LIBS = []


def _library_op(torch, mt, ns, keys):
    """An op doing nothing, of the op's schema, registered by megamoe._torch's own
    registration function (Library define / impl on ``keys`` / register_fake)."""
    from megamoe._signature import PREPARE

    lib = torch.library.Library(ns, "DEF")
    _LIBS.append(lib)
    return mt._define(lib, PREPARE, "prepare_inputs_empty", lambda *a: None, "no-op", keys)


def _custom_op(torch, qualname, spec, kernel, fake):
    """A torch.library.custom_op as megamoe registered its ops before (custom_op + register_fake)."""
    name = qualname.split("::")[1]
    op = torch.library.custom_op(qualname, spec.make_op_function(name, kernel, "benchmark op"),
                                 mutates_args=spec.mutates_args(), device_types=("cuda", "cpu"),
                                 schema=spec.op_schema())  # fmt: skip
    op.register_fake(spec.make_op_function(f"{name}_fake", fake, "no-op"))
    return op


def make_calls(torch, megamoe, dev, T=1, H=7168, K=8):
    from megamoe import _torch as mt
    from megamoe._signature import PREPARE

    gen = torch.Generator(device=dev).manual_seed(1)
    hs = (torch.randn(T, H, device=dev, generator=gen) * 17).bfloat16()
    ids = torch.randint(0, 256, (T, K), device=dev, dtype=torch.int32, generator=gen)
    w = torch.rand(T, K, device=dev, generator=gen)
    pad = torch.zeros(T, dtype=torch.bool, device=dev)
    xq = torch.empty(T, H, dtype=torch.uint8, device=dev)
    sf = torch.empty(T, H // 128, dtype=torch.int32, device=dev)
    io = torch.empty(T, K, dtype=torch.int64, device=dev)
    wo = torch.empty(T, K, dtype=torch.float32, device=dev)
    values = [None] * len(PREPARE.params)
    given = dict(hidden_states=hs, topk_weights=w, topk_ids=ids, x_fp8=xq, x_sf=sf, topk_idx_out=io,
                 topk_weights_out=wo, is_padding=pad, hidden_quant=megamoe.MXFP8, full_buffer=False,
                 enable_pdl=False)
    for i, p in enumerate(PREPARE.params):
        values[i] = given.get(p.name, p.default)
    op_args = PREPARE.op_values(values, mt._op_scheme_args)

    def nothing(*a):
        return None

    # Under namespaces of the benchmark's own; the names carry the pid and the time so that
    # a second run in one process (the tests) registers afresh.
    ns = f"megamoe_bench{os.getpid()}_{int(time.time() * 1e6) % 10**9}"
    empty_lib = _library_op(torch, mt, f"{ns}_lib", mt.DISPATCH_KEYS)
    empty_cea = _library_op(torch, mt, f"{ns}_cea", ("CompositeExplicitAutograd",))
    empty = _custom_op(torch, f"{ns}::prepare_inputs_empty", PREPARE, nothing, nothing)
    custom = _custom_op(torch, f"{ns}::prepare_inputs", PREPARE, mt._prepare_kernel, nothing)

    def touch(x):
        return None

    one = torch.library.custom_op(f"{ns}::touch", touch, mutates_args=("x",), device_types=("cuda", "cpu"),
                                  schema="(Tensor(a!) x) -> ()")
    one.register_fake(touch)
    lib = torch.library.Library(f"{ns}_one", "DEF")
    _LIBS.append(lib)
    lib.define("touch(Tensor(a!) x) -> ()", tags=mt.TAGS)
    for key in mt.DISPATCH_KEYS:
        lib.impl("touch", touch, key)
    torch.library.register_fake(f"{ns}_one::touch", touch, lib=lib)
    one_lib = getattr(torch.ops, f"{ns}_one").touch
    op = torch.ops.megamoe.prepare_inputs

    def direct():
        megamoe.prepare_megamoe_inputs(hs, w, ids, xq, sf, io, wo, is_padding=pad)

    def empty_then_direct():
        empty_lib(*op_args)
        direct()

    return {
        "direct": direct,
        "op": lambda: op(*op_args),
        "op_default": lambda: op.default(*op_args),
        "op_kernel": lambda: mt._prepare_kernel(*op_args),
        "op_custom_op": lambda: custom(*op_args),
        "empty_library": lambda: empty_lib(*op_args),
        "empty_library_composite": lambda: empty_cea(*op_args),
        "empty_same_schema": lambda: empty(*op_args),
        "empty_one_tensor": lambda: one(xq),
        "empty_library_one_tensor": lambda: one_lib(xq),
        "empty_library_then_direct": empty_then_direct,
    }, (xq, sf, io, wo)


def measure(torch, calls, n, rounds, sync):
    per = {k: [] for k in calls}
    for f in calls.values():  # warm-up: dispatcher caches, first-call paths
        for _ in range(min(200, n)):
            f()
    sync()
    for _ in range(rounds):
        for name, f in calls.items():
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            t1 = time.perf_counter()
            sync()
            per[name].append((t1 - t0) / n * 1e6)
    return per


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--n", type=int, default=3000, help="calls per round and variant")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="where the tensors live (cpu: the CPU backend does the staging work)")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--cpu-check", action="store_true", help="CPU tensors, few calls: the code path only")
    args = ap.parse_args(argv)
    if args.dry_run:
        return dry_run([dict(call=c, n=args.n, rounds=args.rounds, device=args.device) for c in CALLS],
                       os.path.join(args.out, "op_overhead.jsonl"))
    import torch

    import megamoe
    from megamoe import _torch as mt

    dev = "cpu" if args.cpu_check else args.device
    if args.cpu_check:
        args.n, args.rounds = min(args.n, 30), min(args.rounds, 2)
    calls, outs = make_calls(torch, megamoe, dev)
    # The op, its OpOverload, its kernel, its custom_op twin and the direct call write the
    # same bytes.
    ref = None
    for name in STAGING:
        for o in outs:
            o.view(torch.uint8).fill_(0xA5)
        calls[name]()
        got = [o.clone() for o in outs]
        if ref is None:
            ref = got
        elif not all(torch.equal(a, b) for a, b in zip(ref, got)):
            print(json.dumps(dict(kind="error", call=name, msg="bytes differ from the direct call")))
            return 1
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    rows = Rows(None if args.cpu_check else os.path.join(args.out, "op_overhead.jsonl"))
    rows.write(header(n=args.n, rounds=args.rounds, T=1, H=7168, cpu_check=args.cpu_check, tensor_device=dev,
                      dispatch_keys=list(mt.DISPATCH_KEYS)))  # fmt: skip
    per = measure(torch, calls, args.n, args.rounds, sync)
    med = {}
    for name, v in per.items():
        med[name] = statistics.median(v)
        rows.write(dict(kind="op_overhead", call=name, us_median=med[name], us_min=min(v), us_max=max(v),
                        rounds=v))
    rows.write(dict(kind="op_overhead_summary", floor=FLOOR,
                    op_minus_direct_us=med["op"] - med["direct"],
                    op_over_direct=med["op"] / med["direct"],
                    op_minus_floor_us=med["op"] - med[FLOOR],
                    op_minus_floor_then_direct_us=med["op"] - med["empty_library_then_direct"],
                    dispatcher_us=med["op"] - med["op_kernel"],
                    op_custom_op_minus_direct_us=med["op_custom_op"] - med["direct"],
                    op_custom_op_minus_empty_same_schema_us=med["op_custom_op"] - med["empty_same_schema"],
                    empty_same_schema_minus_empty_library_us=med["empty_same_schema"] - med["empty_library"],
                    empty_library_composite_minus_empty_library_us=med["empty_library_composite"] - med["empty_library"],
                    empty_library_minus_one_tensor_us=med["empty_library"] - med["empty_library_one_tensor"],
                    empty_same_schema_minus_one_tensor_us=med["empty_same_schema"] - med["empty_one_tensor"]))
    rows.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
