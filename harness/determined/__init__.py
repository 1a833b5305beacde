"""determined: the Keras training API of Determined AI, served by localdet on one machine.

User code imports it exactly as it did under Determined:

    import determined as det
    from determined import keras

    class MyTrial(keras.TFKerasTrial):
        ...

Names load on first use, so `import determined` stays cheap (no TensorFlow import).
docs/determined-api.md lists every name of Determined 0.17 to 0.38 and what localdet does
with it; the subpackages of frameworks it does not serve (determined.pytorch, ...) raise
one sentence when used.
"""

import importlib

from determined import _refused

_refused.install()

__version__ = "0.38.0+localdet"

# Determined's format for `logging.basicConfig(format=det.LOG_FORMAT)` (0.18 on): the
# level first, then the process id and the logger's name.
LOG_FORMAT = "%(levelname)s: [%(process)s] %(name)s: %(message)s"

# name -> module that defines it (a name equal to its module is the module itself)
_NAMES = {
    "core": "determined.core",
    "keras": "determined.keras",
    "errors": "determined.errors",
    "util": "determined.util",
    "launch": "determined.launch",
    "experimental": "determined.experimental",
    "searcher": "determined.searcher",
    # served in part: they import, and refuse their other names when used (_refused)
    "common": "determined.common",
    "gpu": "determined.gpu",
    "workload": "determined.workload",
    "InvalidHP": "determined.errors",
    "EnvContext": "determined._env_context",
    "ExperimentConfig": "determined._env_context",
    "TrialContext": "determined._trial_context",
    "Trial": "determined._trial",
    "LegacyTrial": "determined._trial",
    "TrialController": "determined._trial",
    "ClusterInfo": "determined._info",
    "TrialInfo": "determined._info",
    "RendezvousInfo": "determined._info",
    "ResourcesInfo": "determined._info",
    "get_cluster_info": "determined._info",
    "import_from_path": "determined._import",
    "Categorical": "determined._hparams",
    "Constant": "determined._hparams",
    "Double": "determined._hparams",
    "Integer": "determined._hparams",
    "Log": "determined._hparams",
    "DistributedContext": "determined.core",
    "_catch_sys_exit": "determined._runner_internals",
    "_local_execution_manager": "determined._runner_internals",
    "_get_gpus": "determined._runner_internals",
    "_load_trial_for_checkpoint_export": "determined._runner_internals",
    "_make_local_execution_env": "determined._runner_internals",
    "_make_local_execution_exp_config": "determined._runner_internals",
    "_make_test_experiment_config": "determined._runner_internals",
    "NativeContext": "determined._runner_internals",
    "RankInfo": "determined._runner_internals",
    "_DistributedBackend": "determined._runner_internals",
}
# Determined 0.17.6 to 0.17.15 called its Core API `determined._core`.
_MODULE_ALIASES = {"_core": "determined.core"}

__all__ = ["__version__", "LOG_FORMAT", *_NAMES, *_MODULE_ALIASES]


def __getattr__(name: str):
    if name in _MODULE_ALIASES:
        value = importlib.import_module(_MODULE_ALIASES[name])
        globals()[name] = value
        return value
    if name in _NAMES:
        module = importlib.import_module(_NAMES[name])
        value = module if _NAMES[name] == f"determined.{name}" else getattr(module, name)
        globals()[name] = value
        return value
    if name in _refused.REFUSED:
        raise _refused.refusal(name)
    raise AttributeError(f"module 'determined' has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *_NAMES, *_MODULE_ALIASES})
