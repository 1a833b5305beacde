"""Determined's public API as docs/determined-api.md lists it: every listed name exists,
every supported one does its job (a tiny TFKerasTrial built through `from_config` and
trained, and one trained and resumed by localdet's runner on a real database), and every
refused one raises one sentence at use, never at import."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import io
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import types
import typing
from pathlib import Path

import numpy as np
import pytest
import sdk_api_checks
import searcher_api_checks

pytestmark = pytest.mark.keras2  # and again under Keras 2 (tests/test_keras_2_line.py)

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "determined-api.md"
DATA = REPO / "docs" / "determined-api-names.json"
SCRIPT = REPO / "scripts" / "determined_api_names.py"
STATUSES = {"supported", "accepted", "refused"}
HEADING = re.compile(r"^## (module|class|object) `([^`]+)`\s*$")
ROW = re.compile(r"^\| `([^`]+)` \|(.*)\|\s*$")
NOT_EXPORTED = {"localdet", "subpackage"}  # releases of names Determined's __init__ lacked


def parse_doc() -> dict:
    """{section: {name: (status, releases, assignable or None)}}, in the page's order."""
    sections: dict = {}
    current = None
    for line in DOC.read_text().splitlines():
        heading = HEADING.match(line)
        if heading:
            current = sections.setdefault(heading.group(2), {})
            continue
        row = ROW.match(line)
        if row and current is not None:
            name, cells = row.group(1), [c.strip() for c in row.group(2).split(" | ")]
            assert name not in current, f"{name} is listed twice"
            assert len(cells) in (3, 4), f"{name}: a row has 4 or 5 columns"
            current[name] = (cells[0], cells[1], cells[2] if len(cells) == 4 else None)
    return sections


SECTIONS = parse_doc()
ROWS = [(section, name, row[0]) for section, names in SECTIONS.items()
        for name, row in names.items()]
ASSIGNABLE = [(section, name) for section, names in SECTIONS.items()
              for name, row in names.items() if row[2] == "yes"]
DETERMINED_DATA = json.loads(DATA.read_text())
# A clone of determined-ai/determined with its tags, named only by the environment: no
# machine's own path is written into the repository.
CHECKOUT = os.environ.get("DETERMINED_CHECKOUT") or None


