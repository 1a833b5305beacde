"""`python3 -m determined.launch.horovod [--autohorovod] [--trial MODULE:CLASS | [--] SCRIPT...]`

Determined's default launcher. Under localdet the daemon reads this entrypoint: a trial
class runs under localdet's trial runner, a script is started once per slot with Horovod's
variables where the trial's engine is Horovod (Keras 2 with Horovod installed), and once
otherwise. Run by hand, a script starts once, unchanged; a trial class needs the runner:
`localdet run CONFIG MODEL_DIR`.
"""

from __future__ import annotations

import sys

from determined.launch._exec import run, script_after_options

if __name__ == "__main__":
    args = sys.argv[1:]
    if any(a == "--trial" or a.startswith("--trial=") for a in args[:args.index("--")
                                                              if "--" in args else None]):
        sys.exit("determined.launch.horovod --trial runs a trial class, which needs "
                 "localdet's runner: `localdet run CONFIG MODEL_DIR` (or submit it)")
    run(script_after_options(args, ("--trial",)), "horovod")
