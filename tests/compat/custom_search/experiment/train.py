"""A trial for custom search methods, written against Determined's Core API: it trains to
each length the searcher asks for (`core_context.searcher.operations()`), checkpoints, and
reports a validation loss that is a pure function of its hyperparameters and length, so a
simulated search can predict every decision. `fail: true` makes it fail at its start (the
search sees the trial exit early)."""

import json

import determined as det


def loss(hparams, length):
    return round((hparams["x"] - 0.3) ** 2 + 1.0 / length, 9)


def main(core_context):
    info = det.get_cluster_info()
    hparams = info.trial.hparams
    if hparams.get("fail"):
        raise RuntimeError("this trial's hyperparameters fail it on purpose")
    trained = 0
    if info.latest_checkpoint:
        with core_context.checkpoint.restore_path(info.latest_checkpoint) as path:
            trained = json.loads((path / "state.json").read_text())["trained"]
    for op in core_context.searcher.operations():
        while trained < op.length:
            trained += 1
            core_context.train.report_training_metrics(trained, {"loss": 1.0 / trained})
        value = loss(hparams, trained)
        core_context.train.report_validation_metrics(trained, {"validation_loss": value})
        with core_context.checkpoint.store_path({"steps_completed": trained}) as (path, _):
            (path / "state.json").write_text(json.dumps({"trained": trained}))
        op.report_completed(value)


if __name__ == "__main__":
    with det.core.init() as core_context:
        main(core_context)