@functools.lru_cache(maxsize=1)
def script():
    """scripts/determined_api_names.py as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("determined_api_names", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_page_covers_every_module_and_class_the_issue_names():
    assert set(SECTIONS) == {
        "determined", "determined.errors", "determined.core", "determined.experimental",
        "determined.experimental.client", "determined.common.experimental",
        "determined.keras", "determined.keras.callbacks",
        "determined.keras.TFKerasTrial", "determined.keras.TFKerasTrialContext",
        "context.env", "determined.keras.TFKerasExperimentalContext", "context.distributed",
        "determined.ClusterInfo", "determined.TrialInfo", "determined.searcher"}
    assert {status for _, _, status in ROWS} <= STATUSES, "a name is left unclassified"
    # The names users' folders failed on.
    assert SECTIONS["determined.keras"]["InputData"][0] == "supported"
    assert SECTIONS["determined.keras"]["_ArrayLikeAdapter"][0] == "supported"
    assert SECTIONS["determined"]["LOG_FORMAT"][0] == "supported"
    assert SECTIONS["context.env"]["hparams"][0] == "supported"
    assert SECTIONS["context.env"]["container_gpus"][2] == "yes"
    assert SECTIONS["determined.keras.TFKerasTrialContext"]["from_config"][0] == "supported"


@pytest.mark.parametrize("section", sorted(set(DETERMINED_DATA["modules"])
                                           | set(DETERMINED_DATA["members"])))
def test_the_page_lists_every_name_determined_exported(section):
    """Every name of the data file is on the page with its releases (and, for an object,
    whether Determined let code assign it); names it lacks say why they are there."""
    assignable_mark = script().assignable_mark
    doc = SECTIONS[section]
    if section in DETERMINED_DATA["modules"]:
        data = {n: {"releases": r} for n, r in DETERMINED_DATA["modules"][section].items()}
    else:
        data = DETERMINED_DATA["members"][section]
    assert sorted(set(data) - set(doc)) == [], f"{section}: names missing from the page"
    for name, (_, releases, assignable) in doc.items():
        if name not in data:
            assert releases in NOT_EXPORTED, f"{section}.{name}: releases {releases}"
            continue
        assert releases == data[name]["releases"], f"{section}.{name}: releases"
        if "assignable" in data[name]:
            assert assignable == assignable_mark(data[name]), f"{section}.{name}: assignable"


@pytest.mark.skipif(CHECKOUT is None, reason="no Determined checkout: set DETERMINED_CHECKOUT "
                    "to a clone of determined-ai/determined with its tags")
def test_the_data_file_is_what_determineds_releases_export(tmp_path):
    result = subprocess.run([sys.executable, str(SCRIPT), str(CHECKOUT), "--out",
                             str(tmp_path / "names.json")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "names.json").read_text()) == DETERMINED_DATA


def test_the_script_fills_the_page_and_flags_new_names():
    fill_doc = script().fill_doc
    assert fill_doc(DOC.read_text(), DETERMINED_DATA) == DOC.read_text()
    data = json.loads(json.dumps(DETERMINED_DATA))
    data["modules"]["determined.keras"]["new_name"] = "0.39.0"
    data["members"]["context.env"]["new_field"] = {"releases": "0.39.0", "assignable": "0.39.0",
                                                   "kinds": "attribute"}
    filled = fill_doc(DOC.read_text(), data)
    assert "| `new_name` | unclassified | 0.39.0 | to decide |" in filled
    assert "| `new_field` | unclassified | 0.39.0 | yes | to decide |" in filled


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


# Names Determined had that localdet still lacks, as ("missing" | "assign", section, name):
# a missing name fails every check, an "assign" one only the assignment. Strict xfails: a
# gap closed makes its test pass and fail here, so the entry goes with the fix. None now.
KNOWN_GAPS: dict = {}


def cases(pairs, kind="missing"):
    """(section, name) pairs as test parameters, the known gaps marked."""
    out = []
    for section, name in pairs:
        gap = KNOWN_GAPS.get((kind, section, name))
        marks = [pytest.mark.xfail(strict=True, reason=gap)] if gap else []
        out.append(pytest.param(section, name, marks=marks, id=f"{section}-{name}"))
    return out


def owner(section: str, w):
    objects = {"determined.keras.TFKerasTrial": lambda: w.trial,
               "determined.keras.TFKerasTrialContext": lambda: w.ctx,
               "context.env": lambda: w.ctx.env,
               "determined.keras.TFKerasExperimentalContext": lambda: w.ctx.experimental,
               "context.distributed": lambda: w.ctx.distributed,
               "determined.ClusterInfo": lambda: w.cluster_info,
               "determined.TrialInfo": lambda: w.cluster_info.trial}
    if section in objects:
        return objects[section]()
    import importlib

    return importlib.import_module(section)


def fresh_owner(section: str, w):
    """An object of the section's kind that a test may change."""
    import copy

    ctx = keras.TFKerasTrialContext.from_config(CONFIG)
    objects = {"determined.keras.TFKerasTrial": lambda: TinyTrial(ctx),
               "determined.keras.TFKerasTrialContext": lambda: ctx,
               "context.env": lambda: ctx.env,
               "determined.keras.TFKerasExperimentalContext": lambda: ctx.experimental,
               "context.distributed": lambda: ctx.distributed,
               "determined.ClusterInfo": lambda: copy.copy(w.cluster_info),
               "determined.TrialInfo": lambda: copy.copy(w.cluster_info.trial)}
    return objects[section]()


@pytest.mark.parametrize("section,name", cases((s, n) for s, n, st in ROWS
                                                if st != "refused"))
def test_every_supported_or_accepted_name_exists(world, section, name):
    getattr(owner(section, world), name)


@pytest.mark.parametrize("section,name", cases((s, n) for s, n, st in ROWS if st == "refused"))
def test_every_refused_name_raises_one_sentence_at_use(world, section, name):
    from determined._refused import REFUSED, NotServedImportError

    target = owner(section, world)
    assert name in dir(target) or section == "determined", f"{name} does not exist"
    with pytest.raises((det.errors.NotServedError, NotServedImportError)) as raised:
        value = getattr(target, name)
        value()  # a refused class refuses to be made
    one_sentence(str(raised.value))
    if section == "determined" and name in REFUSED:  # a subpackage refuses its import too
        with pytest.raises(NotServedImportError):
            exec(f"import determined.{name}")


