"""How a trial trains on its slots, chosen per trial at submission and recorded at launch:

    engine, why = choose(config, model_dir)   # ("single", ...) or ("mirrored", ...)

- "single": one slot, one process.
- "mirrored": several slots under Keras 3, one process with a `MirroredStrategy` over the
  slots' GPUs (or as many logical CPU devices); the harness sets it up from LOCALDET_SLOTS.

Several slots under Keras 2 need one process per slot (MultiWorkerMirroredStrategy or
Horovod), which is not available yet: such a config is refused at submission, with the
reason, rather than train on one slot while holding several.
"""

from __future__ import annotations

from pathlib import Path

from localdet import keras_line

SINGLE, MIRRORED = "single", "mirrored"


class EngineError(ValueError):
    """No engine here can train this config on its slots; the message says what to change."""


def choose(config: dict, model_dir: Path) -> tuple[str, str]:
    slots = config["resources"]["slots_per_trial"]
    if slots <= 1:
        return SINGLE, "one slot"
    environment = {str(k): str(v) for k, v in
                   config["environment"]["environment_variables"].items()}
    line, why = keras_line.choose(Path(model_dir), environment)
    if line == "keras2":
        raise EngineError(
            f"resources.slots_per_trial is {slots} but the trial runs under Keras 2 ({why}), "
            "and several slots under Keras 2 need one process per slot, which localdet "
            "cannot run yet; use slots_per_trial: 1, or Keras 3")
    return MIRRORED, f"{slots} slots under Keras 3: one process, MirroredStrategy"
