"""Which Keras a trial runs under: Keras 3 (TensorFlow's default) or Keras 2 (`tf-keras`).

A config may choose with `TF_USE_LEGACY_KERAS` in `environment.environment_variables`.
Otherwise the model folder decides: code that uses what only Keras 2 has (the legacy
optimizers Determined's examples used, `keras.engine`, `tf_keras`) runs under Keras 2, so
Determined trials run unchanged; everything else runs under Keras 3. TensorFlow before 2.16
(the Horovod environment's 2.15) has Keras 2 only.
"""

from __future__ import annotations

import functools
import re
from importlib import metadata
from pathlib import Path

KERAS2_ONLY = re.compile(r"optimizers\.legacy|keras\.engine\b|\btf_keras\b|"
                         r"keras\.wrappers\.scikit_learn|keras\.layers\.experimental")


def choose(model_dir: Path, environment: dict[str, str]) -> tuple[str, str]:
    """("keras2" | "keras3", why), for the launcher and the trial's record."""
    version = tensorflow_version()
    if version and version < (2, 16):
        return "keras2", f"TensorFlow {'.'.join(map(str, version))} here has Keras 2 only"
    if "TF_USE_LEGACY_KERAS" in environment:
        line = "keras2" if environment["TF_USE_LEGACY_KERAS"] == "1" else "keras3"
        return line, "TF_USE_LEGACY_KERAS in environment.environment_variables"
    for source in sorted(Path(model_dir).rglob("*.py")):
        try:
            text = source.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        match = KERAS2_ONLY.search(text)
        if match:
            where = source.relative_to(model_dir)
            return "keras2", f"{where} uses {match.group(0)}, which only Keras 2 has"
    return "keras3", "the default"


@functools.cache
def tensorflow_version() -> tuple[int, int] | None:
    """The installed TensorFlow's (major, minor), read without importing it."""
    for distribution in ("tensorflow", "tensorflow-cpu"):
        try:
            major, minor = metadata.version(distribution).split(".")[:2]
            return int(major), int(minor)
        except (metadata.PackageNotFoundError, ValueError):
            continue
    return None
