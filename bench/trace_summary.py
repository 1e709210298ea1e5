#!/usr/bin/env python3
"""Medians of a trace build's phase lines (dev/trace/; scripts/device.sh trace).

    python3 bench/trace_summary.py FILE...   one JSON object per (file, kernel, block, thread)

Each input holds one `megamoe_bench_kernel --one-format SCHEME T H CALLS graph|sync` run;
its device lines read `TRACE name b=B t=T sm=S g0=NS g1=NS d=P1 .. P6 END`: the points as
SM cycles from the block's start (-1: not reached) and the block's end. The first tenth of
each key's lines (the first calls) is dropped. Block numbers above 7 are the grid's last
block ("last"). Out: the medians of every point and of the end, and of the block's
globaltimer span in ns.
"""
import json
import re
import statistics
import sys
from collections import defaultdict

LINE = re.compile(r"TRACE (\S+) b=(\d+) t=(\d+) sm=\d+ g0=(\d+) g1=(\d+) d=(.*)")


def summarize(path):
    rows = defaultdict(list)
    with open(path) as f:
        for line in f:
            m = LINE.match(line.strip())
            if not m:
                continue
            name, b, t, g0, g1, d = m.groups()
            points = [int(v) for v in d.split()]
            block = int(b) if int(b) < 8 else "last"
            rows[(name, block, int(t))].append(points + [int(g1) - int(g0)])
    out = []
    order = lambda kv: (kv[0][0], kv[0][1] if kv[0][1] != "last" else 8, kv[0][2])  # noqa: E731
    for (name, block, t), v in sorted(rows.items(), key=order):
        v = v[len(v) // 10:]
        med = [int(statistics.median(x[i] for x in v)) for i in range(len(v[0]))]
        out.append(dict(file=path.rsplit("/", 1)[-1], kernel=name, block=block, thread=t, n=len(v),
                        points=[p if p >= 0 else None for p in med[:-2]], end=med[-2], span_ns=med[-1]))
    return out


def main(paths):
    if not paths:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    for p in paths:
        for r in summarize(p):
            print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
