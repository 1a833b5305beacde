# batch_inference.py: the proposal's batch-inference example, on the digits held out by
# train.py. Run it as a job: `localdet job run inference.yaml .`
import numpy as np
from sklearn.datasets import load_digits

import determined as det
import determined.keras

context = det.keras.init()

# you can access values from your config's .data field
# which is just a dictionary of arbitrary user data
trial_id = context.config_data["trial_id"]

# load a model you trained in localdet
model = context.load_checkpoint_model(trial_id=trial_id)

digits = load_digits()
images = np.kron(digits.images, np.ones((4, 4)))[:, 2:30, 2:30] * 16.0
data = np.expand_dims(images[1500:].astype("float32") / 255, -1)
data = context.wrap_data(data)

batch_size = context.config_data["batch_size"]

# simple wrapper around model.predict()
predictions = context.predict(model, data, batch_size=batch_size, verbose=0)

# keep the predictions somewhere persistent
output = context.config_data.get("output", "predictions.npy")
np.save(output, predictions)
accuracy = float(np.mean(predictions.argmax(axis=1) == digits.target[1500:]))
print(f"wrote {len(predictions)} predictions to {output}; accuracy {accuracy:.3f}")
