"""The `det` command as Determined's users type it, against a real daemon that `det` itself
starts (operations/creation.ensure_daemon): create (with -f and --config), list, describe,
JSON and CSV, pause/activate/kill, archive, labels, fork, delete, the model registry,
checkpoint download, test mode; and the refusals (cluster commands, --template) and the
ignored -m/--master and DET_MASTER."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from conftest import TEST_TRIALS, Home, end_running_trials, wait_for

DET = Path(sys.executable).with_name("det")
COUNTER = TEST_TRIALS / "counter"


def det(home: Home, *args, check: bool = True, stdin: str | None = None,
        env: dict | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run([str(DET), *map(str, args)], env={**home.env, **(env or {})},
                            capture_output=True, text=True, timeout=120, input=stdin)
    if check and result.returncode != 0:
        raise AssertionError(f"det {' '.join(map(str, args))} failed ({result.returncode}):\n"
                             f"{result.stdout}\n{result.stderr}")
    return result


def counter_config(folder: Path, name: str, batches: int = 20, batch_seconds: float = 0.01,
                   **hparams) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "name": name, "entrypoint_script": "python3 train.py",
        "hyperparameters": {"variant": 0, "batch_seconds": batch_seconds,
                            "checkpoint_seconds": 0, "crash_at": 0, **hparams},
        "searcher": {"name": "single", "metric": "val_loss",
                     "max_length": {"batches": batches}},
        "scheduling_unit": 5, "min_checkpoint_period": {"batches": 10}, "max_restarts": 0,
    }))
    return path


def table(text: str) -> list[dict]:
    """The rows of a presto table (one line per row; multi-line cells not used here)."""
    lines = [line for line in text.splitlines() if " | " in line or line.startswith(" ")]
    header = [h.strip() for h in lines[0].split("|")]
    return [dict(zip(header, (c.strip() for c in line.split("|")), strict=False))
            for line in lines[1:] if not set(line) <= set("-+")]


def state_of(home: Home, experiment_id: int) -> str:
    return home.rows("SELECT state FROM experiments WHERE id = ?", experiment_id)[0]["state"]


# -- without a daemon ---------------------------------------------------------------------

def test_cluster_commands_are_refused_in_one_line(home):
    for args, hint in ((["agent", "list"], "localdet daemon --slots"),
                       (["slot", "ls"], "--slots"), (["cmd", "run", "ls"], "det job run"),
                       (["notebook", "start"], "jupyter"), (["u", "login", "admin"], "no users"),
                       (["tensorboard", "start", "3"], "localdet tensorboard"),
                       (["template", "list"], "--config")):
        result = det(home, *args, check=False)
        assert result.returncode == 1, args
        assert result.stdout == ""
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "no" in result.stderr and hint in result.stderr, result.stderr
    assert not home.path.exists()  # nothing was recorded or started


def test_master_and_det_master_are_ignored_with_a_notice(home):
    result = det(home, "-m", "https://det.example.com:8080", "e", "list")
    notice = result.stderr.strip().splitlines()
    assert len(notice) == 1 and "ignoring -m/--master" in notice[0]
    assert table(result.stdout) == [] and result.stdout.startswith(" ID | Owner | Name")
    result = det(home, "experiment", "ls", "--csv", env={"DET_MASTER": "det.example.com"})
    assert "ignoring DET_MASTER=det.example.com" in result.stderr
    assert result.stdout.splitlines() == [
        "ID,Owner,Name,Parent ID,State,Progress,Started,Ended,Resource Pool"]
    assert "det" in det(home, "-v").stdout


def test_template_is_refused_and_nothing_is_queued(home, tmp_path):
    config = counter_config(tmp_path, "templated")
    result = det(home, "e", "create", config, COUNTER, "--template", "gpu", check=False)
    assert result.returncode == 1
    assert "--template is refused" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not home.path.exists()


def test_config_overrides_are_dotted_keys_with_yaml_values():
    from localdet.operations.creation import apply_overrides, parse_overrides
    from localdet.operations.errors import OperationError

    overrides = parse_overrides(["searcher.max_length.batches=7", "resources.slots_per_trial=2",
                                 "labels=a,b", "hyperparameters.lr=1e-3",
                                 "data={x: [1, 2]}", "name=plain text"])
    assert overrides == {"searcher.max_length.batches": 7, "resources.slots_per_trial": 2,
                         "labels": ["a", "b"], "hyperparameters.lr": "1e-3",
                         "data": {"x": [1, 2]}, "name": "plain text"}
    text = apply_overrides("name: a\nsearcher: {name: single, max_length: {batches: 1}}\n",
                           overrides)
    config = yaml.safe_load(text)
    assert config["searcher"] == {"name": "single", "max_length": {"batches": 7}}
    assert config["resources"] == {"slots_per_trial": 2} and config["name"] == "plain text"
    with pytest.raises(OperationError, match="not key=value"):
        parse_overrides(["searcher.max_length"])
    assert apply_overrides("# kept\nname: a\n", {}) == "# kept\nname: a\n"


# -- against a daemon det starts -----------------------------------------------------------

@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """A home whose daemon the first `det e create` starts; stopped (by its pid in the lock)
    after the module's last test, with any trial it left running."""
    folder = tmp_path_factory.mktemp("det")
    home = Home(folder / "home")
    yield home, folder
    lock = home.path / "daemon.lock"
    from localdet.pids import DaemonLock

    pid = DaemonLock.holder(lock)
    if pid and pid > 0:
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: DaemonLock.holder(lock) is None, 30, "the det-started daemon to stop")
    end_running_trials(home)


