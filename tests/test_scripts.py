"""Every script under scripts/ runs in the suite (issue 26, item 3), so that a module or a
command that moves breaks a test, not a user's run:

- each benchmark in scripts/bench/ (every `*.py` but the `_` modules it shares) with
  `--smoke`: tiny sizes, one repeat, seconds; it must exit 0 and print its figures (their
  values mean nothing at these sizes, and no timing is asserted);
- scripts/demo on the suite's own environment (LOCALDET_DEMO_PYTHON: nothing installed), all
  its steps: daemon, the digits example to COMPLETED, status, the best checkpoint exported and
  loaded; then scripts/screenshots.py photographs what the demo trained (`--home`).

scripts/test, scripts/horovod-env, scripts/cpu-image and scripts/device-jax-bench run elsewhere
(the suite itself, tests/test_horovod_e2e.py, tests/test_container_image.py,
tests/test_backends.py); scripts/determined_api_names.py in
tests/test_determined_api.py.

The runs are subprocesses started together at this file's first test, two at a time, longest
first; each test waits for its own and checks what it printed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow

BENCH = REPO / "scripts" / "bench"
BENCHMARKS = sorted(path.name for path in BENCH.glob("*.py") if not path.name.startswith("_"))
DEMO = "demo + screenshots"
# The longest first, so that two at a time end together; the rest (new ones too) after them.
LONGEST = ["search.py", DEMO, "scaling.py", "overhead.py", "checkpoint.py", "cluster.py"]
TIMEOUT = 600

# What each prints: a line per figure (the benchmarks of other files: a number at least).
FIGURES = {
    "overhead.py": [r"bare model\.fit: \d+\.\d+ s", r"localdet trial: \d+\.\d+ s",
                    r"ratio: \d+\.\d+", r"ratio of the fastest runs: \d+\.\d+"],
    "scaling.py": [r"Keras 3 +mirrored +1 slot +\d+ +2 slots +\d+ samples/s +efficiency "
                   r"\d+\.\d+ +max \|weights - 1 slot\| \d"],
    "search.py": [r"Optuna +process +\d+\.\d s, search +\d+\.\d s",
                  r"Keras Tuner +process +\d+\.\d s",
                  r"2 trials, 2 epochs trained .* 2 launches"]
                 + [figure for line in ("Keras 2",) for figure in (  # --smoke: one line
                     rf"bare fits, {line} +fits summed +\d+\.\d s \(\d+\.\d\d s a trial\), "
                     r"process +\d+\.\d s; localdet's draws",
                     rf"localdet, {line} +submit -> COMPLETED +\d+\.\d s: \d+\.\d\dx the bare",
                     rf"timeline \({line}\), shares of .*: training \d+\.\d%, start-up \d+\.\d%",
                     rf"phase means \({line}\), s: .*process_ready \d+\.\d\d, .*first_batch \d",
                     rf"launch -> first batch \({line}\): median \d+\.\d+ s",
                     rf"the warm-up trial before the clock, launch -> first batch \({line}\): "
                     r"\d+\.\d\d s")],
    "search_quality.py": [rf"{label} +\d+\.\d+ \+- \d+\.\d+ +median" for label in
                          ("localdet random", "localdet tpe", "optuna TPESampler")]
                         + [r"digits SVC validation error", r"tpe vs Optuna: difference"],
    "remote_checkpoint.py": [rf" {name} +store +\d+\.\d MB = \d+\.\d\dx one checkpoint"
                             for name in ("whole files", "chunks")]
                            + [r"a later one +\d+\.\d\d MB = \d+\.\d%"],
    "cli.py": [rf"{re.escape(command)} +\d+\.\d+ +\d+\.\d +\d+\.\d+ +(yes|NO)$" for command in
               ("localdet --help", "localdet status", "localdet status 7",
                "localdet checkpoints 7", "localdet metrics 7", "det e list")],
}


@dataclass
class Run:
    argv: list[str]
    returncode: int
    output: str  # stdout, then stderr
    seconds: float

    def failure(self) -> str:
        return (f"`{' '.join(self.argv)}` exited {self.returncode} after {self.seconds:.0f} s:"
                f"\n{self.output[-6000:]}")


def run(argv: list[str], env: dict[str, str]) -> Run:
    start = time.monotonic()
    try:
        done = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True,
                              timeout=TIMEOUT)
        returncode, output = done.returncode, done.stdout + "\n-- stderr --\n" + done.stderr
    except subprocess.TimeoutExpired as error:
        returncode, output = -1, f"timed out after {TIMEOUT} s\n{error.stdout}\n{error.stderr}"
    return Run(argv, returncode, output, time.monotonic() - start)


def demo_then_screenshots(folder: Path, env: dict[str, str]) -> tuple[Run, Run | None]:
    demo = run(["scripts/demo"], {**env, "LOCALDET_DEMO_PYTHON": sys.executable,
                                  "LOCALDET_DEMO_DIR": str(folder),
                                  "LOCALDET_HOME": str(folder / "home")})
    if demo.returncode:
        return demo, None
    return demo, run([sys.executable, "scripts/screenshots.py", "--home",
                      str(folder / "home"), "--out", str(folder / "screenshots")], env)


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory) -> dict[str, Future]:
    """Every run this session's selected tests want, started now, two at a time."""
    wanted = {item.callspec.params.get("script", DEMO) if hasattr(item, "callspec") else DEMO
              for item in request.session.items if item.path == Path(__file__)}
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
    env.pop("LOCALDET_HOME", None)
    order = sorted(wanted, key=lambda name: LONGEST.index(name) if name in LONGEST
                   else len(LONGEST))
    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="smoke")
    started: dict[str, Future] = {}
    for name in order:
        if name == DEMO:
            started[name] = pool.submit(demo_then_screenshots, tmp_path_factory.mktemp("demo"),
                                        env)
        else:
            started[name] = pool.submit(run, [sys.executable, str(BENCH / name), "--smoke"],
                                        env)
    yield started
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("script", BENCHMARKS)
def test_the_benchmark_runs_in_its_smoke_mode_and_prints_its_figures(runs, script):
    done: Run = runs[script].result()
    print(f"{script} --smoke: {done.seconds:.1f} s")
    assert done.returncode == 0, done.failure()
    stdout = done.output.split("\n-- stderr --\n")[0]
    for figure in FIGURES.get(script, [r"\d"]):
        assert re.search(figure, stdout, re.MULTILINE), \
            f"{script} --smoke printed no line matching {figure!r}:\n{done.output[-6000:]}"
    assert "Traceback" not in done.output and "FAILED" not in stdout, done.failure()


def test_the_demo_runs_its_steps_and_the_screenshots_show_what_it_trained(runs):
    demo, screenshots = runs[DEMO].result()
    print(f"scripts/demo: {demo.seconds:.1f} s" + (
        f", scripts/screenshots.py: {screenshots.seconds:.1f} s" if screenshots else ""))
    assert demo.returncode == 0, demo.failure()
    for step in (r"== training experiment 1", r"Experiment 1 \(digits-const\): COMPLETED",
                 r"written to .*/best", r"best checkpoint .*: validation accuracy 0\.\d+ on 360 "
                 r"digits", r"== done"):
        assert re.search(step, demo.output), f"the demo did not print {step!r}:\n{demo.output}"
    assert screenshots is not None and screenshots.returncode == 0, screenshots.failure()
    for name in ("experiment.png", "trial.png"):
        assert re.search(rf"/screenshots/{name}$", screenshots.output, re.MULTILINE)
        path = Path(re.search(rf"(\S+/screenshots/{name})$", screenshots.output,
                              re.MULTILINE).group(1))
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is no PNG"
