#!/usr/bin/env python3
"""Plots of the formats benchmark (bench/bench_formats.py, part "formats") for
docs/PERFORMANCE.md: per card, the rate in GB/s (bytes read + written over the time of a
call) against T for every format, each next to the same-run copy of the same bytes
(dashed, same colour), one panel per H.

    python3 bench/plot_formats.py                 # every card of CARDS -> docs/perf_<card>.png
    python3 bench/plot_formats.py --card h100     # one card
    python3 bench/plot_formats.py --card h200=bench/results/OTHER.jsonl   # another raw file

CARDS names the raw files the doc's tables cite; change them together. Needs matplotlib
(pip install matplotlib), nothing else: no torch, no GPU.
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# card -> (raw rows, the device name where the file has no header row)
CARDS = {
    "h100": ("bench/results/h100_405d1a4_formats.jsonl", "NVIDIA H100 80GB HBM3"),
    "h200": ("bench/results/h200_f37de43_formats.jsonl", "NVIDIA H200"),
}
FORMATS = ("mxfp8", "fp8_fp32_g128", "mxfp4", "nvfp4_static", "nvfp4_per_token")
COLORS = {"mxfp8": "tab:blue", "fp8_fp32_g128": "tab:cyan", "mxfp4": "tab:green",
          "nvfp4_static": "tab:orange", "nvfp4_per_token": "tab:red"}


def load(path):
    """(header or None, the formats rows) of a bench_formats.py JSON-lines file."""
    header, rows = None, []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            if r.get("kind") == "header":
                header = r
            elif r.get("part") == "formats":
                rows.append(r)
    if not rows:
        raise ValueError(f"{path}: no formats rows")
    return header, rows


def gbps(r, key):
    """GB/s (1e9 bytes a second) of a row's megamoe or copy time."""
    return r["bytes"] / r[key] * 1e-3


def plot(path, device, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    header, rows = load(path)
    device = (header or {}).get("device") or device
    commit = (header or {}).get("commit") or os.path.basename(path).split("_")[1]
    hs = sorted({r["H"] for r in rows}, reverse=True)
    fig, axes = plt.subplots(1, len(hs), figsize=(6.2 * len(hs), 5.2), sharey=True, squeeze=False)
    for ax, H in zip(axes[0], hs):
        for name in FORMATS:
            pts = sorted((r for r in rows if r["H"] == H and r["format"] == name), key=lambda r: r["T"])
            if not pts:
                continue
            Ts = [r["T"] for r in pts]
            c = COLORS[name]
            ax.plot(Ts, [gbps(r, "megamoe_us") for r in pts], "o-", color=c, label=name, lw=1.6, ms=4)
            ax.plot(Ts, [gbps(r, "copy_us") for r in pts], "--", color=c, lw=1.0, alpha=0.7,
                    label=f"{name}: same-run copy")
        Ts = sorted({r["T"] for r in rows if r["H"] == H})
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(Ts)
        ax.set_xticklabels([str(t) for t in Ts], rotation=45 if len(Ts) > 4 else 0)
        ax.set_xlabel("T (tokens)")
        ax.set_title(f"H = {H}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("GB/s (bytes read + written / time)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, ncol=len(FORMATS), loc="lower center")
    fig.suptitle(f"megamoe staging, every format, on {device} at {commit} "
                 "(CUDA-graph replays; dashed: same-run copy of the same bytes)", fontsize=10)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--card", action="append", default=[],
                    help="a card of CARDS, or CARD=PATH for another raw file (repeatable; default: every card)")
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "docs"), help="where perf_<card>.png go (docs/)")
    args = ap.parse_args(argv)
    jobs = []
    for spec in args.card or list(CARDS):
        card, _, path = spec.partition("=")
        if card not in CARDS and not path:
            ap.error(f"unknown card {card!r} (known: {', '.join(CARDS)}); give CARD=PATH")
        default_path, device = CARDS.get(card, (None, card.upper()))
        jobs.append((card, path or default_path, device))
    for card, path, device in jobs:
        if not os.path.isabs(path):
            path = os.path.join(ROOT, path)
        print(plot(path, device, os.path.join(args.out_dir, f"perf_{card}.png")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
