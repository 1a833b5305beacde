"""The Keras 2 side of tests/test_cross_line_layers.py, in one subprocess: each group of
shared_layers/layer_models.py trained by the trial runner as a TFKerasTrial, its checkpoint
exported, and the trained model's predictions.

    TF_USE_LEGACY_KERAS=1 python layers_keras2.py REQUEST.json ANSWER.json
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np

FOLDER = Path(__file__).resolve().parent / "shared_layers"
TESTS = Path(__file__).resolve().parent.parent
ROWS, SEED = 16, 2  # the rows predicted on, on both sides


def train(scratch: Path, group: str) -> dict:
    sys.path.insert(0, str(TESTS))
    from conftest import start_trial

    import determined as det
    from determined.keras._trial_controller import TrialController
    from localdet.reporting.sqlite_reporter import CheckpointReader

    scratch.mkdir(parents=True, exist_ok=True)
    db, trial_id, reporter, info = start_trial(
        scratch, 4, hparams={"global_batch_size": 8, "group": group},
        entrypoint="model_def:SharedLayersTrial")
    shutil.copytree(FOLDER, scratch / "model", dirs_exist_ok=True)
    with det.import_from_path(FOLDER):
        import layer_models
        import model_def
    controller = TrialController.for_trial_class(model_def.SharedLayersTrial, info, reporter)
    controller.run()
    reader = CheckpointReader(reporter.layout)
    folder = reader.materialize(reader.resolve(trial_id=trial_id), scratch / "export")
    x, _ = layer_models.data(group, ROWS, SEED)
    # The trained model, whose weights the last checkpoint holds.
    np.save(scratch / "predictions.npy", controller.model.predict(x, verbose=0))
    return {"folder": str(folder), "predictions": str(scratch / "predictions.npy"),
            # What the trial process's generator choice made the model's layers record.
            "rng_types": sorted({layer.get_config().get("rng_type") or ""
                                 for layer in controller.model._flatten_layers()} - {""})}


def main(request_path: str, answer_path: str) -> None:
    request = json.loads(Path(request_path).read_text())
    scratch = Path(request["scratch"])
    answer = {group: train(scratch / group.replace("/", "_"), group)
              for group in request["groups"]}
    Path(answer_path).write_text(json.dumps(answer))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
