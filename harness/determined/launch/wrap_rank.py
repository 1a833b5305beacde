"""`python3 -m determined.launch.wrap_rank RANK [--] SCRIPT...`: Determined's helper that
prefixed a rank's output. localdet's rank supervisor prefixes every rank's lines
(`[rank r] ...`), so this starts the script unchanged."""

from __future__ import annotations

import sys

from determined.launch._exec import run, script_after_options

if __name__ == "__main__":
    run(script_after_options(sys.argv[2:]), "wrap_rank")
