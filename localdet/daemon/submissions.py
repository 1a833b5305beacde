"""Submissions: folders (or bare YAML files) in the queue folder become experiments, and
those in `queue/jobs/` become jobs.

A submission is ingested only once it has settled (nothing in it changed for
`SETTLE_SECONDS`, and no process holds a file in it open for writing), so a folder still
being copied, however slowly, is never read half-written; `submit` copies under a hidden
name and renames, so its submissions appear whole.

Whatever is dropped in the queue, the intake reads nothing outside it (a symbolic link is
refused, not followed, unless it leads to a file inside the submission), and a submission
it cannot take is moved to `queue/rejected/<name>/` with a one-line `error.txt` saying what
to fix.

    intake = Intake(layout, db)
    intake.poll()          # ingests what has settled; returns the new experiment ids

Both the daemon (`Intake(..., slots=...)`) and `submit` (from the slot file the daemon wrote)
refuse a config that asks for more slots per trial than the machine has.

A job is recorded as an experiment row of kind 'job' with exactly one trial row, so it
shares scheduling, launching, logs, kill and status with trials.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import stat
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from localdet.checkpoints import warm_start
from localdet.config import engines, script_hparams
from localdet.config.experiment import (
    MAX_CONFIG_BYTES,
    ConfigError,
    ParsedConfig,
    load_config_text,
    load_job_config_text,
)
from localdet.paths import Layout
from localdet.pids import DaemonLock
from localdet.records.db import StateDB
from localdet.records.states import ExperimentKind, Runner
from localdet.scheduling.slots import GPU, Slot, cpu_only, describe, read_slot_file

SETTLE_SECONDS = 1.0
CONFIG_SUFFIXES = (".yaml", ".yml")
SUBMITTED_CONFIG = "experiment.yaml"  # the name `submit` gives the config it copies
EXPERIMENT, JOB = ExperimentKind.EXPERIMENT, ExperimentKind.JOB  # the kinds of submission
JOB_SEARCHER = "none"  # the searcher column of a job's row: it has no search


class SubmissionError(Exception):
    """A submission localdet cannot run; the message names the problem."""


def _quoted(name: str) -> str:
    """A file name as messages show it: quoted, on one line, cut short."""
    text = repr(name)
    return text if len(text) <= 80 else text[:77] + "..."


def _clipped(name: str, limit: int = 200) -> str:
    """`name` cut to `limit` bytes, leaving room for the suffix staging or rejection adds."""
    raw = os.fsencode(name)
    return name if len(raw) <= limit else os.fsdecode(raw[:limit])


def _signature(path: Path) -> tuple:
    # lstat throughout: a link is looked at, never followed out of the queue.
    try:
        top = path.lstat()
    except FileNotFoundError:
        return ()
    if not stat.S_ISDIR(top.st_mode):
        return ((path.name, top.st_size, top.st_mtime_ns),)
    entries = []
    for root, dirs, files in os.walk(path):
        for name in files + dirs:
            full = Path(root, name)
            try:
                info = full.lstat()
            except FileNotFoundError:
                continue  # vanished mid-walk: the folder is still changing
            entries.append((str(full.relative_to(path)), info.st_size, info.st_mtime_ns))
    return tuple(sorted(entries))


def _open_for_writing(folder: Path) -> set[str]:
    """The files under `folder` that a process we can see holds open for writing (a copy
    that pauses longer than the settle time is still unfinished), by psutil's open files."""
    inside, found = str(folder) + os.sep, set()
    for process in psutil.process_iter():
        try:
            opened = process.open_files()
        except psutil.Error:
            continue  # gone, or not ours to see
        for file in opened:
            if file.path.startswith(inside) and file.flags & (os.O_WRONLY | os.O_RDWR):
                found.add(file.path)
    return found


def _within(path: Path, paths: set[str]) -> bool:
    return any(p == str(path) or p.startswith(str(path) + os.sep) for p in paths)


