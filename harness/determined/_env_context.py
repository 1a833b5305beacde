"""EnvContext: `context.env`, what Determined told a trial about its surroundings, filled
from the reporter's `TrialInfo`."""

from __future__ import annotations

import os
import socket
from typing import Any, Callable, Dict, List, Optional

from determined import errors
from determined._assignable import computed, refused_attribute
from determined.core import DistributedContext, TrialInfo
from determined.core._reporting import SLOTS_VAR, reporter_factory


class ExperimentConfig(dict):
    """The experiment config as a dict (Determined's `det.ExperimentConfig`), with the two
    helpers trial code used."""

    def slots_per_trial(self) -> int:
        return int(self.get("resources", {}).get("slots_per_trial", 1))

    def debug_enabled(self) -> bool:
        return bool(self.get("debug", False))


class EnvContext:
    """What a trial is and where it runs: `context.env.hparams`, `.experiment_config`,
    `.trial_seed`, `.det_trial_id`, `.latest_checkpoint`, `.steps_completed`, ...

    Cluster-only fields (the master's address and certificates, the run counter) raise
    `NotServedError` when read."""

    def __init__(self, info: TrialInfo, distributed: DistributedContext, *,
                 managed_training: bool = True,
                 steps_completed: Optional[Callable[[], int]] = None):
        self._info = info
        self._distributed = distributed
        self._steps_completed = steps_completed
        self.experiment_config = ExperimentConfig(info.config)
        self.hparams: Dict[str, Any] = info.hparams
        self.trial_seed: int = info.seed
        # A warm start's source shows here as under Determined; the trial still starts at 0.
        self.latest_checkpoint: Optional[str] = \
            info.latest_checkpoint or info.warm_start_checkpoint
        # Determined passed ids as strings in the environment and kept them so.
        self.det_trial_id = str(info.trial_id)
        self.det_experiment_id = str(info.experiment_id)
        self.det_cluster_id = "localdet"
        self.det_agent_id = socket.gethostname()
        self.allocation_id = f"trial-{info.trial_id}"
        self.det_trial_unique_port_offset = 0
        self.container_id = f"trial-{info.trial_id}"  # Determined 0.17's container, one here
        self.managed_training = managed_training
        self.on_cluster = managed_training
        self.test_mode = False
        self.debug = bool(info.config.get("debug", False))

    # Every attribute can be assigned, as Determined's plain attributes could; those computed
    # here are computed until then.

    # -- the batch position of the run ---------------------------------------------------
    @computed
    def steps_completed(self) -> int:
        """Batches the trial had trained when this run started (0 for a fresh or a
        warm-started trial)."""
        own = self._info.latest_checkpoint
        if own is None:
            return 0
        if self._steps_completed is None:
            # Read once, while the process's LOCALDET_HOME still names the trial's state.
            batches = reporter_factory().checkpoint_batches(own)
            self._steps_completed = lambda: batches
        return self._steps_completed()

    @computed
    def latest_batch(self) -> int:
        """Determined 0.17's name for `steps_completed`."""
        return self.steps_completed

    # -- batch sizes (Determined 0.17 kept them on the env) ------------------------------
    @property
    def global_batch_size(self) -> int:
        return _global_batch_size(self.hparams)

    @property
    def per_slot_batch_size(self) -> int:
        return self.global_batch_size // self._distributed.size

    # -- devices --------------------------------------------------------------------------
    @computed
    def container_gpus(self) -> List[str]:
        """The GPUs this process may use, as `CUDA_VISIBLE_DEVICES` names them."""
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        return [g.strip() for g in visible.split(",") if g.strip() and g.strip() != "-1"]

    @computed
    def slot_ids(self) -> List[int]:
        slots = os.environ.get(SLOTS_VAR, "")
        return [int(s) for s in slots.split(",") if s.strip().isdigit()]

    @computed
    def use_gpu(self) -> bool:
        return bool(self.container_gpus)

    # -- cluster-only ----------------------------------------------------------------------
    master_url = refused_attribute("context.env.master_url", "there is no master: the "
                                   "daemon and the database are local, and `localdet status` "
                                   "shows the state")
    master_cert_file = refused_attribute("context.env.master_cert_file", "there is no master "
                                         "to trust; nothing needs a certificate")
    master_cert_name = refused_attribute("context.env.master_cert_name", "there is no master "
                                         "to trust; nothing needs a certificate")
    trial_run_id = refused_attribute("context.env.trial_run_id", "runs are not counted; "
                                     "`context.env.latest_checkpoint` is set when a run resumes")
    # Determined 0.17.0's cluster addresses and tokens.
    master_addr = refused_attribute("context.env.master_addr", "there is no master: "
                                    "`localdet status` shows the state")
    master_port = refused_attribute("context.env.master_port", "there is no master: "
                                    "`localdet status` shows the state")
    use_tls = refused_attribute("context.env.use_tls", "there is no master to connect to")
    det_allocation_token = refused_attribute("context.env.det_allocation_token", "there is no "
                                             "master to authenticate to")
    det_rendezvous_port = refused_attribute("context.env.det_rendezvous_port", "a trial's "
                                            "processes all run here; `context.distributed` "
                                            "has the ranks")
    det_trial_runner_network_interface = refused_attribute(
        "context.env.det_trial_runner_network_interface", "a trial's processes all run on this "
        "machine and talk over its loopback interface")

    def rendezvous_port(self) -> int:
        raise errors.refuse("context.env.rendezvous_port()", "a trial's processes all run "
                            "here; `context.distributed` has the ranks")

def _global_batch_size(hparams: Dict[str, Any]) -> int:
    if "global_batch_size" not in hparams:
        raise ValueError("the batch size needs a 'global_batch_size' hyperparameter in the "
                         "experiment config")
    return int(hparams["global_batch_size"])
