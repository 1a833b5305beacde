"""Checkpoints cross Keras lines compiled: every built-in loss and metric class that Keras 2
(tf_keras) and Keras 3 share, by name and as objects with arguments, recorded as each
line's `.h5` records it and translated for the other gives the same values there; checkpoints
the harness writes under each line load under the other and evaluate to the validation
metrics recorded; and a model whose code or layers need the other line is built there.

One Keras 2 subprocess does all the Keras 2 side (tests/cross_line/other_line.py); the
Keras 3 side runs in this process. The translation rules themselves are tested without
TensorFlow first.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

CROSS = Path(__file__).parent / "cross_line"
KERAS = Path(__file__).parent.parent / "harness" / "determined" / "keras"


def _by_path(name: str, path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


# The translation modules by their files: `determined.keras` would start TensorFlow, and
# they need none.
_compile_translation = _by_path("cross_line_compile_translation",
                                KERAS / "_compile_translation.py")
_architecture_translation = _by_path("cross_line_architecture_translation",
                                     KERAS / "_architecture_translation.py")
ArchitectureNotTranslatable = _architecture_translation.ArchitectureNotTranslatable
keras3_model_config_for_keras2 = _architecture_translation.keras3_model_config_for_keras2
FUNCTIONS_ONLY_IN = _compile_translation.FUNCTIONS_ONLY_IN
ONLY_IN = _compile_translation.ONLY_IN
translate_training_config = _compile_translation.translate_training_config


# -- the translation rules, without TensorFlow ------------------------------------------
KERAS2_RECORDED = {  # what tf_keras writes for the model, after training
    "loss": {"class_name": "SparseCategoricalCrossentropy",
             "config": {"reduction": "auto", "name": "sparse_categorical_crossentropy",
                        "from_logits": True, "ignore_class": None,
                        "fn": "sparse_categorical_crossentropy"}},
    "metrics": [[{"class_name": "MeanMetricWrapper",
                  "config": {"name": "acc", "dtype": "float32",
                             "fn": "sparse_categorical_accuracy"}},
                 {"class_name": "SparseTopKCategoricalAccuracy",
                  "config": {"name": "top2", "dtype": "float32", "k": 2}}]],
    "weighted_metrics": None, "loss_weights": None,
    "optimizer_config": {"class_name": "Custom>Adam",
                         "config": {"name": "Adam", "learning_rate": 0.01, "jit_compile": False,
                                    "is_legacy_optimizer": False, "beta_1": 0.9}},
}


def test_a_keras2_loss_with_its_function_and_auto_reduction_translates_for_keras3():
    args = translate_training_config(KERAS2_RECORDED, "keras3")
    assert args.compile and args.notes == []
    assert args.loss == {"class_name": "SparseCategoricalCrossentropy",
                         "config": {"reduction": "sum_over_batch_size",
                                    "name": "sparse_categorical_crossentropy",
                                    "from_logits": True, "ignore_class": None}}
    # "acc" keeps its name (the evaluated metric's key) and the function it stood for.
    assert args.metrics[0][0] == {"class_name": "MeanMetricWrapper",
                                  "config": {"name": "acc", "dtype": "float32",
                                             "fn": "sparse_categorical_accuracy"}}
    assert args.optimizer == {"class_name": "Adam",
                              "config": {"name": "Adam", "learning_rate": 0.01,
                                         "beta_1": 0.9}}


def test_keras3_arguments_keras2_lacks_are_dropped_at_their_defaults_and_named_otherwise():
    recorded = {
        "loss": {"class_name": "SparseCategoricalCrossentropy",
                 "config": {"name": "scce", "reduction": "mean", "from_logits": True,
                            "ignore_class": None, "axis": -1, "dtype": None}},
        "metrics": ["acc", {"class_name": "MeanIoU",
                            "config": {"num_classes": 3, "dtype": "int64", "name": "iou"}},
                    {"class_name": "SparseTopKCategoricalAccuracy",
                     "config": {"name": "top", "k": 2, "from_sorted_ids": True}}],
        "optimizer_config": {"class_name": "Adam",
                             "config": {"learning_rate": 0.1, "loss_scale_factor": None,
                                        "gradient_accumulation_steps": 4}},
    }
    args = translate_training_config(recorded, "keras2")
    assert args.loss["config"] == {"name": "scce", "reduction": "sum_over_batch_size",
                                   "from_logits": True, "ignore_class": None}
    assert args.metrics[0] == "acc"
    assert args.metrics[1]["config"] == {"num_classes": 3, "name": "iou"}
    assert "from_sorted_ids" not in args.metrics[2]["config"]
    assert args.optimizer == {"class_name": "Adam", "config": {"learning_rate": 0.1}}
    assert len(args.notes) == 2
    assert "'SparseTopKCategoricalAccuracy' has from_sorted_ids=True" in args.notes[0]
    assert "gradient_accumulation_steps=4 has no Keras 2 equivalent" in args.notes[1]


def test_what_has_no_equivalent_is_named_a_metric_left_out_a_loss_leaves_it_uncompiled():
    metrics = ["mae", {"class_name": "PearsonCorrelation", "config": {"name": "r"}},
               "pearson_correlation"]
    args = translate_training_config({"loss": "mse", "metrics": metrics}, "keras2")
    assert args.compile and args.metrics == ["mae"]
    assert args.notes == [
        "the metric class 'PearsonCorrelation' has no Keras 2 equivalent and is left out",
        "the metric 'pearson_correlation' has no Keras 2 equivalent and is left out"]
    args = translate_training_config(
        {"loss": {"class_name": "Dice", "config": {}}, "metrics": ["mae"]}, "keras2")
    assert not args.compile
    assert args.notes == ["the loss class 'Dice' has no Keras 2 equivalent, so the model is "
                          "returned uncompiled: compile it with a loss of your choice"]
    # A custom object of the same name is the trial's own: passed through.
    args = translate_training_config({"loss": {"class_name": "Dice", "config": {"a": 1}}},
                                     "keras2", custom_names=frozenset({"Dice"}))
    assert args.compile and args.loss == {"class_name": "Dice", "config": {"a": 1}}
    # Keras 2's shape-chosen "ce" becomes a function Keras 3 chooses by shape too.
    args = translate_training_config({"loss": "mse", "metrics": ["ce", "kld"]}, "keras3")
    assert [m["config"] for m in args.metrics] == [{"fn": "crossentropy", "name": "ce"},
                                                    {"fn": "kl_divergence", "name": "kld"}]


def test_a_keras3_functional_architecture_is_rewritten_in_keras2s_form():
    tensor = {"class_name": "__keras_tensor__",
              "config": {"shape": [None, 4], "dtype": "float32",
                         "keras_history": ["dense", 0, 0]}}
    policy = {"module": "keras", "class_name": "DTypePolicy",
              "config": {"name": "float32"}, "registered_name": None}
    config = {"class_name": "Functional", "config": {
        "name": "f", "input_layers": ["input_layer", 0, 0],
        "output_layers": ["add", 0, 0],
        "layers": [
            {"class_name": "InputLayer", "name": "input_layer", "inbound_nodes": [],
             "config": {"batch_shape": [None, 4], "dtype": "float32", "optional": False,
                        "name": "input_layer"}},
            {"class_name": "Add", "name": "add",
             "config": {"name": "add", "dtype": policy},
             "inbound_nodes": [{"args": [[tensor, tensor]], "kwargs": {"mask": None}}]}]}}
    rewritten = keras3_model_config_for_keras2(config)["config"]
    assert rewritten["input_layers"] == [["input_layer", 0, 0]]
    assert rewritten["layers"][0]["config"] == {"batch_input_shape": [None, 4],
                                                "dtype": "float32", "name": "input_layer"}
    assert rewritten["layers"][1]["config"]["dtype"] == "float32"
    assert rewritten["layers"][1]["inbound_nodes"] == [[["dense", 0, 0, {}],
                                                        ["dense", 0, 0, {}]]]
    config["config"]["layers"][1]["config"]["quantization_config"] = {"mode": "int8"}
    with pytest.raises(ArchitectureNotTranslatable, match="quantization_config"):
        keras3_model_config_for_keras2(config)


KERAS2_FUNCTIONAL = {"class_name": "Functional", "config": {
    "name": "f", "input_layers": [["input_1", 0, 0]], "output_layers": [["mha", 0, 0]],
    "layers": [
        {"class_name": "InputLayer", "name": "input_1", "inbound_nodes": [],
         "config": {"batch_input_shape": [None, 6, 4], "dtype": "float32", "name": "input_1"}},
        {"class_name": "Bidirectional", "name": "bi", "inbound_nodes": [[["input_1", 0, 0, {}]]],
         "config": {"name": "bi", "layer": {"class_name": "LSTM", "config": {
             "name": "lstm", "rng_type": "stateful", "time_major": False, "dropout": 0.1,
             "recurrent_activation": "hard_sigmoid"}}}},
        {"class_name": "MultiHeadAttention", "name": "mha",
         "inbound_nodes": [[["bi", 0, 0, {"value": ["input_1", 0, 0]}]]],
         "config": {"name": "mha", "num_heads": 2, "key_dim": 3, "query_shape": [None, 6, 4],
                    "key_shape": [None, 6, 4], "value_shape": [None, 6, 4],
                    "softmax_robust_masking": False}},
        {"class_name": "Dropout", "name": "mine", "inbound_nodes": [[["mha", 0, 0, {}]]],
         "config": {"name": "mine", "rate": 0.1, "rng_type": "stateful"}}]}}


def test_a_keras2_architecture_is_rewritten_in_keras3s_form():
    import copy

    translate = _architecture_translation.keras2_model_config_for_keras3
    rewritten = translate(copy.deepcopy(KERAS2_FUNCTIONAL), frozenset({"Dropout"}))["config"]
    lstm = rewritten["layers"][1]["config"]["layer"]["config"]
    assert lstm == {"name": "lstm", "dropout": 0.1,
                    "recurrent_activation": _architecture_translation.KERAS2_HARD_SIGMOID}
    mha = rewritten["layers"][2]
    assert mha["config"] == {"name": "mha", "num_heads": 2, "key_dim": 3}
    tensor = {"class_name": "__keras_tensor__", "config": {"shape": [], "dtype": "float32"}}
    assert mha["inbound_nodes"] == [{
        "args": [{**tensor, "config": {**tensor["config"], "keras_history": ["bi", 0, 0]}}],
        "kwargs": {"value": {**tensor, "config": {**tensor["config"],
                                                  "keras_history": ["input_1", 0, 0]}}}}]
    # A class of the trial's own keeps what it records; a call with no tensor by keyword
    # keeps Keras 2's form, which Keras 3 reads.
    assert rewritten["layers"][3]["config"]["rng_type"] == "stateful"
    assert rewritten["layers"][1]["inbound_nodes"] == [[["input_1", 0, 0, {}]]]
    time_major = copy.deepcopy(KERAS2_FUNCTIONAL)
    time_major["config"]["layers"][1]["config"]["layer"]["config"]["time_major"] = True
    with pytest.raises(ArchitectureNotTranslatable, match="'lstm' has time_major=True"):
        translate(time_major)


def test_the_trial_processs_generator_choice_is_left_out_of_what_it_saves():
    import copy

    config = copy.deepcopy(KERAS2_FUNCTIONAL)
    config["config"]["layers"][3]["config"]["rng_type"] = "stateless"  # the model's own
    assert _architecture_translation.without_generator_choice(config)
    assert "rng_type" not in config["config"]["layers"][1]["config"]["layer"]["config"]
    assert config["config"]["layers"][3]["config"]["rng_type"] == "stateless"
    assert not _architecture_translation.without_generator_choice(config)


@pytest.mark.parametrize("other", ["keras2", "keras3"])
def test_a_model_only_the_other_line_builds_is_refused_remedy_first(other, tmp_path):
    """Either way round: one line that starts with what to set, then why."""
    from determined.keras import _load
    from determined.keras._checkpoint_formats import SavedCheckpoint

    here = "keras3" if other == "keras2" else "keras2"
    saved = SavedCheckpoint(folder=tmp_path, format="localdet",
                            weights=tmp_path / "determined-keras-model.h5",
                            trial_spec="model_def:Trial", keras_line=other)
    attempt = _load._Attempt()
    attempt.tried_h5 = True
    with pytest.raises(_load.CheckpointLoadError) as refused:
        _load._load_from_other_line(saved, here, attempt,
                                    AttributeError("no attribute '_trainable_weights'\nmore"))
    switch = "1" if other == "keras2" else "0"
    spoken = {"keras2": "Keras 2", "keras3": "Keras 3"}
    assert str(refused.value) == (
        f"set TF_USE_LEGACY_KERAS={switch} before TensorFlow is imported and load it again: "
        f"the model in '{tmp_path}' needs {spoken[other]}, which wrote it, and cannot be "
        f"rebuilt under {spoken[here]} (AttributeError: no attribute '_trainable_weights')")


# -- every shared class and name, both ways -----------------------------------------------
# (kind, class) -> cases: the arguments and the data it is computed on. Every parameter
# both lines' constructors share is given a value other than its default somewhere.
BINARY_CONFUSION = ["FalseNegatives", "FalsePositives", "TrueNegatives", "TruePositives"]
CLASS_CASES: dict = {
    ("losses", "BinaryCrossentropy"): [
        ({}, "binary"),
        ({"from_logits": True, "label_smoothing": 0.2, "axis": -1, "reduction": "sum"},
         "binary_logits"),
        ({"axis": 0}, "binary")],
    ("losses", "BinaryFocalCrossentropy"): [
        ({}, "binary"),
        ({"apply_class_balancing": True, "alpha": 0.4, "gamma": 1.5, "from_logits": True,
          "label_smoothing": 0.1, "axis": -1, "reduction": "none"}, "binary_logits"),
        ({"axis": 0}, "binary")],
    ("losses", "CategoricalCrossentropy"): [
        ({}, "categorical"),
        ({"from_logits": True, "label_smoothing": 0.1, "axis": -1, "reduction": "none"},
         "categorical_logits"),
        ({"axis": 0}, "categorical")],
    ("losses", "CategoricalFocalCrossentropy"): [
        ({"alpha": 0.3, "gamma": 1.0, "from_logits": True, "label_smoothing": 0.05,
          "axis": -1, "reduction": "sum"}, "categorical_logits"),
        ({"axis": 0}, "categorical")],
    ("losses", "CategoricalHinge"): [({"reduction": "sum"}, "categorical")],
    ("losses", "CosineSimilarity"): [({"axis": 0, "reduction": "sum"}, "regression")],
    ("losses", "Hinge"): [({"reduction": "sum"}, "hinge")],
    ("losses", "Huber"): [({"delta": 0.5, "reduction": "sum"}, "regression")],
    ("losses", "KLDivergence"): [({"reduction": "none"}, "categorical")],
    ("losses", "LogCosh"): [({"reduction": "sum"}, "regression")],
    ("losses", "MeanAbsoluteError"): [({"reduction": "sum"}, "regression")],
    ("losses", "MeanAbsolutePercentageError"): [({"reduction": "none"}, "regression")],
    ("losses", "MeanSquaredError"): [({"reduction": "none"}, "regression")],
    ("losses", "MeanSquaredLogarithmicError"): [({"reduction": "sum"}, "regression")],
    ("losses", "Poisson"): [({"reduction": "sum"}, "regression")],
    ("losses", "SparseCategoricalCrossentropy"): [
        ({}, "sparse"),
        ({"from_logits": True, "ignore_class": 0, "reduction": "sum"}, "sparse_logits")],
    ("losses", "SquaredHinge"): [({"reduction": "none"}, "hinge")],
    ("metrics", "AUC"): [
        ({}, "binary"),
        ({"num_thresholds": 50, "curve": "PR", "summation_method": "minoring",
          "multi_label": True, "num_labels": 3, "label_weights": [0.5, 1.0, 2.0],
          "from_logits": True}, "binary_logits"),
        ({"thresholds": [0.3, 0.5, 0.7]}, "binary")],
    ("metrics", "Accuracy"): [({}, "exact")],
    ("metrics", "BinaryAccuracy"): [({"threshold": 0.3}, "binary")],
    ("metrics", "BinaryCrossentropy"): [
        ({"from_logits": True, "label_smoothing": 0.1}, "binary_logits")],
    ("metrics", "BinaryIoU"): [({"target_class_ids": [1], "threshold": 0.4}, "binary")],
    ("metrics", "CategoricalAccuracy"): [({}, "categorical")],
    ("metrics", "CategoricalCrossentropy"): [
        ({"from_logits": True, "label_smoothing": 0.1, "axis": -1}, "categorical_logits"),
        ({"axis": 0}, "categorical")],
    ("metrics", "CategoricalHinge"): [({}, "categorical")],
    ("metrics", "CosineSimilarity"): [({"axis": 0}, "regression")],
    ("metrics", "F1Score"): [({"average": "macro", "threshold": 0.5}, "binary")],
    ("metrics", "FBetaScore"): [
        ({"average": "weighted", "beta": 2.0, "threshold": 0.4}, "binary")],
    **{("metrics", name): [({"thresholds": [0.3, 0.6]}, "binary")]
       for name in BINARY_CONFUSION},
    ("metrics", "Hinge"): [({}, "hinge")],
    ("metrics", "IoU"): [
        ({"num_classes": 3, "target_class_ids": [0, 2], "ignore_class": 1,
          "sparse_y_true": True, "sparse_y_pred": False, "axis": -1}, "iou_dense"),
        ({"num_classes": 3, "target_class_ids": [1], "sparse_y_true": False,
          "sparse_y_pred": False, "axis": 0}, "iou_onehot_t")],
    ("metrics", "KLDivergence"): [({}, "categorical")],
    ("metrics", "LogCoshError"): [({}, "regression")],
    ("metrics", "Mean"): [({}, "values")],
    ("metrics", "MeanAbsoluteError"): [({}, "regression")],
    ("metrics", "MeanAbsolutePercentageError"): [({}, "regression")],
    ("metrics", "MeanIoU"): [
        ({"num_classes": 3, "ignore_class": 2, "sparse_y_true": True,
          "sparse_y_pred": True, "axis": -1}, "iou"),
        ({"num_classes": 3, "sparse_y_true": False, "sparse_y_pred": False, "axis": 0},
         "iou_onehot_t")],
    ("metrics", "MeanMetricWrapper"): [
        ({"fn": "mean_absolute_error", "name": "wrapped_mae"}, "regression")],
    ("metrics", "MeanSquaredError"): [({}, "regression")],
    ("metrics", "MeanSquaredLogarithmicError"): [({}, "regression")],
    ("metrics", "OneHotIoU"): [
        ({"num_classes": 3, "target_class_ids": [1], "ignore_class": None,
          "sparse_y_pred": False, "axis": -1}, "onehot_iou"),
        ({"num_classes": 3, "target_class_ids": [0, 1], "ignore_class": 2,
          "sparse_y_pred": True}, "onehot_iou_sparse"),
        ({"num_classes": 3, "target_class_ids": [2], "axis": 0}, "iou_onehot_t")],
    ("metrics", "OneHotMeanIoU"): [
        ({"num_classes": 3, "ignore_class": 0, "sparse_y_pred": False, "axis": -1},
         "onehot_iou"),
        ({"num_classes": 3, "sparse_y_pred": True}, "onehot_iou_sparse"),
        ({"num_classes": 3, "axis": 0}, "iou_onehot_t")],
    ("metrics", "Poisson"): [({}, "regression")],
    ("metrics", "Precision"): [({"thresholds": 0.4, "class_id": 1}, "binary"),
                               ({"top_k": 2}, "binary")],
    ("metrics", "PrecisionAtRecall"): [
        ({"recall": 0.6, "num_thresholds": 50, "class_id": 0}, "binary")],
    ("metrics", "R2Score"): [
        ({"class_aggregation": "variance_weighted_average", "num_regressors": 1},
         "regression")],
    ("metrics", "Recall"): [({"thresholds": [0.3, 0.7]}, "binary"),
                            ({"top_k": 1, "class_id": 2}, "binary")],
    ("metrics", "RecallAtPrecision"): [
        ({"precision": 0.5, "num_thresholds": 50, "class_id": 1}, "binary")],
    ("metrics", "RootMeanSquaredError"): [({}, "regression")],
    ("metrics", "SensitivityAtSpecificity"): [
        ({"specificity": 0.5, "num_thresholds": 50, "class_id": 2}, "binary")],
    ("metrics", "SparseCategoricalAccuracy"): [({}, "sparse")],
    ("metrics", "SparseCategoricalCrossentropy"): [
        ({"from_logits": True, "ignore_class": 0, "axis": -1}, "sparse_logits")],
    ("metrics", "SparseTopKCategoricalAccuracy"): [({"k": 2}, "sparse")],
    ("metrics", "SpecificityAtSensitivity"): [
        ({"sensitivity": 0.5, "num_thresholds": 50, "class_id": 0}, "binary")],
    ("metrics", "SquaredHinge"): [({}, "hinge")],
    ("metrics", "Sum"): [({}, "values")],
    ("metrics", "TopKCategoricalAccuracy"): [({"k": 2}, "categorical")],
}
# Shared parameters only one value of which both lines compute.
DEFAULT_ONLY = {("metrics", "SparseCategoricalCrossentropy", "axis")}  # Keras 3: -1 only
# Classes of one line only: recorded there, named and left out by the other.
ONE_LINE_CASES: dict = {
    ("losses", "CTC"): "keras3", ("losses", "CategoricalGeneralizedCrossEntropy"): "keras3",
    ("losses", "Circle"): "keras3", ("losses", "Dice"): "keras3",
    ("losses", "Tversky"): "keras3", ("metrics", "ConcordanceCorrelation"): "keras3",
    ("metrics", "PearsonCorrelation"): "keras3", ("metrics", "MeanRelativeError"): "keras2",
    ("metrics", "MeanTensor"): "keras2",
}
ONE_LINE_ARGUMENTS = {"MeanRelativeError": {"normalizer": [1.0, 2.0, 3.0]}}
# Metric names `compile` takes in either line, by the data they apply to; losses by name.
METRIC_NAMES = {
    "binary": ["binary_accuracy", "binary_crossentropy"],
    "categorical": ["categorical_accuracy", "categorical_crossentropy",
                    "top_k_categorical_accuracy", "cosine_similarity", "categorical_hinge",
                    "kl_divergence", "kld", "kullback_leibler_divergence", "KLD"],
    "sparse": ["acc", "accuracy", "sparse_categorical_accuracy",
               "sparse_categorical_crossentropy", "sparse_top_k_categorical_accuracy",
               "ce", "crossentropy"],
    "regression": ["mae", "mape", "mse", "msle", "mean_absolute_error",
                   "mean_absolute_percentage_error", "mean_squared_error",
                   "mean_squared_logarithmic_error", "logcosh", "log_cosh", "poisson"],
    "hinge": ["hinge", "squared_hinge"],
}
LOSS_NAMES = {
    **{name: "binary" for name in ["binary_crossentropy", "binary_focal_crossentropy"]},
    **{name: "categorical" for name in [
        "categorical_crossentropy", "categorical_focal_crossentropy", "categorical_hinge",
        "cosine_similarity", "kl_divergence", "kld", "kullback_leibler_divergence"]},
    "sparse_categorical_crossentropy": "sparse",
    **{name: "regression" for name in [
        "huber", "log_cosh", "logcosh", "mae", "mape", "mse", "msle", "mean_absolute_error",
        "mean_absolute_percentage_error", "mean_squared_error",
        "mean_squared_logarithmic_error", "poisson"]},
    **{name: "hinge" for name in ["hinge", "squared_hinge"]},
}


def case_list() -> list:
    cases = []
    for (kind, name), variants in CLASS_CASES.items():
        for index, (kwargs, data) in enumerate(variants):
            cases.append({"id": f"{kind}:{name}:{index}", "kind": kind, "class": name,
                          "kwargs": kwargs, "data": data})
    for (kind, name), line in ONE_LINE_CASES.items():
        cases.append({"id": f"{kind}:{name}:only", "kind": kind, "class": name,
                      "kwargs": ONE_LINE_ARGUMENTS.get(name, {}), "data": "regression",
                      "only": line})
    return cases


def write_data(path: Path) -> None:
    rng = np.random.default_rng(7)
    rows = 8

    def softmax(z):
        e = np.exp(z - z.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    z3, z4 = rng.normal(size=(rows, 3)), rng.normal(size=(rows, 4))
    binary = rng.integers(0, 2, (rows, 3)).astype("float32")
    labels4, labels3 = rng.integers(0, 4, rows), rng.integers(0, 3, rows)
    exact = rng.integers(0, 3, (rows, 3)).astype("float32")
    dense3 = softmax(rng.normal(size=(rows, 3)))
    arrays = {
        "binary": (binary, 1 / (1 + np.exp(-z3))), "binary_logits": (binary, z3),
        "categorical": (np.eye(4)[labels4], softmax(z4)),
        "categorical_logits": (np.eye(4)[labels4], z4),
        "sparse": (labels4, softmax(z4)), "sparse_logits": (labels4, z4),
        "regression": (rng.uniform(0.5, 2.0, (rows, 3)), rng.uniform(0.5, 2.0, (rows, 3))),
        "hinge": (binary * 2 - 1, z3),
        "exact": (exact, np.where(rng.random((rows, 3)) < 0.5, exact, (exact + 1) % 3)),
        "values": (np.zeros(rows), rng.normal(size=rows)),
        "iou": (labels3, rng.integers(0, 3, rows)), "iou_dense": (labels3, dense3),
        "onehot_iou": (np.eye(3)[labels3], dense3),
        "onehot_iou_sparse": (np.eye(3)[labels3], rng.integers(0, 3, rows)),
        "iou_onehot_t": (np.eye(3)[labels3].T, dense3.T),
    }
    np.savez(path, **{f"{name}_y": (y if y.dtype.kind == "i" else y.astype("float32"))
                      for name, (y, _) in arrays.items()},
             **{f"{name}_p": p.astype("float32") for name, (_, p) in arrays.items()})


def run_keras2(request: dict, scratch: Path) -> dict:
    (scratch / "request.json").write_text(json.dumps(request))
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run(
        [sys.executable, str(CROSS / "other_line.py"), str(scratch / "request.json"),
         str(scratch / "answer.json")], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((scratch / "answer.json").read_text())


def _module(name: str):
    """A helper of tests/cross_line/, imported by path (its names are common ones)."""
    return _by_path(f"cross_line_{name}", CROSS / f"{name}.py")


@pytest.fixture(scope="module")
def lines(tmp_path_factory):
    """Both lines' answers: Keras 3's from this process, Keras 2's from one subprocess that
    also trains the Keras 2 checkpoints and loads this process's Keras 3 one."""
    catalogue, checkpoints = _module("catalogue"), _module("checkpoints")
    scratch = tmp_path_factory.mktemp("cross_line")
    write_data(scratch / "data.npz")
    request = {"data": str(scratch / "data.npz"), "cases": case_list(),
               "metric_names": METRIC_NAMES, "loss_names": LOSS_NAMES}
    keras3 = catalogue.side(request)
    script, recorded = checkpoints.script_checkpoint(scratch / "keras3-script")
    keras3["script"] = {"folder": str(script), "recorded": recorded}
    keras2 = run_keras2({**request, "other": keras3, "scratch": str(scratch / "keras2"),
                         "candidates": keras3["enumerated"]["candidates"],
                         "trials": ["HeadsTrial", "LegacyTrial"],
                         "other_script": str(script)}, scratch)
    data = np.load(scratch / "data.npz")
    keras3["translated"] = catalogue.translated_values(request["cases"], keras2["cases"],
                                                       data)
    keras3["translated_names"] = catalogue.name_values(METRIC_NAMES, data, keras2["names"])
    keras3["resolvable"] = catalogue.resolvable(keras3["enumerated"]["candidates"]
                                                + keras2["enumerated"]["candidates"])
    return {"keras2": keras2, "keras3": keras3, "checkpoints": checkpoints}


