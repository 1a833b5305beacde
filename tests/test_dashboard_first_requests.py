"""The dashboard's first requests after it starts: a freshly started `localdet web` (its own
process, nothing imported yet) answers every page and every API endpoint with 200 while
several requests for each arrive at once, in an environment with the optional packages
people keep beside localdet (pandas, scikit-learn: the test extra installs them). With
pandas installed, plotly's figures met pandas half-imported by a concurrent request (issue
33: `partially initialized module 'pandas' has no attribute 'Series'`)."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from browser import free_port
from conftest import wait_for

from localdet.paths import Layout
from localdet.records.db import StateDB

AT_ONCE = 4  # requests for each address, all sent together


def record_search(layout: Layout, name: str) -> tuple[int, int]:
    """An experiment of three trials with training and validation metrics; its id and its
    first trial's."""
    with StateDB.open(layout.ensure().db) as db:
        experiment_id = db.create_experiment(
            name=name, description="", config={}, original_config="", searcher="random",
            metric="val_loss", smaller_is_better=True, experiment_seed=1, model_dir="")
        trial_ids = []
        for request in range(1, 4):
            trial_id = db.create_trial(experiment_id=experiment_id, request_id=request,
                                       hparams={"lr": 10.0 ** -request, "units": 8 * request},
                                       seed=request, target_batches=30)
            for step in range(1, 4):
                db.record_metrics(trial_id, "training", 10 * step, {"loss": 1.0 / step})
                db.record_metrics(trial_id, "validation", 10 * step,
                                  {"val_loss": 1.0 / (step + request)})
            trial_ids.append(trial_id)
    return experiment_id, trial_ids[0]


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def listening(port: int) -> bool:
    with socket.socket() as probe:  # a TCP connection, not a request: nothing is warmed
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.skipif(importlib.util.find_spec("pandas") is None,
                    reason="needs pandas (pip install -e '.[test]')")
def test_concurrent_first_requests_to_a_fresh_dashboard_all_succeed(tmp_path, processes):
    layout = Layout(tmp_path / "home")
    experiment_id, trial_id = record_search(layout, "first")
    other, _ = record_search(layout, "second")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = processes(  # ended at the test's end, whatever happens
        [str(Path(sys.executable).parent / "localdet"), "web", "--no-token", "--port", str(port)],
        env={**os.environ, "LOCALDET_HOME": str(layout.home)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for(lambda: listening(port) or server.poll() is not None, 60,
             "the dashboard to listen")
    assert server.poll() is None, server.stdout.read() if server.stdout else ""
    addresses = [
        "/", f"/experiments/{experiment_id}", f"/trials/{trial_id}", "/jobs", "/models",
        f"/compare?ids={experiment_id},{other}",
        "/api/daemon", "/api/experiments", f"/api/experiments/{experiment_id}",
        f"/api/experiments/{experiment_id}/curves?full=1",
        f"/api/trials/{trial_id}", f"/api/trials/{trial_id}/curves",
        "/api/jobs", "/api/models", f"/api/compare?ids={experiment_id},{other}",
    ]
    # The experiment and trial pages' own requests first, all at once: the ones that
    # draw figures.
    drawing = [a for a in addresses if a.startswith(("/api/experiments/", "/api/trials/",
                                                     "/api/compare"))]
    ordered = drawing + [a for a in addresses if a not in drawing]
    with ThreadPoolExecutor(max_workers=len(ordered) * AT_ONCE) as pool:
        answers = list(pool.map(lambda a: (a, *get(base + a)), ordered * AT_ONCE))
    failed = [(address, status, body[:300]) for address, status, body in answers
              if status != 200]
    assert failed == []
    for address, _, body in answers:
        if address.startswith("/api/"):
            json.loads(body)  # JSON, not an error page
    facts = json.loads(next(b for a, _, b in answers if a == f"/api/experiments/"
                            f"{experiment_id}"))
    assert len(facts["trials"]) == 3 and facts["charts"]["curves"]["data"]
