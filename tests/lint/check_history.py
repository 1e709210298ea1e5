#!/usr/bin/env python3
"""Comments in the product explain why, in the present tense: no commit hashes and no ISO
dates in src/ or include/ (the history lives in git and CHANGELOG.md).

    python3 tests/lint/check_history.py [ROOT]   exit 1 naming each line that has one

A commit hash is a token of 7 to 40 hex digits with at least one letter and one digit that
is not part of a number (0x..., a float's digits after its point or exponent) or an identifier.
"""
from __future__ import annotations

import os
import re
import sys

HASH = re.compile(r"(?<![0-9A-Za-z_.+-])([0-9a-f]{7,40})(?![0-9A-Za-z_])")
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
DIRS = ("src", "include")


def findings(root: str):
    for top in DIRS:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    for n, line in enumerate(f, 1):
                        for m in HASH.finditer(line):
                            tok = m.group(1)
                            if re.search("[a-f]", tok) and re.search("[0-9]", tok):
                                yield path, n, f"commit hash {tok}", line.strip()
                        for m in DATE.finditer(line):
                            yield path, n, f"date {m.group(0)}", line.strip()


def main() -> int:
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    bad = list(findings(root))
    for path, n, what, line in bad:
        print(f"{os.path.relpath(path, root)}:{n}: {what}: {line[:120]}")
    if bad:
        print(f"check_history: {len(bad)} line(s) carry history; say why in the present tense instead")
        return 1
    print("check_history: no commit hashes or dates in src/ or include/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
