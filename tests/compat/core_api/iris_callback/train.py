"""An iris classifier trained the way Determined 0.38 taught Keras users: a plain
`model.fit` under `det.core.init()`, with `DeterminedCallback` and `det.keras.TensorBoard`,
reading the trial's facts from `det.get_cluster_info()`. Runs under localdet (any of the
configs here) and on its own (`python3 train.py --epochs 3`)."""

import argparse
import logging

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_iris

import determined as det
import determined.keras


def iris():
    features, labels = load_iris(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(labels))
    features = features[order].astype("float32")
    onehot = np.eye(3, dtype="float32")[labels[order]]
    return (features[:120], onehot[:120]), (features[120:], onehot[120:])


def main(core_context, strategy, checkpoint, continue_id, hparams, epochs):
    (x, y), validation = iris()
    with strategy.scope():
        inputs = tf.keras.layers.Input(shape=(4,))
        hidden = tf.keras.layers.Dense(hparams["layer1_dense_size"])(inputs)
        outputs = tf.keras.layers.Dense(3, activation="softmax")(hidden)
        model = tf.keras.models.Model(inputs=inputs, outputs=outputs)
        model.compile(optimizer=tf.keras.optimizers.RMSprop(hparams["learning_rate"]),
                      loss=tf.keras.losses.categorical_crossentropy,
                      metrics=["categorical_accuracy"])
    callbacks = [
        det.keras.DeterminedCallback(core_context, checkpoint=checkpoint,
                                     continue_id=continue_id, checkpoint_epochs=0),
        det.keras.TensorBoard(core_context, update_freq="epoch", profile_batch=0),
    ]
    # shuffle=False: a paused run then sees the batches an uninterrupted one would.
    model.fit(x, y, batch_size=hparams["global_batch_size"], validation_data=validation,
              epochs=epochs, shuffle=False, verbose=2, callbacks=callbacks)
    if core_context.distributed.rank == 0:
        np.save("final_weights.npy", np.concatenate([w.ravel() for w in model.get_weights()]))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=30)
    args = parser.parse_args()

    info = det.get_cluster_info()
    if info and info.task_type == "TRIAL":
        continue_id, checkpoint = info.trial.trial_id, info.latest_checkpoint
        hparams = info.trial.hparams
    else:
        continue_id, checkpoint = "local", None
        hparams = {"learning_rate": 0.01, "layer1_dense_size": 8, "global_batch_size": 16}

    distributed, strategy = det.core.DistributedContext.from_tf_config()
    with det.core.init(distributed=distributed) as core_context:
        main(core_context, strategy, checkpoint, continue_id, hparams, args.epochs)
