"""What `localdet tensorboard` serves: an experiment's recorded metrics as TensorBoard event
files, one run per trial, beside the trial's own TensorBoard folder when its code wrote one.

    <home>/tensorboard/<exp>/trial_<id>/localdet/   scalars training/<name>, validation/<name>
                                                    (step = batches trained), from the database
    <home>/tensorboard/<exp>/trial_<id>/keras       a link to the trial's `tensorboard/` folder
                                                    (determined.keras.callbacks.TensorBoard)

Written with the `tensorboard` package's own record writer and protos, so no TensorFlow is
imported.

    logdir = export(layout, db, db.experiment(1))
    subprocess.run(server_command(logdir, port=6006, host="127.0.0.1"))
"""

from __future__ import annotations

import datetime
import os
import shutil
import socket
import sys
import time
from pathlib import Path

from localdet.paths import Layout
from localdet.records.db import Experiment, MetricRow, StateDB

KINDS = ("training", "validation")


def logdir(layout: Layout, experiment_id: int) -> Path:
    return layout.home / "tensorboard" / str(experiment_id)


def _wall_time(row: MetricRow) -> float:
    try:
        return datetime.datetime.fromisoformat(row.recorded_at).timestamp()
    except (TypeError, ValueError):
        return 0.0


def write_scalars(folder: Path, rows: list[MetricRow]) -> int:
    """One event file in `folder` with each row's numeric metrics as scalars tagged
    `<kind>/<name>` at step `batches_trained`; returns how many scalars were written.

    TensorBoard's record writer over a plain file: its `EventFileWriter` opens files through
    `tensorboard.compat.tf`, which imports TensorFlow (seconds) where it is installed."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.record_writer import RecordWriter

    folder.mkdir(parents=True, exist_ok=True)
    filename = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.localdet"
    writer = RecordWriter(open(folder / filename, "wb"))
    written = 0
    try:
        header = Event(wall_time=time.time(), file_version="brain.Event:2")
        writer.write(header.SerializeToString())
        for row in rows:
            values = [Summary.Value(tag=f"{row.kind}/{name}", simple_value=float(value))
                      for name, value in row.metrics.items()
                      if isinstance(value, (int, float)) and not isinstance(value, bool)]
            if values:
                writer.write(Event(wall_time=_wall_time(row), step=row.batches_trained,
                                   summary=Summary(value=values)).SerializeToString())
                written += len(values)
    finally:
        writer.close()
    return written


def _link(target: Path, link: Path) -> None:
    """`link` pointing at `target` (a copy where links cannot be made)."""
    try:
        link.symlink_to(target, target_is_directory=True)
    except OSError:
        shutil.copytree(target, link)


def export(layout: Layout, db: StateDB, experiment: Experiment) -> Path:
    """(Re)write the experiment's TensorBoard folder from the database; returns it."""
    root = logdir(layout, experiment.id)
    if root.exists():
        shutil.rmtree(root)  # removes links, never what they point at
    root.mkdir(parents=True)
    for trial in db.trials(experiment.id):
        folder = root / f"trial_{trial.id}"
        (folder / "localdet").mkdir(parents=True)
        write_scalars(folder / "localdet",
                      [row for row in db.metrics(trial.id) if row.kind in KINDS])
        own = layout.trial_dir(experiment.id, trial.id) / "tensorboard"
        if own.is_dir():
            _link(own, folder / "keras")
    return root


def server_command(folder: Path, port: int, host: str) -> list[str]:
    """TensorBoard from this environment, over `folder`."""
    return [sys.executable, "-m", "tensorboard.main", "--logdir", os.fspath(folder),
            "--port", str(port), "--host", host]
