"""Make the README's dashboard screenshots (docs/experiment.png, docs/trial.png): a small ASHA
search over the digits example under `localdet daemon --web`, then headless Chromium
(Debian's, driven by Playwright) photographs the experiment and its best trial.

    .venv/bin/python scripts/screenshots.py                 # runs the search (a few minutes)
    .venv/bin/python scripts/screenshots.py --home DIR      # an existing state folder
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync"]


def small_search(folder: Path) -> Path:
    """The bundled ASHA example, shortened: 8 trials of 1 or 4 epochs."""
    config = yaml.safe_load((REPO / "examples" / "digits_adaptive.yaml").read_text())
    config["searcher"].update(max_trials=8, max_rungs=2, max_length={"epochs": 4})
    path = folder / "asha.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", type=Path, help="an existing state folder to photograph")
    parser.add_argument("--out", type=Path, default=REPO / "docs")
    args = parser.parse_args()
    home = args.home or Path(tempfile.mkdtemp(prefix="localdet-screens-"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "LOCALDET_HOME": str(home)}
    # On loopback, for this script's own reads and browser: no token to pass around.
    daemon = subprocess.Popen([sys.executable, "-m", "localdet", "daemon", "--slots", "2",
                               "--web", "--port", str(port), "--no-token"], env=env,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_served(base, daemon)
        if args.home is None:
            subprocess.run([sys.executable, "-m", "localdet", "submit", str(small_search(home)),
                            str(REPO / "examples" / "digits_trial")], env=env, check=True)
        while True:
            experiments = json.load(urllib.request.urlopen(base + "/api/experiments"))
            if experiments and all(e["state"] != "ACTIVE" for e in experiments):
                break
            time.sleep(5)
        newest = max(experiments, key=lambda e: e["id"])
        # The list gives no best trial; the experiment's own facts do.
        experiment = json.load(urllib.request.urlopen(f"{base}/api/experiments/{newest['id']}"))
        photograph(base, experiment, args.out)
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        daemon.wait()


def wait_until_served(base: str, daemon: subprocess.Popen) -> None:
    """Until the daemon's dashboard answers (a loaded machine takes seconds to start it)."""
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(base + "/api/experiments", timeout=5).close()
            return
        except OSError:
            if daemon.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"the daemon's dashboard did not start at {base}")
            time.sleep(0.2)


def photograph(base: str, experiment: dict, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    out.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium",
                                             args=BROWSER_ARGS)
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        for path, name in ((f"/experiments/{experiment['id']}", "experiment.png"),
                           (f"/trials/{experiment['best_trial']}", "trial.png")):
            page.goto(base + path)
            page.wait_for_function("document.getElementById('curves')?.data?.length > 0")
            page.wait_for_timeout(500)  # plotly's transitions
            page.screenshot(path=out / name, full_page=True)
            print(out / name)
        browser.close()


if __name__ == "__main__":
    main()
