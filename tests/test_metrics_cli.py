"""`localdet metrics`, `localdet logs` and `localdet tensorboard`, over metrics recorded the
way a trial records them (through `SQLiteReporter`), without training anything."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import pytest

from localdet.config.experiment import parse_config
from localdet.paths import Layout
from localdet.records.db import StateDB
from localdet.reporting.sqlite_reporter import SQLiteReporter

NAMES = ["loss", "accuracy", "val_loss", "val_accuracy"]
# val_loss by trial: trial 2 (the second one) is the best at every step.
VAL_LOSS = {0: [0.9, 0.7, 0.6], 1: [0.8, 0.4, 0.31], 2: [1.1, 1.0, 0.95]}


@dataclass
class Recorded:
    layout: Layout
    experiment_id: int
    trials: list[int]
    rows: dict  # (trial, kind, batches) -> metrics


def create_experiment(db: StateDB, name: str = "curves") -> int:
    config = parse_config({
        "name": name, "entrypoint": "model_def:Trial",
        "hyperparameters": {"global_batch_size": 8, "lr": {"type": "log", "base": 10,
                                                            "minval": -3, "maxval": -1}},
        "searcher": {"name": "random", "metric": "val_loss", "smaller_is_better": True,
                     "max_trials": 3, "max_length": {"batches": 30}},
    }).config
    return db.create_experiment(name=name, description="", config=config, original_config="",
                                searcher="random", metric="val_loss", smaller_is_better=True,
                                experiment_seed=1, model_dir="/nowhere")


@pytest.fixture
def recorded(home) -> Recorded:
    """An experiment of three trials, each with training and validation metrics at 10, 20
    and 30 batches, recorded through the reporter trials use."""
    layout = Layout(home.path).ensure()
    db = StateDB.open(layout.db)
    experiment_id = create_experiment(db)
    trials, rows = [], {}
    for index, losses in VAL_LOSS.items():
        trial_id = db.create_trial(experiment_id=experiment_id, request_id=index + 1,
                                   hparams={"global_batch_size": 8, "lr": 0.01 * (index + 1)},
                                   seed=index, target_batches=30)
        reporter = SQLiteReporter(layout, trial_id)
        for step, val_loss in enumerate(losses):
            batches = 10 * (step + 1)
            training = {"loss": val_loss + 0.05 / 3, "accuracy": 1 - val_loss / 7}
            validation = {"val_loss": val_loss, "val_accuracy": 1 - val_loss / 3}
            reporter.report_training_metrics(batches, training)
            reporter.report_validation_metrics(batches, validation)
            rows[(trial_id, "training", batches)] = training
            rows[(trial_id, "validation", batches)] = validation
        db.update_trial(trial_id, state="COMPLETED")
        trials.append(trial_id)
    db.close()
    return Recorded(layout, experiment_id, trials, rows)


def assert_one_sentence_error(result, *fragments: str) -> None:
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


# -- metrics --------------------------------------------------------------------------------

def test_csv_holds_exactly_what_was_recorded(home, recorded):
    result = home.cli("metrics", recorded.experiment_id, "--csv")
    assert result.stderr == ""
    table = list(csv.reader(io.StringIO(result.stdout)))
    assert table[0] == ["trial", "kind", "batches", *NAMES]
    assert len(table) == 1 + len(recorded.rows)
    seen = []
    for trial, kind, batches, *values in table[1:]:
        key = (int(trial), kind, int(batches))
        seen.append(key)
        expected = recorded.rows[key]
        assert {name: float(v) for name, v in zip(NAMES, values, strict=True) if v} == expected
        assert [name for name, v in zip(NAMES, values, strict=True) if not v] == [
            name for name in NAMES if name not in expected]
    # By trial, then batches, training before validation.
    assert seen == sorted(recorded.rows, key=lambda k: (k[0], k[2], k[1]))

    one = home.cli("metrics", recorded.experiment_id, "--trial", recorded.trials[1],
                   "--metric", "val_loss", "--csv")
    assert list(csv.reader(io.StringIO(one.stdout))) == [
        ["trial", "kind", "batches", "val_loss"],
        *([str(recorded.trials[1]), "validation", str(10 * (i + 1)), repr(loss)]
          for i, loss in enumerate(VAL_LOSS[1]))]


def test_table_has_a_row_per_recorded_row_and_a_column_per_metric(home, recorded):
    out = home.cli("metrics", recorded.experiment_id).stdout
    assert f"Metrics of experiment {recorded.experiment_id}" in out
    header = next(line for line in out.splitlines() if "Kind" in line)
    assert [w for w in header.replace("┃", " ").split()] == ["Trial", "Kind", "Batches", *NAMES]
    body = [line.replace("│", " ").split() for line in out.splitlines()
            if "training" in line or "validation" in line]
    assert len(body) == len(recorded.rows)
    trial = recorded.trials[1]
    assert [str(trial), "validation", "30", "0.31", f"{1 - 0.31 / 3:.6g}"] in body
    assert [str(trial), "training", "30", f"{0.31 + 0.05 / 3:.6g}", f"{1 - 0.31 / 7:.6g}"] in body


def test_plot_writes_the_learning_curves_as_a_png(home, recorded, tmp_path):
    path = tmp_path / "out" / "curves.png"
    result = home.cli("metrics", recorded.experiment_id, "--plot", path)
    assert str(path) in result.stdout
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 20_000

    import matplotlib.image

    # Four metrics: two rows of three subplots, 5.5 x 3.8 inches each, at 100 dpi.
    assert matplotlib.image.imread(path).shape == (760, 1650, 4)


def test_curves_draw_one_line_per_trial_and_the_best_thicker(recorded):
    import matplotlib.pyplot as plt

    from localdet.ui import metrics_report, views
    db = StateDB.open(recorded.layout.db)
    experiment = db.experiment(recorded.experiment_id)
    best = views.experiment_facts(db, experiment)["best_trial"]
    assert best == recorded.trials[1]
    figure = metrics_report.curves(metrics_report.collect(db, experiment), best)
    db.close()
    try:
        axes = {ax.get_title(): ax for ax in figure.axes if ax.get_visible()}
        assert sorted(axes) == sorted(NAMES)
        first, second, third = recorded.trials
        for name, style in (("val_loss", "-"), ("loss", "--")):
            lines = {line.get_label(): line for line in axes[name].get_lines()}
            assert sorted(lines) == [f"trial {first}", f"trial {second} (best)", f"trial {third}"]
            assert {line.get_linestyle() for line in lines.values()} == {style}
            assert lines[f"trial {second} (best)"].get_linewidth() > lines[
                f"trial {first}"].get_linewidth()
            assert list(lines[f"trial {second} (best)"].get_xdata()) == [10, 20, 30]
        assert list(axes["val_loss"].get_lines()[1].get_ydata()) == VAL_LOSS[1]
    finally:
        plt.close(figure)


def test_metrics_mistakes_get_one_sentence(home, recorded):
    exp = recorded.experiment_id
    assert_one_sentence_error(home.cli("metrics", 99, check=False), "no experiment 99")
    assert_one_sentence_error(home.cli("metrics", exp, "--trial", 99, check=False),
                              f"experiment {exp} has no trial 99",
                              ", ".join(map(str, recorded.trials)))
    assert_one_sentence_error(home.cli("metrics", exp, "--metric", "val_acc", check=False),
                              "'val_acc'", "recorded: loss, accuracy, val_loss, val_accuracy")
    db = StateDB.open(recorded.layout.db)
    empty = create_experiment(db, "empty")
    db.close()
    assert_one_sentence_error(home.cli("metrics", empty, "--csv", check=False),
                              f"experiment {empty} has no metrics recorded yet")
    assert_one_sentence_error(home.cli("metrics", exp, "--csv", "--plot", "x.png",
                                       check=False), "--csv and --plot")


# -- logs -----------------------------------------------------------------------------------

LOG = "[localdet] launched on slots 0, 1\n[rank 0] epoch 1\n[rank 1] epoch 1\n"


def test_logs_prints_the_trials_log_as_written(home, recorded):
    trial = recorded.trials[0]
    log = recorded.layout.trial_log(recorded.experiment_id, trial)
    assert_one_sentence_error(home.cli("logs", trial, check=False),
                              f"trial {trial} has no log yet")
    log.parent.mkdir(parents=True)
    log.write_text(LOG)
    assert home.cli("logs", trial).stdout == LOG
    assert home.cli("logs", trial, "-f").stdout == LOG  # an ended trial: printed, done
    assert_one_sentence_error(home.cli("logs", 99, check=False), "there is no trial 99")


def test_logs_follow_prints_new_lines_until_the_trial_ends(home, recorded, processes):
    trial = recorded.trials[2]
    db = StateDB.open(recorded.layout.db)
    # Reopened behind StateDB's back, which refuses to take a trial out of COMPLETED.
    db.db.execute("UPDATE trials SET state = 'RUNNING' WHERE id = ?", [trial])
    db.close()
    log = recorded.layout.trial_log(recorded.experiment_id, trial)
    log.parent.mkdir(parents=True)
    log.write_text(LOG)
    later = [f"[rank {i % 2}] batch {i}\n" for i in range(6)]

    follower = processes([sys.executable, "-m", "localdet", "logs", trial, "-f"], env=home.env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def write_then_end():
        for line in later:
            time.sleep(0.25)
            with open(log, "a") as out:
                out.write(line)
        with open(log, "a") as out:
            out.write("[localdet] trial ended\n")
        db = StateDB.open(recorded.layout.db)  # a connection stays in its thread
        db.update_trial(trial, state="COMPLETED")
        db.close()

    writer = threading.Thread(target=write_then_end)
    started = time.monotonic()
    writer.start()
    try:
        stdout, stderr = follower.communicate(timeout=30)
    finally:
        writer.join()  # (the processes fixture ends the follower if it still runs)
    assert follower.returncode == 0, stderr
    assert stdout == LOG + "".join(later) + "[localdet] trial ended\n"
    assert time.monotonic() - started >= 6 * 0.25  # it followed, rather than read once


# -- tensorboard ----------------------------------------------------------------------------

READ_BACK = """
import json, sys, types
# TensorBoard's stand-in for TensorFlow, as `tensorboard.compat` allows: reading back needs
# no TensorFlow, which would take seconds to import.
sys.modules["tensorboard.compat.notf"] = types.ModuleType("tensorboard.compat.notf")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
found = {}
for folder in sys.argv[1:]:
    events = EventAccumulator(folder)
    events.Reload()
    found[folder] = {tag: [[s.step, s.value] for s in events.Scalars(tag)]
                     for tag in events.Tags()["scalars"]}
