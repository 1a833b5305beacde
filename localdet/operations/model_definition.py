"""An experiment's model definition (the model folder it was submitted with, as kept in
the state folder) as a gzipped tar, as Determined's `det e download-model-def` wrote it.

    path = download_model_def(layout, db, 3, Path("."))   # ./experiment_3_model_def.tgz
"""

from __future__ import annotations

import tarfile
from pathlib import Path

from localdet.operations.errors import OperationError
from localdet.paths import Layout
from localdet.records.db import StateDB


def download_model_def(layout: Layout, db: StateDB, experiment_id: int,
                       output_dir: Path) -> Path:
    """Write `experiment_<id>_model_def.tgz` (the model folder's files at its top level)
    into `output_dir`; returns its path. NotFound for no such experiment."""
    experiment = db.experiment(experiment_id)
    folder = Path(experiment.model_dir) if experiment.model_dir else \
        layout.model_dir(experiment_id)
    if not folder.is_dir():
        raise OperationError(f"experiment {experiment_id} has no model folder at {folder} "
                             "(it was run as a script outside the daemon)")
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    target = output_dir / f"experiment_{experiment_id}_model_def.tgz"
    partial = target.with_name(f".{target.name}.partial")
    with tarfile.open(partial, "w:gz") as archive:
        for path in sorted(folder.rglob("*")):
            if "__pycache__" not in path.parts:
                archive.add(path, arcname=str(path.relative_to(folder)), recursive=False)
    partial.replace(target)
    return target
