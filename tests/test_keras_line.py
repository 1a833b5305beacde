"""Which Keras a trial runs under, read from the code its entrypoint reaches, and what a
trial that fails for a Keras reason is told."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
import yaml

from determined.exec.run_trial import keras_version_hint
from localdet.config import keras_choice, keras_packages, keras_uses
from localdet.config.experiment import parse_config

TRIAL = {"entrypoint_kind": "trial_class", "trial_class": "model_def:Trial"}
SCRIPT = {"entrypoint_kind": "script", "script_command": "python3 train.py",
          "entrypoint": "python3 train.py"}
SCRIPT_OF_MODEL_DEF = {"entrypoint_kind": "script", "script_command": "python3 model_def.py",
                       "entrypoint": "python3 model_def.py"}


def _rule(choice: tuple[str, str]) -> tuple[str, str | None]:
    return choice[0], keras_choice.rule_of(choice[1])[0]


def _folder(tmp_path, files: dict[str, str]):
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


def test_the_config_decides_when_it_names_the_line(tmp_path):
    (tmp_path / "model_def.py").write_text("from tensorflow.keras.optimizers.legacy import SGD\n")
    assert keras_choice.choose(tmp_path, {"TF_USE_LEGACY_KERAS": "0"}, TRIAL)[0] == "keras3"
    assert keras_choice.choose(tmp_path, {"TF_USE_LEGACY_KERAS": "1"}, TRIAL)[0] == "keras2"


@pytest.mark.parametrize("code, spelling", [
    ("from tensorflow.keras.optimizers import legacy\n",
     "from tensorflow.keras.optimizers import legacy"),
    ("from keras.optimizers.legacy import Adam\n", "from keras.optimizers.legacy import Adam"),
    ("import tensorflow as tf\nopt = tf.keras.optimizers.legacy.RMSprop(lr=1)\n",
     "tf.keras.optimizers.legacy.RMSprop"),
    ("import tf_keras\n", "import tf_keras"),
    ("import tf_keras as keras\n", "import tf_keras as keras"),
    ("from tf_keras import layers\n", "from tf_keras import layers"),
    ("from keras.engine import data_adapter\n", "from keras.engine import data_adapter"),
    ("import keras.engine.training\n", "import keras.engine.training"),
    ("import keras\nbase = keras.engine.base_layer.Layer\n", "keras.engine.base_layer.Layer"),
    ("from tensorflow import keras\nopt = keras.optimizers.legacy.Adam()\n",
     "keras.optimizers.legacy.Adam"),
    ("import keras as K\nK.optimizers.legacy.SGD()\n", "K.optimizers.legacy.SGD"),
    ("from tensorflow.keras import optimizers\noptimizers.legacy.Adam(0.1)\n",
     "optimizers.legacy.Adam"),
    ("import tensorflow\ntensorflow.keras.optimizers.legacy.Adam()\n",
     "tensorflow.keras.optimizers.legacy.Adam"),
    ("import tensorflow as tf\nkeras = tf.keras\nkeras.optimizers.legacy.Adam()\n",
     "keras.optimizers.legacy.Adam"),
    ("import tensorflow as tf\ntf.keras.optimizers.experimental.AdamW()\n",
     "tf.keras.optimizers.experimental.AdamW"),
    ("import tensorflow as tf\ntf.keras.layers.experimental.preprocessing.Rescaling(1)\n",
     "tf.keras.layers.experimental.preprocessing.Rescaling"),
    ("from tensorflow.keras.layers.experimental import preprocessing\n",
     "from tensorflow.keras.layers.experimental import preprocessing"),
    ("import tensorflow as tf\ntf.keras.layers.DenseFeatures([])\n",
     "tf.keras.layers.DenseFeatures"),
    ("import tensorflow as tf\ntf.keras.estimator.model_to_estimator\n",
     "tf.keras.estimator.model_to_estimator"),
    ("def build():\n    from tensorflow.keras.optimizers.legacy import SGD\n    return SGD()\n",
     "from tensorflow.keras.optimizers.legacy import SGD"),
])
def test_every_spelling_of_keras2_only_api_chooses_keras2(tmp_path, code, spelling):
    _folder(tmp_path, {"model_def.py": "import os\n" + code})
    line, reason = keras_choice.choose(tmp_path, {}, TRIAL)
    assert line == "keras2", reason
    assert keras_choice.rule_of(reason)[0] == "keras2_api"
    assert keras_choice.rule_of(reason)[1].startswith("model_def.py:")
    assert spelling in reason and "only Keras 2 has" in reason


@pytest.mark.parametrize("code", [
    "import tensorflow as tf\nopt = tf.keras.optimizers.Adam(0.1)\n",
    "from tensorflow import keras\nkeras.layers.Dense(2)\n",
    # Determined's own `keras` is not Keras.
    "from determined import keras\nclass T(keras.TFKerasTrial):\n    x: keras.InputData\n",
    "import determined.keras\ndetermined.keras.engine = 1\n",
    # Words in comments and strings are not code.
    "# we used to use tf.keras.optimizers.legacy.Adam and keras.engine here\n"
    "NOTE = 'tf_keras is not needed'\n",
    # A name that was never imported is not Keras either.
    "opt = tf.keras.optimizers.legacy.RMSprop(lr=1)\n",
    # Removed in Keras 2.12: neither line has it, so it chooses neither.
    "from tensorflow.keras.wrappers.scikit_learn import KerasClassifier\n",
])
def test_code_and_lookalikes_of_neither_line_leave_it_to_the_entrypoint(tmp_path, code):
    _folder(tmp_path, {"model_def.py": code, "train.py": code})
    # A trial class is Determined's: Keras 2.
    assert _rule(keras_choice.choose(tmp_path, {}, TRIAL)) == ("keras2", "determined_api")
    assert _rule(keras_choice.choose(tmp_path, {}, SCRIPT))[1] in ("default", "determined_api")


@pytest.mark.parametrize("code, spelling", [
    ("import keras\nkeras.ops.sum\n", "keras.ops.sum"),
    ("from keras import ops\n", "from keras import ops"),
    ("import tensorflow as tf\ntf.keras.ops.abs(1)\n", "tf.keras.ops.abs"),
    ("import keras\nclass L(keras.Layer): pass\n", "keras.Layer"),
    ("from tensorflow import keras\nclass D(keras.utils.PyDataset): pass\n",
     "keras.utils.PyDataset"),
    ("import keras\nkeras.random.uniform((2,))\n", "keras.random.uniform"),
    ("from keras.src.trainers import trainer\n", "from keras.src.trainers import trainer"),
    ("import keras\nkeras.saving.save_weights\n", "keras.saving.save_weights"),
])
def test_keras3_only_api_chooses_keras3_even_for_a_trial_class(tmp_path, code, spelling):
    _folder(tmp_path, {"model_def.py": "import os\n" + code})
    line, reason = keras_choice.choose(tmp_path, {}, TRIAL)
    rule, source = keras_choice.rule_of(reason)
    assert (line, rule) == ("keras3", "keras3_api") and source.startswith("model_def.py:")
    assert f"it uses {spelling}, which only Keras 3 has" in reason


def test_the_tables_of_one_line_only_api_match_the_installed_lines():
    import importlib

    import keras
    import tf_keras

    def has(module, dotted: str) -> bool:
        try:
            importlib.import_module(f"{module.__name__}.{dotted}")
            return True
        except ImportError:
            pass
        value = module
        for part in dotted.split("."):
            if not hasattr(value, part):
                return False
            value = getattr(value, part)
        return True

    for part in keras_uses.KERAS3_ONLY:
        assert has(keras, part) and not has(tf_keras, part), part
    # (Keras 3 keeps stubs of some Keras 2 names, `keras.optimizers.legacy` among them, that
    # raise when used: the Keras 2 table cannot be checked the same way.)


def test_the_reason_names_file_line_and_spelling(tmp_path):
    _folder(tmp_path, {"model_def.py": """\
        import tensorflow as tf

        def optimizer():
            return tf.keras.optimizers.legacy.Adam(lr=0.1)
        """})
    assert keras_choice.choose(tmp_path, {}, TRIAL) == (
        "keras2", "rule keras2_api, decided by model_def.py:4: it uses "
                  "tf.keras.optimizers.legacy.Adam, which only Keras 2 has")


def test_local_imports_are_followed_transitively_and_unreachable_files_ignored(tmp_path):
    _folder(tmp_path, {
        "model_def.py": "from lib import helpers\n",
        "lib/__init__.py": "",
        "lib/helpers.py": "from . import optim\n",
        "lib/optim.py": "from .deep import make\n",
        "lib/deep.py": "import tensorflow as tf\nmake = tf.keras.optimizers.legacy.SGD\n",
        "old/experiment.py": "import tf_keras\n",       # nothing imports it
        "scratch.py": "from keras.engine import training\n",
    })
    line, reason = keras_choice.choose(tmp_path, {}, TRIAL)
    assert (line, keras_choice.rule_of(reason)[1]) == ("keras2", "lib/deep.py:2")
    (tmp_path / "lib" / "deep.py").write_text("make = None\n")
    assert _rule(keras_choice.choose(tmp_path, {}, TRIAL)) == ("keras2", "determined_api")
    (tmp_path / "lib" / "deep.py").write_text("import keras\nmake = keras.ops.add\n")
    assert keras_choice.choose(tmp_path, {}, TRIAL) == (
        "keras3", "rule keras3_api, decided by lib/deep.py:2: it uses keras.ops.add, which "
                  "only Keras 3 has")
    # Without an entrypoint every file counts (what engines did before it passed one).
    assert keras_choice.choose(tmp_path, {})[0] == "keras2"


def test_a_package_entrypoint_runs_its_init_and_absolute_imports_of_the_folder(tmp_path):
    _folder(tmp_path, {
        "pkg/__init__.py": "from pkg.common import OPT\n",
        "pkg/model.py": "class Trial: pass\n",
        "pkg/common.py": "from keras.optimizers.legacy import Adam as OPT\n",
    })
    config = {"entrypoint_kind": "trial_class", "trial_class": "pkg.model:Trial"}
    line, reason = keras_choice.choose(tmp_path, {}, config)
    assert line == "keras2"
    assert reason.startswith("rule keras2_api, decided by pkg/common.py:1: it uses from "
                             "keras.optimizers.legacy")


@pytest.mark.parametrize("entrypoint", [
    "python3 train.py", "python3 -u train.py --epochs 2", "python3 -m train",
    "python3 -m determined.launch.horovod --autohorovod python3 train.py",
])
def test_script_entrypoints_start_from_the_script(tmp_path, entrypoint):
    _folder(tmp_path, {"train.py": "import model\n",
                       "model.py": "import tensorflow as tf\n"
                                   "opt = tf.keras.optimizers.legacy.Adam()\n",
                       "unused.py": "import tf_keras\n"})
    config = parse_config({"entrypoint": entrypoint}).config
    line, reason = keras_choice.choose(tmp_path, {}, config)
    assert line == "keras2" and keras_choice.rule_of(reason) == ("keras2_api", "model.py:2")


def test_the_launcher_form_starts_from_its_trial_class(tmp_path):
    _folder(tmp_path, {"model_def.py": "from tensorflow.keras.optimizers import legacy\n",
                       "other.py": "import tf_keras\n"})
    config = parse_config({
        "entrypoint": "python3 -m determined.launch.horovod --autohorovod "
                      "--trial model_def:IrisTrial",
        "hyperparameters": {"global_batch_size": 8},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 1}}}).config
    line, reason = keras_choice.choose(tmp_path, {}, config)
    assert line == "keras2" and keras_choice.rule_of(reason) == ("keras2_api", "model_def.py:1")
    (tmp_path / "model_def.py").write_text("import tensorflow\n")
    assert keras_choice.rule_of(keras_choice.choose(tmp_path, {}, config)[1]) == (
        "determined_api", "model_def:IrisTrial")


def test_a_file_that_does_not_parse_is_searched_as_text_and_the_reason_says_so(tmp_path):
    _folder(tmp_path, {"model_def.py": "import helpers\n",
                       "helpers.py": "print 'python 2'\nopt = keras.optimizers.legacy.Adam()\n"})
    line, reason = keras_choice.choose(tmp_path, {}, TRIAL)
    assert line == "keras2"
    assert reason.startswith("rule keras2_api, decided by helpers.py:2: it uses "
                             "optimizers.legacy") and "does not parse" in reason
    (tmp_path / "helpers.py").write_text("def broken(:\n")
    line, reason = keras_choice.choose(tmp_path, {}, SCRIPT_OF_MODEL_DEF)
    assert line == "keras3" and "helpers.py (line 1) does not parse" in reason


def test_an_entrypoint_that_names_no_file_falls_back_to_every_file(tmp_path):
    _folder(tmp_path, {"run.sh": "python3 x.py\n", "x.py": "import tf_keras\n"})
    config = {"entrypoint_kind": "script", "script_command": "bash run.sh"}
    assert keras_choice.choose(tmp_path, {}, config)[0] == "keras2"


def test_a_keras_line_failure_says_which_line_ran_and_how_to_switch(monkeypatch):
    monkeypatch.setenv("LOCALDET_KERAS_LINE_REASON", "rule default: nothing")
    hint = keras_version_hint(ValueError("Argument(s) not recognized: {'lr': 0.1}"), "keras3")
    assert "under keras3" in hint and "TF_USE_LEGACY_KERAS=1" in hint
    hint = keras_version_hint(ImportError(
        "`keras.optimizers.legacy` is not supported in Keras 3. When using ..."), "keras3")
    assert "TF_USE_LEGACY_KERAS=1" in hint
    hint = keras_version_hint(ModuleNotFoundError("No module named 'keras.engine'",
                                                  name="keras.engine"), "keras3")
    assert "TF_USE_LEGACY_KERAS=1" in hint
    import keras
    try:
        keras.ops_that_keras2_lacks  # noqa: B018
    except AttributeError as error:
        hint = keras_version_hint(error, "keras2")
    assert "under keras2" in hint and "TF_USE_LEGACY_KERAS=0" in hint


def test_other_failures_get_their_own_message_and_no_keras_hint():
    for error in (ZeroDivisionError("division by zero"),
                  AttributeError("module 'determined.keras' has no attribute 'InputData'"),
                  AttributeError("'Trial' object has no attribute 'optimizer'"),
                  ImportError("cannot import name 'NoSuchName' from 'determined.keras'",
                              name="determined.keras"),
                  ModuleNotFoundError("No module named 'not_a_module'", name="not_a_module"),
                  ValueError("Input 0 of layer 'dense' is incompatible with the layer")):
        hint = keras_version_hint(error, "keras3")
        assert "TF_USE_LEGACY_KERAS" not in hint
        assert hint.startswith(f"{type(error).__name__}: {error}")


# -- Determined's rule, on our own folders (tests/compat/keras_line) -------------------------

KERAS_LINE = Path(__file__).parent / "compat" / "keras_line"
SITE = KERAS_LINE / "site"  # a "third-party" package outside every model folder


def _config_of(folder: Path) -> dict:
    return parse_config(yaml.safe_load((folder / "const.yaml").read_text())).config


@pytest.mark.parametrize("folder, line, rule, source", [
    # Needs Keras 2 through the package it imports (Keras 2's `_trainable_weights`).
    ("dense_heads_trial", "keras2", "package", "dense_heads"),
    ("plain_trial", "keras2", "determined_api", "model_def:PlainTrial"),
    ("keras3_trial", "keras3", "keras3_api", "model_def.py:13"),
    ("new_api", "keras3", "new_keras_api", "train.py:9"),
    ("core_api", "keras2", "determined_api", "determined.launch.tensorflow"),
])
def test_each_folder_runs_on_the_line_it_needs(folder, line, rule, source):
    chosen, why = keras_choice.choose(KERAS_LINE / folder, {"PYTHONPATH": str(SITE)},
                                      _config_of(KERAS_LINE / folder))
    assert (chosen, *keras_choice.rule_of(why)) == (line, rule, source), why


def test_a_script_written_for_determined_runs_under_keras_2_without_its_launcher():
    line, why = keras_choice.choose(KERAS_LINE / "core_api", {}, SCRIPT)
    assert (line, *keras_choice.rule_of(why)) == ("keras2", "determined_api", "train.py:7")
    assert "it uses import determined as det" in why


def test_a_package_is_read_where_the_trial_finds_it_and_named_in_the_reason():
    folder = KERAS_LINE / "dense_heads_trial"
    line, why = keras_choice.choose(folder, {"PYTHONPATH": str(SITE)}, _config_of(folder))
    assert why == ("rule package, decided by dense_heads: model_def.py imports dense_heads, "
                   "whose dense_heads/layer.py:22 uses self._trainable_weights, which only "
                   "Keras 2 has")
    # Where the trial would not find it, it decides nothing: the trial class's rule does.
    assert _rule(keras_choice.choose(folder, {}, _config_of(folder))) == (
        "keras2", "determined_api")
    # The config's own choice comes first.
    assert keras_choice.choose(folder, {"PYTHONPATH": str(SITE), "TF_USE_LEGACY_KERAS": "0"},
                               _config_of(folder))[0] == "keras3"


def _package(root: Path, name: str, files: dict[str, str]) -> None:
    for relative, text in files.items():
        _write(root / name / relative, textwrap.dedent(text))


def _write(path: Path, text: str) -> None:
    """Write, and move its time on by a second: a package is read again when a file's
    time changes, and a file system may count time in coarser steps than these writes."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    later = max(path.stat().st_mtime_ns, before + 10**9)
    os.utime(path, ns=(later, later))


