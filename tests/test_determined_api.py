"""Determined's public API as docs/determined-api.md lists it: every listed name exists,
every supported one does its job (a tiny TFKerasTrial built through `from_config` and
trained, and one trained and resumed by localdet's runner on a real database), and every
refused one raises one sentence at use, never at import."""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import socket
import subprocess
import sys
import typing
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "determined-api.md"
STATUSES = {"supported", "accepted", "refused"}
HEADING = re.compile(r"^## (module|class|object) `([^`]+)`\s*$")
ROW = re.compile(r"^\| `([^`]+)` \| (\w+) \| (.+) \|\s*$")


def parse_doc() -> dict:
    """{section: {name: status}}, in the page's order."""
    sections: dict = {}
    current = None
    for line in DOC.read_text().splitlines():
        heading = HEADING.match(line)
        if heading:
            current = sections.setdefault(heading.group(2), {})
            continue
        row = ROW.match(line)
        if row and current is not None:
            name, status, _ = row.groups()
            assert name not in current, f"{name} is listed twice"
            current[name] = status
    return sections


SECTIONS = parse_doc()
ROWS = [(section, name, status) for section, names in SECTIONS.items()
        for name, status in names.items()]


def test_the_page_covers_every_module_and_class_the_issue_names():
    assert set(SECTIONS) == {
        "determined", "determined.errors", "determined.keras", "determined.keras.callbacks",
        "determined.keras.TFKerasTrial", "determined.keras.TFKerasTrialContext",
        "context.env", "determined.keras.TFKerasExperimentalContext", "context.distributed"}
    assert {status for _, _, status in ROWS} <= STATUSES
    # The names users' folders failed on.
    assert SECTIONS["determined.keras"]["InputData"] == "supported"
    assert SECTIONS["context.env"]["hparams"] == "supported"
    assert SECTIONS["determined.keras.TFKerasTrialContext"]["from_config"] == "supported"


def test_import_determined_loads_no_tensorflow_and_refuses_nothing():
    code = ("import sys, determined as det; det.errors; det.EnvContext; det.util; "
            "assert 'tensorflow' not in sys.modules, 'tensorflow imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


# -- the trial the tests build ----------------------------------------------------------
import tensorflow as tf  # noqa: E402

import determined as det  # noqa: E402
from determined import keras  # noqa: E402

CONFIG = {
    "hyperparameters": {
        "global_batch_size": 4,
        "units": {"type": "int", "minval": 2, "maxval": 6},
        "lr": {"type": "log", "minval": -3, "maxval": -1, "base": 10},
        "act": det.Categorical(["relu", "tanh"]),
    },
    "data": {"rows": 32},
    "reproducibility": {"experiment_seed": 7},
    "searcher": {"name": "random", "metric": "val_loss", "max_length": {"batches": 4}},
}


class Recorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.calls = []

    def on_train_workload_end(self, total_batches_trained, logs):
        self.calls.append(("workload_end", total_batches_trained))

    def on_checkpoint_end(self, checkpoint_dir):
        self.calls.append(("checkpoint_end", Path(checkpoint_dir).is_dir()))


class TinyTrial(keras.TFKerasTrial):
    def __init__(self, context):
        super().__init__(context)
        self.seen_env = {"hparams": dict(context.env.hparams),
                         "steps_completed": context.env.steps_completed}
        self.recorder = Recorder()
        self.early = keras.callbacks.EarlyStopping(monitor="val_loss", patience=100)
        context.configure_fit(verbose=False)
        context.add_checkpoint_metadata({"made_by": "test_determined_api"})

    def build_model(self) -> tf.keras.Model:
        hp = self.context.get_hparams()
        model = self.context.wrap_model(tf.keras.Sequential([
            tf.keras.Input(shape=(3,)),
            tf.keras.layers.Dense(int(hp.get("units", 4)), activation=hp.get("act", "relu")),
            tf.keras.layers.Dense(1)]))
        optimizer = self.context.wrap_optimizer(tf.keras.optimizers.SGD(0.01))
        # (a loss object: Keras 3 cannot load a "mse" string back from .h5; reported)
        model.compile(optimizer=optimizer, loss=tf.keras.losses.MeanSquaredError())
        return model

    def _data(self, rows: int) -> tf.data.Dataset:
        rng = np.random.default_rng(0)
        x = rng.normal(size=(rows, 3)).astype("float32")
        y = x.sum(axis=1, keepdims=True)
        batch = self.context.get_per_slot_batch_size()
        return self.context.wrap_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(batch))

    def build_training_data_loader(self) -> keras.InputData:
        return self._data(int(self.context.get_data_config().get("rows", 16)))

    def build_validation_data_loader(self) -> keras.InputData:
        return self._data(8)

    def keras_callbacks(self):
        return [self.recorder, self.early, keras.callbacks.DeterminedProgress(),
                keras.callbacks.TensorBoard()]


