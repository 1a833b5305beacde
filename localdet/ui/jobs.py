"""`localdet job run`: follow a queued batch job to its end.

A job is queued like an experiment (`submit(..., kind=JOB)` into `queue/jobs/`); the daemon
ingests it as an experiment of kind 'job' with one trial, and this follows it:

    code = follow(layout, queued.name)   # prints "job N", then the job's log
"""

from __future__ import annotations

import sys
import time

import click

from localdet.daemon.submissions import ingested_as
from localdet.paths import Layout
from localdet.pids import DaemonLock
from localdet.processes import capped_log
from localdet.records.db import StateDB
from localdet.records.states import TERMINAL_STATES, ExperimentState
from localdet.ui.trial_logs import copy_new

POLL_SECONDS = 0.3


class JobNotTaken(RuntimeError):
    """The daemon did not take the job (it stopped, or rejected the submission)."""


def wait_for_ingest(layout: Layout, db: StateDB, queued_name: str) -> int:
    """The id the daemon gave the queued job; raises JobNotTaken if it never will."""
    while True:
        outcome = ingested_as(db, queued_name)
        if outcome is not None:
            status, value = outcome
            if status == "rejected":
                raise JobNotTaken(f"the daemon rejected the job: {value}")
            return int(value)  # accepted: the experiment id
        if DaemonLock.holder(layout.daemon_lock) is None:
            raise JobNotTaken(f"the daemon stopped before taking the job; it waits in "
                              f"{layout.job_queue / queued_name} for the next `localdet daemon`")
        time.sleep(POLL_SECONDS)


def follow(layout: Layout, queued_name: str) -> int:
    """Wait for the daemon to take the job, print "job N", copy its log to stdout until it
    ends; returns 0 when it COMPLETED, else 1. Raises JobNotTaken."""
    out = sys.stdout.buffer  # (click.get_binary_stream is deprecated since click 8.5)
    db = StateDB.open(layout.db)
    try:
        job_id = wait_for_ingest(layout, db, queued_name)
        click.echo(f"job {job_id}")
        (trial,) = db.trials(job_id)
        log_path = layout.trial_log(job_id, trial.id)
        offset = 0
        while True:
            ended = db.experiment(job_id).state in TERMINAL_STATES  # read before the log
            if ended:  # its last lines may still be on their way through the log's writer
                capped_log.wait_for_writer(log_path)
            offset = copy_new(log_path, offset, out)
            if ended:
                break
            if DaemonLock.holder(layout.daemon_lock) is None:
                raise JobNotTaken(f"the daemon stopped while job {job_id} ran; a restarted "
                                  f"daemon takes it up again (`localdet status {job_id}`)")
            time.sleep(POLL_SECONDS)
        job = db.experiment(job_id)
        # Failed with no log written: it never ran, so the reason is not in a log.
        if job.state == ExperimentState.ERROR and offset == 0:
            click.echo(f"error: job {job_id} failed: {job.error}", err=True)
        elif job.state == ExperimentState.ERROR:
            click.echo(f"error: job {job_id} failed; its log is above and in {log_path}",
                       err=True)
        elif job.state != ExperimentState.COMPLETED:
            click.echo(f"error: job {job_id} was {job.state}", err=True)
        return 0 if job.state == ExperimentState.COMPLETED else 1
    finally:
        db.close()
