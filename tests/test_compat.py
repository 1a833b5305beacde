"""The compatibility suite: model folders in tests/compat/ written the way Determined's
users wrote them (annotated loaders, `context.env`, every data form, custom objects, legacy
optimizers in every spelling), each submitted unchanged to a real daemon, under both Keras
lines where the code allows; then their checkpoints loaded back the way a downstream script
loads them. (The order-checking callback's folder has its own file: test_callback_order.py.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

COMPAT = Path(__file__).parent / "compat"
LEGACY = COMPAT / "legacy_optimizers"
# Entry module -> the Keras line chosen for it: its own imports' (a legacy optimizer in
# some spelling), or, with nothing only one line has, Determined's rule for trial classes.
LEGACY_ENTRIES = {"from_import": "keras2", "attribute_chain": "keras2",
                  "keras_package": "keras2", "tf_keras_package": "keras2", "current": "keras2"}


def submit(home, tmp_path, folder: Path, config_file: str, line: str | None = None) -> int:
    """`line`: the Keras line the config asks for (TF_USE_LEGACY_KERAS), or None: the
    line localdet chooses."""
    raw = yaml.safe_load((folder / config_file).read_text())
    if line is not None:
        raw["name"] += f"-{line}"
        flag = "1" if line == "keras2" else "0"
        raw["environment"] = {"environment_variables": [f"TF_USE_LEGACY_KERAS={flag}"]}
    path = tmp_path / f"{raw['name']}.yaml"
    path.write_text(yaml.safe_dump(raw))
    home.cli("submit", path, folder)
    return home.experiment_named(raw["name"])["id"]


def custom_objects_data():
    import determined as det

    with det.import_from_path(COMPAT / "custom_objects"):  # others import their model_def
        from model_def import make_data
    return make_data(seed=1, rows=128)


LOAD_AND_EVALUATE = """
import json, sys
import numpy as np
from determined.keras import load_model_from_checkpoint_path
x, y = np.load(sys.argv[1])["x"], np.load(sys.argv[1])["y"]
found = []
for folder in sys.argv[2:]:
    model = load_model_from_checkpoint_path(folder)
    found.append(model.evaluate(x, y, verbose=0, return_dict=True))
print(json.dumps(found))
"""


def evaluate_in(line: str, folders: list[Path], data: Path) -> list[dict]:
    """The exported checkpoints loaded and evaluated, one after the other, in a fresh
    process of `line` (one process per line: each start imports TensorFlow)."""
    env = {"TF_USE_LEGACY_KERAS": "1" if line == "keras2" else "0", "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run([sys.executable, "-c", LOAD_AND_EVALUATE, str(data),
                             *map(str, folders)],
                            env={**os.environ, **env}, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_determined_style_folders_run_unchanged_and_their_checkpoints_load(home, tmp_path,
                                                                           daemons):
    # Two warm processes, one per Keras line: the 19 trials (all single-slot trial classes)
    # fork from a process that imported TensorFlow once, instead of each importing it (some
    # 4 CPU seconds a trial on a 2-core machine). Cold launches are covered elsewhere.
    daemon = daemons(home, "--slots", "2", "--warm", "2")
    custom = {line: submit(home, tmp_path, COMPAT / "custom_objects", "const.yaml", line)
              for line in ("keras3", "keras2")}
    forms = {line: submit(home, tmp_path, COMPAT / "data_forms", "grid.yaml", line)
             for line in ("keras3", "keras2")}
    legacy = {entry: submit(home, tmp_path, LEGACY, f"{entry}.yaml")
              for entry in LEGACY_ENTRIES}
    ended = {experiment_id: home.wait_until_ended(experiment_id, timeout=900)
             for experiment_id in [*custom.values(), *forms.values(), *legacy.values()]}
    daemon.stop()
    for experiment_id, facts in ended.items():
        assert facts["state"] == "COMPLETED", home.ended_report(experiment_id)
        assert all(t["state"] == "COMPLETED" for t in facts["trials"]), facts["trials"]
    assert "warm trial processes: 2 (--warm)" in daemon.log_path.read_text()

    # Every data form trained and validated, under each line.
    forms_listed = yaml.safe_load((COMPAT / "data_forms" / "grid.yaml").read_text())[
        "hyperparameters"]["data_form"]["vals"]
    for line, experiment_id in forms.items():
        trials = ended[experiment_id]["trials"]
        assert sorted(t["hparams"]["data_form"] for t in trials) == sorted(forms_listed)
        for t in trials:
            assert t["keras_line"] == line, t
            assert t["batches_trained"] == 40, t
            assert t["latest_validation"]["val_accuracy"] > 0.5, t

    # Each spelling of a legacy optimizer chose Keras 2 for its own file; the current
    # optimizer chose nothing, and the trial class is Determined's: Keras 2 too.
    for entry, line in LEGACY_ENTRIES.items():
        trial = ended[legacy[entry]]["trials"][0]
        assert trial["keras_line"] == line, (entry, trial)
        if entry != "current":
            assert trial["keras_line_rule"] == "keras2_api", (entry, trial)
            assert trial["keras_line_source"].startswith(f"{entry}.py:"), (entry, trial)
        else:
            assert (trial["keras_line_rule"], trial["keras_line_source"]) == (
                "determined_api", "current:Trial"), (entry, trial)
        first_line = home.cli("logs", trial["id"]).stdout.splitlines()[0]
        assert line in first_line and trial["keras_line_reason"] in first_line, first_line

    # Custom layer, loss and metric: each line's checkpoint loads compiled, in each line,
    # and evaluates to the validation metrics the trial recorded.
    x, y = custom_objects_data()
    data = tmp_path / "validation.npz"
    np.savez(data, x=x, y=y)
    folders = {}
    for trained_under, experiment_id in custom.items():
        assert ended[experiment_id]["trials"][0]["keras_line"] == trained_under
        uuid = home.json("checkpoints", experiment_id)[-1]["uuid"]
        folders[trained_under] = tmp_path / f"checkpoint-{trained_under}"
        home.cli("checkpoint", "export", uuid, folders[trained_under])
    for loaded_under in ("keras3", "keras2"):
        evaluated = evaluate_in(loaded_under, list(folders.values()), data)
        for trained_under, metrics in zip(folders, evaluated, strict=True):
            recorded = ended[custom[trained_under]]["trials"][0]["latest_validation"]
            assert metrics["loss"] == pytest.approx(recorded["val_loss"], rel=1e-4), \
                (trained_under, loaded_under, metrics, recorded)
            assert metrics["within_half"] == pytest.approx(recorded["val_within_half"],
                                                           abs=1e-6)
