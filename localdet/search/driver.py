"""Drive an experiment's search: record what happened to its trials as searcher events and
carry out the operations the search method answers with.

A search method is a pure function of (config, experiment seed, events): its state is never
stored, only replayed from `searcher_events`. Each event is recorded in the same transaction
as the trials it creates, promotes or closes, so a daemon killed at any instant restarts
into a search that makes exactly the decisions it would have made uninterrupted.

    search = Search(db)
    search.start(experiment)                              # the first trials
    search.validation_completed(experiment, trial, metric=0.12)
    search.exited_early(experiment, trial)                # ERROR after its restarts, or killed
    replay(experiment, db.searcher_events(experiment.id)).rungs()   # for status
"""

from __future__ import annotations

from localdet.records.db import Experiment, StateDB, Trial
from localdet.records.states import TERMINAL_STATES, ExperimentState, TrialState
from localdet.search.methods import (
    Close,
    Create,
    SearchMethod,
    Shutdown,
    ValidateAfter,
    make_search_method,
    worst_if_nan,
)


class SearchError(RuntimeError):
    """The search method failed; the experiment ends in ERROR with this message."""


def replay(experiment: Experiment, events: list[dict]) -> SearchMethod:
    """The experiment's search method with every recorded event fed back in."""
    method = make_search_method(experiment.config, experiment.experiment_seed)
    for event in events:
        _feed(method, event)
    return method


def _feed(method: SearchMethod, event: dict) -> list:
    kind = event["kind"]
    if kind == "initialized":
        return method.initial_operations()
    if kind == "validation_completed":
        return method.on_validation_completed(event["request_id"], event["metric"],
                                              event["length"])
    if kind == "trial_closed":
        return method.on_trial_closed(event["request_id"])
    if kind == "trial_exited_early":
        return method.on_trial_exited_early(event["request_id"])
    if kind == "trial_continued":  # `det e continue` (records/continuation.py): single only
        continued = getattr(method, "on_trial_continued", None)
        if continued is None:
            raise ValueError(f"a {type(method).__name__} cannot continue a trial")
        return continued(event["request_id"])
    if kind in ("trial_created", "shutdown"):  # recorded for a custom searcher's runner
        handler = getattr(method, f"on_{kind}", None)
        if handler is None:
            raise ValueError(f"a {type(method).__name__} has no {kind} events")
        return handler(*([event["request_id"]] if kind == "trial_created" else []))
    raise ValueError(f"unknown searcher event {kind!r}")


