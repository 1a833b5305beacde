"""Names Determined's `determined` module exported for its own trial runner and local test
mode (underscore names, and the 0.17.0 Native API's context), defined so that code naming
them imports. `_catch_sys_exit` and `_local_execution_manager` work as Determined's did; the
others refuse with one sentence at use: localdet's runner builds trials and contexts itself."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any, Iterator

from determined import errors


@contextlib.contextmanager
def _catch_sys_exit() -> Iterator[None]:
    """Turns a `sys.exit()` in the block into an `InvalidExperimentException`."""
    try:
        yield
    except SystemExit as exit_:
        raise errors.InvalidExperimentException(
            f"the model code called sys.exit({exit_.code!r}): remove the call (or the "
            "library call that makes it) from the trial") from exit_


@contextlib.contextmanager
def _local_execution_manager(context_dir: Path) -> Iterator[None]:
    """Runs the block in `context_dir`, with it first on the import path and `sys.exit()`
    caught, then puts the working directory and `sys.path[0]` back."""
    directory, first = os.getcwd(), sys.path[0]
    try:
        os.chdir(str(context_dir))
        sys.path[0] = ""  # the working directory, as an interactive Python has it
        with _catch_sys_exit():
            yield
    finally:
        os.chdir(directory)
        sys.path[0] = first


def _refusing_function(name: str, instead: str, owner: str = "det") -> Any:
    """A function named `name` that refuses to run: `{owner}.{name}` is not served."""
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise errors.refuse(f"{owner}.{name}", instead)

    refused.__name__ = refused.__qualname__ = name
    refused.__doc__ = f"Determined's internal `{name}`; refused here: {instead}."
    return refused


def _refusing_class(name: str, instead: str, owner: str = "det",
                    module: str = __name__) -> type:
    """A class named `name` that refuses to be made: `{owner}.{name}` is not served."""
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        raise errors.refuse(f"{owner}.{name}", instead)

    return type(name, (), {"__init__": __init__, "__module__": module,
                           "__doc__": f"Determined's `{name}`; refused here: {instead}."})


_BUILD = ("localdet's runner builds the trial and its context; use "
          "TFKerasTrialContext.from_config(config) to try a trial out of localdet")

_get_gpus = _refusing_function(
    "_get_gpus", "read context.env.container_gpus or tf.config.list_physical_devices('GPU')")
_load_trial_for_checkpoint_export = _refusing_function(
    "_load_trial_for_checkpoint_export",
    "determined.keras.load_model_from_checkpoint_path rebuilds the trial from a checkpoint")
_make_local_execution_env = _refusing_function("_make_local_execution_env", _BUILD)
_make_local_execution_exp_config = _refusing_function("_make_local_execution_exp_config", _BUILD)
_make_test_experiment_config = _refusing_function("_make_test_experiment_config", _BUILD)

NativeContext = _refusing_class(
    "NativeContext", "Determined 0.17.0's Native API is not served; write a TFKerasTrial or "
    "a script with det.keras.init()")
RankInfo = _refusing_class(
    "RankInfo", "context.distributed has rank, size, local_rank, local_size, cross_rank and "
    "cross_size")
_DistributedBackend = _refusing_class(
    "_DistributedBackend", "set resources.engine in the experiment config, and read "
    "context.distributed.size for the number of processes")