class World:
    """Everything the checks look at, built once."""


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from conftest import start_trial

    from determined.keras._trial_controller import TrialController

    w = World()
    tmp = tmp_path_factory.mktemp("api")
    # A notebook: the context from the config, the model built and trained a step.
    w.ctx = keras.TFKerasTrialContext.from_config(CONFIG)
    w.trial = TinyTrial(w.ctx)
    w.model = w.trial.build_model()
    w.train_data = w.trial.build_training_data_loader()
    w.history = w.model.fit(w.train_data, steps_per_epoch=1, epochs=1, verbose=0)
    w.eval_loss = w.model.evaluate(w.trial.build_validation_data_loader(), verbose=0)

    # localdet's runner on a real database: 4 batches, then a resumed context.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOCALDET_HOME", str(tmp / "home"))
        db, trial_id, reporter, info = start_trial(
            tmp, target=4, hparams={"global_batch_size": 4, "units": 3},
            scheduling_unit=2, data={"rows": 16})
        w.db, w.trial_id, w.info = db, trial_id, info
        controller = TrialController.for_trial_class(TinyTrial, info, reporter)
        w.managed = controller.context
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            controller.run()
        reporter.wait_for_checkpoints()
        w.progress = out.getvalue()
        w.managed_model = controller.model
        w.tensorboard_path = w.managed.get_tensorboard_path()
        w.recorder = [c for c in controller.user_callbacks if isinstance(c, Recorder)][0]
        w.early = [c for c in controller.user_callbacks
                   if isinstance(c, keras.callbacks.EarlyStopping)][0]
        w.resumed_info = reporter.trial_info()
        w.resumed = keras.TFKerasTrialContext(w.resumed_info)
        w.resumed_steps = w.resumed.env.steps_completed
        w.resumed_trial = TinyTrial(w.resumed)
        mp.setenv("CUDA_VISIBLE_DEVICES", "")
        mp.setenv("LOCALDET_SLOTS", "0")
        w.devices = (w.managed.env.container_gpus, w.managed.env.slot_ids,
                     w.managed.env.use_gpu)
        from localdet.paths import Layout
        from localdet.reporting.sqlite_reporter import CheckpointReader

        reader = CheckpointReader(Layout(tmp / "home"))
        w.checkpoint = reader.resolve(trial_id=trial_id)
        w.export = reader.materialize(w.checkpoint, tmp / "export")
        # get_cluster_info() in a process localdet started (recorded as running here).
        db.update_trial(trial_id, state="RUNNING", pid=os.getpgrp())
        mp.setenv("LOCALDET_TRIAL_ID", str(trial_id))
        w.cluster_info = det.get_cluster_info()
    w.tmp = tmp
    return w


# -- refused names ------------------------------------------------------------------------
def one_sentence(message: str) -> None:
    assert message.endswith("."), message
    assert "\n" not in message, message
    assert not re.search(r"\.\s+[A-Z]", message), f"more than one sentence: {message}"
    assert "localdet" in message, message


def owner(section: str, w):
    objects = {"determined.keras.TFKerasTrial": lambda: w.trial,
               "determined.keras.TFKerasTrialContext": lambda: w.ctx,
               "context.env": lambda: w.ctx.env,
               "determined.keras.TFKerasExperimentalContext": lambda: w.ctx.experimental,
               "context.distributed": lambda: w.ctx.distributed}
    if section in objects:
        return objects[section]()
    import importlib

    return importlib.import_module(section)


@pytest.mark.parametrize("section,name", [(s, n) for s, n, st in ROWS if st != "refused"])
def test_every_supported_or_accepted_name_exists(world, section, name):
    getattr(owner(section, world), name)


