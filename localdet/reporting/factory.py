"""localdet's side of the `determined.core` reporter seam, registered in pyproject.toml
under the entry point group `determined.reporters`: the `determined` package imports nothing
of localdet and finds this class through the entry point instead.

    factory = LocaldetReporterFactory()
    reporter = factory.from_environment()   # SQLite and the store, or HTTP to the daemon
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Optional

from determined.core._reporting import REPORT_URL_VAR, TRIAL_ID_VAR, TrialReporter


class LocaldetReporterFactory:
    """Implements `determined.core._reporting.ReporterFactory`. Imports lazily: a trial
    process loads only the transport it uses."""

    def from_environment(self) -> TrialReporter:
        """Over HTTP to the daemon when `LOCALDET_REPORT_URL` is set (a trial on another
        machine), else straight into the daemon's SQLite file and store."""
        if os.environ.get(REPORT_URL_VAR):
            from localdet.reporting.http_reporter import HTTPReporter

            return HTTPReporter.from_environment()
        from localdet.reporting.sqlite_reporter import SQLiteReporter

        return SQLiteReporter.from_environment(int(os.environ[TRIAL_ID_VAR]))

    def for_script(self, script: Path, hparams: Optional[Dict[str, Any]],
                   config_path: Optional[str], record: bool) -> TrialReporter:
        from localdet.reporting.unmanaged import script_run_reporter

        return script_run_reporter(script, hparams, config_path, record)

    def checkpoint_batches(self, uuid: str) -> int:
        from localdet.paths import Layout
        from localdet.records.db import StateDB

        db = StateDB.open(Layout.from_environment().db)
        try:
            return int(db.checkpoint(uuid).batches_trained)
        finally:
            db.close()

    def checkpoint_metadata(self, uuid: str) -> Dict[str, Any]:
        """From the database; a trial reporting over HTTP does not read it (the caller
        then reads the checkpoint's metadata.json), hence FileNotFoundError."""
        if os.environ.get(REPORT_URL_VAR):
            raise FileNotFoundError("a trial reporting over HTTP does not read the daemon's "
                                    "database")
        from localdet.paths import Layout
        from localdet.records.db import StateDB

        db = StateDB.open(Layout.from_environment().db)
        try:
            return dict(db.checkpoint(uuid).metadata)
        finally:
            db.close()

    def delete_checkpoint(self, uuid: str) -> None:
        """Marked deleted at once; retention's collector frees the files (`localdet gc`,
        or the daemon after the trial), never while a reader holds them."""
        if os.environ.get(REPORT_URL_VAR):
            raise RuntimeError("a trial reporting over HTTP cannot delete checkpoints; "
                               "delete them with `localdet gc` or retention settings")
        from localdet.paths import Layout
        from localdet.records.db import StateDB
        from localdet.records.registry import registered_checkpoints

        db = StateDB.open(Layout.from_environment().db)
        try:
            found = db.checkpoint(uuid).uuid
            if found in registered_checkpoints(db):  # kept until its model version is deleted
                raise RuntimeError(f"checkpoint {found} is registered as a model version, "
                                   "so it is kept; delete that model version first")
            db.delete_checkpoint(found, "deleted by the trial's code")
        finally:
            db.close()

    def load_checkpoint(self, destination: Path, trial_id: Optional[int] = None,
                        uuid: Optional[str] = None) -> Path:
        from localdet.paths import Layout
        from localdet.reporting.sqlite_reporter import CheckpointReader

        reader = CheckpointReader(Layout.from_environment())
        return reader.materialize(reader.resolve(trial_id=trial_id, uuid=uuid), destination)