@pytest.fixture(scope="module")
def first(shared):
    """Experiment 1, created (the daemon started for it) and followed with -f."""
    home, folder = shared
    config = counter_config(folder, "first", batches=40)
    result = det(home, "e", "create", config, COUNTER, "-f",
                 "--config", "searcher.max_length.batches=15")
    return home, folder, result


@pytest.mark.slow
def test_create_starts_the_daemon_and_follows_the_first_trial(first):
    home, _, result = first
    lines = result.stdout.splitlines()
    assert lines[:3] == ["Created experiment 1", "Waiting for first trial to begin...",
                         "Following first trial with ID 1"]
    assert lines[-1] == "Trial log stream ended. To reopen log stream, run: det trial logs -f 1"
    assert any("trial 1 launch 1" in line for line in lines)
    assert (home.path / "daemon.out").exists()
    assert state_of(home, 1) == "COMPLETED"
    trial = home.first_trial(1)
    assert trial["batches_trained"] == 15  # --config changed the length


@pytest.mark.slow
def test_list_describe_json_csv_and_checkpoints(first):
    home, _, _ = first
    (row,) = table(det(home, "e", "list").stdout)
    assert (row["ID"], row["Name"], row["State"], row["Progress"]) == ("1", "first",
                                                                      "COMPLETED", "100.0%")
    rows = list(csv.DictReader(io.StringIO(det(home, "e", "ls", "--csv").stdout)))
    assert rows[0]["State"] == "COMPLETED" and rows[0]["Parent ID"] == ""
    (described,) = json.loads(det(home, "e", "describe", "1", "--json").stdout)
    assert described["experiment"]["state"] == "STATE_COMPLETED"
    assert described["config"]["searcher"]["max_length"] == {"batches": 15}
    text = det(home, "e", "describe", "1", "--metrics").stdout
    assert "Experiment:" in text and "\nTrials:" in text and "\nWorkloads:" in text
    assert "Validation Metric: val_loss" in text and "Training Metric: loss" in text
    best = list(csv.DictReader(io.StringIO(det(home, "e", "lc", "1", "--best", "1",
                                               "--csv").stdout)))
    assert len(best) == 1 and best[0]["# of Batches"] == "15" and best[0]["Validation Metric"]
    assert "Trial ID,State,H-Params" in det(home, "e", "lt", "1", "--csv").stdout
    trial = json.loads(det(home, "t", "describe", "1", "--json").stdout)["trial"]
    assert trial["summaryMetrics"]["validation_metrics"]["val_loss"]["count"] == 1
    logs = det(home, "e", "logs", "1", "--tail", "1").stdout.splitlines()
    assert len(logs) == 2 and logs[-1].startswith("Trial log stream ended")
    path = det(home, "c", "download", best[0]["UUID"], "-o", home.path.parent / "dl",
               "-q").stdout.strip()
    assert json.loads(Path(path, "state.json").read_text())["batches"] == 15
    det(home, "e", "download-model-def", "1", "--output-dir", home.path.parent / "code")
    with tarfile.open(home.path.parent / "code" / "experiment_1_model_def.tgz") as archive:
        assert "train.py" in archive.getnames()
    assert yaml.safe_load(det(home, "e", "config", "1").stdout)["name"] == "first"