@pytest.mark.parametrize("section,name", [(s, n) for s, n, st in ROWS if st == "refused"])
def test_every_refused_name_raises_one_sentence_at_use(world, section, name):
    from determined._refused import NotServedImportError

    target = owner(section, world)
    assert name in dir(target) or section == "determined", f"{name} does not exist"
    with pytest.raises((det.errors.NotServedError, NotServedImportError)) as raised:
        value = getattr(target, name)
        value()  # a refused class refuses to be made
    one_sentence(str(raised.value))
    if section == "determined":
        with pytest.raises((det.errors.NotServedError, NotServedImportError)):
            exec(f"import determined.{name}" if name.islower() else f"det.{name}()")


# -- supported names: what each does ------------------------------------------------------
def _det(w):
    from determined import errors, util

    return {
        "__version__": lambda: det.__version__.startswith("0.38"),
        "core": lambda: det.core.DistributedContext is type(w.ctx.distributed),
        "keras": lambda: det.keras is keras,
        "errors": lambda: issubclass(errors.NotServedError, NotImplementedError),
        "util": lambda: (util.calculate_batch_sizes({"global_batch_size": 10}, 3) == (3, 9)
                         and util.is_overridden(w.trial.build_model, keras.TFKerasTrial)
                         and not util.is_overridden(w.trial.session_config,
                                                    keras.TFKerasTrial)
                         and util.json_encode({"a": np.int64(3)}) == '{"a": 3}'),
        "InvalidHP": lambda: det.InvalidHP is errors.InvalidHP
        and str(det.InvalidHP("units too small")) == "units too small",
        "EnvContext": lambda: isinstance(w.managed.env, det.EnvContext),
        "ExperimentConfig": lambda: isinstance(w.ctx.env.experiment_config,
                                               det.ExperimentConfig)
        and w.ctx.env.experiment_config.slots_per_trial() == 1
        and w.ctx.env.experiment_config.debug_enabled() is False,
        "TrialContext": lambda: isinstance(w.ctx, det.TrialContext)
        and det.TrialContext.from_config(CONFIG).get_hparams() == w.ctx.get_hparams(),
        "Trial": lambda: isinstance(w.trial, det.Trial),
        "LegacyTrial": lambda: det.LegacyTrial is det.Trial,
        "ClusterInfo": lambda: isinstance(w.cluster_info, det.ClusterInfo)
        and w.cluster_info.cluster_id == "localdet"
        and w.cluster_info.latest_checkpoint == w.checkpoint,
        "TrialInfo": lambda: isinstance(w.cluster_info.trial, det.TrialInfo)
        and w.cluster_info.trial.trial_id == w.trial_id
        and w.cluster_info.trial.hparams == w.info.hparams
        and w.cluster_info.trial.steps_completed == 4,
        "get_cluster_info": lambda: det.get_cluster_info() is None
        and w.cluster_info.task_type == "TRIAL",
        "import_from_path": lambda: _import_two_model_defs(w.tmp),
        "Categorical": lambda: det.Categorical(["a"]) == {"type": "categorical", "vals": ["a"]}
        and w.ctx.get_hparam("act") in ("relu", "tanh"),
        "Constant": lambda: det.Constant(3) == {"type": "const", "val": 3}
        and keras.TFKerasTrialContext.from_config(
            {"hyperparameters": {"k": det.Constant(3)}}).get_hparam("k") == 3,
        "Double": lambda: 0.5 <= keras.TFKerasTrialContext.from_config(
            {"hyperparameters": {"d": det.Double(0.5, 0.6)}}).get_hparam("d") <= 0.6,
        "Integer": lambda: det.Integer(2, 6) == {"type": "int", "minval": 2, "maxval": 6}
        and 2 <= w.ctx.get_hparam("units") <= 6,
        "Log": lambda: det.Log(-3, -1, 10)["base"] == 10
        and 1e-3 <= w.ctx.get_hparam("lr") <= 1e-1,
    }


def _import_two_model_defs(tmp: Path) -> bool:
    values = []
    for value in (1, 2):
        folder = tmp / f"exp{value}"
        folder.mkdir(exist_ok=True)
        (folder / "model_def_api.py").write_text(f"VALUE = {value}\n")
        with det.import_from_path(folder):
            import model_def_api

            values.append(model_def_api.VALUE)
        assert "model_def_api" not in sys.modules and str(folder) not in sys.path
    return values == [1, 2]