def test_the_sdk_imports_as_determined_users_import_it():
    code = ("from determined.experimental import client, Determined; "
            "from determined.common.experimental import Checkpoint; "
            "from determined.common.api import errors; "
            "assert client.Checkpoint is Checkpoint and errors.NotFoundException")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


@pytest.mark.parametrize("section,name", cases(ASSIGNABLE, "assign"))
def test_what_determined_let_code_assign_can_be_assigned(world, section, name):
    """`self.context.env.container_gpus = []` (a trial of Determined 0.17.7 does it), and any
    attribute Determined held as a plain one: the value read back is the one assigned, a
    refused attribute's included."""
    target = fresh_owner(section, world)
    value = object()
    setattr(target, name, value)
    assert getattr(target, name) is value


# -- supported names: what each does ------------------------------------------------------
def _det(w):
    from determined import errors, util

    return {
        "__version__": lambda: det.__version__.startswith("0.38"),
        "LOG_FORMAT": lambda: det.LOG_FORMAT
        == "%(levelname)s: [%(process)s] %(name)s: %(message)s",
        "_core": lambda: det._core is det.core,
        "DistributedContext": lambda: det.DistributedContext is det.core.DistributedContext,
        "_catch_sys_exit": _sys_exit_is_caught,
        "_local_execution_manager": lambda: _runs_in_folder(w.tmp),
        "core": lambda: det.core.DistributedContext is type(w.ctx.distributed),
        "keras": lambda: det.keras is keras,
        "experimental": lambda: importlib.import_module("determined.experimental").client
        is importlib.import_module("determined.experimental.client"),
        "launch": lambda: det.launch.__name__ == "determined.launch"
        and importlib.util.find_spec("determined.launch.tensorflow") is not None,
        "errors": lambda: issubclass(errors.NotServedError, NotImplementedError),
        "searcher": lambda: det.searcher.SearchMethod
        is importlib.import_module("determined.searcher").SearchMethod,
        "workload": lambda: det.workload.Stream is not None
        and _refuses_in_one_sentence(lambda: det.workload.train_workload),
        "gpu": lambda: _refuses_in_one_sentence(lambda: det.gpu.get_gpu_uuids),
        "common": _common_serves_storage_and_refuses_the_rest,
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


def _refuses_in_one_sentence(use) -> bool:
    from determined._refused import NotServedImportError

    try:
        use()
    except NotServedImportError as error:
        one_sentence(str(error))
        return True
    return False


def _common_serves_storage_and_refuses_the_rest() -> bool:
    from determined.common import check, storage

    with tempfile.TemporaryDirectory() as folder:
        manager = storage.SharedFSStorageManager(folder)
        with manager.store_path("ckpt") as path:
            (path / "w.txt").write_text("1")
        with manager.restore_path("ckpt") as path:
            stored = (path / "w.txt").read_text() == "1"
    return stored and issubclass(check.CheckFailedError, Exception) \
        and _refuses_in_one_sentence(lambda: exec("from determined.common import context")) \
        and _refuses_in_one_sentence(lambda: exec("from determined.common.api import bindings")) \
        and _refuses_in_one_sentence(lambda: storage.S3StorageManager)


def _sys_exit_is_caught() -> bool:
    with pytest.raises(det.errors.InvalidExperimentException, match="sys.exit"):
        with det._catch_sys_exit():
            raise SystemExit(3)
    return True


def _runs_in_folder(tmp: Path) -> bool:
    before, first, inside = os.getcwd(), sys.path[0], []
    with pytest.raises(det.errors.InvalidExperimentException):
        with det._local_execution_manager(tmp):
            inside.append(Path.cwd() == tmp.resolve() and sys.path[0] == "")
            sys.exit(1)
    return inside == [True] and os.getcwd() == before and sys.path[0] == first


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
        "TensorBoard": lambda: issubclass(keras.TensorBoard, tf.keras.callbacks.TensorBoard)
        and "core_context" in inspect.signature(keras.TensorBoard).parameters,
        "DeterminedCallback": lambda: issubclass(keras.DeterminedCallback,
                                                 tf.keras.callbacks.Callback)
        and list(inspect.signature(keras.DeterminedCallback).parameters)[:3]
        == ["core_context", "checkpoint", "continue_id"],
        "TFKerasTensorBoard": lambda: keras.TFKerasTensorBoard is keras.callbacks.TensorBoard,
        "get_rng_state": _rng_round_trip,
        "set_rng_state": _rng_round_trip,
        "_ArrayLikeAdapter": _array_like_adapter,
        "_adapt_data_from_data_loader": _adapt_data_from_data_loader,
        "_adapt_data_from_fit_args": _adapt_data_from_fit_args,
        "_Sampler": _sampler_order,
        "_Enqueuer": lambda: _enqueuer_reads(workers=0) and _enqueuer_reads(workers=2),
        "_build_enqueuer": lambda: _enqueuer_reads(workers=2),
        "_check_if_aggregation_frequency_will_work": lambda:
        keras._check_if_aggregation_frequency_will_work(w.model, 2, use_horovod=True) is None,
        "init": lambda: isinstance(keras.init(hparams={"global_batch_size": 8}, record=False),
                                   keras.KerasContext),
        "KerasContext": lambda: keras.init(hparams={"n": 1}, record=False)
        .training.hparams["n"] == 1,
        "TrainingContext": lambda: isinstance(keras.init(hparams={}, record=False).training,
                                              keras.TrainingContext),
    }


