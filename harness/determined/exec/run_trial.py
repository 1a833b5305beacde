"""The training process of one trial: `python -m determined.exec.run_trial`.

The launcher sets `LOCALDET_HOME` and `LOCALDET_TRIAL_ID` and starts this in the snapshot of
the experiment's model folder; it trains the trial to its length and exits 0, or exits 1
with the reason near the end of its log and, as its last line, `FAILURE_MARK` with the
failure's one-line signature, whether any batch was trained and, once training began, where
it failed (phase and batches trained).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
import time
import traceback
import types
from typing import Any, Dict, Optional

from determined.core._reporting import (
    FAILURE_MARK,
    FORKED_AT_VAR,
    KERAS_LINE_REASON_VAR,
    STAGED_VAR,
    await_launch,
)
from determined.errors import exception_line


def load_trial_class(entrypoint: str) -> type:
    module_name, _, class_name = entrypoint.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name == module_name:
            raise SystemExit(f"entrypoint '{entrypoint}': there is no module '{module_name}' "
                             f"in the model folder ({os.getcwd()})") from None
        raise
    trial_class = getattr(module, class_name, None)
    if trial_class is None:
        raise SystemExit(f"entrypoint '{entrypoint}': module '{module_name}' has no class "
                         f"'{class_name}'")
    return trial_class




def _keras_name(name: object) -> bool:
    """A module of Keras itself (either line), not `determined.keras`."""
    return isinstance(name, str) and bool(
        re.match(r"(tf_keras|keras|tensorflow(\.python)?\.keras)(\.|$)", name))


def about_keras_line(error: BaseException) -> bool:
    """Whether the error is about which Keras runs: a module or attribute of Keras that the
    running line lacks, or an argument only the legacy optimizers take."""
    text = str(error)
    if "not supported in Keras 3" in text or "tf_keras" in text:
        return True
    if isinstance(error, ImportError):
        named = error.name or "".join(re.findall(r"(?:from|named) '([\w.]+)'", text)[-1:])
        return _keras_name(named)
    if isinstance(error, AttributeError):
        owner = getattr(error, "obj", None)
        if owner is not None:
            return isinstance(owner, types.ModuleType) and _keras_name(owner.__name__)
        match = re.match(r"module '([\w.]+)' has no attribute", text)
        return match is not None and _keras_name(match.group(1))
    if isinstance(error, (TypeError, ValueError)):
        return bool(re.search(r"(not recognized|unexpected keyword argument).*'(lr|decay)'",
                              text))
    return False


def keras_version_hint(error: BaseException, line: str) -> str:
    """What a trial that raised is told: the exception's own message line, and, only when
    the error is about the Keras line, which line ran, why, and how to run the other."""
    message = exception_line(error)
    if not about_keras_line(error):
        return message
    reason = os.environ.get(KERAS_LINE_REASON_VAR, "the default")
    other, value = ("Keras 3", "0") if line == "keras2" else ("Keras 2", "1")
    return (f"{message} (the trial ran under {line}, chosen because: {reason}; if it was "
            f"written for {other}, set TF_USE_LEGACY_KERAS={value} in "
            "environment.environment_variables)")


def _current_keras_line() -> str:
    try:
        from determined.keras._line import keras_line
        return keras_line()
    except Exception:  # TensorFlow itself does not import: say what localdet chose
        return "keras2" if os.environ.get("TF_USE_LEGACY_KERAS") == "1" else "keras3"


def _report_failure(signature: str, message: str, stage: str,
                    trained: Optional[bool], point: Optional[Dict[str, Any]] = None) -> None:
    print(FAILURE_MARK + json.dumps({"signature": signature, "message": message,
                                     "stage": stage, "trained": trained, **(point or {})}),
          file=sys.stderr, flush=True)


def _point(error: BaseException, controller) -> Optional[Dict[str, Any]]:
    """Where in training it failed: the phase (a checkpoint, a validation, or training
    itself) and the batches trained, so the daemon can tell a failure that repeats at the
    same point (localdet/processes/failures.py). None before training."""
    if controller is None or not hasattr(controller, "batches_trained"):
        return None
    phase = "training"
    for frame, _ in traceback.walk_tb(error.__traceback__):
        if frame.f_locals.get("self") is controller and \
                frame.f_code.co_name in ("checkpoint", "validate"):
            phase = "checkpoint" if frame.f_code.co_name == "checkpoint" else "validation"
    return {"phase": phase, "batches": int(controller.batches_trained)}


def _trained(stage: str, info, controller) -> Optional[bool]:
    """Whether this launch trained a batch; None where it cannot tell (a resumed trial)."""
    if stage != "training":
        return False
    if info.latest_checkpoint is not None:
        return None
    return getattr(controller, "batches_trained", 1) > 0  # a fresh trial counts from 0


def _process_ready(reporter, entered: float, connected: float, ahead: bool) -> float:
    """Note the launch's `process_ready` phase: from the daemon's start of the process (a
    fork of a warm one, or a cold interpreter; for one started ahead of its slot, before its
    launch, from its fork or its `main`) to this process knowing its trial."""
    ready = time.time()
    forked = os.environ.get(FORKED_AT_VAR)
    details = {"warm": bool(forked), "main": round(entered, 3),
               "reporter": round(connected, 3)}  # the launch record awaited by then
    if forked:
        details["forked"] = round(float(forked), 3)
    began = (float(forked) if forked else entered) if ahead else None
    reporter.record_phase("process_ready", began, ready, {**details, "ahead": ahead})
    return ready


def main() -> int:
    entered = time.time()
    from determined.exec import keras_alias

    keras_alias.install()  # before anything imports `keras`
    from determined.core import reporter_from_environment

    ahead = os.environ.get(STAGED_VAR) == "1"
    reporter = reporter_from_environment()
    connected = time.time()
    info = reporter.trial_info()
    ready = _process_ready(reporter, entered, connected, ahead)
    os.chdir(info.model_dir)
    sys.path.insert(0, str(info.model_dir))
    from determined import _old_releases

    _old_releases.install(info.config)  # before the code meets NumPy or Keras
    entrypoint = info.config.get("trial_class") or info.config["entrypoint"]
    # import: the trial's module; setup: its __init__, build_model and loaders; training:
    # the loop. Before training, no batch was trained, so a repeat is deterministic.
    stage, controller = "import", None
    try:
        trial_class = load_trial_class(entrypoint)
        stage = "setup"
        from determined.keras._trial_controller import TrialController

        reporter.record_phase("import", ready, time.time(), {"entrypoint": entrypoint})
        controller = TrialController.for_trial_class(trial_class, info, reporter)
        stage = "training"
        controller.run()
        reporter.heartbeat()  # writes the last phases noted (the end's)
        reporter.wait_for_checkpoints()  # and over HTTP, waits until they are sent
    except SystemExit as error:  # the entrypoint does not resolve
        if not isinstance(error.code, str):
            raise
        await_launch(reporter)  # started ahead: its failure is its launch's
        message = error.code
        print(f"error: {message}", file=sys.stderr, flush=True)
        _report_failure(message, message, stage, _trained(stage, info, controller))
        return 1
    except Exception as error:
        await_launch(reporter)  # started ahead: its failure is its launch's
        # A TrialError (the controller's own one-sentence refusal) needs no traceback.
        trial_error = stage != "import" and type(error).__name__ == "TrialError"
        if trial_error:
            message = str(error)
        else:
            traceback.print_exc()
            # Only an error about Keras needs to know the line (importing TensorFlow).
            line = _current_keras_line() if about_keras_line(error) else ""
            message = keras_version_hint(error, line)
            message = _old_releases.refusal(error) or message  # removed since its release
            # An ImportError of what a failed startup-hook.sh line was installing names it.
            from determined.exec import hook_failures

            message = hook_failures.named(error, message)
        print(f"error: {message}", file=sys.stderr, flush=True)
        signature = message if trial_error else exception_line(error)
        point = _point(error, controller) if stage == "training" else None
        _report_failure(signature, message, stage, _trained(stage, info, controller), point)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