def _errors(w):
    from determined import errors

    def raises(cls) -> bool:
        try:
            raise cls("what went wrong")
        except Exception as caught:  # noqa: BLE001 - the class under test
            return type(caught) is cls and str(caught) == "what went wrong"

    checks = {name: functools.partial(raises, getattr(errors, name))
              for name in SECTIONS["determined.errors"]}
    for sub in ("InvalidConfigurationException", "InvalidDataTypeException",
                "InvalidModelException"):
        checks[sub] = (lambda s=sub: issubclass(getattr(errors, s),
                                                errors.InvalidExperimentException)
                       and raises(getattr(errors, s)))
    checks["InvalidHP"] = lambda: errors.InvalidHP is det.InvalidHP and raises(errors.InvalidHP)
    return checks


def _keras(w):
    return {
        "TFKerasTrial": lambda: isinstance(w.trial, keras.TFKerasTrial),
        "TFKerasTrialContext": lambda: type(w.ctx) is keras.TFKerasTrialContext,
        "TFKerasContext": lambda: keras.TFKerasContext is keras.TFKerasTrialContext,
        "TFKerasExperimentalContext": lambda: isinstance(w.ctx.experimental,
                                                         keras.TFKerasExperimentalContext),
        "TFKerasTrainConfig": lambda: keras.TFKerasTrainConfig(1, 2, []).validation_data == 2
        and keras.TFKerasTrainConfig._fields == ("training_data", "validation_data",
                                                 "callbacks"),
        "InputData": lambda: tf.data.Dataset in typing.get_args(keras.InputData)
        and isinstance(w.train_data, tf.data.Dataset)
        and typing.get_type_hints(keras.TFKerasTrial.build_training_data_loader)["return"]
        == keras.InputData,
        "ArrayLike": lambda: np.ndarray in typing.get_args(keras.ArrayLike),
        "SequenceAdapter": lambda: _sequence_adapter_trains(w, keras.SequenceAdapter),
        "KerasDataAdapter": lambda: _sequence_adapter_trains(w, keras.KerasDataAdapter),
        "callbacks": lambda: keras.callbacks.Callback.__module__.startswith(
            "determined.keras.callbacks"),
        "load_model_from_checkpoint_path": lambda: _loads_the_trained_model(w),
        "TensorBoard": lambda: keras.TensorBoard is keras.callbacks.TensorBoard,
        "TFKerasTensorBoard": lambda: keras.TFKerasTensorBoard is keras.callbacks.TensorBoard,
        "init": lambda: isinstance(keras.init(hparams={"global_batch_size": 8}, record=False),
                                   keras.KerasContext),
        "KerasContext": lambda: keras.init(hparams={"n": 1}, record=False)
        .training.hparams["n"] == 1,
        "TrainingContext": lambda: isinstance(keras.init(hparams={}, record=False).training,
                                              keras.TrainingContext),
    }


def _sequence_adapter_trains(w, cls) -> bool:
    class Rows(tf.keras.utils.Sequence):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return np.ones((4, 3), "float32") * i, np.ones((4, 1), "float32")

    adapter = cls(Rows(), workers=0)
    return adapter.sequence.__len__() == 2 and adapter.workers == 0


def _loads_the_trained_model(w) -> bool:
    loaded = keras.load_model_from_checkpoint_path(str(w.export))
    x = np.ones((2, 3), "float32")
    return bool(np.allclose(loaded.predict(x, verbose=0), w.managed_model.predict(x, verbose=0)))


def _callbacks(w):
    cb = keras.callbacks
    return {
        "Callback": lambda: ("workload_end", 2) in w.recorder.calls
        and ("workload_end", 4) in w.recorder.calls
        and ("checkpoint_end", True) in w.recorder.calls,
        "DeterminedProgress": lambda: "workload 100% complete (2/2)" in w.progress
        and "total batches trained: 4" in w.progress,
        "EarlyStopping": lambda: isinstance(w.early, cb.EarlyStopping)
        and w.early.get_state() is not None and not w.managed_model.stop_training,
        "ReduceLROnPlateau": lambda: cb.ReduceLROnPlateau(monitor="val_loss").get_state()
        is not None,
        "ReduceLRScheduler": lambda: cb.ReduceLRScheduler is cb.ReduceLROnPlateau,
        "TensorBoard": lambda: issubclass(cb.TensorBoard, tf.keras.callbacks.TensorBoard),
    }


def _trial(w):
    return {
        "__init__": lambda: w.trial.context is w.ctx,
        "context": lambda: w.trial.context is w.ctx,
        "build_model": lambda: w.model in w.ctx.models and w.model.optimizer is not None,
        "build_training_data_loader": lambda: bool(np.isfinite(w.history.history["loss"][0])),
        "build_validation_data_loader": lambda: bool(np.isfinite(w.eval_loss)),
        "session_config": lambda: w.trial.session_config().allow_soft_placement is True,
        "keras_callbacks": lambda: len(w.trial.keras_callbacks()) == 4,
        "trial_context_class": lambda: keras.TFKerasTrial.trial_context_class
        is keras.TFKerasTrialContext,
    }


