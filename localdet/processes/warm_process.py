"""A warm trial process: TensorFlow and Keras imported once, then a fresh process forked
from it for each trial the daemon gives it.

    python -P -m localdet.processes.warm_process FOLDER  # stdin: a Unix socket to the daemon;
                                                         # FOLDER: the state folder's warm-imports

The daemon (localdet/processes/warm_pool.py) starts it in a session of its own with the
environment of one Keras line and one experiment's variables, and nothing of any trial. It imports
TensorFlow, Keras and the harness (no device is touched: nothing of a GPU is taken), says
`{"ready": true}` and waits. For each assignment (the trial's full environment, its folder
and command, and, passed along as a file descriptor, the pipe into the trial's log writer)
it forks: the child starts a session of its own, takes the trial's environment (its
CUDA_VISIBLE_DEVICES among it, before TensorFlow has touched a device), its folder and log,
and runs the trial exactly as a cold process would (`determined.exec.run_trial`, or the
script), one trial, then exits. The parent answers `{"pid": N}`, and `{"exit": N, "code": C}`
when that child ends.

Each trial tells the warm process the installed modules it imported (scikit-learn, SciPy, ...),
as it imports them, and the warm process imports them while the trial runs: the next trial
of the kind starts with them (localdet/processes/learned_imports.py). It keeps them in FOLDER
too, and imports those its kind's trials told earlier warm processes before it says it is ready.

If the daemon goes away, the socket reads end-of-file and the warm process exits; the
trials it forked go on in their own sessions, for the next daemon to adopt. A warm process
never gives a trial to a daemon that did not start it.
"""

from __future__ import annotations

import json
import os
import runpy
import select
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn

from determined.core._reporting import FORKED_AT_VAR
from localdet.processes.learned_imports import (
    InstalledPaths,
    RememberedImports,
    import_quietly,
    tell_imports,
)


def _prepare() -> None:
    """What every trial of this Keras line and backend imports first: the slow part of a
    cold start. KERAS_BACKEND is part of a warm process's environment, so each backend in
    use has warm processes of its own."""
    from determined.exec import keras_alias

    keras_alias.install()  # before anything imports `keras`, as run_trial does
    import localdet.reporting.sqlite_reporter  # noqa: F401  (the TrialReporter seam's: sqlite-utils, jsonschema)
    from determined.core._reporting import reporter_factory

    reporter_factory()  # the seam's entry point, looked up once (40 ms a trial otherwise)
    from determined.keras._backend import is_tensorflow

    if not is_tensorflow():
        # Keras's JAX or PyTorch backend: Keras, the backend and context.fit's runner; a
        # trial on it imports no TensorFlow unless its own code does.
        import keras  # noqa: F401

        import determined.keras  # noqa: F401
        from determined.keras import _backend_fit  # noqa: F401
        return
    import tensorflow  # noqa: F401

    import determined.keras  # noqa: F401  (Keras itself, the controller, the callbacks)
    from determined.keras import _trial_controller  # noqa: F401


# The rank supervisor of a multi-process trial (localdet/processes/launcher.py's supervised_argv).
RANK_SUPERVISOR = ["-P", "-m", "localdet.processes.ranks"]


def _run(argv: list[str]) -> int:
    """Run the trial's command in this interpreter, as `python ARGS...` would."""
    args = argv[1:]
    if args[:3] == RANK_SUPERVISOR:  # its ranks are forked from here, warm too
        from localdet.processes import ranks

        return ranks.main(args[3:], run_forked=_run_and_exit)
    if args == ["-m", "determined.exec.run_trial"]:
        from determined.exec import run_trial

        return run_trial.main()
    if args[:1] == ["-m"]:
        sys.argv = [args[1], *args[2:]]
        sys.path.insert(0, os.getcwd())
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        return 0
    sys.argv = args
    sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))
    runpy.run_path(args[0], run_name="__main__")
    return 0


def _become_trial(order: dict, log: int, in_session: int, forked: float,
                  teach: socket.socket, installed: InstalledPaths) -> None:
    """In the forked child: the trial's session, environment, folder and log; then run it.
    Closing `in_session` tells the parent that the session exists; the parent learns over
    `teach` the installed modules its trial imports."""
    tell_imports_again = tell_imports(teach, installed)
    os.setsid()
    os.close(in_session)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.environ.clear()
    os.environ.update(order["env"])
    os.environ[FORKED_AT_VAR] = repr(forked)  # the trial's timeline: a warm start, since
    os.chdir(order["cwd"])
    _run_and_exit(order["argv"], tell_imports_again)


def _run_and_exit(argv: list[str], before_exit=lambda: None) -> NoReturn:
    """Run the command in this forked process and exit with its status, as the
    interpreter would (a trial, or one rank of a trial forked by its supervisor)."""
    code = 1
    try:
        code = _run(argv)
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
        if isinstance(exit.code, str):
            print(exit.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        before_exit()
        os._exit(code)  # not the parent's exit handlers: they are the warm process's


def main() -> int:
    channel = socket.socket(fileno=0)
    _prepare()
    remembered = RememberedImports(Path(sys.argv[1])) if len(sys.argv) > 1 else None
    if remembered is not None:
        import_quietly(remembered.names)
    sending = threading.Lock()

    def send(message: dict) -> None:
        with sending:
            try:
                channel.sendall(json.dumps(message).encode() + b"\n")
            except OSError:
                pass  # the daemon has gone; we end at our next read

    def reap(pid: int) -> None:
        _, status = os.waitpid(pid, 0)
        send({"exit": pid, "code": os.waitstatus_to_exitcode(status)})

    # Its trials tell it what they imported (localdet/processes/learned_imports.py).
    learn, teach = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    installed = InstalledPaths()
    send({"ready": True})
    while True:
        readable, _, _ = select.select([channel, learn], [], [])
        if learn in readable:
            names = json.loads(learn.recv(1 << 20))
            import_quietly(names)
            if remembered is not None:
                remembered.add(name for name in names if name in sys.modules)
            continue
        message, fds, _, _ = socket.recv_fds(channel, 1 << 20, 1)
        if not message:
            return 0  # the daemon has gone
        if not fds:
            continue
        order, log = json.loads(message), fds[0]
        if installed.changed():  # what it imported may be stale: the trial starts cold
            return 0
        sys.stdout.flush()
        sys.stderr.flush()
        # The pid is told only once the child leads its own session: the daemon ends a trial
        # by killing its process group, which does not exist before the child's setsid.
        waiting, in_session = os.pipe()
        forked = time.time()
        pid = os.fork()
        if pid == 0:
            channel.detach()
            learn.close()
            os.close(waiting)
            _become_trial(order, log, in_session, forked, teach, installed)
        os.close(log)
        os.close(in_session)
        os.read(waiting, 1)  # end of file: the child closed its end, or died
        os.close(waiting)
        send({"pid": pid})
        threading.Thread(target=reap, args=(pid,), daemon=True).start()


def is_warm_command(argv: list[str]) -> bool:
    """Whether a trial's command can run in a warm process: this interpreter running
    the trial runner, a module, or a Python file."""
    if len(argv) < 2 or argv[0] != sys.executable:
        return False
    if argv[1] == "-m":
        return len(argv) >= 3
    return argv[1].endswith(".py")


if __name__ == "__main__":
    sys.exit(main())
