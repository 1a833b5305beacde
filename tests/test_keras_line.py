"""Which Keras a trial runs under, read from the code its entrypoint reaches, and what a
trial that fails for a Keras reason is told."""

from __future__ import annotations

import textwrap

import pytest

from determined.exec.run_trial import keras_version_hint
from localdet.config import keras_choice
from localdet.config.experiment import parse_config

TRIAL = {"entrypoint_kind": "trial_class", "trial_class": "model_def:Trial"}


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
    assert reason.startswith("model_def.py:")
    assert spelling in reason and "only Keras 2 has" in reason


@pytest.mark.parametrize("code", [
    "import tensorflow as tf\nopt = tf.keras.optimizers.Adam(0.1)\n",
    "from tensorflow import keras\nkeras.layers.Dense(2)\n",
    "import keras\nkeras.ops.sum\n",
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
def test_keras3_code_and_lookalikes_stay_on_keras3(tmp_path, code):
    _folder(tmp_path, {"model_def.py": code})
    assert keras_choice.choose(tmp_path, {}, TRIAL) == ("keras3", "the default")


def test_the_reason_names_file_line_and_spelling(tmp_path):
    _folder(tmp_path, {"model_def.py": """\
        import tensorflow as tf

        def optimizer():
            return tf.keras.optimizers.legacy.Adam(lr=0.1)
        """})
    assert keras_choice.choose(tmp_path, {}, TRIAL) == (
        "keras2", "model_def.py:4 uses tf.keras.optimizers.legacy.Adam, which only Keras 2 has")


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
    assert (line, reason.split(" uses")[0]) == ("keras2", "lib/deep.py:2")
    (tmp_path / "lib" / "deep.py").write_text("make = None\n")
    assert keras_choice.choose(tmp_path, {}, TRIAL) == ("keras3", "the default")
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
    assert reason.startswith("pkg/common.py:1 uses from keras.optimizers.legacy")


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
    assert line == "keras2" and reason.startswith("model.py:2"), reason


def test_the_launcher_form_starts_from_its_trial_class(tmp_path):
    _folder(tmp_path, {"model_def.py": "from tensorflow.keras.optimizers import legacy\n",
                       "other.py": "import tf_keras\n"})
    config = parse_config({
        "entrypoint": "python3 -m determined.launch.horovod --autohorovod "
                      "--trial model_def:IrisTrial",
        "hyperparameters": {"global_batch_size": 8},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 1}}}).config
    line, reason = keras_choice.choose(tmp_path, {}, config)
    assert line == "keras2" and reason.startswith("model_def.py:1"), reason
    (tmp_path / "model_def.py").write_text("import tensorflow\n")
    assert keras_choice.choose(tmp_path, {}, config) == ("keras3", "the default")


def test_a_file_that_does_not_parse_is_searched_as_text_and_the_reason_says_so(tmp_path):
    _folder(tmp_path, {"model_def.py": "import helpers\n",
                       "helpers.py": "print 'python 2'\nopt = keras.optimizers.legacy.Adam()\n"})
    line, reason = keras_choice.choose(tmp_path, {}, TRIAL)
    assert line == "keras2"
    assert reason.startswith("helpers.py:2 uses optimizers.legacy") and "does not parse" in reason
    (tmp_path / "helpers.py").write_text("def broken(:\n")
    line, reason = keras_choice.choose(tmp_path, {}, TRIAL)
    assert line == "keras3" and "helpers.py (line 1) does not parse" in reason


def test_an_entrypoint_that_names_no_file_falls_back_to_every_file(tmp_path):
    _folder(tmp_path, {"run.sh": "python3 x.py\n", "x.py": "import tf_keras\n"})
    config = {"entrypoint_kind": "script", "script_command": "bash run.sh"}
    assert keras_choice.choose(tmp_path, {}, config)[0] == "keras2"


def test_a_keras_line_failure_says_which_line_ran_and_how_to_switch(monkeypatch):
    monkeypatch.setenv("LOCALDET_KERAS_LINE_REASON", "the default")
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
