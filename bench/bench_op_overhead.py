#!/usr/bin/env python3
"""Per-call eager host cost of the custom op torch.ops.megamoe.prepare_inputs against the
direct call, with empty custom ops of the same registration style as the floor.

Calls (T = 1, H = 7168, MXFP8, K = 8, eager, no graph; wall time of N back-to-back calls,
the variants interleaved round by round so that host drift hits them alike):
  direct              megamoe.prepare_megamoe_inputs (plain eager: one nanobind call)
  op                  torch.ops.megamoe.prepare_inputs (the OpOverloadPacket)
  op_default          torch.ops.megamoe.prepare_inputs.default (the OpOverload)
  op_kernel           the op's kernel function called as a Python function (no dispatcher)
  empty_same_schema   a torch.library.custom_op with the op's schema and mutated arguments
                      whose kernel does nothing (the floor the op's registration costs)
  empty_one_tensor    a torch.library.custom_op "(Tensor(a!) x) -> ()" doing nothing
op - empty_same_schema is what the library work and argument conversion add inside the op;
empty_same_schema - empty_one_tensor is what the schema's 25 arguments cost the dispatcher.

    python3 bench/bench_op_overhead.py --out DIR [--n 3000] [--rounds 7]
    python3 bench/bench_op_overhead.py --dry-run | --cpu-check
Writes op_overhead.jsonl to --out.
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchutil import Rows, dry_run, header  # noqa: E402

CALLS = ("direct", "op", "op_default", "op_kernel", "empty_same_schema", "empty_one_tensor")


def make_calls(torch, megamoe, dev, T=1, H=7168, K=8):
    from megamoe._signature import PREPARE
    from megamoe._torch import _op_scheme_args, _prepare_kernel

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
    op_args = PREPARE.op_values(values, _op_scheme_args)

    def nothing(*a):
        return None

    # Registered as megamoe._torch registers its ops (custom_op + register_fake), under a
    # namespace of the benchmark's own; the names carry the pid so a second run in one
    # process (the tests) registers afresh.
    ns = f"megamoe_bench{os.getpid()}_{int(time.time() * 1e6) % 10**9}"
    empty = torch.library.custom_op(f"{ns}::prepare_inputs_empty",
                                    PREPARE.make_op_function("prepare_inputs_empty", nothing, "no-op"),
                                    mutates_args=PREPARE.mutates_args(), device_types=("cuda", "cpu"),
                                    schema=PREPARE.op_schema())
    empty.register_fake(PREPARE.make_op_function("prepare_inputs_empty_fake", nothing, "no-op"))

    def touch(x):
        return None

    one = torch.library.custom_op(f"{ns}::touch", touch, mutates_args=("x",), device_types=("cuda", "cpu"),
                                  schema="(Tensor(a!) x) -> ()")
    one.register_fake(touch)
    op = torch.ops.megamoe.prepare_inputs
    return {
        "direct": lambda: megamoe.prepare_megamoe_inputs(hs, w, ids, xq, sf, io, wo, is_padding=pad),
        "op": lambda: op(*op_args),
        "op_default": lambda: op.default(*op_args),
        "op_kernel": lambda: _prepare_kernel(*op_args),
        "empty_same_schema": lambda: empty(*op_args),
        "empty_one_tensor": lambda: one(xq),
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
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--cpu-check", action="store_true", help="CPU tensors, few calls: the code path only")
    args = ap.parse_args(argv)
    if args.dry_run:
        return dry_run([dict(call=c, n=args.n, rounds=args.rounds) for c in CALLS],
                       os.path.join(args.out, "op_overhead.jsonl"))
    import torch

    import megamoe

    dev = "cpu" if args.cpu_check else "cuda"
    if args.cpu_check:
        args.n, args.rounds = min(args.n, 30), min(args.rounds, 2)
    calls, outs = make_calls(torch, megamoe, dev)
    # The op, its OpOverload, its kernel and the direct call write the same bytes.
    ref = None
    for name in ("direct", "op", "op_default", "op_kernel"):
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
    rows.write(header(n=args.n, rounds=args.rounds, T=1, H=7168, cpu_check=args.cpu_check))
    per = measure(torch, calls, args.n, args.rounds, sync)
    med = {}
    for name, v in per.items():
        med[name] = statistics.median(v)
        rows.write(dict(kind="op_overhead", call=name, us_median=med[name], us_min=min(v), us_max=max(v),
                        rounds=v))
    rows.write(dict(kind="op_overhead_summary", op_minus_direct_us=med["op"] - med["direct"],
                    op_minus_empty_same_schema_us=med["op"] - med["empty_same_schema"],
                    empty_same_schema_minus_one_tensor_us=med["empty_same_schema"] - med["empty_one_tensor"],
                    dispatcher_us=med["op"] - med["op_kernel"]))
    rows.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
