"""`python3 -m determined.launch.tensorflow [--port PORT] [--] SCRIPT...`

Determined's launcher for TensorFlow scripts. Under localdet the daemon reads this
entrypoint and starts the script itself: once per slot with a TF_CONFIG each (worker r of
N on 127.0.0.1) where the trial runs one process per slot, as Determined gave each
container one, and once otherwise. Run by hand, it starts the script once, unchanged
(`--port` is accepted: localdet picks free ports itself).
"""

from __future__ import annotations

import sys

from determined.launch._exec import run, script_after_options

if __name__ == "__main__":
    run(script_after_options(sys.argv[1:], ("--port",)), "tensorflow")