@pytest.mark.slow
def test_the_tables_cover_every_class_and_name_both_lines_share(lines):
    keras2, keras3 = lines["keras2"], lines["keras3"]
    for kind in ("losses", "metrics"):
        classes2, classes3 = keras2["enumerated"][kind], keras3["enumerated"][kind]
        assert set(classes2) & set(classes3) == {n for k, n in CLASS_CASES if k == kind}
        for name in set(classes2) & set(classes3):
            # Each parameter both share is given a value other than both defaults.
            for parameter in set(classes2[name]) & set(classes3[name]):
                if (kind, name, parameter) in DEFAULT_ONLY:
                    continue
                defaults = [classes2[name][parameter], classes3[name][parameter]]
                assert any(parameter in kwargs and kwargs[parameter] not in defaults
                           for kwargs, _ in CLASS_CASES[(kind, name)]), (kind, name, parameter)
        for line, only in (("keras2", set(classes2) - set(classes3)),
                           ("keras3", set(classes3) - set(classes2))):
            assert only == ONLY_IN[line][kind]
            assert only == {n for (k, n), o in ONE_LINE_CASES.items() if (k, o) == (kind, line)}
    tables = {"loss_names": set(LOSS_NAMES), "metric_names": set(sum(METRIC_NAMES.values(), []))}
    for key, table in tables.items():
        names2, names3 = set(keras2["resolvable"][key]), set(keras3["resolvable"][key])
        assert names2 & names3 <= table, key
        # A name of one line only is in the table (translated, and computed below) or has
        # no equivalent (named and left out).
        for line, only in (("keras2", names2 - names3), ("keras3", names3 - names2)):
            assert only <= table | FUNCTIONS_ONLY_IN[line], (key, line)


