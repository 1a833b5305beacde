"""The report server's request handler: a request's trial, launch and token checked, then
dispatched to its route.

    POST hello           the launch check only: a new process waits for it before training
    GET  info            the trial's facts (TrialInfo, less the daemon's own folders)
    POST report          {"metrics": [[kind, batches, values], ...], "heartbeat", "first_batch"}
    POST target          {"batches": n}
    POST should_pause    -> {"pause": bool}
    ...and the checkpoint routes (checkpoint_routes.py)

A wrong token is refused (403); what the trial did wrong is answered 4xx with one sentence,
a busy database 503 (the trial retries), a full disk 507.
"""

from __future__ import annotations

import datetime
import json
import sqlite3
import traceback

from localdet.checkpoints.disk_space import DiskFull
from localdet.reporting import chunk_intake
from localdet.reporting import report_wire as wire
from localdet.reporting.checkpoint_routes import CheckpointRoutes
from localdet.reporting.launch_tokens import token_matches
from localdet.reporting.report_request import RequestBody, RequestRefused
from localdet.reporting.sqlite_reporter import SQLiteReporter


class ReportHandler(CheckpointRoutes):
    """Serves one connection of a trial: its requests one after another (keep-alive)."""

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    # -- dispatch -------------------------------------------------------------------------
    def _serve(self, method: str) -> None:
        app = self.server.app
        length = int(self.headers.get("Content-Length") or 0)
        body_read = False
        try:
            parts = self.path.split("?")[0].strip("/").split("/")
            if parts[:2] != wire.API.strip("/").split("/") or len(parts) < 4:
                raise RequestRefused(404, f"no such report endpoint: {method} {self.path}")
            try:
                trial_id = int(parts[2])
                self._launch = int(self.headers.get(wire.LAUNCH_HEADER, ""))
            except ValueError:
                raise RequestRefused(400, "the request names no trial id or launch number") \
                    from None
            token = self.headers.get(wire.TOKEN_HEADER, "").removeprefix("Bearer ")
            if not token_matches(app.secret, trial_id, self._launch, token):
                raise RequestRefused(403, f"the report token is not trial {trial_id}'s for "
                                          f"launch {self._launch}; start trials with the "
                                          "environment from `trial_environment`")
            reporter = app.reporter(trial_id)
            op, args = parts[3], parts[4:]
            if method == "PUT" and op == "blobs" and len(args) == 1:
                self._db(reporter, write=False)  # the launch check, before the upload
                body_read = True
                return self._answer(self._put_blob(reporter, args[0],
                                                   RequestBody(self.rfile, length)))
            if method == "PUT" and op == "chunks" and not args:
                listing = chunk_intake.parse_listing(
                    self.headers.get(wire.CHUNKS_HEADER, ""), length)
                self._db(reporter, write=False)  # the launch check, before the upload
                body_read = True
                return self._answer(self._put_chunks(reporter, listing,
                                                     RequestBody(self.rfile, length)))
            payload = json.loads(self.rfile.read(length) or b"null") if length else None
            body_read = True
            if method == "GET" and op == "checkpoints" and len(args) == 3 and args[1] == "blobs":
                return self._send_blob(reporter, args[0], args[2])
            handler = self._routes().get((method, op, len(args)))
            if handler is None:
                raise RequestRefused(404, f"no such report endpoint: {method} {self.path}")
            self._answer(handler(reporter, payload, *args))
        except RequestRefused as refused:
            self._answer({"error": str(refused), **refused.extra}, refused.status, body_read,
                         length)
        except chunk_intake.Refused as refused:
            self._answer({"error": str(refused)}, 400, body_read, length)
        except DiskFull as error:
            self._answer({"error": str(error)}, wire.INSUFFICIENT_STORAGE, body_read, length)
        except sqlite3.OperationalError as error:  # a busy database: the trial retries
            self._answer({"error": f"the database is busy ({error})"}, 503, body_read, length)
        except (ConnectionError, TimeoutError):
            self.close_connection = True
        except Exception as error:
            app.log(f"report server: unexpected error on {method} {self.path}:\n"
                    + traceback.format_exc())
            self._answer({"error": f"the daemon failed on this report ({error}); see its log"},
                         500, body_read, length)

    def _routes(self) -> dict:
        db = self._db
        return {
            ("POST", "hello", 0): lambda r, p: db(r, write=False) or {"ok": True},
            ("GET", "info", 0): lambda r, p: db(r, _info, write=False),
            ("POST", "report", 0): self._report,
            ("POST", "target", 0): lambda r, p: db(
                r, lambda w: w.set_target_batches(int(p["batches"]))),
            # A read, unless a pause is to be acknowledged (PAUSE -> PAUSING): then
            # SQLiteReporter writes that in a transaction of its own, committed before the
            # answer.
            ("POST", "should_pause", 0): lambda r, p: {"pause": db(
                r, lambda w: w.should_pause(), write=False)},
            **self._checkpoint_routes(),
        }

    # -- metrics and heartbeats -----------------------------------------------------------
    def _report(self, reporter: SQLiteReporter, payload: dict) -> dict:
        metrics = payload.get("metrics", [])
        for kind, _, _ in metrics:  # before anything is written: a report is all or nothing
            if kind not in ("training", "validation"):
                raise RequestRefused(400, f"metric kind {kind!r} is neither training nor "
                                          "validation")

        def write(writing: SQLiteReporter) -> None:
            for kind, batches, values in metrics:
                # A retried batch merges into the rows it already wrote: nothing twice.
                report = (writing.report_training_metrics if kind == "training"
                          else writing.report_validation_metrics)
                report(int(batches), values)
            if payload.get("first_batch") and not _first_batch_recorded(writing):
                writing.report_first_batch()
            if payload.get("heartbeat"):
                writing.heartbeat()

        self._db(reporter, write)
        return {}


def _info(reporter: SQLiteReporter) -> dict:
    facts = dict(vars(reporter.trial_info()))
    facts.pop("model_dir"), facts.pop("trial_dir")  # the node's own, not the daemon's
    return facts


def _first_batch_recorded(reporter: SQLiteReporter) -> bool:
    """Whether this launch's first batch is already recorded (a retried report): a
    `trial_first_batch` event of the trial at or after its `started_at`. Only the events
    since the launch's `trial_launched` are read (the first-batch event comes after it, and
    the launch is recent, so SQLite finds it scanning back from the newest event), not
    every event of the experiment."""
    db, trial = reporter.db, reporter.db.trial(reporter.trial_id)
    if trial.started_at is None:
        return False
    since = datetime.datetime.fromisoformat(trial.started_at)
    launched = db.db.execute(
        "SELECT id FROM events WHERE trial_id = ? AND kind = 'trial_launched' "
        "ORDER BY id DESC LIMIT 1", [trial.id]).fetchone()
    rows = db.db.execute(
        "SELECT at FROM events WHERE id > ? AND trial_id = ? AND kind = 'trial_first_batch'",
        [launched[0] if launched else 0, trial.id]).fetchall()
    return any(datetime.datetime.fromisoformat(at) >= since for (at,) in rows)
