"""A training loop with no framework at all, written against Determined's Core API: it
reports metrics and checkpoints through `core_context`, stops when asked
(`should_preempt()`), and resumes from `info.latest_checkpoint`. It fits y = 3x + 1 by
gradient descent in plain Python."""

import json
import random

import determined as det

STEPS = 400


def load(core_context, uuid):
    with core_context.checkpoint.restore_path(uuid) as path:
        return json.loads((path / "state.json").read_text())


def main(core_context):
    info = det.get_cluster_info()
    hparams = info.trial.hparams if info else {"learning_rate": 0.05}
    state = {"w": 0.0, "b": 0.0, "step": 0, "seed": 1}
    if info and info.latest_checkpoint:
        state = load(core_context, info.latest_checkpoint)
    rng = random.Random(state["seed"] + state["step"])
    while state["step"] < STEPS:
        x = rng.uniform(-1, 1)
        error = state["w"] * x + state["b"] - (3 * x + 1)
        state["w"] -= hparams["learning_rate"] * error * x
        state["b"] -= hparams["learning_rate"] * error
        state["step"] += 1
        if state["step"] % 20 == 0:
            core_context.train.report_training_metrics(state["step"], {"loss": error ** 2})
            core_context.train.report_validation_metrics(
                state["step"], {"validation_error": abs(state["w"] - 3) + abs(state["b"] - 1)})
            with core_context.checkpoint.store_path({"steps_completed": state["step"]}) as (
                    path, _):
                (path / "state.json").write_text(json.dumps(state))
            core_context.train.report_progress(state["step"] / STEPS)
            if core_context.preempt.should_preempt():
                return
    print(f"final w={state['w']!r} b={state['b']!r}")


if __name__ == "__main__":
    with det.core.init() as core_context:
        main(core_context)
