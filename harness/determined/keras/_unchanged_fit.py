"""Each `model.fit` of an unchanged script, trained by localdet's runner (`TrialController`,
the one `context.fit` and `TFKerasTrial`s train through): metrics at the workload boundaries
the config sets, checkpoints, pause and exact resume.

    fits = ScriptFits.start()     # in the trial's process, before the script runs
    _unchanged.install(fits.fit)  # each Model.fit call is served by fits.fit

Phases. The script's fit calls are the trial's phases, counted in the order it makes them
(a frozen phase, then fine-tuning, is phases 0 and 1). The runner trains each phase as a
run of its own, counting batches from 0, while the records count on across phases: a
phase's metrics and checkpoints are recorded at the batches of the phases before it plus
its own, and the trial's length grows by each phase's as it begins. Every checkpoint names
its phase (`unchanged_script` in its metadata). A resumed script runs from its first line
again; a fit call of a phase its checkpoint had finished trains nothing and returns that
phase's recorded History; the phase the checkpoint is in restores it (weights, optimizer,
random generators, data position, epoch) and goes on with `initial_epoch` where it stopped;
later phases train as new.

Length. Where the searcher sets one (`max_length`), it is each phase's length in batches,
in place of the script's `epochs`; where it sets none, the script's `epochs` decide. The log
says which.

Backends. On Keras's TensorFlow backend a phase trains through the TFKerasTrial runner
(`_unchanged_controller`); on JAX and PyTorch through `context.fit`'s backend runner
(`_unchanged_backend`), and nothing here imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from determined.core import TrialInfo, TrialReporter, reporter_from_environment
from determined.core._reporting import reporter_factory
from determined.keras import _unchanged
from determined.keras._backend import is_tensorflow
from determined.keras._unchanged_phase import fit_data

METADATA_KEY = "unchanged_script"
LENGTHS_FILE = ".unchanged-script-length.json"  # in the trial's folder: the length it set


def _history_class(model: Any) -> Any:
    """The model's own Keras's History (`keras`, or `tf_keras` under Keras 2), found from
    the first Keras class it derives from (a script's subclass is defined in `__main__`)."""
    modules = [cls.__module__.split(".")[0] for cls in type(model).__mro__]
    name = next((m for m in modules if m in ("keras", "tf_keras", "tensorflow")), "keras")
    package = importlib.import_module(name)
    keras = getattr(package, "keras", package)  # a model of `tensorflow.python.keras`
    return keras.callbacks.History


def _rank() -> int:
    if is_tensorflow():
        from determined.keras import _engine

        return _engine.current().distributed.rank
    return 0  # on JAX and PyTorch a trial trains in one process


class PhaseReporter:
    """The trial's reporter as one phase's runner sees it: batches counted from the phase's
    start, recorded from the trial's (`offset` more); its checkpoints name the phase."""

    def __init__(self, reporter: TrialReporter, fits: "ScriptFits", phase: int, offset: int):
        self._reporter = reporter
        self._fits = fits
        self.phase = phase
        self.offset = offset
        self.target = 0  # this phase's length in batches, once known
        self.earlier: Dict[str, List[float]] = {}  # its History before this launch
        self.history: Any = None  # its History in this launch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reporter, name)

    def report_training_metrics(self, batches_trained: int, metrics: Dict[str, float]) -> None:
        self._reporter.report_training_metrics(self.offset + batches_trained, metrics)

    def report_validation_metrics(self, batches_trained: int,
                                  metrics: Dict[str, float]) -> None:
        self._reporter.report_validation_metrics(self.offset + batches_trained, metrics)

    def report_stand_in_metrics(self, batches_trained: int, metrics: Dict[str, float]) -> None:
        """A validation point of a fit without validation data: its training metrics stand
        in, under their History names; the searcher's metric `val_X`, which such a fit never
        reports, is taken from `X` (the log says so once), so that a script that validates
        nothing is searched by what it trains rather than ended in ERROR."""
        metrics = dict(metrics)
        wanted = self._fits.searcher_metric
        if metrics and wanted and wanted not in metrics:
            base = wanted[4:] if wanted.startswith("val_") else ""
            if base in metrics:
                metrics[wanted] = metrics[base]
            self._fits.say_once(
                ("stand-in", self.phase),
                f"fit call {self.phase + 1} has no validation data: "
                + (f"its training metric '{base}' is recorded as the searcher's metric "
                   f"'{wanted}' (pass validation data to fit, or set searcher.metric: {base})"
                   if base in metrics else
                   f"the searcher's metric '{wanted}' cannot be reported (it reports "
                   f"{', '.join(sorted(metrics))}); set searcher.metric to one of them"))
        self.report_validation_metrics(batches_trained, metrics)

    def set_target_batches(self, batches: int) -> None:
        self.target = batches
        self._fits.set_length(self.offset + batches)

    def save_checkpoint(self, directory: Path, batches_trained: int, metadata: Dict[str, Any],
                        uuid: Optional[str] = None) -> str:
        metadata = {**metadata, "batches_trained": self.offset + batches_trained,
                    METADATA_KEY: self._fits.phase_record(self, batches_trained)}
        (directory / "metadata.json").write_text(json.dumps(metadata, indent=2, default=str))
        return self._reporter.save_checkpoint(directory, self.offset + batches_trained,
                                              metadata, uuid)


class ScriptFits:
    """The trial's fit calls, phase by phase; see the module docstring."""

    def __init__(self, info: TrialInfo, reporter: TrialReporter, managed: bool = True):
        self.info = info
        self.reporter = reporter
        self.managed = managed
        self.calls = 0                   # fit calls made so far: the next one's phase
        self.trained = 0                 # batches of the phases run so far
        self.histories: List[Dict[str, List[float]]] = []  # finished phases' History
        saved = self._saved_phase(info)
        self.resume_phase: Optional[int] = saved.get("phase") if saved else None
        self.resume_offset = int(saved.get("offset", 0)) if saved else 0
        self.resumed_history: Dict[str, List[float]] = {}
        if saved:
            self.histories = [dict(h) for h in saved.get("histories", [])]
            self.resumed_history = dict(saved.get("phase_history") or {})
        # The searcher's length of a phase: the trial's, unless an earlier launch set the
        # trial's length itself (a phase's start) and the daemon has not changed it since
        # (ASHA's next rung).
        self.searcher_length = info.target_batches
        self._lengths = info.trial_dir / LENGTHS_FILE
        try:
            set_before = json.loads(self._lengths.read_text())
        except (OSError, ValueError):
            set_before = {}
        if set_before.get("target") == info.target_batches:
            self.searcher_length = int(set_before.get("searcher_length", 0))
        self.recorded_target = info.target_batches
        searcher = info.config.get("searcher")
        self.searcher_metric = str(searcher.get("metric") or "") \
            if isinstance(searcher, dict) else ""
        self._said: set = set()

    @classmethod
    def start(cls) -> "ScriptFits":
        """For the trial this process was launched for: its reporter, settings and seeded
        generators, as `det.keras.init()` prepares a script that calls it."""
        from determined import _old_releases

        if is_tensorflow():
            from determined.keras._trial_controller import prepare_process
        else:
            from determined.keras._backend_fit import prepare_process  # type: ignore[assignment]
        reporter = reporter_from_environment()
        info = reporter.trial_info()
        _old_releases.install(info.config)
        prepare_process(info)
        return cls(info, reporter)

    def _saved_phase(self, info: TrialInfo) -> Dict[str, Any]:
        if not info.latest_checkpoint:
            return {}
        try:
            metadata = reporter_factory().checkpoint_metadata(info.latest_checkpoint)
        except FileNotFoundError:  # a trial reporting over HTTP: read the checkpoint's own
            metadata = self._restored_metadata(info.latest_checkpoint)
        saved = metadata.get(METADATA_KEY)
        # A checkpoint without one (a script changed to unchanged): its phase is the first.
        return dict(saved) if isinstance(saved, dict) else {"phase": 0, "offset": 0}

    def _restored_metadata(self, uuid: str) -> Dict[str, Any]:
        scratch = Path(tempfile.mkdtemp(dir=self.info.trial_dir, prefix=".phase-"))
        try:
            folder = self.reporter.restore_checkpoint(uuid, scratch / "checkpoint")
            metadata = json.loads((folder / "metadata.json").read_text())
            self.reporter.verify_restored_checkpoint()
            return dict(metadata)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def set_length(self, target: int) -> None:
        """Record the trial's length as it grows phase by phase, and remember that this
        trial set it (not the searcher)."""
        self.recorded_target = target
        if _rank() == 0:
            self.info.trial_dir.mkdir(parents=True, exist_ok=True)
            self._lengths.write_text(json.dumps({"target": target,
                                                 "searcher_length": self.searcher_length}))
        self.reporter.set_target_batches(target)

    def phase_record(self, phase: PhaseReporter, batches_trained: int) -> Dict[str, Any]:
        """What a checkpoint of `phase` says of the phases (read back on resume)."""
        return {"phase": phase.phase, "offset": phase.offset, "phase_batches": batches_trained,
                "phase_target": phase.target, "searcher_length": self.searcher_length,
                "recorded_target": self.recorded_target, "histories": self.histories,
                "phase_history": _joined(phase.earlier, phase.history)}

    def say_once(self, key: Any, text: str) -> None:
        if key not in self._said:
            self._said.add(key)
            self._say(text)

    def _say(self, text: str) -> None:
        if _rank() == 0:
            print(f"[trial {self.info.trial_id}] {text}", flush=True)

    # -- one fit call --------------------------------------------------------------------
    def fit(self, original: Callable[..., Any], model: Any, args: Tuple[Any, ...],
            kwargs: Dict[str, Any]) -> Any:
        """Serve one `model.fit(*args, **kwargs)` call of the script."""
        arguments = _unchanged.fit_arguments(original, model, args, kwargs)
        phase = self.calls
        self.calls += 1
        if self.resume_phase is not None and phase < self.resume_phase:
            self._say(f"fit call {phase + 1}: trained before this trial was resumed; skipped "
                      "(the checkpoint holds what it trained)")
            history = _history_class(model)()
            history.set_model(model)
            recorded = self.histories[phase] if phase < len(self.histories) else {}
            history.history = {k: list(v) for k, v in recorded.items()}
            history.epoch = list(range(len(next(iter(recorded.values()), []))))
            return history
        resuming = self.resume_phase == phase
        offset = self.resume_offset if resuming else self.trained
        config = self.info.config
        if phase and isinstance(config.get("searcher"), dict):
            # searcher.source_checkpoint_uuid starts the first phase only.
            config = {**config, "searcher": {**config["searcher"],
                                             "source_checkpoint_uuid": None}}
        info = dataclasses.replace(
            self.info, latest_checkpoint=self.info.latest_checkpoint if resuming else None,
            target_batches=self.searcher_length, config=config)
        reporter = PhaseReporter(self.reporter, self, phase, offset)
        reporter.earlier = self.resumed_history if resuming else {}
        reporter.history = history = _history_class(model)()
        if self.searcher_length:
            reporter.set_target_batches(self.searcher_length)
            self._say(f"fit call {phase + 1}: trains the searcher's length, "
                      f"{self.searcher_length} batches, in place of the script's "
                      f"epochs={arguments.get('epochs', 1)}")
        else:
            self._say(f"fit call {phase + 1}: trains the script's "
                      f"epochs={arguments.get('epochs', 1)} (the searcher sets no length)")
        if is_tensorflow():
            controller = _run_phase(info, reporter, model, arguments, history)
        else:
            from determined.keras import _unchanged_backend

            controller = _unchanged_backend.run_phase(info, reporter, model, arguments,
                                                      history)
        self.trained = offset + controller.batches_trained
        if controller.paused:
            if self.managed:
                sys.exit(0)  # checkpointed: the script runs again from its start on resume
            return history
        # The History of the whole phase, the epochs before a pause included.
        whole = _joined(reporter.earlier, history)
        history.history = {k: list(v) for k, v in whole.items()}
        if reporter.earlier:
            first = history.epoch[0] if history.epoch else 0
            before = len(next(iter(reporter.earlier.values()), []))
            history.epoch = [*range(first - before, first), *history.epoch]
        self.histories.append(whole)
        return history


def _joined(earlier: Dict[str, List[float]], history: Any) -> Dict[str, List[float]]:
    """A phase's History so far: the epochs of earlier launches, then this launch's."""
    now = getattr(history, "history", None) or {}
    return {k: [float(x) for x in earlier.get(k, [])] + [float(x) for x in now.get(k, [])]
            for k in {*earlier, *now}}


def _run_phase(info: TrialInfo, reporter: PhaseReporter, model: Any,
               arguments: Dict[str, Any], history: Any) -> Any:
    """Train one phase through the runner, as `context.fit` does, into Keras's `history`;
    returns the controller."""
    from determined.keras import _keras_context as fit_args
    from determined.keras._context import TFKerasTrialContext
    from determined.keras._trial_controller import FitOptions
    from determined.keras._unchanged_controller import ScriptController

    train, validation, batch_size = fit_data(arguments, fit_args)
    if isinstance(validation, tuple):
        val_x, val_y, val_weight = [*validation, None, None][:3]
        validation = fit_args._as_loader(val_x, val_y, val_weight, "validation_data")
    context = TFKerasTrialContext(info)
    context.fit_config = {"verbose": fit_args._interactive_verbose(
                              arguments.get("verbose", "auto")),
                          "shuffle": arguments.get("shuffle", True),
                          "class_weight": arguments.get("class_weight"),
                          "validation_steps": arguments.get("validation_steps")}
    context.configure_fit(workers=arguments.get("workers"),
                          use_multiprocessing=arguments.get("use_multiprocessing"),
                          max_queue_size=arguments.get("max_queue_size"))
    context.wrap_model(model)
    for loader in (train, validation):  # the script's own datasets: shared as they are
        if loader is not None and not isinstance(loader, tuple):
            context._wrapped_datasets.add(id(loader))
    options = FitOptions(epochs=arguments.get("epochs", 1) or 1,
                         initial_epoch=arguments.get("initial_epoch", 0) or 0,
                         steps_per_epoch=arguments.get("steps_per_epoch"),
                         validation_freq=arguments.get("validation_freq", 1) or 1,
                         validation_batch_size=arguments.get("validation_batch_size"),
                         history=history)
    controller = ScriptController(info, reporter, context, model, train, validation,
                                  list(arguments.get("callbacks") or []),
                                  batch_size=batch_size or None, fit=options)
    controller.run()
    reporter.heartbeat()  # writes the phase's last timeline phases (its end)
    return controller
