"""determined.keras: train a tf.keras model the way Determined did, on one machine.

The New Keras API (a plain training script):

    context = det.keras.init()
    history = context.fit(model, x, y, validation_data=(x_val, y_val))

or a TFKerasTrial class:

    from determined import keras

    class MyTrial(keras.TFKerasTrial):
        def __init__(self, context): self.context = context
        def build_model(self): ...
        def build_training_data_loader(self): ...
        def build_validation_data_loader(self): ...

The Keras line is whatever `tf.keras` is in the process: Keras 3 by default, Keras 2
(`tf-keras`) with `TF_USE_LEGACY_KERAS=1`.
"""

from determined.keras._backend import is_tensorflow as _is_tensorflow

if _is_tensorflow():
    from determined.keras import callbacks
    from determined.keras._adapters import (
        _adapt_data_from_data_loader,
        _adapt_data_from_fit_args,
        _ArrayLikeAdapter,
    )
    from determined.keras._aggregation import _check_if_aggregation_frequency_will_work
    from determined.keras._callback import DeterminedCallback, TensorBoard
    from determined.keras._context import (
        TFKerasExperimentalContext,
        TFKerasTrainConfig,
        TFKerasTrialContext,
    )
    from determined.keras._enqueuer import _build_enqueuer, _Enqueuer, _Sampler
    from determined.keras._init import init
    from determined.keras._keras_context import KerasContext, TrainingContext
    from determined.keras._load import (
        load_model_from_checkpoint_path,
        load_weights_from_checkpoint_path,
    )
    from determined.keras._rng import get_rng_state, set_rng_state
    from determined.keras._sequence import KerasDataAdapter, SequenceAdapter
    from determined.keras._trial import TFKerasTrial
    from determined.keras._types import (
        ArrayLike,
        InputData,
        TFKerasNativeContext,
        TFKerasTrialController,
    )

    # Determined's docs name the context both ways.
    TFKerasContext = TFKerasTrialContext
    # Older Determined put the trial's TensorBoard callback here too (0.38's `TensorBoard` here
    # is the Core API's, from _callback).
    TFKerasTensorBoard = callbacks.TensorBoard

else:
    # Keras's JAX or PyTorch backend (KERAS_BACKEND): the New Keras API without TensorFlow.
    # What only TensorFlow runs (TFKerasTrial, the Core API's DeterminedCallback, ...) says
    # so in one sentence when it is reached for (__getattr__ below).
    from determined.keras._backend_context import (  # type: ignore[assignment]
        BackendKerasContext as KerasContext,
    )
    from determined.keras._backend_context import TrainingContext
    from determined.keras._init import init
    from determined.keras._load import (
        load_model_from_checkpoint_path,
        load_weights_from_checkpoint_path,
    )

    def __getattr__(name: str):  # type: ignore[no-redef]
        if name in __all__:
            from determined.keras._backend import tensorflow_only

            raise tensorflow_only(f"determined.keras.{name}")
        raise AttributeError(f"module 'determined.keras' has no attribute '{name}'")

__all__ = [
    "TFKerasTrial",
    "init",
    "KerasContext",
    "TrainingContext",
    "TFKerasTrialContext",
    "TFKerasContext",
    "TFKerasExperimentalContext",
    "callbacks",
    "load_model_from_checkpoint_path",
    "load_weights_from_checkpoint_path",  # localdet's: a script's checkpoint of weights alone
    "SequenceAdapter",
    "KerasDataAdapter",
    "ArrayLike",
    "InputData",
    "TFKerasTrainConfig",
    "TFKerasTrialController",
    "TFKerasNativeContext",
    "TFKerasTensorBoard",
    "TensorBoard",
    "DeterminedCallback",
    "get_rng_state",
    "set_rng_state",
    # Determined exported these underscore names too; its own test trials use them.
    "_ArrayLikeAdapter",
    "_adapt_data_from_data_loader",
    "_adapt_data_from_fit_args",
    "_Enqueuer",
    "_Sampler",
    "_build_enqueuer",
    "_check_if_aggregation_frequency_will_work",
]