def check_entries(folder: Path, shown_name: str) -> None:
    """Raise SubmissionError for what the intake will not take into a snapshot: a name that
    is not UTF-8, a link leading anywhere but to a file inside the folder, a special file.
    Looks at links and names only: nothing outside `folder` is opened."""
    name = _quoted(shown_name)
    try:
        shown_name.encode("utf-8")
    except UnicodeEncodeError:
        raise SubmissionError(f"the name {name} is not valid UTF-8; rename it") from None
    top = folder.resolve()
    for root, dirs, files in os.walk(folder):
        for entry in sorted(dirs + files):
            path = Path(root, entry)
            relative = _quoted(str(path.relative_to(folder)))
            try:
                str(path.relative_to(folder)).encode("utf-8")
            except UnicodeEncodeError:
                raise SubmissionError(f"{name} holds a file whose name is not valid UTF-8, "
                                      f"{relative}; rename it") from None
            mode = path.lstat().st_mode
            # A bare file (or link) was staged alone in a folder, under its own name.
            itself = path.parent == folder and entry == shown_name
            if stat.S_ISLNK(mode):
                # Reads the links, never what they point to; a loop ends up broken.
                target = Path(os.path.realpath(path))
                if not target.is_relative_to(top):
                    what = "something outside the submission"
                elif not target.exists():
                    what = "nothing (it is broken)"
                elif not target.is_file():
                    what = "a folder"
                else:
                    continue  # a file of the submission under a second name
                if itself:
                    raise SubmissionError(f"{name} is a symbolic link to {what}; put the file "
                                          f"or folder itself in the queue")
                raise SubmissionError(f"{name} holds {relative}, a symbolic link to {what}; "
                                      f"put a copy of the file itself there")
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                which = f"{name} is" if itself else f"{name} holds {relative}, which is"
                raise SubmissionError(f"{which} not a regular file or folder (a FIFO, "
                                      f"socket or device); remove it")


def read_config_text(path: Path, shown_name: str) -> str:
    """The text of a config file, refused (SubmissionError) when too big or not UTF-8."""
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise SubmissionError(f"{_quoted(shown_name)} is {size / 1e6:.1f} MB, more than the "
                              f"{MAX_CONFIG_BYTES / 1e6:g} MB a config may be; keep data out "
                              f"of the config, in files the model reads")
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise SubmissionError(f"{_quoted(shown_name)} is not UTF-8 text (byte "
                              f"0x{data[error.start]:02x} at offset {error.start}); save it "
                              f"as UTF-8") from None


def find_config(folder: Path, shown_name: str | None = None, kind: str = EXPERIMENT) -> Path:
    """The experiment (or job) YAML at the top of a submission folder (`shown_name` in
    messages)."""
    shown = _quoted(shown_name or folder.name)
    candidates = sorted(p for p in folder.iterdir()
                        if p.is_file() and p.suffix in CONFIG_SUFFIXES)
    if len(candidates) == 1:
        return candidates[0]
    preferred = [p for p in candidates if p.name == SUBMITTED_CONFIG]
    if preferred:
        return preferred[0]
    if not candidates:
        example = "job.yaml" if kind == JOB else "const.yaml"
        raise SubmissionError(f"{shown} holds no {kind} YAML file at its top level; "
                              f"add one (e.g. {example}) next to the code")
    names = ", ".join(p.name if p.name.isprintable() and len(p.name) < 60 else _quoted(p.name)
                      for p in candidates[:5])
    names += ", ..." if len(candidates) > 5 else ""
    raise SubmissionError(f"{shown} holds several YAML files ({names}); keep exactly one, "
                          "or run `localdet submit CONFIG MODEL_DIR` to choose")


def _load(kind: str, text: str) -> ParsedConfig:
    # Through the module's names, so that tests can stand in for them.
    return load_job_config_text(text) if kind == JOB else load_config_text(text)


def check_warm_start(db: StateDB, parsed: ParsedConfig, kind: str) -> None:
    """Resolve the experiment's warm-start checkpoint into its config
    (`localdet.checkpoints.warm_start`); SubmissionError when it does not exist."""
    if kind == JOB or not warm_start.requested(parsed.config):
        return
    try:
        parsed.warnings.extend(warm_start.resolve(db, parsed.config))
    except warm_start.WarmStartError as error:
        raise SubmissionError(str(error)) from None


def check_slots(config: dict, kind: str, slots: list[Slot] | None) -> None:
    """Raise SubmissionError when one trial (or the job) asks for more slots than `slots`
    (None: not known, so nothing to check)."""
    if not slots:
        return
    asked = config["resources"]["slots_per_trial"]  # a job's resources.slots, renamed
    if asked <= len(slots):
        return
    key = "resources.slots" if kind == JOB else "resources.slots_per_trial"
    if any(slot.kind == GPU for slot in slots):
        remedy = f"lower {key} to {len(slots)} or fewer"
    else:
        remedy = f"lower {key} or start `localdet daemon --slots {asked}`"
    raise SubmissionError(f"{key} is {asked} but this machine has {describe(slots)}; {remedy}")