def _rng_round_trip() -> bool:
    import pickle
    import random

    def draw():
        return (np.random.rand(), random.random(),
                tf.random.get_global_generator().normal([3]).numpy().tolist())

    state = pickle.loads(pickle.dumps(keras.get_rng_state()))
    first = draw()
    keras.set_rng_state(state)
    return draw() == first and {"np_rng_state", "random_rng_state"} <= set(state)


def _array_like_adapter() -> bool:
    seq = keras._ArrayLikeAdapter(np.arange(100), np.arange(100, 200), batch_size=16)
    short = keras._ArrayLikeAdapter(np.arange(100), np.arange(100, 200), batch_size=16,
                                    drop_leftovers=True)
    weighted = keras._ArrayLikeAdapter({"a": np.arange(4)}, [np.arange(4), np.arange(4)],
                                       batch_size=2, sample_weights=np.ones(4))
    from determined.common.check import CheckFailedError

    with pytest.raises(CheckFailedError, match="batch_size 32"):  # Determined's error
        keras._ArrayLikeAdapter(np.arange(16), np.arange(16), batch_size=32)
    x, y, sw = weighted[1]
    return (isinstance(seq, tf.keras.utils.Sequence) and len(seq) == 7 and len(short) == 6
            and np.array_equal(seq[6][0], np.arange(96, 100))
            and np.array_equal(seq[6][1], np.arange(196, 200))
            and np.array_equal(x["a"], [2, 3]) and len(y) == 2 and len(sw) == 2)


def _adapt_data_from_data_loader() -> bool:
    dataset = tf.data.Dataset.range(3)
    adapted = keras._adapt_data_from_data_loader((np.arange(8), np.arange(8)), batch_size=4)
    with pytest.raises(det.errors.InvalidDataTypeException):
        keras._adapt_data_from_data_loader((None, adapted), batch_size=1)
    return (keras._adapt_data_from_data_loader(dataset, 2) is dataset
            and keras._adapt_data_from_data_loader(adapted, 2) is adapted and len(adapted) == 2)


def _adapt_data_from_fit_args() -> bool:
    adapted = keras._adapt_data_from_fit_args(x=[np.arange(100), np.arange(100, 200)],
                                              y=np.arange(200, 300), sample_weight=None,
                                              batch_size=16)
    (x0, x1), y = adapted[3]
    with pytest.raises(det.errors.InvalidDataTypeException):
        keras._adapt_data_from_fit_args(adapted, np.arange(3), None, 1)
    return (len(adapted) == 7 and np.array_equal(x1, np.arange(148, 164))
            and np.array_equal(y, np.arange(248, 264)))


def _expected_order(shuffle: bool, rank: int, size: int, skip: int, length: int = 10):
    """Determined's order: one RandomState shuffles the indices anew every epoch; shard r
    of n takes every n-th index of the endless stream from r, less `skip` of its own."""
    rng, stream, indices = np.random.RandomState(777), [], list(range(length))
    for _ in range(8):
        if shuffle:
            rng.shuffle(indices)
        stream += indices
    return stream[rank::size][skip:]