# Keras 3's .h5 writer fails on AUC's label weights (a tensor it cannot turn into JSON):
# such a model cannot be saved as an .h5 under Keras 3 at all.
UNSAVEABLE = {"keras2": set(), "keras3": {"metrics:AUC:1"}}


def _differences(source: dict, reader: dict) -> list:
    assert {case_id for case_id, recorded in source["cases"].items()
            if "unsaveable" in recorded} == UNSAVEABLE[source["line"]]
    found = []
    for case_id, recorded in source["cases"].items():
        if ":only" in case_id or case_id in UNSAVEABLE[source["line"]]:
            continue
        translated = reader["translated"][case_id]
        if translated["notes"] or translated["value"] != pytest.approx(
                recorded["value"], rel=1e-5, abs=1e-6):
            found.append((case_id, recorded["value"], translated, recorded["entry"]))
    return found


@pytest.mark.slow
def test_every_shared_class_with_its_arguments_computes_the_same_in_the_other_line(lines):
    assert _differences(lines["keras2"], lines["keras3"]) == []
    assert _differences(lines["keras3"], lines["keras2"]) == []


@pytest.mark.slow
def test_a_class_of_one_line_is_named_and_left_out_in_the_other(lines):
    for source, reader in (("keras2", "keras3"), ("keras3", "keras2")):
        for case_id in lines[source]["cases"]:
            if ":only" in case_id:
                translated = lines[reader]["translated"][case_id]
                assert translated["value"] is None
                assert case_id.split(":")[1] in " ".join(translated["notes"])