def _context(w):
    c, m = w.ctx, w.managed

    def stop() -> bool:
        fresh = keras.TFKerasTrialContext.from_config(CONFIG)
        before = fresh.get_stop_requested()
        fresh.set_stop_requested(True)
        with pytest.raises(TypeError):
            fresh.set_stop_requested("yes")
        return before is False and fresh.get_stop_requested() is True

    def configure_fit() -> bool:
        fresh = keras.TFKerasTrialContext.from_config(CONFIG)
        fresh.configure_fit(verbose=True, workers=2)
        fresh.configure_fit(shuffle=False)
        return fresh.fit_config == {"verbose": True, "workers": 2, "shuffle": False}

    def get_hparam() -> bool:
        with pytest.raises(ValueError, match="global_batch_size, lr, units"):
            c.get_hparam("missing")
        return m.get_hparam("units") == 3

    return {
        "from_config": lambda: c.get_hparams() == keras.TFKerasTrialContext.from_config(
            CONFIG).get_hparams() and c.get_hparam("global_batch_size") == 4
        and c.env.managed_training is False,
        "env": lambda: isinstance(c.env, det.EnvContext),
        "distributed": lambda: c.distributed.size == 1,
        "experimental": lambda: isinstance(c.experimental, keras.TFKerasExperimentalContext),
        "get_experiment_config": lambda: m.get_experiment_config() == w.info.config
        and c.get_experiment_config()["data"] == {"rows": 32},
        "get_data_config": lambda: c.get_data_config() == {"rows": 32}
        and m.get_data_config() == {"rows": 16},
        "get_experiment_id": lambda: m.get_experiment_id() == w.info.experiment_id
        and c.get_experiment_id() == 0,
        "get_trial_id": lambda: m.get_trial_id() == w.trial_id and c.get_trial_id() == 0,
        "get_trial_seed": lambda: m.get_trial_seed() == w.info.seed == 3
        and c.get_trial_seed() == 7,
        "get_hparams": lambda: m.get_hparams() == {"global_batch_size": 4, "units": 3},
        "get_hparam": get_hparam,
        "get_global_batch_size": lambda: c.get_global_batch_size() == 4,
        "get_per_slot_batch_size": lambda: c.get_per_slot_batch_size() == 4,
        "get_stop_requested": stop,
        "set_stop_requested": stop,
        "get_initial_batch": lambda: m.get_initial_batch() == 0
        and w.resumed.get_initial_batch() == 4,
        "get_tensorboard_path": lambda: w.tensorboard_path == w.info.trial_dir / "tensorboard"
        and (w.tensorboard_path / "train").is_dir(),
        "configure_fit": configure_fit,
        "wrap_model": lambda: c.models == [w.model],
        "wrap_optimizer": lambda: c.optimizers == [w.model.optimizer],
        "wrap_dataset": lambda: c.is_wrapped_dataset(w.train_data),
        "model": lambda: c.model is w.model and m.model is w.managed_model,
        "dataset_initialized": lambda: c.dataset_initialized
        and not keras.TFKerasTrialContext.from_config(CONFIG).dataset_initialized,
        "add_checkpoint_metadata": lambda: w.db.checkpoints(trial_id=w.trial_id)[-1]
        .metadata.get("made_by") == "test_determined_api",
    }


