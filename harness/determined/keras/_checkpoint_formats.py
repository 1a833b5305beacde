"""What a Keras checkpoint folder holds, in each format that wrote one.

- localdet: `determined-keras-model.h5` (the whole model), or for a model Keras saves only
  as weights (a subclassed one) `localdet-keras-weights.h5` (see `_weights_file`), `code/`,
  `config.yaml`, `hparams.json` and a `metadata.json` whose `format` starts with `localdet-`.
- Determined 0.17.8 and later: `load_data.json` (trial type, config, hyperparameters, trial
  class) beside `code/` and the weights as a TensorFlow checkpoint with the prefix
  `determined-keras-model-weights`.
- Determined 0.13.8 to 0.17.7: the same weights (or, before 0.13.8, the `.h5`), with the
  config and hyperparameters in a `metadata.json` that `Checkpoint.download()` wrote.
- Determined up to 0.13.7, straight from checkpoint storage: a lone
  `determined-keras-model.h5`.

    saved = read_checkpoint(Path("./best"))
    saved.trial_spec, saved.weights, saved.keras_line
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional

import yaml

MODEL_FILENAME = "determined-keras-model.h5"
WEIGHTS_PREFIX = "determined-keras-model-weights"
LEGACY_MODEL_FILENAME = "determined-keras-model"  # Determined 0.12: the .h5 without a suffix


class CheckpointFormatError(ValueError):
    """The folder is not a Keras checkpoint that any known format wrote; says what it is."""


@dataclass
class SavedCheckpoint:
    folder: Path
    format: str                      # "localdet", "determined-load-data", ...
    weights: Path                    # an .h5 file, or a TensorFlow checkpoint prefix
    trial_spec: Optional[str]        # "model_def:MyTrial"; None for a script's checkpoint
    config: Dict[str, Any] = field(default_factory=dict)
    hparams: Dict[str, Any] = field(default_factory=dict)
    keras_line: Optional[str] = None  # the line that wrote it, where the folder says

    @property
    def code(self) -> Path:
        return self.folder / "code"

    @property
    def whole_model(self) -> Optional[Path]:
        """The `.h5` holding architecture and weights too, if the checkpoint has one."""
        return self.weights if self.weights.name in (MODEL_FILENAME, LEGACY_MODEL_FILENAME) \
            else None


def trial_spec_of(entrypoint: Any) -> Optional[str]:
    """`module:Class` from an entrypoint in any of Determined's spellings: the bare class,
    or the launcher form (`python3 -m determined.launch.horovod --trial model_def:Trial`)."""
    if not isinstance(entrypoint, str):
        return None
    try:
        tokens = shlex.split(entrypoint)
    except ValueError:
        return None
    if "--trial" in tokens[:-1]:
        return tokens[tokens.index("--trial") + 1]
    if len(tokens) == 1 and ":" in tokens[0]:
        return tokens[0]
    if "determined.launch" in entrypoint:  # `... --autohorovod model_def:Trial`
        found = [t for t in tokens if ":" in t and not t.startswith("-")]
        return found[-1] if found else None
    return None  # a script: no trial class


def _line_of_tensorflow(version: Any) -> Optional[str]:
    """Determined's TensorFlow (always before 2.16) had Keras 2 only."""
    try:
        major, minor = (int(p) for p in str(version).split(".")[:2])
    except ValueError:
        return None
    return "keras2" if (major, minor) < (2, 16) else None


def _json(path: Path) -> Dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise CheckpointFormatError(f"'{path}' is not readable JSON ({error}); the "
                                    "checkpoint folder is damaged: download it again") from None


def _weights_file(folder: Path) -> Path:
    from determined.keras._weights_file import WEIGHTS_FILENAME  # a subclassed model's

    if (folder / WEIGHTS_FILENAME).is_file():
        return folder / WEIGHTS_FILENAME
    if (folder / f"{WEIGHTS_PREFIX}.index").is_file():
        return folder / WEIGHTS_PREFIX
    for name in (MODEL_FILENAME, LEGACY_MODEL_FILENAME):
        if (folder / name).is_file():
            return folder / name
    raise CheckpointFormatError(
        f"'{folder}' holds neither {MODEL_FILENAME} nor {WEIGHTS_PREFIX}.index; pass the "
        "checkpoint's top folder (from `localdet checkpoint export UUID FOLDER`, or "
        "Determined's `Checkpoint.download()`)")


def read_checkpoint(folder: Path) -> SavedCheckpoint:
    """Which format wrote `folder`, and where its weights, code and config are."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointFormatError(f"'{folder}' is not a folder; pass the checkpoint's folder "
                                    "(from `localdet checkpoint export UUID FOLDER`)")
    weights = _weights_file(folder)
    metadata_path, load_data_path = folder / "metadata.json", folder / "load_data.json"
    metadata = _json(metadata_path) if metadata_path.is_file() else {}

    if str(metadata.get("format", "")).startswith("localdet-"):
        config = yaml.safe_load((folder / "config.yaml").read_text()) \
            if (folder / "config.yaml").is_file() else {}
        hparams = _json(folder / "hparams.json") if (folder / "hparams.json").is_file() else {}
        if config.get("trial_class") is None and weights.name != MODEL_FILENAME:
            raise CheckpointFormatError(
                "build the model in your code and read its weights with "
                "determined.keras.load_weights_from_checkpoint_path(model, "
                f"'{folder}'): it holds a script's model as weights alone (a subclassed "
                "model, or one whose .h5 Keras cannot write) and no trial class to build it "
                "from")
        return SavedCheckpoint(folder, "localdet", weights, config.get("trial_class"), config,
                               hparams, metadata.get("keras_line"))
    if load_data_path.is_file():
        load_data = _json(load_data_path)
        return SavedCheckpoint(folder, "determined-load-data", weights,
                               load_data.get("trial_cls_spec"),
                               load_data.get("experiment_config") or {},
                               load_data.get("hparams") or {}, "keras2")
    if metadata:
        config = metadata.get("experiment_config") or {}
        line = _line_of_tensorflow(metadata.get("tensorflow_version")) or "keras2"
        return SavedCheckpoint(folder, "determined-metadata", weights,
                               trial_spec_of(config.get("entrypoint")), config,
                               metadata.get("hparams") or {}, line)
    if weights.suffix != ".h5" and weights.name != LEGACY_MODEL_FILENAME:
        raise CheckpointFormatError(
            f"'{folder}' holds Determined's weights but no load_data.json or metadata.json "
            "saying which trial class they belong to; download it with Determined's "
            "`Checkpoint.download()` (which writes metadata.json), or write that file with "
            "`Checkpoint.write_metadata_file('metadata.json')`")
    return SavedCheckpoint(folder, "determined-h5", weights, None, keras_line="keras2")