@pytest.mark.slow
def test_every_metric_name_computes_the_same_in_the_other_line(lines):
    """As an `.h5` records it after training (Keras 2: the object "acc" became) and as
    given (before any training, and Keras 3 always)."""
    for source, reader in (("keras2", "keras3"), ("keras3", "keras2")):
        given = lines[source]["names"]["values"]
        translated = lines[reader]["translated_names"]
        assert translated["notes"] == []
        for form in ("values", "raw"):
            for kind, values in given.items():
                assert translated[form][kind] == pytest.approx(values, rel=1e-5, abs=1e-6), \
                    (source, form, kind)


@pytest.mark.slow
def test_every_shared_loss_name_means_the_same_function(lines):
    keras2, keras3 = lines["keras2"]["loss_names"], lines["keras3"]["loss_names"]
    shared = set(keras2) & set(keras3)
    assert shared == set(LOSS_NAMES)
    assert {n: keras3[n] for n in shared} == pytest.approx({n: keras2[n] for n in shared},
                                                           rel=1e-5)


# -- checkpoints the harness writes, loaded in the other line ----------------------------
def _like_recorded(evaluated: dict, recorded: dict) -> None:
    assert {f"val_{name}" for name in evaluated} == set(recorded)
    for name, value in evaluated.items():
        assert value == pytest.approx(recorded[f"val_{name}"], rel=1e-5, abs=1e-6), name


