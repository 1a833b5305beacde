"""Every built-in layer class Keras 2 (tf_keras) and Keras 3 share, in a handful of small
models, for tests/test_cross_line_layers.py. Importable in both lines: the Keras 2 trial
(model_def.py) builds the models, and the Keras 3 side reads the cases and the data.

A case is a layer class (by its `tf.keras.layers` name; "Name/variant" for a second use of
a class) with the kind of input it takes and a body that applies it (with arguments other
than its defaults where it has any). The cases of one group are branches of one model, one
input per kind, each ending in a Dense unit, concatenated into a Dense head.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Tuple

import numpy as np

SHAPES = {"vector": (8,), "sequence": (6, 4), "image": (8, 8, 3), "volume": (4, 4, 4, 2),
          "frames1d": (3, 6, 2), "frames2d": (3, 6, 6, 2), "frames3d": (2, 4, 4, 4, 1),
          "tokens": (5,), "strings": (3,), "text": (1,), "pair_a": (1,), "pair_b": (1,)}
DTYPES = {"tokens": "int64", "pair_a": "int64", "pair_b": "int64", "strings": "string",
          "text": "string"}
COLOURS = ["red", "green", "blue", "cyan"]
WORDS = ["the", "cat", "sat", "on", "mat"]

# Shared classes that no model here holds as a layer of its own: abstract bases, and the
# input layer every functional model holds (its Keras 3 class differs by name only).
NOT_CASES = {"Layer": "an abstract base", "Wrapper": "an abstract base",
             "InputLayer": "in every model"}
# Shared classes a case holds inside the layer it is named by.
INSIDE = {"RNN": ["StackedRNNCells", "SimpleRNNCell", "GRUCell", "LSTMCell"]}


def classes_of(case: str) -> List[str]:
    """The `tf.keras.layers` names of the classes the case's model holds for it."""
    name = case.split("/")[0]
    return [name, *INSIDE.get(name, [])]