def test_packages_are_followed_through_their_modules_and_imports_within_bounds(tmp_path):
    site, model = tmp_path / "site", tmp_path / "model"
    _folder(model, {"model_def.py": "import outer\n"})
    _package(site, "outer", {"__init__.py": "from .impl import thing\n",
                             "impl.py": "import inner.layers\nthing = 1\n",
                             "unused.py": "import tf_keras\n"})  # never imported
    _package(site, "inner", {"__init__.py": "", "layers.py": "import keras\nkeras.ops.add\n"})
    env = {"PYTHONPATH": str(site)}
    line, why = keras_choice.choose(model, env, TRIAL)
    assert (line, keras_choice.rule_of(why)) == ("keras3", ("package", "inner"))
    assert "model_def.py imports outer, which imports inner, whose inner/layers.py:2 " \
           "uses keras.ops.add, which only Keras 3 has" in why
    # A package that uses both lines' own API checks which it runs under: it decides nothing.
    _write(site / "inner" / "layers.py", "import keras\nkeras.ops.add\n"
                                         "keras.optimizers.legacy.SGD\n")
    assert _rule(keras_choice.choose(model, env, TRIAL)) == ("keras2", "determined_api")
    # MAX_DEPTH packages deep, no further: a third level is not read.
    _write(site / "inner" / "layers.py", "import deepest\n")
    _package(site, "deepest", {"__init__.py": "import tf_keras\n"})
    assert keras_packages.MAX_DEPTH == 2
    assert _rule(keras_choice.choose(model, env, TRIAL)) == ("keras2", "determined_api")
    _write(model / "model_def.py", "import inner.layers\n")  # now two deep: read
    assert _rule(keras_choice.choose(model, env, TRIAL)) == ("keras2", "package")