def _env(w):
    e, r = w.managed.env, w.resumed.env
    return {
        "experiment_config": lambda: e.experiment_config == w.info.config,
        "hparams": lambda: e.hparams == w.info.hparams
        and w.resumed_trial.seen_env["hparams"] == w.info.hparams,
        "trial_seed": lambda: e.trial_seed == 3,
        "latest_checkpoint": lambda: e.latest_checkpoint is None
        and r.latest_checkpoint == w.checkpoint,
        "steps_completed": lambda: e.steps_completed == 0 and w.resumed_steps == 4
        and w.resumed_trial.seen_env["steps_completed"] == 4,
        "latest_batch": lambda: e.latest_batch == 0 and w.resumed_steps == 4,
        "det_trial_id": lambda: e.det_trial_id == str(w.trial_id),
        "det_experiment_id": lambda: e.det_experiment_id == str(w.info.experiment_id),
        "global_batch_size": lambda: e.global_batch_size == 4,
        "per_slot_batch_size": lambda: e.per_slot_batch_size == 4,
        "managed_training": lambda: e.managed_training is True
        and w.ctx.env.managed_training is False,
        "on_cluster": lambda: e.on_cluster is True and w.ctx.env.on_cluster is False,
        "test_mode": lambda: e.test_mode is False,
        "debug": lambda: e.debug is False,
        "container_gpus": lambda: w.devices[0] == [],
        "slot_ids": lambda: w.devices[1] == [0],
        "use_gpu": lambda: w.devices[2] is False,
        "det_cluster_id": lambda: e.det_cluster_id == "localdet",
        "det_agent_id": lambda: e.det_agent_id == socket.gethostname(),
        "allocation_id": lambda: e.allocation_id == f"trial-{w.trial_id}",
        "det_trial_unique_port_offset": lambda: e.det_trial_unique_port_offset == 0,
    }


def _experimental(w):
    def cached(decorator_name: str, shuffle: bool) -> bool:
        made = []

        def numbers():
            made.append(1)  # counts passes over the source: a cached pass adds none
            yield from range(6)

        ctx = keras.TFKerasTrialContext.from_config(CONFIG)
        decorator = getattr(ctx.experimental, decorator_name)

        @decorator("numbers", f"v-{decorator_name}-{shuffle}", shuffle=shuffle)
        def make():
            return tf.data.Dataset.from_generator(
                numbers, output_signature=tf.TensorSpec((), tf.int64))

        dataset = make()
        first = [int(v) for v in dataset]
        second = [int(v) for v in dataset]
        return (len(made) == 1 and sorted(first) == sorted(second) == list(range(6))
                and (first == list(range(6))) != shuffle)

    return {"cache_train_dataset": lambda: cached("cache_train_dataset", True),
            "cache_validation_dataset": lambda: cached("cache_validation_dataset", False)}


def _distributed(w):
    d = w.ctx.distributed

    class Horovod:  # the functions DistributedContext reads from an initialised horovod
        rank = local_rank = cross_rank = staticmethod(lambda: 0)
        size = local_size = cross_size = staticmethod(lambda: 1)

    return {
        "rank": lambda: d.rank == 0, "size": lambda: d.size == 1,
        "local_rank": lambda: d.local_rank == 0, "local_size": lambda: d.local_size == 1,
        "cross_rank": lambda: d.cross_rank == 0, "cross_size": lambda: d.cross_size == 1,
        "get_rank": lambda: d.get_rank() == 0, "get_local_rank": lambda: d.get_local_rank() == 0,
        "get_size": lambda: d.get_size() == 1, "get_num_agents": lambda: d.get_num_agents() == 1,
        "gather": lambda: d.gather("a") == ["a"],
        "gather_local": lambda: d.gather_local("a") == ["a"],
        "allgather": lambda: d.allgather("a") == ["a"],
        "allgather_local": lambda: d.allgather_local("a") == ["a"],
        "broadcast": lambda: d.broadcast({"k": 1}) == {"k": 1},
        "broadcast_local": lambda: d.broadcast_local(5) == 5,
        "from_horovod": lambda: type(d).from_horovod(Horovod).size == 1,
    }


CHECKS = {
    "determined": _det, "determined.errors": _errors, "determined.keras": _keras,
    "determined.keras.callbacks": _callbacks, "determined.keras.TFKerasTrial": _trial,
    "determined.keras.TFKerasTrialContext": _context, "context.env": _env,
    "determined.keras.TFKerasExperimentalContext": _experimental,
    "context.distributed": _distributed,
}


@pytest.mark.parametrize("section,name", [(s, n) for s, n, st in ROWS if st != "refused"])
def test_every_supported_name_does_its_job(world, section, name):
    checks = CHECKS[section](world)
    assert name in checks, f"{section}.{name} is listed but no test exercises it"
    assert checks[name]() is True, f"{section}.{name} did not behave as documented"


# -- Keras 2 ------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("TF_USE_LEGACY_KERAS") == "1",
                    reason="already running under Keras 2")
def test_this_file_passes_under_keras2():
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
        env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and "1 skipped" in result.stdout
    assert "tf_keras" in subprocess.run(
        [sys.executable, "-c", "import tensorflow as tf; print(tf.keras.__name__)"],
        env=env, capture_output=True, text=True, check=True).stdout