def _cases(L: Any) -> Dict[str, Tuple[str, Callable[[Any], Any]]]:
    """name -> (input kind, body); `L` is the line's `tf.keras.layers`."""
    def pair(x: Dict[str, Any]) -> Tuple[Any, Any]:
        return x["pair_a"], x["pair_b"]

    return {
        # vectors
        "Dense": ("vector", lambda x: L.Dense(4, activation="hard_sigmoid")(x)),
        "Activation": ("vector", lambda x: L.Activation("selu")(x)),
        "ActivityRegularization": ("vector", lambda x: L.ActivityRegularization(0.01, 0.01)(x)),
        "Dropout": ("vector", lambda x: L.Dropout(0.3, seed=1)(x)),
        "AlphaDropout": ("vector", lambda x: L.AlphaDropout(0.2, seed=1)(x)),
        "GaussianDropout": ("vector", lambda x: L.GaussianDropout(0.2, seed=1)(x)),
        "GaussianNoise": ("vector", lambda x: L.GaussianNoise(0.1, seed=1)(x)),
        "BatchNormalization": ("vector", lambda x: L.BatchNormalization(momentum=0.9)(x)),
        "LayerNormalization": ("vector", lambda x: L.LayerNormalization(epsilon=0.01)(x)),
        "UnitNormalization": ("vector", lambda x: L.UnitNormalization()(x)),
        "GroupNormalization": ("vector", lambda x: L.GroupNormalization(groups=2)(x)),
        "ELU": ("vector", lambda x: L.ELU(alpha=0.5)(x)),
        "LeakyReLU": ("vector", lambda x: L.LeakyReLU(0.2)(x)),
        "PReLU": ("vector", lambda x: L.PReLU()(x)),
        "ReLU": ("vector", lambda x: L.ReLU(max_value=2.0, negative_slope=0.1,
                                            threshold=0.1)(x)),
        "Softmax": ("vector", lambda x: L.Softmax()(x)),
        "ThresholdedReLU": ("vector", lambda x: L.ThresholdedReLU(theta=0.5)(x)),
        "Identity": ("vector", lambda x: L.Identity()(x)),
        "Lambda": ("vector", lambda x: L.Lambda(lambda t: t * 2.0)(x)),
        "EinsumDense": ("vector", lambda x: L.EinsumDense("ab,bc->ac", output_shape=4,
                                                          bias_axes="c")(x)),
        "Normalization": ("vector", lambda x: L.Normalization(mean=0.5, variance=2.0)(x)),
        "Discretization": ("vector", lambda x: L.Discretization(
            bin_boundaries=[-0.5, 0.0, 0.5], output_mode="count")(x)),
        "RepeatVector": ("vector", lambda x: L.RepeatVector(2)(x)),
        "Reshape": ("vector", lambda x: L.Reshape((2, 4))(x)),
        "SpectralNormalization": ("vector", lambda x: L.SpectralNormalization(L.Dense(4))(x)),
        "Rescaling": ("vector", lambda x: L.Rescaling(0.5, offset=0.1)(x)),
        "Add": ("vector", lambda x: L.Add()([x, L.Dense(8)(x)])),
        "Subtract": ("vector", lambda x: L.Subtract()([x, L.Dense(8)(x)])),
        "Multiply": ("vector", lambda x: L.Multiply()([x, L.Dense(8)(x)])),
        "Average": ("vector", lambda x: L.Average()([x, L.Dense(8)(x)])),
        "Maximum": ("vector", lambda x: L.Maximum()([x, L.Dense(8)(x)])),
        "Minimum": ("vector", lambda x: L.Minimum()([x, L.Dense(8)(x)])),
        "Concatenate": ("vector", lambda x: L.Concatenate()([x, L.Dense(4)(x)])),
        "Dot": ("vector", lambda x: L.Dot(axes=1, normalize=True)([x, L.Dense(8)(x)])),
        # sequences
        "Masking": ("sequence", lambda x: L.LSTM(2)(L.Masking(mask_value=0.0)(x))),
        "Permute": ("sequence", lambda x: L.Permute((2, 1))(x)),
        "Flatten": ("sequence", lambda x: L.Flatten(data_format="channels_first")(x)),
        "Conv1D": ("sequence", lambda x: L.Conv1D(3, 2, padding="same", dilation_rate=2)(x)),
        "Conv1DTranspose": ("sequence", lambda x: L.Conv1DTranspose(3, 2, strides=2)(x)),
        "DepthwiseConv1D": ("sequence", lambda x: L.DepthwiseConv1D(2, depth_multiplier=2)(x)),
        "SeparableConv1D": ("sequence", lambda x: L.SeparableConv1D(3, 2)(x)),
        "AveragePooling1D": ("sequence", lambda x: L.AveragePooling1D(2)(x)),
        "MaxPooling1D": ("sequence", lambda x: L.MaxPooling1D(2, padding="same")(x)),
        "GlobalAveragePooling1D": ("sequence", lambda x: L.GlobalAveragePooling1D()(x)),
        "GlobalMaxPooling1D": ("sequence", lambda x: L.GlobalMaxPooling1D(keepdims=True)(x)),
        "Cropping1D": ("sequence", lambda x: L.Cropping1D((1, 2))(x)),
        "ZeroPadding1D": ("sequence", lambda x: L.ZeroPadding1D(1)(x)),
        "UpSampling1D": ("sequence", lambda x: L.UpSampling1D(2)(x)),
        "SpatialDropout1D": ("sequence", lambda x: L.SpatialDropout1D(0.3, seed=1)(x)),
        "SimpleRNN": ("sequence", lambda x: L.SimpleRNN(3, dropout=0.1,
                                                        recurrent_dropout=0.1)(x)),
        "GRU": ("sequence", lambda x: L.GRU(3, dropout=0.1, recurrent_dropout=0.1)(x)),
        "LSTM": ("sequence", lambda x: L.LSTM(3, dropout=0.1, recurrent_dropout=0.1,
                                              return_sequences=True)(x)),
        "RNN": ("sequence", lambda x: L.RNN(L.StackedRNNCells([
            L.SimpleRNNCell(3, dropout=0.1), L.GRUCell(3, dropout=0.1),
            L.LSTMCell(3, dropout=0.1)]))(x)),
        "Bidirectional": ("sequence", lambda x: L.Bidirectional(L.LSTM(2, dropout=0.1))(x)),
        "TimeDistributed": ("sequence", lambda x: L.TimeDistributed(L.Dense(2))(x)),
        "Attention": ("sequence", lambda x: L.Attention(dropout=0.1)([x, x])),
        "AdditiveAttention": ("sequence", lambda x: L.AdditiveAttention(dropout=0.1)([x, x])),
        "MultiHeadAttention": ("sequence", lambda x: L.MultiHeadAttention(
            2, 3, dropout=0.1)(x, x)),
        # frames
        "ConvLSTM1D": ("frames1d", lambda x: L.ConvLSTM1D(2, 3, dropout=0.1,
                                                          recurrent_dropout=0.1)(x)),
        "ConvLSTM2D": ("frames2d", lambda x: L.ConvLSTM2D(2, 3, dropout=0.1)(x)),
        "ConvLSTM3D": ("frames3d", lambda x: L.ConvLSTM3D(2, 3, dropout=0.1)(x)),
        # images
        "Conv2D": ("image", lambda x: L.Conv2D(2, 3, strides=2)(x)),
        "Conv2DTranspose": ("image", lambda x: L.Conv2DTranspose(2, 3, strides=2)(x)),
        "DepthwiseConv2D": ("image", lambda x: L.DepthwiseConv2D(3)(x)),
        "SeparableConv2D": ("image", lambda x: L.SeparableConv2D(2, 3)(x)),
        "AveragePooling2D": ("image", lambda x: L.AveragePooling2D()(x)),
        "MaxPooling2D": ("image", lambda x: L.MaxPooling2D()(x)),
        "GlobalAveragePooling2D": ("image", lambda x: L.GlobalAveragePooling2D()(x)),
        "GlobalMaxPooling2D": ("image", lambda x: L.GlobalMaxPooling2D()(x)),
        "Cropping2D": ("image", lambda x: L.Cropping2D(((1, 0), (2, 1)))(x)),
        "ZeroPadding2D": ("image", lambda x: L.ZeroPadding2D(1)(x)),
        "UpSampling2D": ("image", lambda x: L.UpSampling2D(2, interpolation="bilinear")(x)),
        "SpatialDropout2D": ("image", lambda x: L.SpatialDropout2D(0.3, seed=1)(x)),
        "CenterCrop": ("image", lambda x: L.CenterCrop(6, 6)(x)),
        "Resizing": ("image", lambda x: L.Resizing(4, 4)(x)),
        "RandomBrightness": ("image", lambda x: L.RandomBrightness(
            0.2, value_range=(-3, 3), seed=1)(x)),
        "RandomContrast": ("image", lambda x: L.RandomContrast(0.2, seed=1)(x)),
        "RandomCrop": ("image", lambda x: L.RandomCrop(6, 6, seed=1)(x)),
        "RandomFlip": ("image", lambda x: L.RandomFlip(seed=1)(x)),
        "RandomHeight": ("image", lambda x: L.GlobalAveragePooling2D()(
            L.RandomHeight(0.2, seed=1)(x))),
        "RandomRotation": ("image", lambda x: L.RandomRotation(0.1, seed=1)(x)),
        "RandomTranslation": ("image", lambda x: L.RandomTranslation(0.1, 0.1, seed=1)(x)),
        "RandomWidth": ("image", lambda x: L.GlobalAveragePooling2D()(
            L.RandomWidth(0.2, seed=1)(x))),
        "RandomZoom": ("image", lambda x: L.RandomZoom(0.1, seed=1)(x)),
        # volumes
        "Conv3D": ("volume", lambda x: L.Conv3D(2, 2)(x)),
        "Conv3DTranspose": ("volume", lambda x: L.Conv3DTranspose(2, 2, strides=2)(x)),
        "AveragePooling3D": ("volume", lambda x: L.AveragePooling3D()(x)),
        "MaxPooling3D": ("volume", lambda x: L.MaxPooling3D()(x)),
        "GlobalAveragePooling3D": ("volume", lambda x: L.GlobalAveragePooling3D()(x)),
        "GlobalMaxPooling3D": ("volume", lambda x: L.GlobalMaxPooling3D()(x)),
        "Cropping3D": ("volume", lambda x: L.Cropping3D(1)(x)),
        "ZeroPadding3D": ("volume", lambda x: L.ZeroPadding3D(1)(x)),
        "UpSampling3D": ("volume", lambda x: L.UpSampling3D(2)(x)),
        "SpatialDropout3D": ("volume", lambda x: L.SpatialDropout3D(0.3, seed=1)(x)),
        # lookups
        "Embedding": ("tokens", lambda x: L.Embedding(10, 3)(x)),
        "CategoryEncoding": ("tokens", lambda x: L.CategoryEncoding(10, output_mode="count")(x)),
        "IntegerLookup": ("tokens", lambda x: L.IntegerLookup(
            vocabulary=[1, 2, 3, 5], output_mode="multi_hot")(x)),
        "Hashing": ("tokens", lambda x: L.CategoryEncoding(4, output_mode="multi_hot")(
            L.Hashing(4, salt=7)(x))),
        "HashedCrossing": ("pair", lambda x: L.HashedCrossing(5, output_mode="one_hot")(
            pair(x))),
        "StringLookup": ("strings", lambda x: L.StringLookup(vocabulary=COLOURS,
                                                             output_mode="count")(x)),
        "TextVectorization": ("text", lambda x: L.Embedding(8, 2)(L.TextVectorization(
            max_tokens=8, output_sequence_length=4, vocabulary=WORDS)(x))),
        "TextVectorization/tf_idf": ("text", lambda x: L.TextVectorization(
            max_tokens=8, output_mode="tf_idf", vocabulary=WORDS,
            idf_weights=[1.0, 1.5, 2.0, 2.5, 3.0])(x)),
    }