def check_script_hparams(config: dict, kind: str, model_dir: Path) -> None:
    """Raise ConfigError for a hyperparameter a script that never imports `determined`
    defines neither as a command-line option nor as a module-level constant
    (localdet/config/script_hparams.py): refused before anything runs."""
    if kind != JOB:
        script_hparams.check(config, model_dir)


def check_engine(config: dict, kind: str, model_dir: Path, node_slots: int | None = None
                 ) -> None:
    """Raise SubmissionError when no engine here can train a trial on its slots (a job's
    slots are only reserved for it: any number goes). `node_slots`: on a cluster, the most
    slots one node has, which bounds a trial whose engine keeps it within one node."""
    if kind == JOB:
        return
    try:
        engine, _ = engines.choose(config, model_dir)
    except engines.EngineRefusal as error:
        raise SubmissionError(str(error)) from None
    asked = config["resources"]["slots_per_trial"]
    if node_slots is not None and asked > node_slots and not engines.spans_nodes(engine):
        raise SubmissionError(
            f"resources.slots_per_trial is {asked} but no node of the Ray cluster has more "
            f"than {node_slots} slot(s), and engine {engine} keeps a trial within one node; "
            "lower it, add a bigger node, or train under Keras 2 (TF_USE_LEGACY_KERAS=1), "
            "whose ranks (one process per slot) may run on several nodes")


