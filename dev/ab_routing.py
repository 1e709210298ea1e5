"""Routing-only staging (megamoe.stage_megamoe_routing) timed on the GPU, for an A/B of two
builds of the package: run it once per build (PYTHONPATH picks the build) and compare the
rows. CUDA-graph replays (bench/benchutil.py), T x K = 8 entries, plain and full-buffer
(rows T..4T-1 the tail), fp32 weights, int32 ids, routed scaling 2.5.

    PYTHONPATH=/tmp/pkg-a python3 dev/ab_routing.py --label a >> ab_routing.jsonl
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

import benchutil  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", required=True)
    ap.add_argument("--T", default="1,64,1024,16384,131072")
    args = ap.parse_args()
    import torch

    import megamoe

    bench = benchutil.timer("cuda")
    K = 8
    for T in (int(t) for t in args.T.split(",")):
        for full in (False, True):
            M = 4 * T if full else T
            g = torch.Generator(device="cuda").manual_seed(T)
            w = torch.rand((T, K), device="cuda", generator=g)
            ids = torch.randint(0, 256, (T, K), device="cuda", dtype=torch.int32, generator=g)
            io = torch.empty((M, K), device="cuda", dtype=torch.int64)
            wo = torch.empty((M, K), device="cuda", dtype=torch.float32)

            def fn():
                megamoe.stage_megamoe_routing(w, ids, io, wo, full_buffer=full, routed_scaling_factor=2.5)

            fn()
            torch.cuda.synchronize()
            us = bench(fn)
            print(json.dumps(dict(label=args.label, T=T, M=M, K=K, full_buffer=full, us=round(us, 3),
                                  megamoe=getattr(megamoe, "__file__", ""))), flush=True)


if __name__ == "__main__":
    main()
