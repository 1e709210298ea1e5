#!/usr/bin/env python3
"""Opcode histograms of the kernels in a CUDA object or cubin (from `cuobjdump -sass`).

Which pipe a kernel keeps busy is in its instruction mix: LOP3 / IADD3 / SHF / PRMT / F2FP
issue on the SM's integer pipe (one warp instruction every other cycle), FFMA / FMUL /
IMAD and the f16x2 instructions on the fp32 pipes. Counts are static (every path of the
kernel, the cold ones included), so compare variants of one kernel, not kernels.

    python3 bench/sass_mix.py OBJ [--match REGEX] [--top 30]   # needs cuobjdump, cu++filt
    python3 bench/sass_mix.py --sass-file FILE ...               # a saved `cuobjdump -sass`
"""
import argparse
import collections
import re
import shutil
import subprocess
import sys

_OP = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def parse(sass):
    """{mangled name: Counter of opcodes (modifiers dropped)} of a `cuobjdump -sass` text."""
    out = {}
    for part in re.split(r"\n\s*Function : ", "\n" + sass)[1:]:
        name, body = (part.split("\n", 1) + [""])[:2]
        out[name.strip()] = collections.Counter(m.group(1) for m in _OP.finditer(body))
    return out


def demangle(names):
    if not names or shutil.which("cu++filt") is None:
        return {n: n for n in names}
    p = subprocess.run(["cu++filt"], input="\n".join(names), capture_output=True, text=True)
    lines = p.stdout.splitlines()
    return dict(zip(names, lines)) if len(lines) == len(names) else {n: n for n in names}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("obj", nargs="?", help="object file or cubin")
    ap.add_argument("--sass-file", help="read a saved `cuobjdump -sass` output instead")
    ap.add_argument("--match", default="", help="regex on the demangled kernel names")
    ap.add_argument("--top", type=int, default=30, help="opcodes listed per kernel")
    args = ap.parse_args(argv)
    if args.sass_file:
        with open(args.sass_file) as f:
            sass = f.read()
    elif args.obj:
        sass = subprocess.run(["cuobjdump", "-sass", args.obj], capture_output=True, text=True, check=True).stdout
    else:
        ap.error("give OBJ or --sass-file")
    kernels = parse(sass)
    names = demangle(list(kernels))
    for mangled, ops in kernels.items():
        dem = names[mangled]
        if args.match and not re.search(args.match, dem):
            continue
        print(f"{dem}  {sum(ops.values())} instructions")
        print("    " + ", ".join(f"{k}:{v}" for k, v in ops.most_common(args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