def _sampler_order() -> bool:
    from determined.common.check import CheckFailedError

    with pytest.raises(CheckFailedError, match="at least one batch per process"):
        keras._Sampler(3, 0, 4, False, 0, 0)
    for shuffle, rank, size, skip in [(False, 0, 1, 0), (True, 1, 3, 5), (True, 2, 3, 7)]:
        sampler = keras._Sampler(10, rank, size, shuffle, 777, skip)
        got = [i for _ in range(3) for i in sampler.yield_epoch()]
        if got != _expected_order(shuffle, rank, size, skip)[:len(got)] or len(got) < 8:
            return False
    return True


class _Numbers(tf.keras.utils.Sequence):
    def __init__(self):
        super().__init__()
        self.epochs = 0

    def __len__(self):
        return 10

    def __getitem__(self, index):
        return index

    def on_epoch_end(self):
        self.epochs += 1


def _enqueuer_reads(workers: int) -> bool:
    sequence = _Numbers()
    sampler = keras._Sampler(10, 1, 3, True, 777, 2)
    with keras._build_enqueuer(sequence=sequence, workers=workers, use_multiprocessing=False,
                               max_queue_size=4, shard_rank=1, num_shards=3, repeat=False,
                               shuffle=True, shuffle_seed=777,
                               prior_batches_trained=2) as enqueuer:
        same = all(list(enqueuer.data()) == list(sampler.yield_epoch()) for _ in range(3))
    return same and isinstance(enqueuer, keras._Enqueuer) and sequence.epochs == 3


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
        "_DeterminedProgress": lambda: cb._DeterminedProgress is cb.DeterminedProgress,
        "_DeterminedHistory": _history_keeps_validations,
        "logger": lambda: cb.logger.name == "determined.keras",
    }


def _history_keeps_validations() -> bool:
    history = keras.callbacks._DeterminedHistory()
    history.on_test_end({"val_loss": 0.5})
    history.on_test_end({"val_loss": 0.25})
    resumed = keras.callbacks._DeterminedHistory()
    resumed.load_state(history.get_state())
    return resumed.history == {"val_loss": [0.5, 0.25]}


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
        "__init__": lambda: isinstance(m, keras.TFKerasTrialContext),
        "train_config": lambda: c.train_config is None,
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
        "__init__": lambda: isinstance(e, det.EnvContext),
        "container_id": lambda: e.container_id == f"trial-{w.trial_id}",
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

    x = w.ctx.experimental
    return {"cache_train_dataset": lambda: cached("cache_train_dataset", True),
            "cache_validation_dataset": lambda: cached("cache_validation_dataset", False),
            "__init__": lambda: isinstance(x, keras.TFKerasExperimentalContext),
            "get_train_cacheable": lambda: x.get_train_cacheable() == x.cache_train_dataset,
            "get_validation_cacheable": lambda: x.get_validation_cacheable()
            == x.cache_validation_dataset}


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
        "__init__": lambda: type(d)(rank=0, size=1).size == 1,
        "close": lambda: type(d)().close() is None,
        "tempdir": lambda: d.tempdir is None,
        "from_tf_config": _from_tf_config,
    }


def _from_tf_config() -> bool:
    config = '{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 0}}'
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TF_CONFIG", config)
        made, strategy = det.core.DistributedContext.from_tf_config()
    return made.rank == 0 and made.size == 1 and strategy.num_replicas_in_sync == 1


def _cluster_info(w):
    i = w.cluster_info
    return {
        "__init__": lambda: isinstance(i, det.ClusterInfo),
        "cluster_id": lambda: i.cluster_id == "localdet",
        "agent_id": lambda: i.agent_id == socket.gethostname(),
        "slot_ids": lambda: isinstance(i.slot_ids, list),
        "task_id": lambda: i.task_id == f"trial-{w.trial_id}",
        "allocation_id": lambda: i.allocation_id == f"trial-{w.trial_id}",
        "task_type": lambda: i.task_type == "TRIAL",
        "latest_checkpoint": lambda: i.latest_checkpoint == w.checkpoint,
        "trial": lambda: isinstance(i.trial, det.TrialInfo),
        "user_data": lambda: i.user_data == {"rows": 16},
        "container_rank": lambda: i.container_rank == 0,
        "container_addrs": lambda: i.container_addrs == ["127.0.0.1"],
        "container_slot_counts": lambda: i.container_slot_counts == [len(i.slot_ids)],
        "gpu_uuids": lambda: isinstance(i.gpu_uuids, list),
        "container_id": lambda: i.container_id == f"trial-{w.trial_id}",
        "master_cert_file": lambda: i.master_cert_file is None,
        "master_cert_name": lambda: i.master_cert_name is None,
    }