@pytest.mark.slow
def test_a_keras2_script_checkpoint_loads_compiled_under_keras_3(lines):
    checkpoints, script = lines["checkpoints"], lines["keras2"]["script"]
    _like_recorded(checkpoints.evaluate_loaded(Path(script["folder"]),
                                               checkpoints.script_data(1, 64)),
                   script["recorded"])
    # The optimizer has a Keras 3 equivalent: the same class and rate.
    assert checkpoints.optimizer_of(Path(script["folder"])) == {
        "class": "Adam", "learning_rate": pytest.approx(0.02)}


@pytest.mark.slow
def test_a_keras3_script_checkpoint_loads_compiled_under_keras_2(lines):
    _like_recorded(lines["keras2"]["loaded"]["other_script"],
                   lines["keras3"]["script"]["recorded"])
    assert lines["keras2"]["optimizer"] == {"class": "Adam",
                                            "learning_rate": pytest.approx(0.02)}


@pytest.mark.slow
def test_a_trial_whose_code_needs_keras_2_loads_under_keras_3_from_its_h5(lines, caplog):
    checkpoints, trial = lines["checkpoints"], lines["keras2"]["trials"]["LegacyTrial"]
    with caplog.at_level(logging.WARNING, logger="determined.keras"):
        evaluated = checkpoints.evaluate_loaded(Path(trial["folder"]),
                                                checkpoints.trial_validation())
    _like_recorded(evaluated, trial["recorded"])
    assert "under Keras 3 failed (ImportError" in caplog.text
    assert "loading the Keras 2 .h5 the checkpoint holds instead" in caplog.text


