"""The dashboard, for real: `localdet daemon --web` serves it while a trial trains, and a
headless Chromium (Debian's, driven by Playwright) opens the address it printed (with its
token), opens the running experiment, sees its learning curve grow, pauses it from the button
and sees its state change; screenshots land in the test's folder. Bound to a non-local
address, the API refuses a request without the token too (tests/test_dashboard_security.py
has the rest of the dashboard's guards)."""

from __future__ import annotations

import io
import json
import re
import socket
import subprocess
import sys
import tarfile
import urllib.error
import urllib.request

import pytest
from browser import CHROMIUM, CHROMIUM_ARGS, free_port
from conftest import SLOW_DIGITS, wait_for, write_config

pytestmark = pytest.mark.slow

def get(url: str, **headers) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except urllib.error.URLError:  # not listening (yet)
        return 0, b""


def test_a_running_experiment_in_the_browser_grows_and_pauses_from_its_button(
        home, tmp_path, daemons):
    from playwright.sync_api import expect, sync_playwright

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    daemon = daemons(home, "--web", "--port", str(port))
    announced = re.search(r"dashboard at (\S+)", daemon.log_path.read_text()).group(1)
    assert announced.startswith(f"{base}/?token=")  # a token on loopback too
    token = announced.rsplit("=", 1)[1]
    home.cli("submit", write_config(
        tmp_path, "watched", entrypoint="model_def:SlowDigitsTrial",
        hyperparameters={"global_batch_size": 16, "hidden_units": 16, "dropout": 0.0,
                         "learning_rate": 0.01, "batch_sleep": 0.05},
        searcher={"name": "single", "metric": "val_accuracy", "smaller_is_better": False,
                  "max_length": {"batches": 2000}},
        scheduling_unit=5, min_validation_period={"batches": 10}), SLOW_DIGITS)
    experiment = home.experiment_named("watched")["id"]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        page.goto(announced)
        row = page.locator("#experiments tbody tr", has_text="watched")
        expect(row).to_be_visible(timeout=30_000)
        page.screenshot(path=tmp_path / "experiments.png", full_page=True)
        assert page.url == f"{base}/"  # the token left the address bar for a cookie
        row.click()
        page.wait_for_url(f"{base}/experiments/{experiment}")

        def points() -> int:  # training-loss points plotted so far, on the live page
            return page.evaluate("""() => {
                const chart = document.getElementById("curves");
                return (chart && chart.data || []).reduce((n, t) => n + t.x.length, 0);
            }""")
        first = wait_for(points, 180, "the first points of the curves")
        wait_for(lambda: points() > first, 180, "the curves to grow without a reload")
        expect(page.locator("#state")).to_have_text("ACTIVE")
        page.screenshot(path=tmp_path / "running.png", full_page=True)
        page.locator("button[data-action=pause]").click()
        expect(page.locator("#message")).to_contain_text("pause requested for experiment")
        expect(page.locator("#state")).to_have_text("PAUSED", timeout=60_000)
        page.screenshot(path=tmp_path / "paused.png", full_page=True)
        # The trial's page: its checkpoint (taken at the pause), with a download link.
        trial = home.experiment(experiment)["trials"][0]
        page.goto(f"{base}/trials/{trial['id']}")
        link = page.locator("a", has_text="download .tar.gz")
        expect(link).to_have_count(1, timeout=30_000)
        expect(page.locator("#log")).to_contain_text("paused at")
        # How long its launch took to end the first batch (a slow model folder shows).
        expect(page.locator("#first-batch")).to_contain_text(
            re.compile(r"first batch \d+\.\d s after launch"))
        # Its timeline strip: the launch's phases drawn (issue 34 item 2).
        drawn = wait_for(lambda: page.evaluate("""() => {
            const chart = document.getElementById("timeline");
            return (chart && chart.data || []).map((t) => t.name);
        }"""), 30, "the trial's timeline strip")
        assert {"start-up", "training", "checkpoints"} <= set(drawn), drawn
        assert home.experiment(experiment)["state"] == "PAUSED"  # as `localdet pause` does
        # The trial's own buttons act on it alone, as `localdet resume|kill --trial ID`.
        page.locator("button[data-action=resume]").click()
        expect(page.locator("#message")).to_contain_text("resume requested for trial")
        expect(page.locator("#state")).to_have_text("RUNNING", timeout=60_000)
        # Relaunched: both launches are listed, the first with its time.
        expect(page.locator("#launches")).to_contain_text(
            re.compile(r"1: \d+\.\d s, 2: "), timeout=30_000)
        page.locator("button[data-action=kill]").click()
        expect(page.locator("#state")).to_have_text("CANCELED", timeout=60_000)
        page.screenshot(path=tmp_path / "trial.png", full_page=True)
        browser.close()
    download = f"{base}/api/checkpoints/{trial['latest_checkpoint']}.tar.gz"
    assert get(download)[0] == 401
    status, body = get(download, Authorization=f"Bearer {token}")
    assert status == 200
    with tarfile.open(fileobj=io.BytesIO(body)) as archive:
        names = archive.getnames()
    assert f"{trial['latest_checkpoint']}/determined-keras-model.h5" in names
    status, body = get(f"{base}/api/experiments/{experiment}/resume",
                       Authorization=f"Bearer {token}")
    assert status == 405  # actions are POSTs only
    daemon.stop()
    for shot in ("experiments.png", "running.png", "paused.png", "trial.png"):
        assert (tmp_path / shot).stat().st_size > 10_000


def test_a_non_local_binding_refuses_requests_without_its_token(home, tmp_path, processes):
    home.path.mkdir(parents=True)
    port = free_port()
    server = processes([sys.executable, "-m", "localdet", "web", "--host", "0.0.0.0",
                        "--port", port], env=home.env, stderr=subprocess.PIPE, text=True)
    announced = server.stderr.readline()
    assert announced.startswith(f"dashboard at http://0.0.0.0:{port}/?token=")
    token = announced.strip().rsplit("=", 1)[1]
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: get(base + "/api/jobs")[0] in (200, 401), 30, "the dashboard", 0.1)
    status, body = get(base + "/api/experiments")
    assert status == 401 and "needs its token" in json.loads(body)["error"]
    assert get(base + "/")[0] == 401
    assert get(base + "/api/experiments", Authorization="Bearer wrong")[0] == 401
    assert get(f"{base}/api/experiments?token={token}") == (200, b"[]")
    assert get(base + "/api/experiments", Authorization=f"Bearer {token}")[0] == 200
    server.terminate()
    server.wait(timeout=30)
    # A port already taken is one sentence, not a traceback.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = home.cli("web", "--port", str(taken.getsockname()[1]), check=False)
    assert result.returncode != 0 and "cannot serve the dashboard on 127.0.0.1" in result.stderr