# Shared classes whose Keras 2 checkpoint Keras 3 still cannot host as Keras 2 did, each in a
# model of its own, and why.
UNLOADABLE = {
    "Lambda": "Keras 3 refuses to read a Python lambda's bytecode from an .h5 unless the "
              "loading process enables unsafe deserialization "
              "(keras.config.enable_unsafe_deserialization()), as its error says",
    "RandomCrop": "Keras 3's RandomCrop passes images through uncropped at inference, where "
                  "Keras 2's crops their centre, so the layers after it receive another shape",
    "TextVectorization/tf_idf": "Keras 3's TextVectorization keeps TF-IDF weights out of its "
                                "weights, so the Keras 2 .h5's weight for them has no layer "
                                "to go to",
}
_KIND_GROUPS = {"vector": "vectors", "sequence": "sequences", "frames1d": "frames",
                "frames2d": "frames", "frames3d": "frames", "image": "images",
                "volume": "volumes", "tokens": "lookups", "strings": "lookups",
                "text": "lookups", "pair": "lookups"}


def groups() -> Dict[str, List[str]]:
    """group -> its cases: one group per kind of input, and one per unloadable case."""
    import tensorflow as tf

    out: Dict[str, List[str]] = {}
    for name, (kind, _) in _cases(tf.keras.layers).items():
        group = name if name in UNLOADABLE else _KIND_GROUPS[kind]
        out.setdefault(group, []).append(name)
    return out


