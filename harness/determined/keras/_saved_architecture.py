"""Take out of a saved `.h5`'s architecture what the trial process put there for its own
needs, so that the file reads in the other Keras line as one saved by plain Keras does.

    model.save(h5_path)
    drop_generator_choice(h5_path)   # under Keras 2

Under Keras 2 the trial process calls `enable_tf_random_generator()` (random layers then
keep their generator's state in variables, which a checkpoint holds), and every random
layer (Dropout, GaussianNoise, the Random* preprocessing layers, RNNs with dropout, ...)
records that choice as `rng_type: "stateful"`, an argument Keras 3's layers refuse.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import h5py

from determined.keras._architecture_translation import without_generator_choice


def rewrite_architecture(h5_path: Path, change: Callable[[Any], bool]) -> None:
    """Let `change` edit, in place, the architecture (`model_config`) a saved `.h5` holds;
    written back only when it returns True."""
    with h5py.File(h5_path, "r+") as h5:
        raw = h5.attrs.get("model_config")
        if raw is None:
            return
        config = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
        if change(config):
            h5.attrs["model_config"] = json.dumps(config)


def drop_generator_choice(h5_path: Path) -> None:
    """Leave the trial process's generator choice out of the architecture `h5_path` holds."""
    rewrite_architecture(h5_path, without_generator_choice)
