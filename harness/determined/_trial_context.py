"""TrialContext: what every trial knows about itself (`det.TrialContext`), and
`from_config`, which builds one without a daemon, e.g. in a notebook."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Dict

from determined._env_context import EnvContext, _global_batch_size
from determined.core import DistributedContext, TrialInfo
from determined.core._reporting import TENSORBOARD_DIR_VAR

logger = logging.getLogger("determined")


class TrialContext:
    """The system's side of a trial: `context.env`, `context.distributed`, the
    hyperparameters and the ids."""

    def __init__(self, info: TrialInfo, distributed: DistributedContext, *,
                 managed_training: bool = True) -> None:
        self._info = info
        self.distributed = distributed
        self.env = EnvContext(info, distributed, managed_training=managed_training)
        self._stop_requested = False

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> "TrialContext":
        """A context for trying a trial out of localdet (a notebook, a debugger):

            context = det.keras.TFKerasTrialContext.from_config(config)
            trial = MyTrial(context)
            model = trial.build_model()
            model.fit(*trial.build_training_data_loader(), epochs=1)

        Hyperparameters are the config's constants; a searched one gets one value drawn
        from its range (seeded by `reproducibility.experiment_seed`). Nothing is recorded."""
        from determined._hparams import sample_hparams

        if not isinstance(config, dict):
            raise TypeError("from_config() takes the experiment config as a dict, e.g. "
                            "yaml.safe_load(open('const.yaml'))")
        trial_dir = Path(tempfile.mkdtemp(prefix="localdet-notebook-"))
        info = TrialInfo(
            experiment_id=0, trial_id=0, hparams=sample_hparams(config),
            seed=int(config.get("reproducibility", {}).get("experiment_seed", 0) or 0),
            target_batches=0, scheduling_unit=int(config.get("scheduling_unit", 100)),
            validation_period=0, checkpoint_period=0, latest_checkpoint=None,
            config=dict(config), model_dir=Path.cwd(), trial_dir=trial_dir)
        return cls._for_notebook(info)

    @classmethod
    def _for_notebook(cls, info: TrialInfo) -> "TrialContext":
        return cls(info, DistributedContext(), managed_training=False)

    # -- who am I -----------------------------------------------------------------------
    def get_experiment_config(self) -> Dict[str, Any]:
        return self.env.experiment_config

    def get_data_config(self) -> Dict[str, Any]:
        return self.env.experiment_config.get("data", {})

    def get_experiment_id(self) -> int:
        return self._info.experiment_id

    def get_trial_id(self) -> int:
        return self._info.trial_id

    def get_trial_seed(self) -> int:
        return self._info.seed

    def get_hparams(self) -> Dict[str, Any]:
        return self._info.hparams

    def get_hparam(self, name: str) -> Any:
        if name not in self._info.hparams:
            known = ", ".join(sorted(self._info.hparams)) or "none"
            raise ValueError(f"hyperparameter '{name}' is not in the experiment config; "
                             f"the known hyperparameters are: {known}")
        return self._info.hparams[name]

    def get_global_batch_size(self) -> int:
        return _global_batch_size(self._info.hparams)

    def get_per_slot_batch_size(self) -> int:
        return self.get_global_batch_size() // self.distributed.size

    def get_initial_batch(self) -> int:
        """Batches trained before this run started (0 unless it resumes a checkpoint)."""
        return self.env.steps_completed

    def get_tensorboard_path(self) -> Path:
        """The folder whose files `localdet tensorboard` shows for this trial."""
        managed = self.env.managed_training and os.environ.get(TENSORBOARD_DIR_VAR)
        return Path(managed or self._info.trial_dir / "tensorboard")

    def get_stop_requested(self) -> bool:
        return self._stop_requested

    def set_stop_requested(self, stop_requested: bool) -> None:
        """Ask localdet to end this trial at the next workload boundary (with a
        checkpoint)."""
        if not isinstance(stop_requested, bool):
            raise TypeError("set_stop_requested() takes True or False")
        self._stop_requested = stop_requested


