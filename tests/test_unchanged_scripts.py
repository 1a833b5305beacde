"""Which scripts get localdet's fit hook (localdet/processes/unchanged_scripts.py): those whose
files import Keras and never `determined`; every other command runs as it is."""

from __future__ import annotations

import sys

import pytest

from localdet.processes.unchanged_scripts import RUNNER, injected


@pytest.mark.parametrize("code, hooked", [
    ("import keras\nkeras.Sequential().fit\n", True),
    ("from tensorflow import keras\n", True),
    ("import helper\n", True),  # the Keras import is in a module of the folder
    ("import determined as det\nimport keras\n", False),  # the New Keras API's own
    ("import os\nprint(os.getpid())\n", False),  # no Keras: no fit to serve
    ("import helper_with_det\n", False),
])
def test_the_hook_goes_in_front_of_keras_scripts_that_never_import_determined(tmp_path, code,
                                                                             hooked):
    (tmp_path / "train.py").write_text(code)
    (tmp_path / "helper.py").write_text("import tf_keras\n")
    (tmp_path / "helper_with_det.py").write_text("import keras\nfrom determined import core\n")
    config = {"entrypoint_kind": "script", "script_command": "python3 train.py --epochs 2"}
    argv = [sys.executable, "train.py", "--epochs", "2"]
    expected = [sys.executable, "-m", RUNNER, "train.py", "--epochs", "2"] if hooked else argv
    assert injected(argv, config, tmp_path) == expected
    assert injected(argv, config, tmp_path, job=True) == argv  # a batch job never


@pytest.mark.parametrize("code, env, expected", [
    # keras.io's way: the script's own assignment wins over the environment's, as it does
    # when the script runs on its own
    ('import os\nos.environ["KERAS_BACKEND"] = "jax"\nimport keras\n', {"KERAS_BACKEND": "torch"},
     "jax"),
    ('import os\nos.environ.setdefault("KERAS_BACKEND", "jax")\nimport keras\n', {}, "jax"),
    ('import os\nos.environ.setdefault("KERAS_BACKEND", "jax")\nimport keras\n',
     {"KERAS_BACKEND": "torch"}, "torch"),
    # set after Keras is imported, it changes nothing; nor does a script that sets none
    ('import os\nimport keras\nos.environ["KERAS_BACKEND"] = "jax"\n', {}, None),
    ("import keras\n", {"KERAS_BACKEND": "torch"}, "torch"),
    # a script that imports determined is not an unchanged script: its code decides
    ('import os\nos.environ["KERAS_BACKEND"] = "jax"\nimport determined\nimport keras\n', {},
     None),
])
def test_the_backend_an_unchanged_script_sets_at_its_top_is_the_trials(tmp_path, code, env,
                                                                      expected):
    from localdet.processes.unchanged_scripts import backend_environment

    (tmp_path / "train.py").write_text(code)
    config = {"entrypoint_kind": "script", "script_command": "python3 train.py"}
    backend_environment(env, config, tmp_path)
    assert env.get("KERAS_BACKEND") == expected


SETS_JAX = 'import os\nos.environ["KERAS_BACKEND"] = "jax"\n'


@pytest.mark.parametrize("code, modules, env, expected", [
    # a module of the folder, imported before Keras, sets it (and may import Keras itself)
    ("import settings\nimport keras\n", {"settings.py": SETS_JAX}, {}, "jax"),
    ("import settings\n", {"settings.py": SETS_JAX + "import keras\n"},
     {"KERAS_BACKEND": "torch"}, "jax"),
    ("from config import setup\nimport keras\n",
     {"config/__init__.py": "", "config/setup.py": SETS_JAX}, {}, "jax"),
    ("import a\nimport keras\n", {"a.py": "import b\n", "b.py": SETS_JAX}, {}, "jax"),
    # ... but not when it comes after Keras, or after a module that imported Keras first
    ("import keras\nimport settings\n", {"settings.py": SETS_JAX}, {}, None),
    ("import models\nimport settings\n",
     {"models.py": "import keras\n", "settings.py": SETS_JAX}, {}, None),
    # the script's own line, after the module's, is the last word; a setdefault after a
    # value is set changes nothing; a module runs once, however often it is imported
    ("import settings\nimport os\nos.environ['KERAS_BACKEND'] = 'torch'\nimport keras\n",
     {"settings.py": SETS_JAX}, {}, "torch"),
    ("import settings\nimport os\nos.environ.setdefault('KERAS_BACKEND', 'torch')\n"
     "import keras\n", {"settings.py": SETS_JAX}, {}, "jax"),
    ("import a\nimport b\nimport keras\n",
     {"a.py": "import b\n", "b.py": "import os\nos.environ.setdefault('KERAS_BACKEND', 'jax')\n"},
     {"KERAS_BACKEND": "torch"}, "torch"),
])
def test_the_backend_a_module_of_the_folder_sets_before_keras_is_the_trials(
        tmp_path, code, modules, env, expected):
    from localdet.processes.unchanged_scripts import backend_environment

    (tmp_path / "train.py").write_text(code)
    for name, text in modules.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    config = {"entrypoint_kind": "script", "script_command": "python3 train.py"}
    backend_environment(env, config, tmp_path)
    assert env.get("KERAS_BACKEND") == expected