def test_a_package_is_read_once_per_version(tmp_path, monkeypatch):
    site, model = tmp_path / "site", tmp_path / "model"
    _folder(model, {"model_def.py": "from heads import Heads\n"})
    _package(site, "heads", {"__init__.py": "class Heads:\n    def w(self):\n"
                                            "        return self._trainable_weights\n"
                                            "import tensorflow\n"})
    env = {"PYTHONPATH": str(site)}
    reads = []
    real = keras_uses.uses
    monkeypatch.setattr(keras_uses, "uses", lambda path: reads.append(path) or real(path))
    assert _rule(keras_choice.choose(model, env, TRIAL)) == ("keras2", "package")
    package_reads = [p for p in reads if "site" in p.parts]
    assert _rule(keras_choice.choose(model, env, TRIAL)) == ("keras2", "package")
    assert [p for p in reads if "site" in p.parts] == package_reads  # not read again
    _write(site / "heads" / "__init__.py", "class Heads:\n    pass\n")
    assert _rule(keras_choice.choose(model, env, TRIAL)) == ("keras2", "determined_api")


def test_the_standard_library_and_the_lines_themselves_are_not_read():
    assert not any(map(keras_packages.readable, ("os", "json", "tensorflow", "keras",
                                                 "tf_keras", "numpy", "determined", "")))
    assert keras_packages.readable("keras_multi_head")


