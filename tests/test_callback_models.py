"""DeterminedCallback (a plain `model.fit`, Determined's Core API form) on models Keras 3
will not save or load weights for until they are built: a subclassed model whose layers
make their weights on its first call, resumed into a model not built yet; and a GAN-like
model whose own `train_step` trains two sub-models with two optimizers, so that the model
itself is never called. Each is preempted, resumed, and compared with a straight run, and
its checkpoint read back with `model.load_weights` as Determined documented."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from test_core_api import _Recorder

from determined.keras import DeterminedCallback

pytestmark = pytest.mark.keras2  # and again under Keras 2 (tests/test_keras_2_line.py)

KERAS2 = tf.keras.__name__.startswith("tf_keras")
if KERAS2:
    # Keras 2's dropout otherwise draws from stateful ops whose sequences restart in a
    # resumed process; with TensorFlow's generators a checkpoint carries their states.
    tf.keras.backend.experimental.enable_tf_random_generator()
# Keras 2 shuffles arrays with a stateful op in the dataset, which starts over in a resumed
# process (data order is kept only unshuffled there); Keras 3 from seeded generators.
SHUFFLE = not KERAS2


class Recommender(tf.keras.Model):
    """Embeddings of a (user, item) pair, as keras.io's collaborative filtering builds;
    no build(), so nothing exists before the first call."""

    def __init__(self):
        super().__init__()
        self.users = tf.keras.layers.Embedding(12, 4)
        self.items = tf.keras.layers.Embedding(9, 4)
        self.dropout = tf.keras.layers.Dropout(0.25)
        self.out = tf.keras.layers.Dense(1)

    def call(self, pairs, training=False):
        joined = tf.concat([self.users(pairs[:, 0]), self.items(pairs[:, 1])], axis=-1)
        return self.out(self.dropout(joined, training=training))


class TinyGan(tf.keras.Model):
    """A generator and a discriminator, each with its own optimizer, trained by the
    model's own `train_step`; `call` (the discriminator) is never run by fit."""

    def __init__(self):
        super().__init__()
        self.generator = tf.keras.Sequential([tf.keras.Input((2,)),
                                              tf.keras.layers.Dense(3)], name="generator")
        self.discriminator = tf.keras.Sequential(
            [tf.keras.Input((3,)), tf.keras.layers.Dense(4, activation="relu"),
             tf.keras.layers.Dense(1)], name="discriminator")

    def compile(self, d_optimizer, g_optimizer):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer

    def call(self, samples):
        return self.discriminator(samples)

    def train_step(self, data):
        # The noise comes with the data: an unseeded random op in a step restarts its
        # sequence in a resumed process, under Determined as here.
        real, noise = data["real"], data["noise"]
        loss = tf.keras.losses.BinaryCrossentropy(from_logits=True)
        with tf.GradientTape() as tape:
            fake = self.generator(noise)
            scores = self.discriminator(tf.concat([fake, real], axis=0))
            labels = tf.concat([tf.ones_like(scores[:4]), tf.zeros_like(scores[4:])], axis=0)
            d_loss = loss(labels, scores)
        weights = self.discriminator.trainable_weights
        grads = tape.gradient(d_loss, weights)
        self.d_optimizer.apply_gradients(zip(grads, weights, strict=True))
        with tf.GradientTape() as tape:
            scores = self.discriminator(self.generator(noise))
            g_loss = loss(tf.zeros_like(scores), scores)
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights, strict=True))
        return {"d_loss": d_loss, "g_loss": g_loss}


def _recommender(optimizer=None):
    model = Recommender()
    model.compile(loss="mse", optimizer=optimizer or tf.keras.optimizers.Adam(0.05))
    return model


def _gan():
    model = TinyGan()
    model.compile(d_optimizer=tf.keras.optimizers.Adam(0.01),
                  g_optimizer=tf.keras.optimizers.SGD(0.05, momentum=0.9))
    return model


def _pairs():
    rng = np.random.default_rng(3)
    x = np.stack([rng.integers(0, 12, 48), rng.integers(0, 9, 48)], axis=1).astype("int32")
    y = ((x[:, :1] % 3 + x[:, 1:] % 4) / 5.0).astype("float32")
    return x, y


def _gan_data():
    rng = np.random.default_rng(4)
    return {"real": rng.normal(1.0, 0.5, (32, 3)).astype("float32"),
            "noise": rng.normal(size=(32, 2)).astype("float32")}


def fit(kind: str, folder: Path, epochs: int, checkpoint=None, preempt_after_epochs=None,
        continue_id=1, rows=48, optimizer=None):
    """A fresh model of `kind` fitted under DeterminedCallback; (events, the model)."""
    core = _Recorder(folder)
    core.preempt_after_epochs = preempt_after_epochs
    tf.keras.utils.set_random_seed(11)
    callback = DeterminedCallback(core, checkpoint=checkpoint, continue_id=continue_id)
    if kind == "recommender":
        model = _recommender(optimizer)
        x, y = _pairs()
        model.fit(x[:rows], y[:rows], batch_size=8, epochs=epochs, verbose=0, shuffle=SHUFFLE,
                  callbacks=[callback])
    else:
        model = _gan()
        model.fit(_gan_data(), batch_size=4, epochs=epochs, verbose=0, shuffle=False,
                  callbacks=[callback])
    return core.events, model


