"""A trial's checkpoint, written and read back: the half of `TrialController` that saves
(`checkpoint()`) and loads (`_load_restored`) everything a resumed trial needs to continue
exactly as if it had never stopped.

    <checkpoint>/
        determined-keras-model.h5   a Functional or Sequential model whole, Keras's own .h5;
                                    any other model's weights alone (see `_weights_file`), as
                                    are those whose .h5 Keras cannot write (an adapted lookup
                                    layer's vocabulary, two weights of one name)
        code/, config.yaml, hparams.json, metadata.json (names the weights' file and form)
        trial_state.pkl             batches, epochs, every optimizer's and generator's state,
                                    callback states, where the current epoch began
        data_iterator/              the tf.data iterator's own checkpoint, where TensorFlow
                                    can save it (else the stream resumes by position)
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import h5py
import tensorflow as tf
import yaml

from determined.core import TrialInfo, TrialReporter
from determined.errors import exception_line
from determined.keras import _data, _graph_mode, _open_h5, _state, _weights_file
from determined.keras._context import TFKerasTrialContext
from determined.keras._line import keras_line
from determined.keras._quiet import quiet_keras_warnings
from determined.keras._saved_architecture import (
    drop_generator_choice,
    keep_native_architecture,
)
from determined.keras._saved_compile import record_missing_arguments

MODEL_FILENAME = "determined-keras-model.h5"
MODEL_FORM = "keras-model-h5"  # architecture, weights, compile settings: Keras's own .h5
STATE_FILENAME = "trial_state.pkl"
ITERATOR_FOLDER = "data_iterator"


class TrialCheckpoints:
    """Writes and loads a trial's checkpoints; `TrialController` holds the state it reads
    (declared here) and trains."""

    info: TrialInfo
    reporter: TrialReporter
    context: TFKerasTrialContext
    model: Any
    user_callbacks: List[Any]
    is_chief: bool
    graph_mode: bool
    batches_trained: int
    epochs_completed: int
    epoch_start_batch: int
    last_validation: int
    last_checkpoint: int
    position_only: bool
    train_stream: Optional[_data.TrainingStream]
    iterator: Any

    def _optimizers(self) -> List[Any]:
        raise NotImplementedError

    def _call(self, hook: str, *args: Any) -> None:
        raise NotImplementedError

    def _note(self, phase: str, started: float, details: Optional[Dict[str, Any]] = None
              ) -> float:
        raise NotImplementedError

    def checkpoint(self) -> str:
        if not self.is_chief:  # the ranks' weights are the same; the chief saves them
            self.last_checkpoint = self.batches_trained
            return ""
        paused = time.time()  # training waits from here until the reporter takes the files
        directory = Path(tempfile.mkdtemp(dir=self.info.trial_dir, prefix=".checkpoint-"))
        try:
            weights = self._save_weights(directory)
            shutil.copytree(self.info.model_dir, directory / "code",
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            (directory / "config.yaml").write_text(
                yaml.safe_dump(without_secrets(self.info.config)))
            (directory / "hparams.json").write_text(json.dumps(self.info.hparams, indent=2))
            self._save_trial_state(directory, weights)
            # Callbacks may add files, and metadata for this very checkpoint.
            self._call("on_checkpoint_end", str(directory))
            metadata = {
                **self.context.checkpoint_metadata,
                "experiment_id": self.info.experiment_id,
                "trial_id": self.info.trial_id,
                "batches_trained": self.batches_trained,
                "keras_line": keras_line(),
                **weights,
                "tensorflow_version": tf.__version__,
                "format": "localdet-keras-checkpoint/1",
            }
            (directory / "metadata.json").write_text(json.dumps(metadata, indent=2, default=str))
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        # The reporter owns the folder now; it may store it while training goes on.
        uuid = self.reporter.save_checkpoint(directory, self.batches_trained, metadata)
        self._note("checkpoint", paused, {"uuid": uuid, "batches": self.batches_trained})
        self.last_checkpoint = self.batches_trained
        print(f"[trial {self.info.trial_id}] checkpoint {uuid} at {self.batches_trained}",
              flush=True)
        return uuid

    def _save_weights(self, directory: Path) -> Dict[str, str]:
        """Write the model's weights; returns the metadata naming their file and form. A
        model saved whole whose .h5 Keras cannot write (or that would not hold it all) keeps
        its weights alone instead, the trial class building the model to load them."""
        if saves_whole(self.model):
            path = directory / MODEL_FILENAME
            # With eager execution disabled, the weights alone cannot be read or written.
            refusal = None if self.graph_mode else _weights_file.whole_h5_refusal(self.model)
            if refusal is None:
                try:
                    with quiet_keras_warnings():
                        self.model.save(path)
                except (NotImplementedError, ValueError, TypeError) as error:
                    if self.graph_mode:
                        raise
                    path.unlink(missing_ok=True)
                    refusal = ("two weights of one layer share a name, which Keras's .h5 "
                               "format cannot hold" if "name already exists" in str(error)
                               else f"Keras's .h5 writer refused it ({exception_line(error)})")
            if refusal is None:
                record_missing_arguments(self.model, path)  # Keras 3's
                if keras_line() == "keras2":  # prepare_process's generator choice
                    drop_generator_choice(path)
                else:
                    keep_native_architecture(self.model, path)
                if self.graph_mode:
                    _graph_mode.portable_h5(path)
                return {"weights_file": MODEL_FILENAME, "weights_form": MODEL_FORM}
            if not getattr(self, "_said_weights_alone", False):
                self._said_weights_alone = True
                print(f"[trial {self.info.trial_id}] note: checkpoints keep this model's "
                      f"weights alone ({_weights_file.WEIGHTS_FILENAME}), read back into the model "
                      f"the code builds, since {refusal}", flush=True)
        # Keras saves no other model whole in an .h5; the trial class rebuilds it.
        _weights_file.write_weights(self.model, directory / _weights_file.WEIGHTS_FILENAME)
        return _weights_file.describe()

    def _save_trial_state(self, directory: Path, weights: Dict[str, str]) -> None:
        # The compiled optimizer's variables are in a whole model's .h5 already: kept once
        # (for a 70 MB model with Adam, 46 MB less to write, store and read back).
        h5_path = directory / MODEL_FILENAME
        in_h5 = self.model.optimizer if weights["weights_form"] == MODEL_FORM \
            and not self.graph_mode and self.model.optimizer is not None \
            and _state.h5_holds_optimizer(h5_path, self.model.optimizer) else None
        state = {
            "format": 1,
            "batches_trained": self.batches_trained,
            "epochs_completed": self.epochs_completed,
            "last_validation": self.last_validation,
            "generators": _state.capture(self.model, self._optimizers(), in_h5),
            "callbacks": [c.get_state() if hasattr(c, "get_state") else None
                          for c in self.user_callbacks],
            "iterator_checkpoint": self._save_iterator(directory),
            "epoch_start_batch": self.epoch_start_batch,
        }
        with open(directory / STATE_FILENAME, "wb") as handle:
            # Protocol 5 writes the optimizers' numpy buffers to the file uncopied (PEP 574):
            # a third of the pickling time of a 70 MB model's checkpoint.
            pickle.dump(state, handle, protocol=5)

    def _save_iterator(self, directory: Path) -> Optional[str]:
        """The training iterator's own checkpoint (its path in `directory`), or None where
        the stream finds its place by position: always, or since TensorFlow refused to save
        an iterator whose pipeline has a stateful op (said once, in the trial's log)."""
        if self.train_stream is None or not self.train_stream.position_in_iterator \
                or self.position_only:
            return None
        try:
            prefix = tf.train.Checkpoint(iterator=self.iterator).write(
                str(directory / ITERATOR_FOLDER / "iterator"))
        except tf.errors.FailedPreconditionError as error:
            if not _data.stateful_op(error):
                raise
            shutil.rmtree(directory / ITERATOR_FOLDER, ignore_errors=True)
            self.position_only = True
            print(f"[trial {self.info.trial_id}] note: "
                  f"{_data.resumes_by_position(_data.stateful_op(error))}", flush=True)
            return None
        return os.path.relpath(prefix, directory)

    def _load_restored(self, directory: Path) -> Dict[str, Any]:
        """Put the restored checkpoint's weights, optimizer and generator states into this
        trial's model and optimizers; returns the saved trial state."""
        with open(directory / STATE_FILENAME, "rb") as handle:
            state = pickle.load(handle)
        weights_file = directory / _weights_file.WEIGHTS_FILENAME
        with contextlib.ExitStack() as files:
            h5: _state.H5Source = None
            if weights_file.is_file():
                _weights_file.read_weights(self.model, weights_file)
                # Why a model saved whole keeps its weights alone: said at its first checkpoint.
                self._said_weights_alone = True
            elif _open_h5.loads_open_h5():
                model_file = directory / MODEL_FILENAME
                # A file written out is read by HDF5 itself; one read in place through Python.
                source = model_file if model_file.is_file() else \
                    files.enter_context(self.reporter.open_restored(MODEL_FILENAME))
                h5 = files.enter_context(h5py.File(source, "r"))
                with quiet_keras_warnings():
                    _open_h5.load_model_weights(self.model, h5)
            else:
                h5 = directory / MODEL_FILENAME
                with quiet_keras_warnings():
                    self.model.load_weights(str(h5))
            if self.graph_mode:
                # The training graph first: the optimizer's state then goes into the very
                # slot variables its updates use.
                self.model._make_train_function()
            if not _state.holds_every_optimizer(state["generators"]):
                _state.restore_optimizer_from_h5(self.model.optimizer, self.model, h5)
            _state.restore(state["generators"], self.model, self._optimizers(), h5)
        return state


def saves_whole(model: Any) -> bool:
    """Whether Keras saves `model` whole in an `.h5`: a Functional or Sequential model (a
    subclass of one included), not a subclassed `keras.Model`."""
    if isinstance(model, tf.keras.Sequential):
        return True
    if keras_line() == "keras2":
        return bool(getattr(model, "_is_graph_network", False))
    # keras.src: checked against keras 3.15 (pyproject's bound <3.16)
    from keras.src.models.functional import Functional

    return isinstance(model, Functional)


SECRET_KEYS = ("access_key", "secret_key")  # checkpoint_storage credentials (type s3)


def without_secrets(config: Dict[str, Any]) -> Dict[str, Any]:
    """The config as a checkpoint keeps it: storage credentials blanked, since a checkpoint
    is exported, downloaded and shared."""
    storage = config.get("checkpoint_storage")
    if not isinstance(storage, dict) or not any(storage.get(k) for k in SECRET_KEYS):
        return config
    hidden = {k: ("<hidden>" if k in SECRET_KEYS and v else v) for k, v in storage.items()}
    return {**config, "checkpoint_storage": hidden}
