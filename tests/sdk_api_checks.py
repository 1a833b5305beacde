"""What each supported name of the SDK's modules (`determined.experimental`,
`determined.experimental.client`, `determined.common.experimental`) does, for
tests/test_determined_api.py: each check runs the name against the records its `world`
fixture trained into (one experiment, one trial, a checkpoint), through the SDK's backend
seam, and returns True when it behaved as docs/determined-api.md says. The seeds' whole
downstream flow against a daemon is tests/sdk_cli/test_sdk.py."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import typing
import warnings
from pathlib import Path
from typing import Any, Callable, Dict

import pytest


@contextlib.contextmanager
def _home(w):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOCALDET_HOME", str(w.tmp / "home"))
        yield


def _quiet(call: Callable[[], Any]) -> Any:
    """Deprecated names warn as Determined's did: the warning is checked, then the value."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = call()
    if not any(issubclass(c.category, FutureWarning) for c in caught):
        raise AssertionError("no FutureWarning for a deprecated name")
    return value


def _model(w, client):
    """One registered model in the world's records, made once."""
    if not hasattr(w, "sdk_model"):
        model = client.create_model("api-check", description="checks", metadata={"k": 1})
        model.register_version(w.checkpoint)
        model.set_labels(["checked"])
        w.sdk_model = model.name
    return client.get_model(w.sdk_model)