print(json.dumps(found))
"""


def read_scalars(*folders) -> dict:
    result = subprocess.run([sys.executable, "-c", READ_BACK, *map(str, folders)],
                            capture_output=True, text=True, timeout=60, check=True)
    return json.loads(result.stdout)


def test_tensorboard_logdir_only_writes_the_recorded_scalars(home, recorded):
    exp = recorded.experiment_id
    # One trial used the TensorBoard callback: its own folder is linked in beside.
    own = recorded.layout.trial_dir(exp, recorded.trials[0]) / "tensorboard" / "train"
    own.mkdir(parents=True)
    (own / "events.out.tfevents.1.keras").write_bytes(b"")

    for _ in range(2):  # regenerated each time, not added to
        result = home.cli("tensorboard", exp, "--logdir-only")
    root = home.path / "tensorboard" / str(exp)
    assert result.stdout.strip() == str(root)
    assert sorted(p.name for p in root.iterdir()) == [f"trial_{t}" for t in recorded.trials]
    assert (root / f"trial_{recorded.trials[0]}" / "keras" / "train").is_dir()
    assert not (root / f"trial_{recorded.trials[1]}" / "keras").exists()

    folders = {t: root / f"trial_{t}" / "localdet" for t in recorded.trials}
    assert all(len(list(f.iterdir())) == 1 for f in folders.values())
    found = read_scalars(*folders.values())
    for trial, folder in folders.items():
        scalars = found[str(folder)]
        expected = {}
        for (t, kind, batches), metrics in sorted(recorded.rows.items()):
            if t == trial:
                for name, value in metrics.items():
                    expected.setdefault(f"{kind}/{name}", []).append([batches, value])
        assert sorted(scalars) == sorted(expected)
        for tag, points in expected.items():
            assert [step for step, _ in scalars[tag]] == [step for step, _ in points]
            assert [v for _, v in scalars[tag]] == pytest.approx([v for _, v in points],
                                                                 rel=1e-6)  # float32

    assert_one_sentence_error(home.cli("tensorboard", 99, "--logdir-only", check=False),
                              "no experiment 99")