@pytest.mark.slow
def test_a_layer_written_against_keras_2_internals_falls_back_and_names_the_line(
        lines, caplog):
    """keras-multi-head's case: the model builds under Keras 3, then its layer reaches for
    Keras 2's internals; the loader turns to Keras 2's build (the checkpoint's .h5), which
    Keras 3 cannot host either, and says which line to load it with. Keras 2 loads it."""
    from determined.keras._load import CheckpointLoadError

    checkpoints, trial = lines["checkpoints"], lines["keras2"]["trials"]["HeadsTrial"]
    _like_recorded(lines["keras2"]["loaded"]["HeadsTrial"], trial["recorded"])
    with caplog.at_level(logging.WARNING, logger="determined.keras"), \
            pytest.raises(CheckpointLoadError) as refused:
        checkpoints.evaluate_loaded(Path(trial["folder"]), checkpoints.trial_validation())
    # One line, the remedy first, then the cause.
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("set TF_USE_LEGACY_KERAS=1 before TensorFlow is imported and "
                              f"load it again: the model in '{trial['folder']}' needs Keras 2; ")
    assert "_trainable_weights" in message
    assert "under Keras 3 failed (AttributeError: 'Heads' object has no attribute " \
           "'_trainable_weights')" in caplog.text


@pytest.mark.slow
def test_a_checkpoint_that_names_no_line_still_falls_back_to_the_other(lines, tmp_path,
                                                                      monkeypatch):
    """Not only where the checkpoint says the other line trained it: a Keras-line error
    here is enough (the subprocess itself is exercised by test_load_checkpoint)."""
    import shutil

    from determined.keras import _load

    folder = tmp_path / "no-line"
    shutil.copytree(lines["keras2"]["trials"]["HeadsTrial"]["folder"], folder)
    metadata = json.loads((folder / "metadata.json").read_text())
    del metadata["keras_line"]
    (folder / "metadata.json").write_text(json.dumps(metadata))
    asked = []

    def rebuild(saved, other, out, reason):
        asked.append((other, reason))
        raise _load.CheckpointLoadError("stopped here")

    monkeypatch.setattr(_load, "_rebuild_in_line", rebuild)
    with pytest.raises(_load.CheckpointLoadError, match="stopped here"):
        _load.load_model_from_checkpoint_path(str(folder))
    assert asked == [("keras2", "AttributeError: 'Heads' object has no attribute "
                                "'_trainable_weights'")]