class Search:
    """Feeds one daemon's experiments' events to their methods, kept in memory between
    events and replayed from the database whenever the newest recorded event is not the
    one the method was last fed (another writer added one, or a rollback took ours away).

    Nothing here reads every trial or every event of an experiment per event: the daemon
    tells the search after every exit, and an experiment may have thousands of trials."""

    def __init__(self, db: StateDB, log=print):
        self.db = db
        self.log = log
        # experiment -> (method, id of the last event it was fed, or 0 before any)
        self._methods: dict[int, tuple[SearchMethod, int]] = {}

    def started(self, experiment: Experiment) -> bool:
        return self.db.db.execute("SELECT 1 FROM searcher_events WHERE experiment_id = ? "
                                  "LIMIT 1", [experiment.id]).fetchone() is not None

    def start(self, experiment: Experiment) -> None:
        self._event(experiment, {"kind": "initialized"})

    def validation_completed(self, experiment: Experiment, trial: Trial, metric: float) -> None:
        # Recorded as the worst number, not NaN: SQLite stores NaN as NULL, which replays as
        # no metric at all.
        metric = worst_if_nan(metric, experiment.smaller_is_better)
        with self.db.atomic():
            self.db.update_trial(trial.id, state=TrialState.WAITING, stop_requested=None)
            self._event(experiment, {"kind": "validation_completed", "request_id":
                                     trial.request_id, "metric": metric,
                                     "length": trial.batches_trained})

    def exited_early(self, experiment: Experiment, trial: Trial) -> None:
        if experiment.state in TERMINAL_STATES:
            return  # the whole experiment was killed or failed: nothing more to decide
        self._event(experiment, {"kind": "trial_exited_early", "request_id": trial.request_id})

    def shut_down(self, experiment_id: int) -> bool:
        """Whether a custom searcher's runner posted Shutdown: until then its experiment waits
        for the runner, even with every trial ended."""
        return self.shutdown_flags(experiment_id) is not None

    def shutdown_flags(self, experiment_id: int) -> dict | None:
        """The custom searcher's Shutdown ({"cancel": ..., "failure": ...}), None before one.
        Its event's `length` holds them as bits (1 cancel, 2 failure)."""
        row = self.db.db.execute("SELECT length FROM searcher_events WHERE experiment_id = ? "
                                 "AND kind = 'shutdown' ORDER BY id LIMIT 1",
                                 [experiment_id]).fetchone()
        if row is None:
            return None
        bits = row[0] or 0
        return {"cancel": bool(bits & 1), "failure": bool(bits & 2)}

    def method(self, experiment: Experiment) -> SearchMethod:
        return self._method(experiment)

    def _method(self, experiment: Experiment) -> SearchMethod:
        cached = self._methods.get(experiment.id)
        if cached is None or cached[1] != self._last_event_id(experiment.id):
            events = self.db.searcher_events(experiment.id)
            method = replay(experiment, events)
            # tpe: the created trials' hyperparameters are read from their records, never
            # proposed again (an Optuna upgraded meanwhile would propose others).
            use_recorded = getattr(method, "use_recorded_hparams", None)
            if use_recorded is not None:
                use_recorded(lambda request_id: self._recorded_hparams(experiment.id,
                                                                       request_id))
            cached = (method, events[-1]["id"] if events else 0)
            self._methods[experiment.id] = cached
        return cached[0]

    def _recorded_hparams(self, experiment_id: int, request_id: int) -> dict | None:
        trial = self.db.trial_by_request(experiment_id, request_id)
        return trial.hparams if trial is not None else None

    def _last_event_id(self, experiment_id: int) -> int:
        """The newest searcher event's id (an index lookup: searcher_events_by_experiment).
        Ids only grow, and a rolled-back insert leaves an older newest id, so this tells
        whether the cached method has seen exactly the recorded events."""
        return self.db.db.execute("SELECT MAX(id) FROM searcher_events WHERE experiment_id = ?",
                                  [experiment_id]).fetchone()[0] or 0

    def _event(self, experiment: Experiment, event: dict) -> None:
        """Record the event and carry out what the method answers, in one transaction;
        closing a trial is itself an event, fed back until the method has nothing to add."""
        with self.db.atomic():
            method = self._method(experiment)
            pending = [event]
            while pending:
                event = pending.pop(0)
                try:
                    operations = _feed(method, event)
                except Exception as error:
                    self._methods.pop(experiment.id, None)  # its state is now unknown
                    raise SearchError(f"the searcher failed: {error}") from error
                self.db.add_searcher_event(experiment.id, event["kind"],
                                           event.get("request_id"), event.get("metric"),
                                           event.get("length"))
                # A rollback shows as a mismatch: the newest id is then an older one.
                self._methods[experiment.id] = (method, self._last_event_id(experiment.id))
                pending += self._carry_out(experiment, operations)
            self._close_stranded(experiment)

    def _carry_out(self, experiment: Experiment, operations: list) -> list[dict]:
        """Apply the operations; returns the events they cause (trials closed)."""
        paused = self.db.experiment(experiment.id).state == ExperimentState.PAUSED
        created: dict[int, Create] = {}
        caused = []
        for op in operations:
            if isinstance(op, Create):
                created[op.request_id] = op
            elif isinstance(op, ValidateAfter):
                state = TrialState.PAUSED if paused else TrialState.QUEUED
                existing = self.db.trial_by_request(experiment.id, op.request_id)
                if op.request_id in created and existing is not None:
                    # Recorded before the search was (an experiment from before searcher
                    # events, or one `localdet run` began): it is that trial.
                    created.pop(op.request_id)
                elif op.request_id in created:
                    create = created.pop(op.request_id)
                    self.db.create_trial(experiment_id=experiment.id, request_id=op.request_id,
                                         hparams=create.hparams, seed=create.seed,
                                         target_batches=op.length, state=state)
                else:  # a promotion: it continues from its latest checkpoint
                    trial = existing
                    if trial is None:  # the method promotes only trials it created
                        raise SearchError(f"the search method promoted request "
                                          f"{op.request_id}, which has no trial")
                    if trial.state in TERMINAL_STATES:
                        continue
                    self.db.update_trial(trial.id, state=state, target_batches=op.length)
                    self.log(f"trial {trial.id} of experiment {experiment.id} promoted: "
                             f"trains on to {op.length} batches")
            elif isinstance(op, Close):
                trial = self.db.trial_by_request(experiment.id, op.request_id)
                if trial is None:  # the method closes only trials it created
                    raise SearchError(f"the search method closed request {op.request_id}, "
                                      "which has no trial")
                if trial.state not in TERMINAL_STATES:
                    self.db.update_trial(trial.id, state=TrialState.COMPLETED)
                caused.append({"kind": "trial_closed", "request_id": op.request_id})
            elif isinstance(op, Shutdown):
                self.db.log_event("searcher_shutdown", experiment_id=experiment.id)
        return caused

    def _close_stranded(self, experiment: Experiment) -> None:
        """Trials WAITING with nothing left to run can never be promoted: the search is over.
        Filtered in SQL, the newest trials first (the ones most likely still to run): this
        runs after every searcher event. A custom searcher's runner decides about its WAITING
        trials until it shuts the search down."""
        if experiment.searcher == "custom" and not self.shut_down(experiment.id):
            return
        if self.db.db.execute(
                "SELECT 1 FROM trials WHERE experiment_id = ? AND state IN (?, ?, ?) "
                "ORDER BY id DESC LIMIT 1", [experiment.id, TrialState.QUEUED,
                                             TrialState.RUNNING, TrialState.PAUSED]
        ).fetchone() is not None:
            return
        for (trial_id,) in self.db.db.execute(
                "SELECT id FROM trials WHERE experiment_id = ? AND state = ? ORDER BY id",
                [experiment.id, TrialState.WAITING]).fetchall():
            self.db.update_trial(trial_id, state=TrialState.COMPLETED)