def client_checks(w) -> Dict[str, Callable[[], bool]]:
    from determined.experimental import client

    experiment_id, trial_id, uuid = w.info.experiment_id, w.trial_id, w.checkpoint

    def run(check: Callable[[], bool]) -> Callable[[], bool]:
        def with_home() -> bool:
            with _home(w):
                return bool(check())
        return with_home

    def download(mode: Any) -> bool:
        folder = w.tmp / f"sdk-download-{mode}"
        path = client.get_checkpoint(uuid).download(str(folder), mode=mode)
        return sorted(p.name for p in Path(path).iterdir()) == sorted(
            p.name for p in Path(w.export).iterdir())

    def metrics(cls: Any, call: Callable[[], Any]) -> bool:
        found = list(_quiet(call))
        return bool(found) and all(isinstance(m, cls) for m in found) \
            and found[0].trial_id == trial_id

    def login() -> bool:
        client.login(master="http://master.example:8080", user="determined", password="x")
        return client.get_trial(trial_id).id == trial_id

    def logout() -> bool:
        client.get_trial(trial_id)
        client.logout()
        return client._determined is None

    def create_experiment() -> bool:
        names = list(inspect.signature(client.create_experiment).parameters)
        try:
            client.create_experiment({"name": "x"}, template="t")
        except NotImplementedError as error:
            return names == ["config", "model_dir", "includes", "project_id", "template"] \
                and "template" in str(error)
        return False

    def experiment_reference() -> bool:
        exp = _quiet(lambda: client.ExperimentReference(experiment_id))
        exp.reload()
        return isinstance(exp, client.Experiment) and exp.config is not None

    def trial_reference() -> bool:
        trial = _quiet(lambda: client.TrialReference(trial_id))
        trial.reload()
        return trial.experiment_id == experiment_id

    checks = {
        "C": lambda: isinstance(client.C, typing.TypeVar),
        "Checkpoint": lambda: isinstance(client.get_checkpoint(uuid), client.Checkpoint)
        and client.get_checkpoint(uuid).training.trial_id == trial_id,
        "CheckpointOrderBy": lambda: {m.name for m in client.CheckpointOrderBy}
        == {"ASC", "DESC"},
        "CheckpointSortBy": lambda: client.get_trial(trial_id).list_checkpoints(
            client.CheckpointSortBy.BATCH_NUMBER, client.OrderBy.DESC)[0].uuid == uuid,
        "CheckpointState": lambda: client.get_checkpoint(uuid).state
        is client.CheckpointState.COMPLETED,
        "Determined": lambda: client.Determined(master="http://x:8080").get_trial(
            trial_id).id == trial_id,
        "DownloadMode": lambda: download(client.DownloadMode.DIRECT)
        and download(client.DownloadMode.AUTO),
        "Experiment": lambda: client.get_experiment(experiment_id).config["searcher"][
            "metric"] == "val_loss",
        "ExperimentOrderBy": lambda: {m.name for m in client.ExperimentOrderBy}
        == {"ASCENDING", "DESCENDING"},
        "ExperimentReference": experiment_reference,
        "ExperimentSortBy": lambda: [e.id for e in client.list_experiments(
            sort_by=client.ExperimentSortBy.ID, order_by=client.OrderBy.DESC)][-1]
        == experiment_id,
        "ExperimentState": lambda: client.get_experiment(experiment_id).state
        in set(client.ExperimentState),
        "Model": lambda: isinstance(_model(w, client), client.Model)
        and _model(w, client).metadata == {"k": 1},
        "ModelOrderBy": lambda: [m.name for m in client.list_models(
            order_by=client.ModelOrderBy.DESC)][0] == _model(w, client).name,
        "ModelSortBy": lambda: _model(w, client).name in [m.name for m in client.list_models(
            sort_by=client.ModelSortBy.CREATION_TIME)],
        "ModelVersion": lambda: isinstance(_model(w, client).get_version(),
                                           client.ModelVersion)
        and _model(w, client).get_version().checkpoint.uuid == uuid,
        "OrderBy": lambda: client.OrderBy.ASC is client.OrderBy.ASCENDING,
        "TrainingMetrics": lambda: metrics(client.TrainingMetrics,
                                           lambda: client.stream_trials_training_metrics(
                                               [trial_id])),
        "Trial": lambda: client.get_trial(trial_id).hparams == w.info.hparams,
        "TrialMetrics": lambda: all(isinstance(m, client.TrialMetrics) for m in
                                    client.iter_trials_metrics([trial_id], "training")),
        "TrialOrderBy": lambda: client.TrialOrderBy.ASC is client.TrialOrderBy.ASCENDING,
        "TrialReference": trial_reference,
        "TrialSortBy": lambda: client.get_experiment(experiment_id).list_trials(
            client.TrialSortBy.ID)[0].id == trial_id,
        "TrialState": lambda: client.get_trial(trial_id).state is client.TrialState.RUNNING,
        "ValidationMetrics": lambda: metrics(client.ValidationMetrics,
                                             lambda: client.stream_trials_validation_metrics(
                                                 [trial_id])),
        "_TrialMetrics": lambda: client._TrialMetrics is client.TrialMetrics,
        "_determined": lambda: client.get_trial(trial_id) is not None
        and isinstance(client._determined, client.Determined),
        "create_experiment": create_experiment,
        "create_model": lambda: _model(w, client).description == "checks",
        "get_checkpoint": lambda: client.get_checkpoint(uuid[:8]).uuid == uuid,
        "get_experiment": lambda: client.get_experiment(experiment_id).id == experiment_id,
        "get_model": lambda: client.get_model(_model(w, client).model_id).name
        == _model(w, client).name,
        "get_model_by_id": lambda: _quiet(lambda: client.get_model_by_id(
            _model(w, client).model_id)).name == _model(w, client).name,
        "get_model_labels": lambda: _model(w, client) is not None
        and "checked" in client.get_model_labels(),
        "get_models": lambda: _model(w, client).name in [
            m.name for m in _quiet(client.get_models)],
        "get_trial": lambda: client.get_trial(trial_id).experiment_id == experiment_id,
        "iter_trials_metrics": lambda: [m.steps_completed for m in client.iter_trials_metrics(
            [trial_id], "validation")][-1] == 4,
        "list_experiments": lambda: experiment_id in [e.id for e in client.list_experiments()],
        "list_models": lambda: _model(w, client).name in [m.name for m in client.list_models()],
        "logger": lambda: client.logger.name == "determined.client",
        "login": login,
        "logout": logout,
        "stream_trials_metrics": lambda: metrics(client.TrialMetrics,
                                                 lambda: client.stream_trials_metrics(
                                                     [trial_id], "validation")),
        "stream_trials_training_metrics": lambda: metrics(
            client.TrainingMetrics, lambda: client.stream_trials_training_metrics([trial_id])),
        "stream_trials_validation_metrics": lambda: metrics(
            client.ValidationMetrics,
            lambda: client.stream_trials_validation_metrics([trial_id])),
    }
    return {name: run(check) for name, check in checks.items()}


def experimental_checks(w, section: str) -> Dict[str, Callable[[], bool]]:
    """`determined.experimental` and `determined.common.experimental`: the client's classes
    (the same objects, so the client's checks cover them) and the modules of the classes."""
    from determined.experimental import client

    module = importlib.import_module(section)
    by_client = client_checks(w)

    def same(name: str) -> Callable[[], bool]:
        return lambda: getattr(module, name) is getattr(client, name) and by_client[name]()

    checks = {name: same(name) for name in by_client if name in vars(module)}
    checks.update({
        "client": lambda: module.client is client,
        "checkpoint": lambda: module.checkpoint.Checkpoint is client.Checkpoint
        and module.checkpoint.DownloadMode is client.DownloadMode,
        "metrics": lambda: module.metrics.TrialMetrics is client.TrialMetrics,
        "model": lambda: module.model.ModelVersion is client.ModelVersion,
    })
    return checks