def _values(model):
    return [np.asarray(w) for w in model.get_weights()]


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def _weights_file(folder: Path) -> Path:
    # As Determined documented under Keras 2; Keras 3 reads weights only by a file's suffix.
    return folder / ("model_checkpoint" if KERAS2 else "model_checkpoint.weights.h5")


@pytest.mark.parametrize("kind", ["recommender", "gan"])
def test_a_preempted_fit_resumes_to_the_straight_runs_weights(kind, tmp_path):
    _, paused = fit(kind, tmp_path, epochs=3, preempt_after_epochs=1)
    saved = [path.parent for path in tmp_path.glob("*/metadata.json")]
    assert len(saved) == 1  # preempted after epoch 1, checkpointed there
    assert Path(f"{_weights_file(saved[0])}{'.index' if KERAS2 else ''}").exists()

    events, resumed = fit(kind, tmp_path, epochs=3, checkpoint=saved[0].name)
    batches = 6 if kind == "recommender" else 8
    assert [steps for group, (steps, _) in
            ((k, v) for k, v in events if k == "training")] == [2 * batches, 3 * batches]
    _, straight = fit(kind, tmp_path / "straight", epochs=3)
    assert _same(_values(resumed), _values(straight))
    if kind == "gan":  # the optimizers' states came back as well
        for name in ("d_optimizer", "g_optimizer"):
            assert _same([np.asarray(v) for v in getattr(resumed, name).variables],
                         [np.asarray(v) for v in getattr(straight, name).variables])

    # Read back as a user would: the model built by calling it on a batch, then loaded.
    model = _recommender() if kind == "recommender" else _gan()
    model(_pairs()[0][:2] if kind == "recommender" else _gan_data()["real"][:2])
    before = _values(model)
    model.load_weights(_weights_file(saved[0]))
    assert _same(_values(model), _values(paused))
    assert not _same(before, _values(paused))


def test_a_warm_start_loads_into_a_model_not_built_yet(tmp_path):
    """Another continue_id: the weights only, from epoch 0, loaded before the first batch
    trains (the batch builds the model): as if loaded into a model built by hand."""
    sgd = tf.keras.optimizers.SGD
    _, first = fit("recommender", tmp_path, epochs=1, optimizer=sgd(0.1))
    saved = next(tmp_path.glob("*/metadata.json")).parent
    events, warm = fit("recommender", tmp_path, epochs=1, checkpoint=saved.name,
                       continue_id=2, rows=8, optimizer=sgd(0.1))
    assert [value[0] for kind, value in events if kind == "training"] == [1]

    tf.keras.utils.set_random_seed(11)
    by_hand = _recommender(sgd(0.1))
    x, y = _pairs()
    if not KERAS2:  # which restores into variables made later, as at the first batch
        by_hand(x[:2])
    by_hand.load_weights(_weights_file(saved))
    by_hand.fit(x[:8], y[:8], batch_size=8, epochs=1, verbose=0, shuffle=SHUFFLE)
    assert _same(_values(warm), _values(by_hand))
    assert not _same(_values(warm), _values(first))


KERAS3_MODEL_IN_A_KERAS2_PROCESS = '''
import sys
from pathlib import Path

import keras  # Keras 3 even on the Keras 2 line: a cold script launch does not alias it
import numpy as np
import tensorflow as tf

sys.path.insert(0, sys.argv[2])
from test_core_api import _Recorder

from determined.keras import DeterminedCallback

assert tf.keras.__name__.startswith("tf_keras") and not keras.__name__.startswith("tf_keras")


def fit(folder, epochs, checkpoint=None, preempt_after_epochs=None):
    core = _Recorder(Path(folder))
    core.preempt_after_epochs = preempt_after_epochs
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    model.fit(x, x.sum(axis=1), batch_size=8, epochs=epochs, verbose=0, shuffle=False,
              callbacks=[DeterminedCallback(core, checkpoint=checkpoint, continue_id=1)])
    return model


root = Path(sys.argv[1])
fit(root / "paused", 2, preempt_after_epochs=1)
saved = [p.parent.name for p in (root / "paused").glob("*/model_checkpoint.weights.h5")]
resumed = fit(root / "paused", 2, checkpoint=saved[0])
straight = fit(root / "straight", 2)
same = all(np.array_equal(a, b) for a, b in zip(resumed.get_weights(), straight.get_weights()))
print("saved", len(saved), "same", same)
'''


def test_a_keras_3_model_in_a_keras_2_process_is_saved_and_resumed_as_keras_3(tmp_path):
    """A Core API script started cold on the Keras 2 line whose `import keras` is Keras 3:
    the model's own line decides the checkpoint's form (its weights in `.weights.h5`)."""
    import os
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", KERAS3_MODEL_IN_A_KERAS2_PROCESS, str(tmp_path),
         str(Path(__file__).parent)],
        env={**os.environ, "TF_USE_LEGACY_KERAS": "1"}, capture_output=True, text=True,
        timeout=300)
    assert "saved 1 same True" in result.stdout, result.stdout[-2000:] + result.stderr[-3000:]