def _trial_info(w):
    t = w.cluster_info.trial
    return {
        "__init__": lambda: isinstance(t, det.TrialInfo),
        "trial_id": lambda: t.trial_id == w.trial_id,
        "experiment_id": lambda: t.experiment_id == w.info.experiment_id,
        "trial_seed": lambda: t.trial_seed == 3,
        "hparams": lambda: t.hparams == w.info.hparams,
        "_config": lambda: t._config == w.info.config,
        "config": lambda: t.config == w.info.config,
        "_steps_completed": lambda: t._steps_completed == 4,
        "steps_completed": lambda: t.steps_completed == 4,
        "_debug": lambda: t._debug is False,
        "debug": lambda: t.debug is False,
    }


def _core(w):
    core = det.core

    def context():  # one off-localdet Core API context, its checkpoints in the test's folder
        if not hasattr(w, "core_context"):
            assert not os.environ.get("LOCALDET_TRIAL_ID")
            w.core_context = core.init(checkpoint_storage=str(w.tmp / "core-checkpoints"))
            w.core_context.__enter__()  # as `with det.core.init() as core_context:` does
        return w.core_context

    def checkpoint_round_trip() -> bool:
        c = context()
        with c.checkpoint.store_path({"steps_completed": 5}) as (path, storage_id):
            (Path(path) / "weights.txt").write_text("w")
        with c.checkpoint.restore_path(storage_id) as path:
            restored = (Path(path) / "weights.txt").read_text()
        return (restored == "w" and c.checkpoint.get_metadata(storage_id)["steps_completed"]
                == 5 and isinstance(c.checkpoint, core.DummyCheckpointContext))

    def searcher() -> bool:
        ops = []
        for op in context().searcher.operations():
            op.report_progress(1)
            op.report_completed(0.5)
            ops.append(op)
        with pytest.raises(ValueError, match="searcher"):
            list(core.SearcherContextMissing().operations())
        return (len(ops) == 1 and ops[0].length == 1
                and isinstance(ops[0], core.SearcherOperation)
                and isinstance(context().searcher, core.DummySearcherContext))

    config = {"searcher": {"name": "single", "max_length": {"batches": 4}}}
    return {
        "init": lambda: isinstance(context(), core.Context),
        "Context": lambda: all(hasattr(context(), part) for part in (
            "distributed", "train", "checkpoint", "preempt", "searcher", "info")),
        "DistributedContext": lambda: core.DistributedContext is type(w.ctx.distributed),
        "DummyDistributedContext": lambda: core.DummyDistributedContext().size == 1,
        "TrainContext": lambda: isinstance(context().train, core.TrainContext)
        and context().train.report_training_metrics(1, {"loss": 0.5}) is None,
        "DummyTrainContext": lambda: isinstance(context().train, core.DummyTrainContext)
        and context().train.report_validation_metrics(1, {"loss": 0.5}) is None,
        "EarlyExitReason": lambda: core.EarlyExitReason.INVALID_HP.name == "INVALID_HP",
        "TensorboardMode": lambda: {"AUTO", "MANUAL"} <= {m.name for m in core.TensorboardMode},
        "CheckpointContext": checkpoint_round_trip,
        "DummyCheckpointContext": checkpoint_round_trip,
        "DownloadMode": lambda: {"LocalWorkersShareDownload", "NoSharedDownload"}
        <= {m.name for m in core.DownloadMode},
        "PreemptContext": lambda: isinstance(context().preempt, core.PreemptContext)
        and context().preempt.should_preempt() is False,
        "DummyPreemptContext": lambda: isinstance(context().preempt, core.DummyPreemptContext),
        "PreemptMode": lambda: core.PreemptMode.WorkersAskChief in core.PreemptMode,
        "SearcherContext": searcher,
        "DummySearcherContext": searcher,
        "SearcherContextMissing": searcher,
        "SearcherOperation": searcher,
        "DummySearcherOperation": lambda: issubclass(core.DummySearcherOperation,
                                                     core.SearcherOperation),
        "SearcherMode": lambda: core.SearcherMode.WorkersAskChief in core.SearcherMode,
        "Unit": lambda: {"RECORDS", "BATCHES", "EPOCHS"} == {u.name for u in core.Unit},
        "ProfilerContext": lambda: context().profiler.on() is None
        and context().profiler.off() is None,
        "DummyProfilerContext": lambda: issubclass(core.DummyProfilerContext,
                                                   core.ProfilerContext),
        "ExperimentalCoreContext": lambda: context().experimental
        .report_task_using_checkpoint(None) is None,
        "DummyExperimentalCoreContext": lambda: issubclass(core.DummyExperimentalCoreContext,
                                                           core.ExperimentalCoreContext),
        "_dummy_init": lambda: isinstance(core._dummy_init(checkpoint_storage=str(
            w.tmp / "core-dummy")).checkpoint, core.DummyCheckpointContext),
        "_parse_searcher_max_length": lambda: core._parse_searcher_max_length(config) == 4,
        "_parse_searcher_units": lambda: core._parse_searcher_units(config) is core.Unit.BATCHES,
        "_run_on_rank_0_and_broadcast": _runs_on_rank_0_and_broadcasts,
        "_install_stacktrace_on_sigusr1": _prints_the_stack_on_sigusr1,
        "_get_storage_manager": lambda: _storage_managers(w.tmp),
    }


