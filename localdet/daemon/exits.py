"""The ends of trials' processes: found each pass (an exit, an adopted pid gone, or a trial
class's work all recorded while its process still tears down), and recorded as the
lifecycle judges them: paused, trained to its length and told to the search, or failed and
restarted, failed for good, or failed in a way every restart would repeat."""

from __future__ import annotations

import subprocess
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from localdet.checkpoints import disk_space
from localdet.daemon.experiments import Experiments
from localdet.daemon.retention import Retention
from localdet.daemon.space import SpaceWatch
from localdet.daemon.watched import Watched, phase_of
from localdet.paths import Layout
from localdet.pids import alive, exit_description
from localdet.processes import failures, launcher, memory_limit
from localdet.records import lifecycle, phases
from localdet.records.db import Experiment, StateDB, Trial
from localdet.records.states import TERMINAL_STATES, ExperimentKind, ExperimentState, TrialState
from localdet.search.driver import Search


@dataclass
class Exits:
    layout: Layout
    db: StateDB
    search: Search
    memory: memory_limit.Guard
    backend: Any  # where trials run (localdet/scheduling/local_machine.py, or a cluster)
    watched: Watched
    experiments: Experiments
    space: SpaceWatch
    retention: Retention
    log: Callable[[str], None]
    batch: int  # exits recorded in one transaction at most (Daemon.BATCH)

    def reap(self) -> None:
        """Find the trials whose processes ended (or whose work is all recorded) and record
        their ends; let go of those done tearing down."""
        trained = self._trained_to_length(list(self.watched.processes))
        ended: list[tuple[int, int | None, Any, bool]] = []
        for trial_id, process in list(self.watched.processes.items()):
            code = process.poll()
            if getattr(process, "orphaned", False):  # its warm process ended before it
                del self.watched.processes[trial_id]
                self.watched.adopted[trial_id] = process.pid
            elif code is not None:
                del self.watched.processes[trial_id]
                ended.append((trial_id, code, process, False))
            elif trial_id in trained and self._work_done(trial_id):
                # Its final checkpoint and metrics are committed: the slot is free now, and
                # the process's teardown (seconds of TensorFlow's) goes on beside the next.
                del self.watched.processes[trial_id]
                self.watched.tearing_down[trial_id] = process
                ended.append((trial_id, 0, process, True))
        for trial_id, pid in list(self.watched.adopted.items()):
            if not alive(pid):
                del self.watched.adopted[trial_id]
                ended.append((trial_id, None, None, False))
        self.finish_all(ended)
        for trial_id, process in list(self.watched.tearing_down.items()):
            code = process.poll()
            if code is not None:
                del self.watched.tearing_down[trial_id]
                self.watched.slots_of.pop(trial_id, None)
                if code != 0:
                    self.log(f"trial {trial_id}'s process ended with {exit_description(code)} "
                             "after its work was recorded; nothing was lost")

    def _trained_to_length(self, trial_ids: list[int]) -> set[int]:
        """Those of the trials RUNNING, checkpointed and trained to their length, from one
        query a pass (the cheap part of _work_done, which read every running trial a pass)."""
        found: set[int] = set()
        for start in range(0, len(trial_ids), 500):
            chunk = trial_ids[start:start + 500]
            found.update(trial_id for (trial_id,) in self.db.db.execute(
                f"SELECT id FROM trials WHERE id IN ({', '.join('?' for _ in chunk)}) "
                "AND state = ? AND latest_checkpoint IS NOT NULL "
                "AND batches_trained >= target_batches", [*chunk, TrialState.RUNNING]))
        return found

    def _work_done(self, trial_id: int) -> bool:
        """Whether a trial class's process has committed all it will: trained to its length,
        checkpointed there and validated there. (A script may go on after `fit`, so only its
        exit tells.)"""
        trial = self.db.trial(trial_id)
        if trial.state != TrialState.RUNNING or not trial.latest_checkpoint \
                or trial.batches_trained < trial.target_batches:
            return False
        experiment = self.db.experiment(trial.experiment_id)
        if experiment.kind == ExperimentKind.JOB \
                or experiment.config.get("entrypoint_kind") != "trial_class":
            return False
        checkpoint = self.db.checkpoint(trial.latest_checkpoint)
        validations = self.db.metrics(trial_id, "validation")
        return (checkpoint.batches_trained >= trial.target_batches and bool(validations)
                and validations[-1].batches_trained >= trial.target_batches
                and experiment.metric in validations[-1].metrics)

    def finish(self, trial_id: int, returncode: int | None,
               process: subprocess.Popen | None = None, tearing_down: bool = False) -> None:
        """A trial process ended (returncode None: not ours, so judge from its records)."""
        self.finish_all([(trial_id, returncode, process, tearing_down)])

    def finish_all(self, ended: list[tuple[int, int | None, Any, bool]]) -> None:
        """Record the ends of these trials' processes ((trial id, returncode, process,
        tearing down)), `BATCH` to a transaction, each in a savepoint of its own: a pass's
        exits cost a commit and a turn at the write lock per batch, not one each. A daemon killed
        half-way leaves the trials RUNNING with dead pids, which the next daemon finishes
        the same way. An exit that fails to be recorded is told and leaves the others be."""
        if not ended:
            return
        noticed = time.time()
        for trial_id, _, process, tearing_down in ended:
            # A launch on a cluster holds its slots there until it ends: freed here, the
            # next launch on them would wait for it, and the daemon with it (CI's Ray runs).
            if not (tearing_down and getattr(process, "slots_held_until_exit", False)):
                self.watched.slots_of.pop(trial_id, None)
            if not tearing_down:  # its last lines (a failure's cause) may be in its log's pipe
                experiment_id = self.db.trial(trial_id).experiment_id
                launcher.wait_for_log(process, self.layout.trial_log(experiment_id, trial_id))
        for start in range(0, len(ended), self.batch):
            with self.db.atomic():
                for trial_id, returncode, process, teardown in ended[start:start + self.batch]:
                    try:
                        phases.record_exit(self.db, trial_id, noticed, {
                            "returncode": returncode, "tearing_down": teardown})
                        self._record_exit(trial_id, returncode, process)
                    except Exception:
                        if len(ended) == 1:
                            raise
                        self.log(f"localdet daemon: the end of trial {trial_id} could not be "
                                 "recorded, carrying on:\n" + traceback.format_exc())

    def _record_exit(self, trial_id: int, returncode: int | None, process) -> None:
        with self.db.atomic():
            trial = self.db.trial(trial_id)
            if trial.state != TrialState.RUNNING:
                return  # killed meanwhile: already settled
            experiment = self.db.experiment(trial.experiment_id)
            reached_end = bool(trial.latest_checkpoint and (
                trial.batches_trained >= trial.target_batches if trial.target_batches > 0
                # No length recorded (a script that ends its own loop, a fit over data of
                # unknown length): one that answered a pause request exited for it.
                else trial.stop_requested not in (lifecycle.PAUSING, lifecycle.REQUEUE)))
            if experiment.kind == ExperimentKind.JOB and returncode is None:
                # A job leaves no records to judge by, and its exit status went to no one.
                self.db.update_trial(trial.id, state=TrialState.ERROR, error=(
                    "the job's process ended while no daemon watched it, so whether it "
                    f"succeeded is unknown; see {self.layout.trial_log(experiment.id, trial.id)}"))
            else:
                # A process not ours left no exit status: one asked to pause is taken to
                # have checkpointed and exited as asked (else it keeps its previous checkpoint).
                clean = returncode == 0 or (returncode is None and (
                    reached_end or trial.stop_requested is not None))
                outcome = lifecycle.on_exit(phase_of(trial),
                                            lifecycle.Exit(clean, bool(reached_end)))
                if outcome.judge == "failed" and getattr(process, "lost", False):
                    self._node_lost(trial, experiment, process, outcome.restart_to)
                elif outcome.phase is not None:
                    self.db.update_trial(trial.id, state=outcome.phase.state,
                                         stop_requested=outcome.phase.stop)
                    how = ("paused" if outcome.phase.state == TrialState.PAUSED
                           else "paused, and is queued again as resumed")
                    self.log(f"trial {trial.id} {how} at {trial.batches_trained} batches")
                elif outcome.judge == "complete":
                    self._complete(trial, experiment)
                else:
                    self._failed(trial, experiment, returncode, outcome.restart_to)
            self.experiments.settle(experiment.id)
        # Retention: at the end of this pass's exits.
        self.retention.exited(experiment.id, trial_id)

    def _node_lost(self, trial: Trial, experiment: Experiment, process,
                   restart_to: str) -> None:
        """The machine under a trial went away: not the trial's failure. It starts again
        from its latest checkpoint on another node, its restarts untouched."""
        self.db.update_trial(trial.id, state=restart_to, stop_requested=None)
        node = self.backend.describe_node(process.node)
        self.db.log_event("trial_node_lost", experiment_id=experiment.id, trial_id=trial.id,
                          node=process.node)
        self.log(f"trial {trial.id}: Ray node {node} was lost; the trial starts again from its "
                 "latest checkpoint on another node (not counted against max_restarts)")

    def _failed(self, trial: Trial, experiment: Experiment, returncode: int | None,
                restart_to: str = TrialState.QUEUED) -> None:
        log_path = self.layout.trial_log(experiment.id, trial.id)
        how = exit_description(returncode)
        self.memory.settle(trial, experiment.config)  # a stop for memory is in the log first
        failure = failures.record(self.db, self.layout, trial)
        if failure and disk_space.out_of_space(failure.signature):
            self.space.out_of_space(trial, experiment, restart_to)
            return
        if failure and memory_limit.exceeded(failure):  # a restart would reach it again
            self.db.update_trial(trial.id, state=TrialState.ERROR, stop_requested=None, error=(
                f"{failure.told}\na restart would only reach the limit again, so it was not "
                f"restarted; see {log_path}"))
            self.experiments.searching(experiment, self.search.exited_early, experiment, trial)
            return
        if failure and experiment.kind != ExperimentKind.JOB and failures.invalid_hparams(failure):
            # Determined closed such a trial at once and let the search go on.
            self.db.update_trial(trial.id, state=TrialState.ERROR, stop_requested=None, error=(
                f"{failure.told}\nthe trial raised InvalidHP: its hyperparameters cannot "
                f"work, so it was not restarted; see {log_path}"))
            self.log(f"trial {trial.id} raised InvalidHP: {failure.signature}")
            self.experiments.searching(experiment, self.search.exited_early, experiment, trial)
            return
        # A job trains no batches, so its failures would all look alike: it keeps its restarts.
        if failure and experiment.kind != ExperimentKind.JOB \
                and failures.repeats(self.db, trial, failure):
            self._fail_fast(trial, experiment, failure, how)
            return
        if trial.restarts < experiment.config["max_restarts"]:
            self.db.update_trial(trial.id, state=restart_to, restarts=trial.restarts + 1,
                                 stop_requested=None)
            self.log(f"trial {trial.id} failed ({how}); restarting from its latest checkpoint "
                     f"({trial.restarts + 1} of {experiment.config['max_restarts']})")
            return
        tail = launcher.log_tail(log_path)
        error = f"{how}; the end of its log:\n{tail}" if tail else how
        if failure:  # the exception's own line first: what status shows at a glance
            error = f"{failure.told}\n{error}"
        self.db.update_trial(trial.id, state=TrialState.ERROR, stop_requested=None, error=error)
        self.log(f"trial {trial.id} failed ({how}); see {log_path}")
        self.experiments.searching(experiment, self.search.exited_early, experiment, trial)

    def _fail_fast(self, trial: Trial, experiment: Experiment, failure: launcher.Failure,
                   how: str) -> None:
        """End the trial without its remaining restarts. A failure at import is the model
        folder's, the same for every trial: when no trial has trained, end them all."""
        log_path = self.layout.trial_log(experiment.id, trial.id)
        point = failures.point_of(self.db, trial) if failure.trained else None
        where = "before training a batch"
        if point:
            where = (f"at its {point[0]} after {point[1]} batches" if point[0] != "training"
                     else f"in training after {point[1]} batches")
        self.db.update_trial(trial.id, state=TrialState.ERROR, stop_requested=None, error=(
            f"{failure.told}\nit failed {where}, the same way as before ({how}); a restart "
            f"would only repeat it, so it was not restarted; see {log_path}"))
        self.db.log_event("trial_failed_fast", experiment_id=experiment.id, trial_id=trial.id,
                          signature=failure.signature, stage=failure.stage,
                          phase=point[0] if point else None)
        self.log(f"trial {trial.id} failed the same way again {where}: "
                 f"{failure.signature}; not restarting it")
        self.experiments.searching(experiment, self.search.exited_early, experiment, trial)
        if not failures.import_failure_for_all(self.db, experiment.id, failure):
            return
        for _ in range(100_000):  # the searcher may answer an exit with new trials
            live = [t for t in self.db.trials(experiment.id)
                    if t.state not in TERMINAL_STATES]
            if not live or self.db.experiment(experiment.id).state in TERMINAL_STATES:
                break
            for sibling in live:
                if sibling.state == TrialState.RUNNING:
                    self.experiments.kill(sibling)
                self.db.update_trial(
                    sibling.id, state=TrialState.ERROR, stop_requested=None, error=(
                        f"{failure.told}\nnot run further: the model folder fails at import, "
                        f"the same way for every trial (trial {trial.id}'s log: {log_path})"))
                self.experiments.searching(experiment, self.search.exited_early,
                                self.db.experiment(experiment.id), sibling)
        if self.db.experiment(experiment.id).state not in TERMINAL_STATES:
            self.db.set_experiment_state(experiment.id, ExperimentState.ERROR, error=(
                f"{failures.SAME_WAY}: {failure.signature}"))
            self.log(f"experiment {experiment.id}: {failures.SAME_WAY}: {failure.signature}")

    def _complete(self, trial: Trial, experiment: Experiment) -> None:
        """The trial trained to its searcher length and exited: the searcher decides what
        next (train it further, close it, start others)."""
        if experiment.kind == ExperimentKind.JOB:  # a job reports no metric: exit 0 is success
            self.db.update_trial(trial.id, state=TrialState.COMPLETED, stop_requested=None)
            self.log(f"job {experiment.id} completed")
            return
        validations = self.db.metrics(trial.id, "validation")
        last = validations[-1].metrics if validations else {}
        if experiment.metric not in last:
            reported = ", ".join(sorted(last)) or "none"
            self.db.update_trial(trial.id, state=TrialState.ERROR, stop_requested=None, error=(
                f"the searcher metric '{experiment.metric}' was never reported; validation "
                f"metrics reported: {reported}; fix searcher.metric in the config"))
            self.experiments.searching(experiment, self.search.exited_early, experiment, trial)
            return
        metric = last[experiment.metric]
        self.log(f"trial {trial.id} validated at {trial.batches_trained} batches: "
                 f"{experiment.metric}={metric:.4g}")
        self.experiments.searching(experiment, self.search.validation_completed, experiment, trial,
                        float(metric))