@dataclass
class Intake:
    layout: Layout
    db: StateDB
    settle_seconds: float = SETTLE_SECONDS
    # The daemon's slots (a count means CPU slots); None: accept any slots_per_trial.
    slots: int | list[Slot] | None = None
    node_slots: int | None = None  # on a cluster: the most slots of one node
    _seen: dict = field(default_factory=dict)  # path -> (signature, when it last changed)

    @property
    def slot_list(self) -> list[Slot] | None:
        return cpu_only(self.slots) if isinstance(self.slots, int) else self.slots

    @property
    def incoming(self) -> Path:
        return self.layout.home / "experiments" / ".incoming"

    @property
    def incoming_jobs(self) -> Path:
        return self.layout.home / "experiments" / ".incoming-jobs"

    @property
    def incoming_foreground(self) -> Path:
        """Where `localdet run` stages its copy; never put back in the queue."""
        return self.layout.home / "experiments" / ".incoming-foreground"

    def _kind_of(self, path: Path) -> str:
        return JOB if path.parent == self.layout.job_queue else EXPERIMENT

    def candidates(self) -> list[Path]:
        """Queue entries, oldest first: submissions settling together become experiments
        in the order they were queued, so they are also scheduled in that order."""
        found = []
        for folder in (self.layout.queue, self.layout.job_queue):
            if not folder.exists():
                continue
            for path in folder.iterdir():
                if path.name.startswith(".") or path in (self.layout.rejected,
                                                         self.layout.job_queue):
                    continue
                if not (path.is_dir() or path.suffix in CONFIG_SUFFIXES):
                    continue
                try:
                    found.append((path.stat().st_mtime_ns, path.name, path))
                except FileNotFoundError:
                    continue  # taken away meanwhile
        return [path for _, _, path in sorted(found)]

    def poll(self) -> list[int]:
        """Ingest every settled submission; returns the ids of the experiments (and jobs)
        created."""
        created, now = [], time.monotonic()
        present, writing = set(), None
        for path in self.candidates():
            present.add(path)
            signature = _signature(path)
            previous = self._seen.get(path)
            if previous is None or previous[0] != signature:
                self._seen[path] = (signature, now)
                continue
            if now - previous[1] < self.settle_seconds:
                continue
            if writing is None:  # looked up once a poll, only when something has settled
                writing = _open_for_writing(Path(os.path.realpath(self.layout.queue)))
            # Paused mid-copy: wait until it is closed (the kernel names files by real paths).
            if _within(Path(os.path.realpath(path.parent), path.name), writing):
                self._seen[path] = (signature, now)
                continue
            del self._seen[path]
            experiment_id = self.ingest(path, self._kind_of(path))
            if experiment_id is not None:
                created.append(experiment_id)
        for gone in set(self._seen) - present:
            del self._seen[gone]
        return created

    def ingest(self, path: Path, kind: str = EXPERIMENT) -> int | None:
        # Take it out of the queue first (one rename), so it is never ingested twice.
        token = f"{_clipped(path.name)}.{secrets.token_hex(4)}"
        staging = self.incoming_jobs if kind == JOB else self.incoming
        staged = staging / token
        staging.mkdir(parents=True, exist_ok=True)
        try:
            if path.is_dir() and not path.is_symlink():
                os.rename(path, staged)
            else:  # a file, or a link (kept as a link, in a folder of its own)
                staged.mkdir()
                os.rename(path, staged / path.name)
        except FileNotFoundError:
            shutil.rmtree(staged, ignore_errors=True)
            return None  # taken away meanwhile
        try:
            text, parsed = self.check(staged, path.name, kind)
        except (SubmissionError, ConfigError) as error:
            self.reject(staged, path.name, str(error))
            return None
        except Exception as error:  # a bug on odd input must not strand it in staging
            self.reject(staged, path.name, (
                f"{_quoted(path.name)} could not be read ({type(error).__name__}: "
                f"{_quoted(str(error))}); check its files, and report this if they look right"),
                detail=traceback.format_exc())
            return None
        return self._commit(staged, path.name, text, parsed, kind=kind, runner=Runner.DAEMON)

    def check(self, staged: Path, source: str, kind: str = EXPERIMENT) -> tuple[str, ParsedConfig]:
        """The config text and parsed config of a staged submission folder; raises
        SubmissionError or ConfigError saying what to fix. Reads nothing outside `staged`."""
        check_entries(staged, source)
        config_file = find_config(staged, source, kind)
        text = read_config_text(config_file, config_file.name)
        parsed = _load(kind, text)
        check_slots(parsed.config, kind, self.slot_list)
        check_engine(parsed.config, kind, staged, self.node_slots)
        check_script_hparams(parsed.config, kind, staged)
        check_warm_start(self.db, parsed, kind)
        return text, parsed

    def record(self, staged: Path, source: str, *, kind: str = EXPERIMENT,
               runner: str = Runner.DAEMON) -> int:
        """Record a staged submission folder as an experiment (or a job and its one trial)
        and move it to the experiment's model folder. Raises SubmissionError or ConfigError,
        having recorded nothing."""
        text, parsed = self.check(staged, source, kind)
        return self._commit(staged, source, text, parsed, kind=kind, runner=runner)

    def _commit(self, staged: Path, source: str, text: str, parsed: ParsedConfig, *,
                kind: str, runner: str) -> int:
        config = parsed.config
        seed = config["reproducibility"].get("experiment_seed")
        if seed is None:
            seed = secrets.randbelow(2**31)
            config["reproducibility"]["experiment_seed"] = seed
        searcher = config["searcher"]
        with self.db.atomic():
            experiment_id = self.db.create_experiment(
                name=config["name"], description=config["description"], config=config,
                original_config=text,
                searcher=JOB_SEARCHER if kind == JOB else searcher["name"],
                metric="" if kind == JOB else searcher["metric"],
                smaller_is_better=searcher["smaller_is_better"],
                experiment_seed=seed, model_dir="", kind=kind, runner=runner)
            model_dir = self.layout.model_dir(experiment_id)
            self.db.db.table("experiments").update(experiment_id, {"model_dir": str(model_dir)})
            if kind == JOB:  # no searcher makes a job's trial: it is the job's one process
                self.db.create_trial(experiment_id=experiment_id, request_id=0, hparams={},
                                     seed=seed, target_batches=0)
            self.db.log_event("submission_ingested", experiment_id=experiment_id,
                              staged=staged.name, source=source)
            for warning in parsed.warnings:
                self.db.log_event("config_warning", experiment_id=experiment_id,
                                  message=warning)
        model_dir.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staged, model_dir)
        return experiment_id

    def reject(self, staged: Path, name: str, reason: str, detail: str | None = None) -> None:
        self.layout.rejected.mkdir(parents=True, exist_ok=True)
        target = self.layout.rejected / name
        while os.path.lexists(target):
            target = self.layout.rejected / f"{_clipped(name)}.{secrets.token_hex(3)}"
        os.rename(staged, target)
        (target / "error.txt").write_text(reason.rstrip() + "\n", encoding="utf-8")
        extra: dict[str, Any] = {"detail": detail} if detail else {}
        self.db.log_event("submission_rejected", source=name, reason=reason,
                          moved_to=str(target), **extra)

    def recover(self) -> None:
        """Finish what a killed daemon (or `localdet run`) left half-done in staging."""
        claimed = None
        for staging, queue in ((self.incoming, self.layout.queue),
                               (self.incoming_jobs, self.layout.job_queue),
                               (self.incoming_foreground, None)):
            if not staging.exists():
                continue
            if claimed is None:
                claimed = {e["payload"].get("staged"): e["experiment_id"]
                           for e in self.db.events(kinds=("submission_ingested",))}
            for staged in staging.iterdir():
                if staged.name in claimed:
                    model_dir = self.layout.model_dir(claimed[staged.name])
                    model_dir.parent.mkdir(parents=True, exist_ok=True)
                    os.rename(staged, model_dir)
                elif queue is not None:  # never recorded: queue it again, to be ingested anew
                    queue.mkdir(parents=True, exist_ok=True)
                    os.rename(staged, queue / staged.name.rsplit(".", 1)[0])
                elif not _staged_by_live_process(staged):
                    # A `localdet run` that died before recording anything: nothing to keep.
                    shutil.rmtree(staged, ignore_errors=True)


