"""A script that never imports `determined`, run as a localdet trial, with every
`model.fit` it calls trained by localdet (metrics, checkpoints, pause, exact resume):

    python -m determined.exec.unchanged_script train.py ARGS...     # as `python train.py ARGS...`
    python -m determined.exec.unchanged_script -m package.main ARGS...

The launcher puts this in front of an `entrypoint_script` whose files never import
`determined` (localdet/processes/unchanged_scripts.py), in a cold process and in a warm
one's fork alike. It prepares the trial as `det.keras.init()` would (reporter, seeded
generators), installs the fit hook (determined/keras/_unchanged.py), then runs the command
exactly as Python would. Outside a localdet trial (no LOCALDET_TRIAL_ID) it only runs it.
"""

from __future__ import annotations

import os
import runpy
import sys

from determined.core._reporting import TRIAL_ID_VAR


def prepare() -> None:
    """Serve this process's `Model.fit` calls with localdet's runner (a trial's only)."""
    if not os.environ.get(TRIAL_ID_VAR):
        return
    from determined.exec import keras_alias

    keras_alias.install()  # `import keras` is the trial's Keras line, as run_trial gives it
    from determined.keras import _unchanged
    from determined.keras._unchanged_fit import ScriptFits

    _unchanged.install(ScriptFits.start().fit)


def main() -> int:
    args = sys.argv[1:]
    if not args or (args[0] == "-m" and len(args) < 2):
        raise SystemExit("usage: python -m determined.exec.unchanged_script FILE.py [ARGS...] "
                         "| -m MODULE [ARGS...]")
    prepare()
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        sys.path[0:1] = [os.getcwd()]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        return 0
    sys.argv = args
    # `python FILE.py` puts the file's folder first (a warm process's fork put the cwd).
    sys.path[0:1] = [os.path.dirname(os.path.abspath(args[0]))]
    runpy.run_path(args[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
