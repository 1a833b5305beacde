# train.py
# The New Keras API proposal's training script (Determined's "New Keras API", itself taken
# from the Keras MNIST example), run as written except for:
#   - data loading: scikit-learn's digits (ships with the package) upsampled to MNIST's
#     28x28, instead of keras.datasets.mnist.load_data(), which downloads;
#   - `epochs=20` and `validation_data=` in the fit call, where the proposal leaves "...";
#   - two typos of the proposal: a missing comma after the Dropout layer, and
#     `hist.score['val_acc']` (a History has `.history`, and Keras names it val_accuracy).

import numpy as np
from tensorflow import keras
from tensorflow.keras import layers

import determined as det
import determined.keras

# this step will also initialize random seeds automatically
context = det.keras.init()

# get the hyperparameters for this trial
hparams = context.training.hparams

# model code is straight from keras mnist example
num_classes = 10
input_shape = (28, 28, 1)

# -- data loading (changed: digits instead of a download) ---------------------------------
from sklearn.datasets import load_digits  # noqa: E402

digits = load_digits()
images = np.kron(digits.images, np.ones((4, 4)))[:, 2:30, 2:30] * 16.0  # 8x8 -> 28x28, 0..255
split = 1500
(x_train, y_train), (x_test, y_test) = ((images[:split], digits.target[:split]),
                                        (images[split:], digits.target[split:]))
# -- end of data loading --------------------------------------------------------------------

x_train = x_train.astype("float32") / 255
x_test = x_test.astype("float32") / 255
x_train = np.expand_dims(x_train, -1)
x_test = np.expand_dims(x_test, -1)

y_train = keras.utils.to_categorical(y_train, num_classes)
y_test = keras.utils.to_categorical(y_test, num_classes)

# calling context.wrap_data() will ensure your data is sharded for distributed
# training, and it is basically a noop when you are on a single gpu
x_train, y_train = context.wrap_data(x_train, y_train)
x_test, y_test = context.wrap_data(x_test, y_test)

model = keras.Sequential(
    [
        keras.Input(shape=input_shape),
        layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Conv2D(64, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Flatten(),
        # example: suppose you wanted to tune dropout as a hyperparameter:
        layers.Dropout(hparams["dropout"]),
        layers.Dense(num_classes, activation="softmax"),
    ]
)

model.summary()

# learning rate is commonly set as a hyperparameter
optimizer = keras.optimizers.SGD(hparams["learning_rate"])

# calling context.wrap_optimizer() does two things:
#   - ensures the optimizer state is saved in checkpoints
#   - wraps the keras optimizer in a Horovod optimizer
#     (only during distributed training)
optimizer = context.wrap_optimizer(optimizer)

model.compile(
    loss="categorical_crossentropy",
    optimizer=optimizer,
    metrics=["accuracy"]
)

# batch_size is a commonly set as a hyperparameter
global_batch_size = hparams["global_batch_size"]

# Optional for distributed training: cacluate this worker's
# batch_size so that the effective batch_size across all workers
# remains constant.  If you choose not to use this, the
# effective batch_size will be multiplied by the number slots_per_trial.
batch_size = context.distributed.shard_batch_size(global_batch_size)

# Our keras support requires that you pass validation data into fit()
# rather than using separate fit() and evaluate() calls.
hist = context.fit(
    model,
    x=x_train,
    y=y_train,
    batch_size=batch_size,
    epochs=20,  # ignored under localdet when the searcher sets a length
    validation_data=(x_test, y_test),
)

print("Test loss:", hist.history['val_loss'][-1])
print("Test accuracy:", hist.history['val_accuracy'][-1])
