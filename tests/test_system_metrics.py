"""Each trial's system metrics (localdet/monitoring/system_metrics.py): the sampler against
a real process, the records and their thinning, the daemon's hook, `localdet metrics
--system`, the SDK's `Trial.iter_metrics("system")`, the migration, and NVML's absence or
presence. The end-to-end path (a daemon's trial sampled) is asserted in
tests/test_pause_resume_e2e.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner
from conftest import older_database, wait_for

from localdet.config.experiment import parse_config
from localdet.daemon.watched import Watched
from localdet.monitoring.system_metrics import Gpus, SystemMetrics, Trees, trial_window
from localdet.records import catalog
from localdet.records import system_metrics as records
from localdet.records.db import StateDB
from localdet.records.system_metrics import Sample

# Burns a core and grows by 8 MB every 50 ms until killed.
BURNER = ("import time\nheld = []\nwhile True:\n    held.append(bytearray(8 << 20))\n"
          "    end = time.time() + 0.05\n    while time.time() < end:\n        pass\n")


def _experiment(db: StateDB, **config) -> tuple[int, int]:
    parsed = parse_config({"entrypoint": "python3 train.py", **config}).config
    experiment_id = db.create_experiment(
        name="sampled", description="", config=parsed, original_config="", searcher="single",
        metric="val_loss", smaller_is_better=True, experiment_seed=1, model_dir="/nowhere")
    trial_id = db.create_trial(experiment_id=experiment_id, request_id=0, hparams={},
                               seed=1, target_batches=100)
    return experiment_id, trial_id


@pytest.fixture
def burner():
    """A process whose child burns: the tree is the pair."""
    process = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; "
                                f"subprocess.run([sys.executable, '-c', {BURNER!r}])"],
                               start_new_session=True)
    yield process
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@pytest.mark.parametrize("walk", ["children files", "process scan"])
def test_a_process_tree_is_sampled_for_cpu_and_growing_memory(burner, walk):
    trees = Trees()
    trees._children_files = trees._children_files and walk == "children files"
    wait_for(lambda: trees.sample({7: burner.pid})[7]["processes"] == 2, 20, "the child")
    first = trees.sample({7: burner.pid})[7]
    time.sleep(0.6)
    second = trees.sample({7: burner.pid})[7]
    assert second["cpu_util"] > 0
    assert second["memory_rss"] > first["memory_rss"]
    assert second["processes"] == 2
    assert {"disk_throughput_read", "disk_throughput_write"} <= set(second)
    assert trees.sample({8: 2 ** 22 + 12345}) == {}  # a process gone: nothing


def test_the_daemons_hook_samples_in_its_thread_and_writes_in_the_pass(layout, db, burner):
    _, trial_id = _experiment(db)
    lines: list[str] = []
    metrics = SystemMetrics(0.2, machine=[], log=lines.append)
    watched = Watched(adopted={trial_id: burner.pid}, slots_of={trial_id: [0]})
    try:
        def recorded() -> int:
            metrics.note(db, watched)
            return records.count(db, trial_id)
        wait_for(lambda: recorded() >= 3, 20, "three samples recorded")
    finally:
        metrics.close()
    found = records.rows(db, trial_id)
    assert found[-1]["metrics"]["cpu_util"] > 0 and found[-1]["samples"] == 1
    assert found[-1]["metrics"]["memory_rss"] > found[0]["metrics"]["memory_rss"]
    assert lines[-1].startswith("system metrics: ") and " ms each on average" in lines[-1]
    # Deleting the experiment takes its samples with it.
    assert catalog.remove_experiment_rows(db, 1)["system_metrics"] == len(found)


def test_profiling_enabled_false_samples_nothing_and_a_window_bounds_batches(layout, db):
    assert trial_window(parse_config({"entrypoint": "x", "profiling": {
        "enabled": False}}).config) is None
    assert trial_window(parse_config({"entrypoint": "x"}).config) == (0, None)
    _, trial_id = _experiment(db, profiling={"begin_on_batch": 10, "end_after_batch": 20})
    window = trial_window(db.experiment(1).config)
    assert window == (10, 20)
    for batches in (0, 10, 20, 30):
        db.update_trial(trial_id, batches_trained=batches)
        records.record(db, [Sample(trial_id, time.time(), {"cpu_util": 1.0})],
                       {trial_id: window})
    assert [r["batches_trained"] for r in records.rows(db, trial_id)] == [10, 20]


def test_long_trials_are_thinned_keeping_recent_samples_and_averages(layout, db):
    _, trial_id = _experiment(db)
    start = 1_700_000_000.0
    samples = [Sample(trial_id, start + 5 * i, {"cpu_util": float(i % 10), "memory_rss": i})
               for i in range(400)]
    records.record(db, samples)
    mean = sum(s.metrics["cpu_util"] for s in samples) / len(samples)
    assert records.thin(db, trial_id, recent=100, older=30) == 130
    found = records.rows(db, trial_id)
    assert len(found) == 130 and sum(r["samples"] for r in found) == 400
    assert [r["metrics"] for r in found[-100:]] == [s.metrics for s in samples[-100:]]
    assert all(r["samples"] > 1 for r in found[:30])
    thinned_mean = sum(r["metrics"]["cpu_util"] * r["samples"] for r in found) / 400
    assert thinned_mean == pytest.approx(mean)
    assert [r["at"] for r in found] == sorted(r["at"] for r in found)
    # Thinned again as more arrive: still bounded, nothing counted twice.
    records.record(db, [Sample(trial_id, start + 5 * (400 + i), {"cpu_util": 1.0})
                        for i in range(200)])
    assert records.thin(db, trial_id, recent=100, older=30) == 130
    assert sum(r["samples"] for r in records.rows(db, trial_id)) == 600


def test_the_migration_adds_the_table_to_older_records(tmp_path):
    path = older_database(tmp_path / "older.db")
    names = StateDB.open(path, migrate=True).db.table_names()
    assert "system_metrics" in names


def _recorded(layout, db) -> tuple[int, int]:
    experiment_id, trial_id = _experiment(db)
    db.update_trial(trial_id, batches_trained=40)
    records.record(db, [Sample(trial_id, 1_700_000_000.0 + i, {
        "cpu_util": 90.0 + i, "memory_rss": 2_000_000_000 + i, "disk_throughput_read": 0,
        "disk_throughput_write": 1_500_000, "processes": 2}) for i in range(3)])
    return experiment_id, trial_id


def test_localdet_metrics_system_shows_a_summary_samples_and_csv(layout, db, monkeypatch):
    from localdet.ui.cli import cli

    experiment_id, trial_id = _recorded(layout, db)
    monkeypatch.setenv("LOCALDET_HOME", str(layout.home))
    runner = CliRunner()
    summary = runner.invoke(cli, ["metrics", str(experiment_id), "--system"])
    assert summary.exit_code == 0, summary.output
    assert "CPU %" in summary.output and "91 (92)" in summary.output  # mean (peak)
    assert "2.0 GB" in summary.output and "GPU" not in summary.output  # no NVML: no column
    samples = runner.invoke(cli, ["metrics", str(experiment_id), "--system", "--trial",
                                  str(trial_id)])
    assert samples.exit_code == 0 and samples.output.count("1.5 MB") == 3
    table = runner.invoke(cli, ["metrics", str(experiment_id), "--system", "--csv"])
    lines = table.output.splitlines()
    assert lines[0].startswith("trial_id,at,batches_trained,samples,cpu_util,memory_rss")
    assert len(lines) == 4 and lines[1].startswith(f"{trial_id},2023-11-14T22:13:20")
    refused = runner.invoke(cli, ["metrics", str(experiment_id), "--system", "--plot",
                                  "x.png"])
    assert refused.exit_code != 0 and "leave out --plot" in refused.output


def test_the_sdk_iterates_system_metrics_as_determined_spells_it(layout, db, monkeypatch):
    from determined.experimental import client

    _, trial_id = _recorded(layout, db)
    monkeypatch.setenv("LOCALDET_HOME", str(layout.home))
    trial = client.get_trial(trial_id)
    system = list(trial.iter_metrics("system"))
    assert [m.metrics["cpu_util"] for m in system] == [90.0, 91.0, 92.0]
    assert {m.group for m in system} == {"system"} and system[0].steps_completed == 40
    assert [m.metrics for m in trial.iter_metrics("memory")][0] == {"memory_rss": 2_000_000_000}
    assert list(trial.iter_metrics("gpu")) == []  # sampled without NVML


def _nvml() -> tuple[Gpus | None, str]:
    return Gpus.open()


@pytest.mark.skipif(_nvml()[0] is not None, reason="NVML is present here: its absence "
                    "cannot be seen")
def test_without_nvml_one_line_says_gpu_metrics_are_not_sampled_and_why():
    lines: list[str] = []
    SystemMetrics(5.0, machine=[], log=lines.append).close()
    assert len(lines) == 1
    assert lines[0].startswith("system metrics: each trial's CPU, memory and disk, every 5 s; "
                               "GPU metrics are not sampled: ")
    assert "NVML" in lines[0] or "nvidia-ml-py" in lines[0]


@pytest.mark.skipif(_nvml()[0] is None, reason=f"no NVML here: {_nvml()[1]}")
def test_with_nvml_a_gpus_utilisation_memory_and_power_are_read():
    gpus, said = _nvml()
    assert gpus is not None and "GPU" in said
    found = gpus.sample(["0"])
    assert 0 <= found["gpu_util"] <= 100 and found["gpu_memory_used"] > 0
    assert found.get("gpu_power", 1) > 0
    uuid = next(key for key in gpus._handles if key.startswith("GPU-"))
    assert gpus.handle(uuid[:12]) is gpus.handle("0") or gpus.handle(uuid[:12]) is not None


def test_the_experiment_config_keeps_determineds_profiling_section():
    parsed = parse_config({"entrypoint": "x", "profiling": {
        "enabled": True, "begin_on_batch": 5, "sync_timings": False}})
    assert parsed.config["profiling"] == {"enabled": True, "begin_on_batch": 5,
                                          "end_after_batch": None}
    assert any("profiling.sync_timings" in warning for warning in parsed.warnings)
    assert json.loads(json.dumps(parsed.config))["profiling"]["enabled"] is True


def _get(app, path: str) -> bytes:
    """The body of a GET of `path` from the ASGI app, called in-process."""
    import asyncio

    sent: list[dict] = []

    requests = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> dict:
        if requests:
            return requests.pop()
        await asyncio.sleep(3600)  # until the response is sent (the call then ends)
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(),
             "query_string": b"", "headers": [(b"host", b"127.0.0.1")], "scheme": "http",
             "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1), "root_path": "",
             "http_version": "1.1"}
    asyncio.run(app(scope, receive, send))
    assert sent[0]["status"] == 200, sent
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_the_trial_page_draws_its_system_metrics_beside_its_curves(layout, db):
    from localdet.ui.web.app import create_app

    _, trial_id = _recorded(layout, db)
    app = create_app(layout, token=None)
    system = json.loads(_get(app, f"/api/trials/{trial_id}"))["charts"]["system"]
    titles = [a["text"] for a in system["layout"]["annotations"]]
    assert titles == ["CPU (% of one core)", "memory (GB)", "disk (MB/s)"]  # no GPU sampled
    cpu = next(trace for trace in system["data"] if trace["name"] == "CPU")
    assert cpu["y"] == [90.0, 91.0, 92.0] and cpu["x"][0].startswith("2023-11-14T22:13:20")
    assert b'chart("system", t.charts.system)' in _get(app, "/static/app.js")
