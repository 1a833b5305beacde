"""The gradient_allreduce engine: Horovod's semantics for a multi-slot Keras 2 trial without
Horovod. Each rank is a plain Keras 2 process that computes its own loss on its part of each
global batch, whatever the loss's reduction; the wrapped optimizers average the gradients
across the ranks before applying them; rank 0's weights are broadcast first.

The two-rank test runs the rank supervisor without a daemon: RANKS below is the program of
each rank, and rank 0 also trains the same models on one process, for comparison."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest
from conftest import REPO

from determined.core._process_group import ProcessGroup

# Two models trained the two ways an optimizer is reached: a subclassed model with its own
# train_step and two optimizers (GAN-like: apply_gradients twice a step), and a Sequential
# model whose default train_step calls minimize (a legacy optimizer). Both losses keep their
# default reduction, SUM_OVER_BATCH_SIZE, which tf.distribute refuses. Rank 1 builds its
# models from another seed: the broadcast from rank 0 must make them the same.
RANKS = r'''
import json, os, sys
import numpy as np
import tensorflow as tf
from determined.keras import _engine

engine = _engine.start("keras2")
rank, size = engine.distributed.rank, engine.distributed.size
GLOBAL_BATCH, STEPS = 16, 12
data = np.random.default_rng(0)
x = data.normal(size=(GLOBAL_BATCH * STEPS, 8)).astype("float32")
y = (x @ data.normal(size=(8, 1))).astype("float32")
labels = (x[:, 0] > 0).astype("int32")


class TwoParts(tf.keras.Model):
    def __init__(self):
        super().__init__()
        self.encoder = tf.keras.Sequential([tf.keras.Input((8,)),
                                            tf.keras.layers.Dense(6, activation="tanh")])
        self.head = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(1)])

    def compile(self, encoder_optimizer, head_optimizer):
        super().compile()
        self.encoder_optimizer, self.head_optimizer = encoder_optimizer, head_optimizer
        self.loss_fn = tf.keras.losses.MeanSquaredError()

    def train_step(self, data):
        x, y = data
        with tf.GradientTape(persistent=True) as tape:
            loss = self.loss_fn(y, self.head(self.encoder(x)))
        for part, optimizer in ((self.encoder, self.encoder_optimizer),
                                (self.head, self.head_optimizer)):
            grads = tape.gradient(loss, part.trainable_weights)
            optimizer.apply_gradients(zip(grads, part.trainable_weights))
        return {"loss": loss}


def build(seed, wrap):
    tf.keras.utils.set_random_seed(seed)
    two = TwoParts()
    two.compile(wrap(tf.keras.optimizers.Adam(0.01)), wrap(tf.keras.optimizers.SGD(0.1)))
    sequential = tf.keras.Sequential([tf.keras.Input((8,)),
                                      tf.keras.layers.Dense(4, activation="relu"),
                                      tf.keras.layers.Dense(2)])
    sequential.compile(optimizer=wrap(tf.keras.optimizers.legacy.SGD(0.2, momentum=0.5)),
                       loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return two, sequential


def part(array):  # this rank's rows of every global batch
    per = GLOBAL_BATCH // size
    return array.reshape(STEPS, size, per, -1)[:, rank].reshape(STEPS * per, -1)


def train(models, batch, rows):
    two, sequential = models
    two.fit(rows(x), rows(y), batch_size=batch, shuffle=False, verbose=0, epochs=2)
    sequential.fit(rows(x), rows(labels[:, None]), batch_size=batch, shuffle=False,
                   verbose=0)
    return [w for model in models for w in model.get_weights()]


jit = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(1)])
jit.compile(optimizer="sgd", loss="mse", jit_compile=True)
try:
    engine.prepare(jit, None)
except _engine.EngineError as error:
    refusal = str(error)
models = build(7 + rank, engine.wrap_optimizer)
initial = [w for model in models for w in model.get_weights()]
for model in models:
    engine.prepare(model, None)
trained = train(models, GLOBAL_BATCH // size, part)
every = engine.distributed.allgather(trained)
if rank == 0:
    one = train(build(7, lambda optimizer: optimizer), GLOBAL_BATCH, lambda a: a)
    print("RESULT " + json.dumps({
        "describe": engine.describe(),
        "refusal": refusal,
        "ranks_differ": max(float(np.abs(a - b).max()) for a, b in zip(*every)),
        "from_one_slot": max(float(np.abs(a - b).max()) for a, b in zip(trained, one)),
        "trained": max(float(np.abs(a - b).max()) for a, b in zip(trained, initial)),
        "classes_kept": all(type(o) is c for o, c in (
            (models[0].encoder_optimizer, tf.keras.optimizers.Adam),
            (models[1].optimizer, tf.keras.optimizers.legacy.SGD))),
    }), flush=True)
'''


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> dict:
    script = tmp_path_factory.mktemp("ranks") / "ranks.py"
    script.write_text(RANKS)
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "LOCALDET_ENGINE": "gradient_allreduce",
           "TF_CPP_MIN_LOG_LEVEL": "2", "TF_DETERMINISTIC_OPS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO / "harness"), str(REPO)])}
    # --tf-config as the launcher passes it: TF_CONFIG is set and must change nothing.
    done = subprocess.run([sys.executable, "-P", "-m", "localdet.processes.ranks", "--size",
                           "2", "--tf-config", "--", sys.executable, str(script)],
                          env=env, cwd=script.parent, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("[rank 0] RESULT ")]
    return json.loads(line.split("RESULT ", 1)[1])


def test_two_ranks_end_within_1e_5_of_one_slot_with_sum_over_batch_size_losses(two_ranks):
    assert two_ranks["describe"] == ("rank 0 of 2: gradients averaged across the ranks' "
                                     "processes (no tf.distribute strategy)")
    assert two_ranks["refusal"].startswith(
        "model.compile(jit_compile=True) cannot train on several slots without Horovod")
    assert two_ranks["trained"] > 1e-2  # the weights moved
    assert two_ranks["ranks_differ"] == 0.0  # the same averaged gradients on every rank
    assert two_ranks["from_one_slot"] < 1e-5
    assert two_ranks["classes_kept"]  # what a checkpoint records stays the optimizer's


def test_allreduce_mean_gives_every_rank_the_same_mean_and_refuses_unlike_arrays(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = ("127.0.0.1", probe.getsockname()[1])
    key, results = secrets.token_bytes(32), {}

    def rank(number: int) -> None:
        group = ProcessGroup(number, 3, address, key)
        try:
            results[number] = group.allreduce_mean(
                "grads", [np.full((2, 3), number, np.float32), np.float16(number * 2)])
            try:
                group.allreduce_mean("grads", [np.zeros(number + 1, np.float32)])
            except RuntimeError as error:
                results[f"error {number}"] = str(error)
        finally:
            group.close()

    threads = [threading.Thread(target=rank, args=(n,)) for n in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    for number in range(3):
        matrix, scalar = results[number]
        assert matrix.dtype == np.float32 and scalar.dtype == np.float16
        np.testing.assert_array_equal(matrix, np.ones((2, 3)))
        assert scalar == 2.0
        assert results[f"error {number}"].startswith(
            "the ranks averaged different arrays in grads (collective #2): rank 0 gave "
            "shapes [(1,)], rank 1 [(2,)]")
