"""An experiment's model folder as submitted (the snapshot the daemon keeps in
`experiments/<id>/model`), written out as Determined's `download_code` and `det e
download-model-def` wrote it: `exp-<id>_model_def.tar.gz`."""

from __future__ import annotations

import tarfile
from pathlib import Path

from localdet.operations.errors import OperationError
from localdet.paths import Layout
from localdet.records.db import StateDB


def download_model_def(layout: Layout, db: StateDB, experiment_id: int,
                       output_dir: Path) -> Path:
    """Write the experiment's model folder to `output_dir/exp-<id>_model_def.tar.gz`
    (replacing such a file); returns its path."""
    db.experiment(experiment_id)  # NotFound, in one sentence
    folder = layout.model_dir(experiment_id)
    if not folder.is_dir():
        raise OperationError(f"experiment {experiment_id} has no model folder recorded "
                             "(a script run records none)")
    output_dir.mkdir(parents=True, exist_ok=True)
    target = output_dir / f"exp-{experiment_id}_model_def.tar.gz"
    with tarfile.open(target, "w:gz") as archive:
        for path in sorted(folder.rglob("*")):
            archive.add(path, arcname=str(path.relative_to(folder)), recursive=False)
    return target
