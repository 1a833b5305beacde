"""A GAN-like model written the way Determined's GAN example was: a `keras.Model` subclass
holding two sub-models, with its own `train_step`/`test_step`, two wrapped optimizers and a
`compile` that takes its own arguments (`generator_optimizer=`, `discriminator_optimizer=`,
`loss_fn=`) instead of Keras's.

The data are generated: "real" samples from a fixed Gaussian, and the generator's noise comes
with each batch rather than from a random op inside `train_step`, so a run on several slots
(each rank its share of every global batch, gradients averaged) sees exactly the global
batches of a one-slot run. No batch normalisation or dropout, for the same reason. Trains in
seconds on a CPU, under either Keras line.
"""

import numpy as np
import tensorflow as tf

from determined import keras

FEATURES = 4


def make_data(seed: int, rows: int, noise_dim: int):
    """(real samples, generator noise): real ones centred on (1, -1, 2, 0.5)."""
    rng = np.random.default_rng(seed)
    centre = np.array([1.0, -1.0, 2.0, 0.5], dtype="float32")
    real = (centre + 0.3 * rng.normal(size=(rows, FEATURES))).astype("float32")
    noise = rng.normal(size=(rows, noise_dim)).astype("float32")
    return real, noise


class TinyGan(tf.keras.Model):
    """A generator and a discriminator, trained against each other one step each."""

    def __init__(self, noise_dim: int, hidden: int):
        super().__init__()
        self.generator = tf.keras.Sequential([
            tf.keras.Input(shape=(noise_dim,)),
            tf.keras.layers.Dense(hidden, activation="tanh"),
            tf.keras.layers.Dense(FEATURES),
        ], name="generator")
        self.discriminator = tf.keras.Sequential([
            tf.keras.Input(shape=(FEATURES,)),
            tf.keras.layers.Dense(hidden, activation="tanh"),
            tf.keras.layers.Dense(1),
        ], name="discriminator")
        # A weight of the model itself (not of a sub-model), and not trainable.
        self.steps_trained = self.add_weight(name="steps_trained", shape=(),
                                             initializer="zeros", trainable=False)
        self.d_loss_tracker = tf.keras.metrics.Mean(name="d_loss")
        self.g_loss_tracker = tf.keras.metrics.Mean(name="g_loss")

    def compile(self, generator_optimizer, discriminator_optimizer, loss_fn,
                real_label: float = 1.0):
        super().compile()
        self.generator_optimizer = generator_optimizer
        self.discriminator_optimizer = discriminator_optimizer
        self.loss_fn = loss_fn
        self.real_label = real_label

    @property
    def metrics(self):
        return [self.d_loss_tracker, self.g_loss_tracker]

    def call(self, noise, training=None):
        return self.generator(noise, training=training)

    def _scores_to_losses(self, real, noise, training):
        fake = self.generator(noise, training=training)
        real_score = self.discriminator(real, training=training)
        fake_score = self.discriminator(fake, training=training)
        real_target = tf.fill(tf.shape(real_score), self.real_label)
        d_loss = (self.loss_fn(real_target, real_score)
                  + self.loss_fn(tf.zeros_like(fake_score), fake_score))
        g_loss = self.loss_fn(tf.fill(tf.shape(fake_score), self.real_label), fake_score)
        return d_loss, g_loss

    def train_step(self, data):
        real, noise = data
        with tf.GradientTape() as d_tape, tf.GradientTape() as g_tape:
            d_loss, g_loss = self._scores_to_losses(real, noise, training=True)
        d_variables = self.discriminator.trainable_variables
        g_variables = self.generator.trainable_variables
        d_gradients = d_tape.gradient(d_loss, d_variables)
        g_gradients = g_tape.gradient(g_loss, g_variables)
        self.discriminator_optimizer.apply_gradients(zip(d_gradients, d_variables, strict=True))
        self.generator_optimizer.apply_gradients(zip(g_gradients, g_variables, strict=True))
        self.steps_trained.assign_add(1.0)
        self.d_loss_tracker.update_state(d_loss)
        self.g_loss_tracker.update_state(g_loss)
        return {m.name: m.result() for m in self.metrics}

    def test_step(self, data):
        real, noise = data
        d_loss, g_loss = self._scores_to_losses(real, noise, training=False)
        self.d_loss_tracker.update_state(d_loss)
        self.g_loss_tracker.update_state(g_loss)
        return {m.name: m.result() for m in self.metrics}


class GanTrial(keras.TFKerasTrial):
    def __init__(self, context: keras.TFKerasTrialContext) -> None:
        self.context = context

    def build_model(self) -> tf.keras.Model:
        model = self.context.wrap_model(TinyGan(noise_dim=self.context.get_hparam("noise_dim"),
                                                hidden=self.context.get_hparam("hidden")))
        generator_optimizer = self.context.wrap_optimizer(
            tf.keras.optimizers.Adam(learning_rate=self.context.get_hparam("generator_lr")))
        discriminator_optimizer = self.context.wrap_optimizer(
            tf.keras.optimizers.Adam(learning_rate=self.context.get_hparam("discriminator_lr")))
        model.compile(discriminator_optimizer=discriminator_optimizer,
                      generator_optimizer=generator_optimizer,
                      loss_fn=tf.keras.losses.BinaryCrossentropy(from_logits=True))
        return model

    def _dataset(self, seed: int, rows: int) -> tf.data.Dataset:
        real, noise = make_data(seed, rows, self.context.get_hparam("noise_dim"))
        dataset = self.context.wrap_dataset(tf.data.Dataset.from_tensor_slices((real, noise)))
        return dataset.batch(self.context.get_per_slot_batch_size())

    def build_training_data_loader(self) -> keras.InputData:
        return self._dataset(seed=0, rows=512)

    def build_validation_data_loader(self) -> keras.InputData:
        return self._dataset(seed=1, rows=128)
