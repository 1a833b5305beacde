"""The Horovod engine, for real: in the second environment (TensorFlow 2.15, Keras 2.15,
Horovod 0.28.1 built with Gloo; `scripts/horovod-env` sets it up once per machine and the
test command passes its python as LOCALDET_HOROVOD_PYTHON), a 2-slot trial runs as two
Horovod ranks under the rank supervisor and ends like the same trial on one slot."""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import REPO, Home
from test_multi_slot_e2e import SHORT, assert_same_weights, one_and_two_slots

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def horovod_python() -> str:
    python = os.environ.get("LOCALDET_HOROVOD_PYTHON")
    if python:
        return python
    setup = subprocess.run([str(REPO / "scripts" / "horovod-env")], capture_output=True,
                           text=True, timeout=1800)
    assert setup.returncode == 0, f"scripts/horovod-env failed:\n{setup.stderr[-4000:]}"
    return setup.stdout.strip().splitlines()[-1]


def test_two_horovod_ranks_end_like_one_slot(tmp_path, horovod_python):
    home = Home(tmp_path / "home", python=horovod_python)
    one, two, log = one_and_two_slots(home, tmp_path, SHORT)
    trial = home.experiment(two)["trials"][0]
    assert "[rank 0] [trial" in log and "rank 1 of 2: Horovod" in log
    # Chosen because horovod.tensorflow imports here and TensorFlow 2.15 has Keras 2 only.
    assert (home.experiment(one)["trials"][0]["engine"], trial["engine"]) == ("single",
                                                                              "horovod")
    assert_same_weights(home, one, two, tmp_path)
    one_trial = home.experiment(one)["trials"][0]
    assert one_trial["latest_validation"]["val_accuracy"] == pytest.approx(
        trial["latest_validation"]["val_accuracy"], abs=1e-5)