def _runs_on_rank_0_and_broadcasts() -> bool:
    run, calls = det.core._run_on_rank_0_and_broadcast, []

    def func():
        calls.append(1)
        return "chief's"

    rank_1 = types.SimpleNamespace(rank=1, broadcast=lambda value: ("broadcast", value))
    return (run(func) == "chief's" and run(func, det.core.DummyDistributedContext())
            == "chief's" and len(calls) == 2
            and run(func, rank_1) == ("broadcast", None) and len(calls) == 2)


def _prints_the_stack_on_sigusr1() -> bool:
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():  # it may not install
        before = signal.getsignal(signal.SIGUSR1)
        det.core._install_stacktrace_on_sigusr1()
        return signal.getsignal(signal.SIGUSR1) is before
    earlier = []
    original = signal.signal(signal.SIGUSR1, lambda signum, frame: earlier.append(signum))
    try:
        det.core._install_stacktrace_on_sigusr1()
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            os.kill(os.getpid(), signal.SIGUSR1)
            for _ in range(100):  # the handler runs between bytecodes of the main thread
                if earlier:
                    break
    finally:
        signal.signal(signal.SIGUSR1, original)
    return "_prints_the_stack_on_sigusr1" in err.getvalue() and earlier == [signal.SIGUSR1]


def _storage_managers(tmp: Path) -> bool:
    from determined.common import storage

    get = det.core._get_storage_manager
    with pytest.raises(ValueError, match="shared_fs"):
        get({"type": "shared_fs", "host_path": str(tmp)})
    with pytest.raises(TypeError):
        get(3)
    folder = get({"type": "directory", "container_path": str(tmp / "dir-storage")})
    return (get(None) is None and isinstance(get(str(tmp)), storage.SharedFSStorageManager)
            and isinstance(folder, storage.DirectoryStorageManager))


CHECKS = {
    "determined": _det, "determined.errors": _errors, "determined.keras": _keras,
    "determined.keras.callbacks": _callbacks, "determined.keras.TFKerasTrial": _trial,
    "determined.keras.TFKerasTrialContext": _context, "context.env": _env,
    "determined.keras.TFKerasExperimentalContext": _experimental,
    "context.distributed": _distributed,
    "determined.ClusterInfo": _cluster_info, "determined.TrialInfo": _trial_info,
    "determined.core": _core,
    "determined.experimental.client": sdk_api_checks.client_checks,
    "determined.experimental": lambda w: sdk_api_checks.experimental_checks(
        w, "determined.experimental"),
    "determined.common.experimental": lambda w: sdk_api_checks.experimental_checks(
        w, "determined.common.experimental"),
    "determined.searcher": searcher_api_checks.searcher_checks,
}


@pytest.mark.parametrize("section,name", cases((s, n) for s, n, st in ROWS
                                                if st != "refused"))
def test_every_supported_name_does_its_job(world, section, name):
    checks = CHECKS[section](world)
    assert name in checks, f"{section}.{name} is listed but no test exercises it"
    assert checks[name]() is True, f"{section}.{name} did not behave as documented"