def case_names() -> List[str]:
    import tensorflow as tf

    return list(_cases(tf.keras.layers))


def _input_kinds(kind: str) -> List[str]:
    return ["pair_a", "pair_b"] if kind == "pair" else [kind]


def build(group: str) -> Any:
    """The group's model, uncompiled."""
    import tensorflow as tf

    L = tf.keras.layers
    cases = _cases(L)
    names = groups()[group]
    kinds = sorted({k for name in names for k in _input_kinds(cases[name][0])})
    inputs = {kind: tf.keras.Input(SHAPES[kind], dtype=DTYPES.get(kind, "float32"), name=kind)
              for kind in kinds}
    branches = []
    for name in names:
        kind, body = cases[name]
        out = body(inputs if kind == "pair" else inputs[kind])
        if len(out.shape) > 2:
            out = L.Flatten()(out)
        branches.append(L.Dense(1)(out))
    merged = branches[0] if len(branches) == 1 else L.Concatenate()(branches)
    return tf.keras.Model(inputs, L.Dense(2)(merged))


def data(group: str, rows: int, seed: int) -> Tuple[Dict[str, np.ndarray], np.ndarray]:
    """Inputs by kind for the group's model, and regression targets."""
    import tensorflow as tf

    cases = _cases(tf.keras.layers)
    kinds = sorted({k for name in groups()[group] for k in _input_kinds(cases[name][0])})
    rng = np.random.default_rng(seed)
    x: Dict[str, np.ndarray] = {}
    for kind in kinds:
        if kind in ("tokens", "pair_a", "pair_b"):
            x[kind] = rng.integers(0, 10, (rows,) + SHAPES[kind]).astype("int64")
        elif kind == "strings":
            x[kind] = rng.choice(COLOURS + ["other"], (rows,) + SHAPES[kind])
        elif kind == "text":
            x[kind] = np.array([[" ".join(rng.choice(WORDS + ["dog"], 4))]
                                for _ in range(rows)])
        else:
            x[kind] = rng.normal(size=(rows,) + SHAPES[kind]).astype("float32")
    return x, rng.normal(size=(rows, 2)).astype("float32")
