#!/usr/bin/env python3
"""Merge the runs of scripts/device.sh's ab-formats step (no torch, no GPU needed).

    python3 bench/ab_formats_merge.py DIR OUT

DIR holds one folder per run, named by the build and the run's number (this1, base1,
this2, base2, and for each extra build of AB_MORE its name: f16mul1, f16mul2, ...), each
with the formats.jsonl of `bench/bench_formats.py --parts formats`. The runs of all builds
alternate in one device session, so that drift of the machine hits each. Per (format, H,
T): each build's median time, the same-run copy's median, and each build's ratio to the
base (this_us / base_us as `ratio`; <name>_us / base_us as `<name>_ratio`). Writes one
JSON row per configuration to OUT and prints them; exits 1 when no row has both this and
base.
"""
import glob
import json
import os
import re
import statistics
import sys


def load(d):
    """{(format, H, T): {"copy": [...], build: [megamoe_us, ...]}} over the runs in d."""
    rows = {}
    for f in sorted(glob.glob(os.path.join(d, "*", "formats.jsonl"))):
        build = re.sub(r"\d+$", "", os.path.basename(os.path.dirname(f)))
        for line in open(f):
            r = json.loads(line)
            e = rows.setdefault((r["format"], r["H"], r["T"]), {"copy": []})
            e.setdefault(build, []).append(r["megamoe_us"])
            e["copy"].append(r["copy_us"])
    return rows


def merge(rows):
    out = []
    for (fmt, H, T), e in sorted(rows.items()):
        if not e.get("this") or not e.get("base"):
            continue
        b, c = statistics.median(e["base"]), statistics.median(e["copy"])
        t = statistics.median(e["this"])
        row = dict(format=fmt, H=H, T=T, this_us=t, base_us=b, copy_us=c, ratio=round(t / b, 4),
                   this_frac_copy=round(c / t, 4), base_frac_copy=round(c / b, 4), this_runs=e["this"],
                   base_runs=e["base"])
        for name in sorted(k for k in e if k not in ("this", "base", "copy")):
            v = statistics.median(e[name])
            row.update({f"{name}_us": v, f"{name}_ratio": round(v / b, 4), f"{name}_frac_copy": round(c / v, 4),
                        f"{name}_runs": e[name]})
        out.append(row)
    return out


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    rows = merge(load(argv[0]))
    with open(argv[1], "w") as o:
        for row in rows:
            o.write(json.dumps(row) + "\n")
            print(json.dumps(row))
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