@pytest.mark.slow
def test_pause_activate_kill_and_wait(first):
    home, folder, _ = first
    config = counter_config(folder, "long", batches=2000, batch_seconds=0.05)
    extra = folder / "labels.txt"
    extra.write_text("zero\none\n")
    created = det(home, "e", "create", config, COUNTER, "-i", extra).stdout
    experiment_id = int(created.split()[-1])
    model = home.path / "experiments" / str(experiment_id) / "model"
    assert (model / "labels.txt").read_text() == "zero\none\n" and (model / "train.py").exists()
    wait_for(lambda: home.first_trial(experiment_id).get("state") == "RUNNING", 60,
             "its trial to run", 0.1)
    assert det(home, "e", "pause", experiment_id).stdout == f"Paused experiment {experiment_id}\n"
    wait_for(lambda: state_of(home, experiment_id) == "PAUSED", 60, "the pause", 0.1)
    paused = det(home, "e", "wait", experiment_id, check=False)  # as Determined's wait
    assert paused.returncode == 1 and "is paused" in paused.stderr
    det(home, "e", "unpause", experiment_id)
    wait_for(lambda: home.first_trial(experiment_id).get("state") == "RUNNING", 60,
             "its trial to run again", 0.1)
    assert "Killed experiment" in det(home, "e", "kill", experiment_id).stdout
    waited = det(home, "e", "wait", experiment_id, "--polling-interval", "0", check=False)
    assert waited.returncode == 1  # it ended CANCELED, not COMPLETED
    assert state_of(home, experiment_id) == "CANCELED"
    refused = det(home, "t", "kill", home.first_trial(experiment_id)["id"], check=False)
    assert refused.returncode == 1 and "nothing to kill" in refused.stderr


