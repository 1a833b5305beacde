"""The training process of one trial: `python -m determined.exec.run_trial`.

The launcher sets `LOCALDET_HOME` and `LOCALDET_TRIAL_ID` and starts this in the snapshot of
the experiment's model folder; it trains the trial to its length and exits 0, or exits 1
with the reason as the last line of its log.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback


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


def keras_version_hint(error: Exception, line: str) -> str:
    """One sentence for a trial that raised: where to look, and, when the error smells of a
    Keras version mismatch, how to run the other Keras."""
    reason = os.environ.get("LOCALDET_KERAS_LINE_REASON", "the default")
    text = f"{type(error).__name__}: {error}".lower()
    other, value = ("Keras 3", "0") if line == "keras2" else ("Keras 2", "1")
    if any(word in text for word in ("keras", "legacy", "optimizer", "not recognized",
                                     "unexpected keyword", "has no attribute")):
        return (f"the trial raised {type(error).__name__} under {line} (chosen because: "
                f"{reason}); if it was written for {other}, set TF_USE_LEGACY_KERAS={value} "
                "in environment.environment_variables")
    return (f"the trial raised {type(error).__name__} under {line}; the traceback above "
            "says where")


def main() -> int:
    from determined.core import reporter_from_environment

    reporter = reporter_from_environment()
    info = reporter.trial_info()
    os.chdir(info.model_dir)
    sys.path.insert(0, str(info.model_dir))
    entrypoint = info.config.get("trial_class") or info.config["entrypoint"]
    trial_class = load_trial_class(entrypoint)

    from determined.keras._trial_controller import TrialController, TrialError, keras_line

    try:
        TrialController.for_trial_class(trial_class, info, reporter).run()
    except TrialError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return 1
    except Exception as error:
        traceback.print_exc()
        print(f"error: {keras_version_hint(error, keras_line())}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