def _staged_by_live_process(staged: Path) -> bool:
    pid = staged.name.split("-", 1)[0]
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def ingested_as(db: StateDB, queued_name: str) -> tuple[str, int | str] | None:
    """What became of a queue entry: ("accepted", experiment id), ("rejected", reason), or
    None while it waits."""
    rows = db.db.execute(
        "SELECT kind, experiment_id, payload FROM events WHERE kind IN "
        "('submission_ingested', 'submission_rejected') "
        "AND json_extract(payload, '$.source') = ? ORDER BY id DESC LIMIT 1",
        [queued_name]).fetchall()
    if not rows:
        return None
    kind, experiment_id, payload = rows[0]
    if kind == "submission_ingested":
        return "accepted", experiment_id
    return "rejected", json.loads(payload)["reason"]


def copy_submission(text: str, model_dir: Path | None, destination: Path) -> None:
    """Write a submission folder: the model folder's files (not its top-level YAML files,
    which the submitted config replaces) and the config text as experiment.yaml."""
    if model_dir is not None:
        top = Path(model_dir).resolve()

        def leave_out(directory: str, names: list[str]) -> set[str]:
            # YAML files deeper down are the model's data and stay.
            skipped = {n for n in names if n in ("__pycache__", ".git") or n.endswith(".pyc")}
            if Path(directory).resolve() == top:
                skipped |= {n for n in names if n.endswith(CONFIG_SUFFIXES)}
            return skipped

        shutil.copytree(model_dir, destination, ignore=leave_out)
    else:
        destination.mkdir(parents=True)
    (destination / SUBMITTED_CONFIG).write_text(text, encoding="utf-8")


def read_submission(config_path: Path, model_dir: Path | None, kind: str = EXPERIMENT,
                    slots: list[Slot] | None = None) -> tuple[str, ParsedConfig]:
    """Check a config and model folder before anything is copied (against `slots` too, when
    given); returns the config's text and its parsed form. Raises SubmissionError or
    ConfigError."""
    config_path = Path(config_path)
    if not config_path.is_file():
        raise SubmissionError(f"config file '{config_path}' does not exist")
    if model_dir is not None and not Path(model_dir).is_dir():
        raise SubmissionError(f"model folder '{model_dir}' does not exist")
    text = read_config_text(config_path, str(config_path))
    parsed = _load(kind, text)
    check_slots(parsed.config, kind, slots)
    if model_dir is not None:
        check_engine(parsed.config, kind, Path(model_dir))
        check_script_hparams(parsed.config, kind, Path(model_dir))
    return text, parsed


def submit(layout: Layout, config_path: Path, model_dir: Path | None,
           kind: str = EXPERIMENT) -> tuple[Path, list[str]]:
    """Copy a config and model folder into the queue (`queue/jobs/` for a job) as one
    submission, atomically. Returns the queued path and the config's warnings. A config
    asking for more slots than the running daemon has is refused here too (with no daemon
    running, the next one to start decides: it may be given more slots)."""
    slots = (read_slot_file(layout.slot_file)
             if DaemonLock.holder(layout.daemon_lock) is not None else None)
    text, parsed = read_submission(config_path, model_dir, kind, slots)  # refuse a bad one now
    if warm_start.requested(parsed.config) and layout.db.exists():  # (the daemon decides)
        with StateDB.open(layout.db) as db:
            check_warm_start(db, parsed, kind)
    # The experiment name may hold anything; the queue entry's name must be a plain file name.
    safe_name = re.sub(r"[^\w.-]+", "_", parsed.config["name"]).lstrip(".") or kind
    name = f"{safe_name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    queue = layout.job_queue if kind == JOB else layout.queue
    queue.mkdir(parents=True, exist_ok=True)
    hidden = queue / f".{name}"
    copy_submission(text, model_dir, hidden)
    os.rename(hidden, queue / name)
    return queue / name, parsed.warnings