@pytest.mark.slow
def test_archive_labels_fork_and_delete(first):
    home, _, _ = first
    det(home, "e", "label", "add", "1", "baseline")
    det(home, "e", "set", "description", "1", "the first one")
    det(home, "e", "set", "notes", "1", "-", stdin="line one\nline two\n")
    det(home, "e", "set", "priority", "1", "7")
    (facts,) = json.loads(det(home, "e", "describe", "1", "--json").stdout)
    assert facts["experiment"]["description"] == "the first one"
    assert facts["experiment"]["notes"] == "line one\nline two\n"
    assert facts["config"]["resources"]["priority"] == 7
    assert [r["ID"] for r in table(det(home, "e", "list", "--label", "baseline").stdout)] == ["1"]
    assert det(home, "e", "archive", "1").stdout == "Archived experiment 1\n"
    assert "1" not in [r["ID"] for r in table(det(home, "e", "list").stdout)]
    everything = {r["ID"]: r for r in table(det(home, "e", "list", "--all").stdout)}
    assert everything["1"]["Archived"] == "True"
    det(home, "e", "unarchive", "1")
    forked = det(home, "e", "fork", "1", "--config", "searcher.max_length.batches=5").stdout
    fork_id = int(forked.split()[2])
    assert forked.strip() == f"Created experiment {fork_id} (forked from experiment 1)"
    det(home, "e", "wait", fork_id, "--polling-interval", "0")
    rows = {r["ID"]: r for r in table(det(home, "e", "list").stdout)}
    assert rows[str(fork_id)]["Parent ID"] == "1"
    assert "Forked into experiment(s)" in det(home, "e", "describe", "1").stdout
    kept = det(home, "e", "delete", fork_id, stdin="n\n")
    assert "Aborting experiment deletion." in kept.stdout
    assert str(fork_id) in {r["ID"] for r in table(det(home, "e", "list").stdout)}
    assert det(home, "e", "delete", fork_id, "--yes").stdout == \
        f"Deleted experiment {fork_id}\n"
    assert str(fork_id) not in {r["ID"] for r in table(det(home, "e", "list", "-a").stdout)}
    gone = det(home, "e", "describe", fork_id, check=False)
    assert gone.returncode == 1 and len(gone.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_model_registry(first):
    home, _, _ = first
    (best,) = list(csv.DictReader(io.StringIO(det(home, "e", "lc", "1", "--best", "1",
                                                  "--csv").stdout)))
    det(home, "m", "create", "counter-model", "--description", "a counter")
    det(home, "model", "register-version", "counter-model", best["UUID"])
    (model,) = json.loads(det(home, "m", "ls", "--json").stdout)
    assert (model["name"], model["description"]) == ("counter-model", "a counter")
    versions = json.loads(det(home, "m", "list-versions", "counter-model",
                              "--json").stdout)["modelVersions"]
    assert [(v["version"], v["checkpoint_uuid"]) for v in versions] == [(1, best["UUID"])]
    assert best["UUID"] in det(home, "m", "describe", "counter-model").stdout
    # A registered checkpoint is kept: deleting its experiment is refused.
    refused = det(home, "e", "delete", "1", "--yes", check=False)
    assert refused.returncode == 1 and "model" in refused.stderr
    assert best["UUID"] in det(home, "m", "delete-version", "counter-model", "1",
                               "--yes").stdout
    assert json.loads(det(home, "m", "list-versions", "counter-model",
                          "--json").stdout)["modelVersions"] == []


@pytest.mark.slow
def test_test_mode_checks_a_run_and_records_nothing(first):
    home, folder, _ = first
    before = home.rows("SELECT count(*) AS n FROM experiments")[0]["n"]
    passed = det(home, "e", "create", counter_config(folder, "tested"), COUNTER, "-t")
    assert "Model definition test succeeded!" in passed.stdout
    for check in ("training (2 batches) [ok]", "validation [ok]", "checkpointing",
                  "restoring the checkpoint [ok]"):
        assert check in passed.stdout
    failed = det(home, "e", "create", counter_config(folder, "crashing", crash_at=1), COUNTER,
                 "--test-mode", check=False)
    assert failed.returncode == 1 and "Model definition test failed" in failed.stderr
    assert home.rows("SELECT count(*) AS n FROM experiments")[0]["n"] == before


@pytest.mark.slow
def test_continue_extends_a_finished_experiment(first):
    home, _, _ = first
    result = det(home, "e", "continue", "1", "--config", "searcher.max_length.batches=25", "-f")
    lines = result.stdout.splitlines()
    assert lines[0] == "Continued experiment 1"
    assert lines[-1] == "Trial log stream ended. To reopen log stream, run: det trial logs -f 1"
    det(home, "e", "wait", "1", "--polling-interval", "0")
    assert home.first_trial(1)["batches_trained"] == 25
    assert "Continued at" in det(home, "e", "describe", "1").stdout
