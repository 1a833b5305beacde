"""`det.get_cluster_info()`: what a process started by localdet knows about its task, in the
shape of Determined's ClusterInfo (None outside localdet, as it was None off-cluster).

    info = det.get_cluster_info()
    if info and info.task_type == "TRIAL":
        hparams = info.trial.hparams
        checkpoint = info.latest_checkpoint     # set when the trial resumes
        continue_id = info.trial.trial_id
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from determined import errors
from determined._assignable import computed, refused_attribute

_NO_RUNS = "runs are not counted; ClusterInfo.latest_checkpoint is set when a run resumes"
_cache: Dict[str, Any] = {}  # this process's reporter and info, keyed by its trial id


def process_reporter() -> Any:
    """The reporter of this process's trial, made once (the Core API and get_cluster_info
    share it)."""
    from determined.core._reporting import TRIAL_ID_VAR, reporter_from_environment

    key = os.environ.get(TRIAL_ID_VAR, "")
    if _cache.get("key") != key or "reporter" not in _cache:
        _cache.clear()
        _cache.update(key=key, reporter=reporter_from_environment())
    return _cache["reporter"]


@dataclass
class TrialInfo:
    """The trial part of `ClusterInfo` (`info.trial`)."""

    trial_id: int
    experiment_id: int
    trial_seed: int
    hparams: Dict[str, Any]
    config: Dict[str, Any]
    steps_completed: int = 0
    debug: bool = False
    inter_node_network_interface: Optional[str] = None

    # Determined's private spellings, which its own and its users' code read; plain
    # attributes there, so assignable here.
    @computed
    def _config(self) -> Dict[str, Any]:
        return self.config

    @computed
    def _steps_completed(self) -> int:
        return self.steps_completed

    @computed
    def _debug(self) -> bool:
        return self.debug

    trial_run_id = refused_attribute("ClusterInfo.trial.trial_run_id", _NO_RUNS)
    _trial_run_id = refused_attribute("ClusterInfo.trial._trial_run_id", _NO_RUNS)


@dataclass
class ClusterInfo:
    """Where this process runs: `cluster_id` is "localdet", `agent_id` the host name;
    `task_type` "TRIAL" for an experiment's trial, "COMMAND" for a batch job."""

    cluster_id: str
    agent_id: str
    slot_ids: List[int]
    task_id: str
    allocation_id: str
    task_type: str
    latest_checkpoint: Optional[str]
    trial: Optional[TrialInfo] = None
    container_rank: int = 0
    container_addrs: List[str] = field(default_factory=lambda: ["127.0.0.1"])
    gpu_uuids: List[str] = field(default_factory=list)
    master_cert_name: Optional[str] = None
    master_cert_file: Optional[str] = None

    @property
    def container_slot_counts(self) -> List[int]:
        return [len(self.slot_ids)]

    @property
    def user_data(self) -> Dict[str, Any]:
        """The experiment config's `data` section."""
        if self.trial is None:
            return {}
        return dict(self.trial.config.get("data") or {})

    @computed
    def container_id(self) -> str:
        """Determined 0.17.1-0.17.8's container id: one container per trial, its task."""
        return self.task_id

    # Plain attributes in Determined, so assignable; with no master they mean nothing.
    master_url = refused_attribute("ClusterInfo.master_url", "there is no master: "
                                   "`localdet status` shows experiments and trials")
    session_token = refused_attribute("ClusterInfo.session_token",
                                      "there is no master to log in to")


class RendezvousInfo:
    """Determined's view of the containers of a multi-machine task."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise errors.refuse("det.RendezvousInfo", "a trial's processes all run on this "
                            "machine; `context.distributed` gives each one's rank and size")


class ResourcesInfo:
    """Determined's view of a container's devices."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise errors.refuse("det.ResourcesInfo", "read `context.env.container_gpus` and "
                            "`context.env.slot_ids` for the devices this process may use")


def get_cluster_info() -> Optional[ClusterInfo]:
    """The ClusterInfo of a process localdet started (LOCALDET_TRIAL_ID set), else None.
    Read once per process: a trial's facts do not change while it runs."""
    from determined.core._reporting import (
        RANK_VAR,
        SLOTS_VAR,
        TRIAL_ID_VAR,
    )

    if not os.environ.get(TRIAL_ID_VAR):
        return None
    reporter = process_reporter()
    if "info" in _cache:
        return _cache["info"]
    info = reporter.trial_info()
    slots = [int(s) for s in os.environ.get(SLOTS_VAR, "").split(",") if s.isdigit()]
    steps = info.latest_checkpoint_batches if info.latest_checkpoint else 0
    trial = None
    if info.kind != "job":
        trial = TrialInfo(trial_id=info.trial_id, experiment_id=info.experiment_id,
                          trial_seed=info.seed, hparams=info.hparams, config=info.config,
                          steps_completed=steps, debug=bool(info.config.get("debug", False)))
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    _cache["info"] = ClusterInfo(
        cluster_id="localdet", agent_id=socket.gethostname(), slot_ids=slots,
        task_id=f"trial-{info.trial_id}", allocation_id=f"trial-{info.trial_id}",
        task_type="TRIAL" if trial else "COMMAND",
        # A warm-started trial's first launch sees its source here, at 0 steps (Determined's).
        latest_checkpoint=(info.latest_checkpoint or info.warm_start_checkpoint) if trial
        else None, trial=trial,
        container_rank=int(os.environ.get(RANK_VAR, "0")),
        gpu_uuids=[g for g in gpus.split(",") if g])
    return _cache["info"]
