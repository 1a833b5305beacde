"""Determined's custom search methods (`determined.searcher`): tests/compat/custom_search's
ASHA and random-with-early-exits SearchMethods run by a LocalSearchRunner script against a
real daemon end as a simulated run (no daemon, the same metrics) predicts; a runner killed
with -9 and started again, and a daemon killed with -9 mid-search, resume to the very same
operations with no duplicate trial; a batch posted twice applies once; a custom config
submitted on its own says what to run."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Home, wait_for

SEARCH = Path(__file__).parent / "compat" / "custom_search"
sys.path.insert(0, str(SEARCH))

import run_search  # noqa: E402
import simulate  # noqa: E402


def start_runner(processes, home: Home, method: str, searcher_dir: Path) -> subprocess.Popen:
    return processes([sys.executable, str(SEARCH / "run_search.py"), method,
                      str(searcher_dir)], home=home, env=home.env, stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT, text=True)


def finished(runner: subprocess.Popen) -> int:
    output, _ = runner.communicate(timeout=180)
    assert runner.returncode == 0, output[-3000:]
    return int(output.strip().splitlines()[-1].split()[1])


def posted(home: Home, experiment_id: int) -> list[list[tuple]]:
    """The batches the runner posted, in event order, as simulate.normalized names them."""
    names: dict[str, int] = {}
    return [simulate.normalized(json.loads(row["operations"]), names) for row in home.rows(
        "SELECT operations FROM custom_search_batches WHERE experiment_id = ? "
        "ORDER BY event_id", experiment_id)]


def batches(home: Home) -> int:
    try:
        return home.rows("SELECT COUNT(*) AS n FROM custom_search_batches")[0]["n"]
    except Exception:  # the database or its table is not there yet
        return 0


def without_progress(answers: list[list[tuple]]) -> collections.Counter:
    return collections.Counter(op for answer in answers for op in answer
                               if dict(op)["type"] != '"progress"')


def state(home: Home, experiment_id: int) -> str:
    return home.rows("SELECT state FROM experiments WHERE id = ?", experiment_id)[0]["state"]


def assert_one_trial_per_create(home: Home, experiment_id: int, creates: int) -> None:
    requests = home.rows("SELECT request_uuid FROM custom_search_requests "
                         "WHERE experiment_id = ?", experiment_id)
    trials = home.trials(experiment_id)
    assert len(requests) == len({r["request_uuid"] for r in requests}) == creates
    assert len(trials) == len({t["request_id"] for t in trials}) == creates


class Shared:
    """One home and its daemon for the module (the last test kills it and starts another)."""

    def __init__(self, home: Home, daemon, start) -> None:
        self.home, self.daemon, self.start = home, daemon, start


@pytest.fixture(scope="module")
def shared_daemon(tmp_path_factory, module_daemons):
    home = Home(tmp_path_factory.mktemp("custom") / "home")
    return Shared(home, module_daemons(home, "--slots", "2"), module_daemons)


@pytest.fixture
def shared(shared_daemon):
    return shared_daemon.home


@pytest.mark.slow
def test_asha_and_random_search_methods_end_as_simulated(shared, tmp_path, processes):
    asha = start_runner(processes, shared, "asha", tmp_path / "asha")
    randoms = start_runner(processes, shared, "random", tmp_path / "random")
    asha_id, random_id = finished(asha), finished(randoms)

    # One trial in flight at a time: every answer, progress included, as predicted.
    expected = simulate.simulate(run_search.METHODS["asha"]())
    assert posted(shared, asha_id) == expected
    assert state(shared, asha_id) == "COMPLETED"
    reached: dict[str, int] = {}  # request -> the last rung's length it was sent to
    for op in (dict(op) for answer in expected for op in answer):
        if op["type"] == '"validate_after"':
            reached[op["request_id"]] = int(op["length"])
    assert [t["batches_trained"] for t in shared.trials(asha_id)] \
        == [reached[str(n)] for n in range(1, 5)]
    assert_one_trial_per_create(shared, asha_id, 4)

    # Two in flight: the order of news varies, the operations do not (progress aside).
    expected = simulate.simulate(run_search.METHODS["random"]())
    answers = posted(shared, random_id)
    assert without_progress(answers) == without_progress(expected)
    assert dict(answers[-1][0])["type"] == '"shutdown"'
    states = collections.Counter(t["state"] for t in shared.trials(random_id))
    assert states == {"COMPLETED": 4, "ERROR": 2}  # trials 3 and 6 fail on purpose
    assert state(shared, random_id) == "COMPLETED"
    assert_one_trial_per_create(shared, random_id, 6)
    # The runner's own experiment never shows the "waits for a search method" sentence.
    assert shared.json("status", str(asha_id))["warnings"] == []


@pytest.mark.slow
def test_a_runner_killed_and_started_again_resumes_the_same_search(shared, tmp_path,
                                                                   processes):
    before = batches(shared)
    runner = start_runner(processes, shared, "asha", tmp_path / "searcher")
    wait_for(lambda: batches(shared) >= before + 6, 120, "the search to be under way", 0.05)
    os.kill(runner.pid, signal.SIGKILL)
    runner.wait()
    experiment_id = int((tmp_path / "searcher" / "experiment_id.txt").read_text())
    assert state(shared, experiment_id) == "ACTIVE"  # waiting for its runner

    again = start_runner(processes, shared, "asha", tmp_path / "searcher")
    assert finished(again) == experiment_id
    assert posted(shared, experiment_id) == simulate.simulate(run_search.METHODS["asha"]())
    assert_one_trial_per_create(shared, experiment_id, 4)
    assert state(shared, experiment_id) == "COMPLETED"


@pytest.mark.slow
def test_a_daemon_killed_mid_search_resumes_it(shared_daemon, tmp_path, processes):
    home = shared_daemon.home
    before = batches(home)
    runner = start_runner(processes, home, "asha", tmp_path / "searcher")
    wait_for(lambda: batches(home) >= before + 6, 120, "the search to be under way", 0.05)
    shared_daemon.daemon.process.kill()
    shared_daemon.daemon.process.wait()
    shared_daemon.daemon = shared_daemon.start(home, "--slots", "2")
    experiment_id = finished(runner)
    assert posted(home, experiment_id) == simulate.simulate(run_search.METHODS["asha"]())
    assert_one_trial_per_create(home, experiment_id, 4)
    assert state(home, experiment_id) == "COMPLETED"


def test_a_batch_posted_twice_applies_once(layout, db):
    from localdet.operations import custom_search
    from localdet.operations.errors import OperationError

    experiment_id = db.create_experiment(
        name="c", description="", config={}, original_config="", searcher="custom",
        metric="loss", smaller_is_better=True, experiment_seed=3, model_dir="")
    db.add_searcher_event(experiment_id, "initialized")
    (first,) = [e["id"] for e in db.searcher_events(experiment_id)]
    create = [{"type": "create", "request_id": "7e4f4c1a-0000-4000-8000-000000000001",
               "hparams": {"x": 0.5}}]
    assert custom_search.post_operations(layout, db, experiment_id, first, create) \
        == {"applied": True}
    assert custom_search.post_operations(layout, db, experiment_id, first, create) \
        == {"applied": False}
    events = custom_search.events(db, experiment_id, after=first)["events"]
    assert [(e["kind"], e["request_id"]) for e in events] == [
        ("trial_created", create[0]["request_id"])]
    train = [{"type": "validate_after", "request_id": create[0]["request_id"], "length": 4},
             {"type": "progress", "progress": 0.25}]
    custom_search.post_operations(layout, db, experiment_id, events[0]["id"], train)
    custom_search.post_operations(layout, db, experiment_id, events[0]["id"], train)
    (trial,) = db.trials(experiment_id)
    assert (trial.state, trial.target_batches, trial.hparams) == ("QUEUED", 4, {"x": 0.5})
    assert custom_search.progress(db, experiment_id) == 0.25
    # A batch naming a request no Create made is refused whole, and recorded not at all.
    db.add_searcher_event(experiment_id, "trial_closed", 1)
    last = db.searcher_events(experiment_id)[-1]["id"]
    with pytest.raises(OperationError, match="which no Create made"):
        custom_search.post_operations(layout, db, experiment_id, last, [
            {"type": "create", "request_id": "7e4f4c1a-0000-4000-8000-000000000002",
             "hparams": {}},
            {"type": "close", "request_id": "7e4f4c1a-0000-4000-8000-0000000000ff"}])
    assert len(db.searcher_events(experiment_id)) == 3
    assert custom_search.post_operations(layout, db, experiment_id, last, []) \
        == {"applied": True}

    # Closing a trial still training asks the daemon to stop it; its stop is not told to
    # the runner as an early exit.
    db.update_trial(trial.id, state="RUNNING")
    db.add_searcher_event(experiment_id, "validation_completed", trial.request_id, 0.5, 2)
    last = db.searcher_events(experiment_id)[-1]["id"]
    custom_search.post_operations(layout, db, experiment_id, last, [
        {"type": "close", "request_id": create[0]["request_id"]}])
    assert [(r["action"], r["trial_id"]) for r in db.pending_requests()] == [("kill", trial.id)]
    db.update_trial(trial.id, state="CANCELED")
    db.add_searcher_event(experiment_id, "trial_exited_early", trial.request_id)
    kinds = [e["kind"] for e in custom_search.events(db, experiment_id, after=last)["events"]]
    assert kinds == ["trial_closed"]

    # After a Shutdown, answers are recorded and not carried out.
    newest = db.searcher_events(experiment_id)[-1]["id"]
    custom_search.post_operations(layout, db, experiment_id, newest, [{"type": "shutdown"}])
    db.add_searcher_event(experiment_id, "trial_closed", 1)
    later = db.searcher_events(experiment_id)[-1]["id"]
    custom_search.post_operations(layout, db, experiment_id, later, [
        {"type": "create", "request_id": "7e4f4c1a-0000-4000-8000-000000000003",
         "hparams": {}}])
    assert custom_search.events(db, experiment_id, after=later)["events"] == []
    assert len(db.trials(experiment_id)) == 1


def test_a_custom_config_submitted_alone_says_what_to_run():
    from localdet.config.experiment import CUSTOM_WAITS, load_config_text

    parsed = load_config_text((SEARCH / "experiment" / "config.yaml").read_text())
    assert CUSTOM_WAITS in parsed.warnings
    assert "LocalSearchRunner(method).run(config, model_dir=...)" in CUSTOM_WAITS


def test_a_script_run_on_its_own_with_a_custom_config_says_what_to_run(tmp_path):
    from localdet.reporting.unmanaged import ScriptRunError, _plan

    config = SEARCH / "experiment" / "config.yaml"
    with pytest.raises(ScriptRunError, match=r"searcher 'custom' creates trials only from a "
                                             r"search runner .*LocalSearchRunner"):
        _plan(SEARCH / "experiment" / "train.py", None, str(config))
