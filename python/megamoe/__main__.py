"""``python -m megamoe [ARGS]``: run the megamoe-stage CLI installed with the package.

The wheel carries the C++ binary (built from tools/) as megamoe/bin/megamoe-stage; the
``megamoe-stage`` console command installed by pip is this same launcher. Arguments, exit
status and output are the CLI's own (``python -m megamoe --help``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List, Optional

__all__ = ["cli_path", "main"]


def cli_path() -> Optional[Path]:
    """The megamoe-stage binary shipped in this package, or None when the wheel was built
    without it (CLI11 / nlohmann-json missing at build time, or MEGAMOE_BUILD_TOOLS=OFF)."""
    from . import _C  # the binary is installed beside the extension (editable installs too)

    for d in (Path(_C.__file__).resolve().parent, Path(__file__).resolve().parent):
        p = d / "bin" / "megamoe-stage"
        if p.is_file() and os.access(p, os.X_OK):
            return p
    return None


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    exe = cli_path()
    if exe is None:
        print(
            "megamoe: this installation has no megamoe-stage CLI (the package was built without "
            "it: CLI11 and nlohmann-json are needed at build time, and MEGAMOE_BUILD_TOOLS must "
            "not be OFF); reinstall with them, e.g. apt install libcli11-dev nlohmann-json3-dev",
            file=sys.stderr,
        )
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    # Replace this process: the CLI's exit status, signals and terminal are its own.
    os.execv(str(exe), [str(exe), *args])
    return 2  # pragma: no cover - execv does not return


if __name__ == "__main__":
    sys.exit(main())
