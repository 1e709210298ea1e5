#!/usr/bin/env python3
"""Same-run A/B of two builds from bench/bench_stage.py results (no torch, no GPU needed).

    python3 bench/ab_compare.py --this this1.json this2.json --base base1.json base2.json \\
        [--tol 0.02] [--out ab.jsonl]

Each file is one `bench_stage.py --only megamoe` run; runs of the two builds alternate in
one device session (this, base, this, base) so that drift of the machine hits both. Per
row (H, scheme, T): the median megamoe time of each build's runs, their ratio, and the
spread between runs of the same build (the noise). A row passes when this build is within
--tol of the base (|this / base - 1| <= tol); `within_noise` says whether the difference is
smaller than the larger of the two builds' own spreads. Prints a markdown table, writes one
JSON row per configuration to --out, and exits 1 when a row fails.
"""
import argparse
import json
import statistics
import sys


def load(paths):
    """{(H, scheme, T): [megamoe_us, ...]} over the runs in `paths`."""
    by = {}
    for p in paths:
        with open(p) as f:
            res = json.load(f)
        for r in res["rows"]:
            if r.get("megamoe_us") is None:
                continue
            by.setdefault((r["H"], r["scheme"], r["T"]), []).append(r["megamoe_us"])
    return by


def spread(v):
    return (max(v) - min(v)) / statistics.median(v) if len(v) > 1 else 0.0


def compare(this, base, tol):
    rows = []
    for key in sorted(set(this) & set(base)):
        a, b = this[key], base[key]
        ma, mb = statistics.median(a), statistics.median(b)
        rel = ma / mb - 1.0
        noise = max(spread(a), spread(b))
        rows.append(dict(kind="ab", H=key[0], scheme=key[1], T=key[2], this_us=ma, base_us=mb, this_runs_us=a,
                         base_runs_us=b, this_over_base_minus_1=rel, noise=noise, within_tol=abs(rel) <= tol,
                         within_noise=abs(rel) <= noise))
    missing = sorted(set(this) ^ set(base))
    return rows, missing


def markdown(rows, tol):
    out = [f"| H | scheme | T | this us | base us | this / base - 1 | noise | within {100 * tol:.0f}% |",
           "|---:|---|---:|---:|---:|---:|---:|:---:|"]
    for r in rows:
        out.append(f"| {r['H']} | {r['scheme']} | {r['T']} | {r['this_us']:.2f} | {r['base_us']:.2f} | "
                   f"{100 * r['this_over_base_minus_1']:+.1f}% | {100 * r['noise']:.1f}% | "
                   f"{'yes' if r['within_tol'] else 'NO'} |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--this", nargs="+", required=True, help="bench_stage JSON of this build's runs")
    ap.add_argument("--base", nargs="+", required=True, help="bench_stage JSON of the base build's runs")
    ap.add_argument("--tol", type=float, default=0.02)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    rows, missing = compare(load(args.this), load(args.base), args.tol)
    print(markdown(rows, args.tol))
    failing = [r for r in rows if not r["within_tol"]]
    summary = dict(kind="ab_summary", rows=len(rows), rows_outside_tol=len(failing), tol=args.tol,
                   missing_in_one_build=[list(k) for k in missing])
    print(json.dumps(summary))
    if args.out:
        with open(args.out, "w") as f:
            for r in rows + [summary]:
                f.write(json.dumps(r) + "\n")
    return 1 if failing or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
