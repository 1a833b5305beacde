"""`det.keras.init()`: the entry point of the New Keras API.

    import determined as det
    import determined.keras

    context = det.keras.init()                       # under localdet: this trial's settings
    context = det.keras.init(hparams={"lr": 0.01})   # on its own: these hyperparameters

Started by localdet (`LOCALDET_TRIAL_ID` set), the context serves that trial or job. Run
on its own, the script takes its hyperparameters from `hparams`, else from the experiment
config named by `LOCALDET_CONFIG`, and records itself in localdet's database as an
unmanaged experiment unless `record=False` (or `LOCALDET_RECORD=0`). Either way the random
generators are seeded with the trial's seed.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any, Dict, Optional

from determined.core import reporter_for_script, reporter_from_environment
from determined.core._reporting import CONFIG_VAR, RECORD_VAR, TRIAL_ID_VAR
from determined.keras._backend import is_tensorflow


def _script_path() -> Path:
    script = sys.argv[0] if sys.argv and sys.argv[0] not in ("", "-c", "-") else ""
    return Path(script) if script else Path.cwd() / "interactive.py"


def _recording(record: Optional[bool]) -> bool:
    if record is not None:
        return bool(record)
    return os.environ.get(RECORD_VAR, "1").strip().lower() not in ("0", "false", "no")


def init(hparams: Optional[Dict[str, Any]] = None, record: Optional[bool] = None) -> Any:
    """The context of this training script or batch job; see the module docstring. On
    Keras's JAX or PyTorch backend (KERAS_BACKEND) it trains without TensorFlow."""
    context_class: Any
    if is_tensorflow():
        from determined.keras._keras_context import KerasContext as context_class
        from determined.keras._trial_controller import prepare_process
    else:
        from determined.keras._backend_context import BackendKerasContext as context_class
        from determined.keras._backend_fit import prepare_process

    managed = bool(os.environ.get(TRIAL_ID_VAR))
    if managed:
        if hparams is not None:
            warnings.warn("det.keras.init(hparams=...) is ignored under localdet: the "
                          "experiment config's hyperparameters are used", stacklevel=2)
        reporter = reporter_from_environment()
    else:
        reporter = reporter_for_script(_script_path(), hparams,
                                       os.environ.get(CONFIG_VAR) or None,
                                       record=_recording(record))
    info = reporter.trial_info()
    from determined import _old_releases

    _old_releases.install(info.config)  # what the script's release allowed
    prepare_process(info)
    return context_class(info, reporter, managed=managed)