def test_a_reason_recorded_before_rules_were_named_has_no_rule():
    assert keras_choice.rule_of("the default") == (None, None)
    assert keras_choice.rule_of("model_def.py:3 uses tf_keras, which only Keras 2 has") == (
        None, None)
    assert keras_choice.rule_of(keras_choice.default()[1]) == ("determined_api", None)


@pytest.mark.slow
def test_a_folder_needing_keras2_through_a_package_trains_and_says_which_rule(home, tmp_path,
                                                                             daemons):
    """The package folder trains and checkpoints under Keras 2 (under Keras 3 it trains,
    then fails at its checkpoint); status and the log say which rule chose the line."""
    daemon = daemons(home, "--slots", "1", "--warm", "0")
    raw = yaml.safe_load((KERAS_LINE / "dense_heads_trial" / "const.yaml").read_text())
    raw["environment"] = {"environment_variables": [f"PYTHONPATH={SITE}"]}
    config = tmp_path / "dense_heads.yaml"
    config.write_text(yaml.safe_dump(raw))
    home.cli("submit", config, KERAS_LINE / "dense_heads_trial")
    experiment_id = home.experiment_named(raw["name"])["id"]
    ended = home.wait_until_ended(experiment_id, timeout=300)
    shown = " ".join(home.cli("status", experiment_id).stdout.split())
    daemon.stop()
    (trial,) = ended["trials"]
    assert ended["state"] == "COMPLETED" and trial["latest_checkpoint"], trial
    assert (trial["keras_line"], trial["keras_line_rule"], trial["keras_line_source"]) == (
        "keras2", "package", "dense_heads"), trial
    first_line = home.cli("logs", trial["id"]).stdout.splitlines()[0]
    assert f"keras2 ({trial['keras_line_reason']})" in first_line, first_line
    assert (f"Keras 2 (trial {trial['id']}): rule package, decided by dense_heads: "
            "model_def.py imports dense_heads") in shown, shown


def test_status_names_each_distinct_choice_once():
    from localdet.ui import views

    trials = [{"id": 1, "keras_line": "keras2", "keras_line_reason": "rule a"},
              {"id": 2, "keras_line": "keras3", "keras_line_reason": "rule b"},
              {"id": 3, "keras_line": "keras2", "keras_line_reason": "rule a"},
              {"id": 4, "keras_line": None, "keras_line_reason": None}]  # never launched
    assert views.keras_lines(trials) == ["Keras 2 (trials 1, 3): rule a",
                                         "Keras 3 (trial 2): rule b"]
