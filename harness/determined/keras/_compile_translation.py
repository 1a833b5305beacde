"""Translate the compile arguments an `.h5` records (its `training_config` attribute) from
the Keras line that wrote them to the one that reads them. Pure Python: it needs no
TensorFlow, so the rules are tested without one.

    translated = translate_training_config(json.loads(h5.attrs["training_config"]), "keras3")
    translated.loss, translated.metrics, translated.notes

What each line writes differs in small ways: Keras 2 records a loss class's function
(`fn`) and the reduction "auto", and every metric as the object `compile` built (a string
like "acc" as `MeanMetricWrapper` of the function it stood for, with its own name);
Keras 3 records the arguments `compile` was given (strings as given), may say `dtype`,
`axis` or the reductions "mean" and "mean_with_sample_weight" that Keras 2 lacks, and some
classes exist in one line only. Entries come back in a neutral form the reading line
builds: a string, `{"class_name": ..., "config": ...}` for a class, or
`{"class_name": "MeanMetricWrapper", "config": {"fn": name, "name": ..., ...}}` for a
function under a metric's own name. What has no equivalent is left out (a loss: the model
is not compiled) and named in `notes`, one sentence each.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, List, Optional

KERAS2, KERAS3 = "keras2", "keras3"
_SPOKEN = {KERAS2: "Keras 2", KERAS3: "Keras 3"}

# Built-in classes that exist in one line only (tests/test_cross_line.py compares these
# with what both installed packages export, so they cannot go stale unnoticed).
ONLY_IN: Dict[str, Dict[str, FrozenSet[str]]] = {
    KERAS2: {"losses": frozenset(),
             "metrics": frozenset({"MeanRelativeError", "MeanTensor"})},
    KERAS3: {"losses": frozenset({"CTC", "CategoricalGeneralizedCrossEntropy", "Circle",
                                  "Dice", "Tversky"}),
             "metrics": frozenset({"ConcordanceCorrelation", "PearsonCorrelation"})},
}
# Built-in functions (by the name an entry records) that exist in one line only.
FUNCTIONS_ONLY_IN: Dict[str, FrozenSet[str]] = {
    KERAS2: frozenset(),
    KERAS3: frozenset({"categorical_generalized_cross_entropy", "circle", "ctc", "dice",
                       "tversky", "concordance_correlation", "pearson_correlation"}),
}
# The metric strings Keras 2's `compile` resolved from the model's shapes; Keras 3 keeps
# "acc"/"accuracy" but not the cross-entropy ones, which become a function chosen by shape.
SHAPE_CHOSEN_CROSSENTROPY = frozenset({"ce", "crossentropy"})
# Metric strings that name a function under another name in the reading line.
METRIC_STRING_ALIASES: Dict[str, Dict[str, str]] = {
    KERAS3: {"kld": "kl_divergence", "KLD": "kl_divergence",
             "kullback_leibler_divergence": "kl_divergence", "logcosh": "log_cosh",
             "log_cosh": "log_cosh"},
    KERAS2: {"kl_divergence": "kullback_leibler_divergence",
             "categorical_hinge": "categorical_hinge"},
}
# Loss strings of Keras 2 that Keras 3 names otherwise (Keras 3's own have no Keras 2 form).
LOSS_STRING_ALIASES: Dict[str, Dict[str, str]] = {
    KERAS3: {"logcosh": "log_cosh", "kullback_leibler_divergence": "kl_divergence"},
    KERAS2: {},
}
# The class a sparse cross-entropy metric with `ignore_class` becomes across lines: Keras 2
# averages over the entries kept, Keras 3 over all of them (the ignored ones count 0).
IGNORE_CLASS_CROSSENTROPY = "localdet>IgnoreClassCrossentropy"
_KERAS2_REDUCTIONS = {"auto", "none", "sum", "sum_over_batch_size"}
# Keras 3's "mean" is its "sum_over_batch_size"; "mean_with_sample_weight" differs only
# where sample weights are given (it divides by their sum).
_REDUCTION_TO: Dict[str, Dict[Any, str]] = {KERAS3: {"auto": "sum_over_batch_size"},
                 KERAS2: {None: "none", "mean": "sum_over_batch_size",
                          "mean_with_sample_weight": "sum_over_batch_size"}}
_WRAPPERS = {"MeanMetricWrapper", "LossFunctionWrapper"}
# Optimizer settings of one line only: dropped silently where they hold the default.
_OPTIMIZER_ONLY_IN: Dict[str, Dict[str, Optional[tuple]]] = {
    KERAS2: {"decay": (0, 0.0, None), "is_legacy_optimizer": None, "jit_compile": None},
    KERAS3: {"loss_scale_factor": (None,), "gradient_accumulation_steps": (None,)},
}


@dataclass
class CompileArguments:
    """What `compile` takes in the reading line (entries in the neutral form above)."""

    loss: Any = None
    metrics: Any = None
    weighted_metrics: Any = None
    loss_weights: Any = None
    optimizer: Optional[Dict[str, Any]] = None   # {"class_name": ..., "config": ...}
    compile: bool = True                          # False: the loss has no equivalent
    notes: List[str] = field(default_factory=list)


def other_line(line: str) -> str:
    return KERAS2 if line == KERAS3 else KERAS3


class _Untranslatable(Exception):
    pass


@dataclass
class _Translator:
    target: str
    custom: FrozenSet[str]
    notes: List[str]
    writer: Optional[str] = None  # the line that recorded it, where known

    @property
    def source(self) -> str:
        """The line whose one-line classes have no equivalent in the target."""
        return other_line(self.target)

    @property
    def crossing(self) -> bool:
        return self.writer != self.target

    def entries(self, entry: Any, kind: str) -> Any:
        """`kind`: "losses" or "metrics". Lists and per-output dicts keep their shape;
        a metric without equivalent is left out of its list."""
        if entry is None:
            return None
        if isinstance(entry, list):
            kept = []
            for item in entry:
                try:
                    kept.append(self.entries(item, kind))
                except _Untranslatable:
                    if kind == "losses":
                        raise
            return kept
        if isinstance(entry, dict) and "class_name" not in entry:
            return {name: self.entries(value, kind) for name, value in entry.items()}
        return self.entry(entry, kind)

    def entry(self, entry: Any, kind: str) -> Any:
        if isinstance(entry, str):
            return self.string(entry, kind)
        if not isinstance(entry, dict):
            return entry
        name = entry.get("class_name")
        config = entry.get("config")
        if name == "function":  # Keras 3's form of a function given by itself
            return self.string(config if isinstance(config, str)
                               else entry.get("registered_name", ""), kind)
        if not isinstance(name, str) or name in self.custom:
            return entry
        if name in _WRAPPERS and isinstance(config, dict):
            return self.wrapper(name, dict(config), kind)
        if name in ONLY_IN[self.source][kind] or \
                name in ONLY_IN[self.source]["losses" if kind == "metrics" else "metrics"]:
            self.untranslatable(f"class '{name}'", kind)
        if not isinstance(config, dict):
            return {"class_name": name, "config": {}}
        config = self.class_config(name, dict(config), kind)
        if name == "SparseCategoricalCrossentropy" and kind == "metrics" and \
                config.get("ignore_class") is not None and self.crossing and self.writer:
            # Computed as the line that recorded it averaged it.
            config["over"] = "kept" if self.writer == KERAS2 else "all"
            return {"class_name": IGNORE_CLASS_CROSSENTROPY, "config": config}
        return {"class_name": name, "config": config}

    def string(self, name: str, kind: str) -> Any:
        if name in self.custom:
            return name
        if name in FUNCTIONS_ONLY_IN[self.source] or name in ONLY_IN[self.source][kind]:
            self.untranslatable(f"'{name}'", kind)
        if kind == "metrics":
            if self.target == KERAS3 and name in SHAPE_CHOSEN_CROSSENTROPY:
                return {"class_name": "MeanMetricWrapper",
                        "config": {"fn": "crossentropy", "name": name}}
            alias = METRIC_STRING_ALIASES[self.target].get(name)
            if alias is not None:  # the name the user chose stays the metric's name
                return {"class_name": "MeanMetricWrapper",
                        "config": {"fn": alias, "name": name}}
            return name
        return LOSS_STRING_ALIASES[self.target].get(name, name)

    def wrapper(self, class_name: str, config: Dict[str, Any], kind: str) -> Any:
        """A built-in or custom function under a name of its own, with its arguments."""
        fn = config.get("fn")
        if isinstance(fn, dict):  # Keras 3 serialises the function as an object
            fn = fn.get("config") if fn.get("class_name") == "function" else fn
        if isinstance(fn, str) and fn not in self.custom and \
                fn in FUNCTIONS_ONLY_IN[self.source]:
            self.untranslatable(f"'{config.get('name') or fn}' (function '{fn}')", kind)
        config["fn"] = fn
        if "reduction" in config:
            config["reduction"] = self.reduction(config["reduction"], config.get("name"))
        if self.target == KERAS2 and kind == "losses":
            self.drop_dtype(config, class_name)
        return {"class_name": class_name, "config": config}

    def class_config(self, name: str, config: Dict[str, Any], kind: str) -> Dict[str, Any]:
        if kind == "losses" or "reduction" in config:
            # Keras 2 records the function a loss class wraps; the class implies it.
            config.pop("fn", None)
        if "reduction" in config:
            config["reduction"] = self.reduction(config["reduction"], name)
        if name == "AUC" and isinstance(config.get("label_weights"), str):
            config["label_weights"] = _numbers(config["label_weights"])
        if self.target == KERAS2:
            if kind == "losses":
                self.drop_dtype(config, name)
                if name == "SparseCategoricalCrossentropy":
                    self.drop_default(config, name, "axis", (-1,))
            if name == "SparseTopKCategoricalAccuracy":
                self.drop_default(config, name, "from_sorted_ids", (False,))
            if kind == "metrics" and str(config.get("dtype", "")).startswith("int"):
                # Keras 3 records the IoU metrics' count dtype there; Keras 2 computes
                # them in floats.
                config.pop("dtype")
        return config

    def reduction(self, value: Any, owner: Any) -> Any:
        mapped = _REDUCTION_TO[self.target].get(value, value)
        if self.target == KERAS2 and value == "mean_with_sample_weight":
            self.notes.append(f"'{owner}' reduces with 'mean_with_sample_weight', which "
                              "Keras 2 lacks; 'sum_over_batch_size' is used (the same "
                              "without sample weights)")
        if self.target == KERAS2 and mapped not in _KERAS2_REDUCTIONS:
            self.notes.append(f"'{owner}' reduces with '{value}', which Keras 2 lacks; "
                              "'sum_over_batch_size' is used")
            mapped = "sum_over_batch_size"
        return mapped

    def drop_dtype(self, config: Dict[str, Any], owner: str) -> None:
        """Keras 2's losses compute in the inputs' dtype and take no `dtype`."""
        self.drop_default(config, owner, "dtype", (None, "float32"))

    def drop_default(self, config: Dict[str, Any], owner: str, key: str,
                     defaults: tuple) -> None:
        if key not in config:
            return
        value = config.pop(key)
        if value not in defaults:
            self.notes.append(f"'{owner}' has {key}={value!r}, which "
                              f"{_SPOKEN[self.target]} does not take; {defaults[0]!r} is used")

    def untranslatable(self, what: str, kind: str) -> None:
        if kind == "losses":
            self.notes.append(f"the loss {what} has no {_SPOKEN[self.target]} equivalent, so "
                              "the model is returned uncompiled: compile it with a loss of "
                              "your choice")
        else:
            self.notes.append(f"the metric {what} has no {_SPOKEN[self.target]} equivalent and is "
                              "left out")
        raise _Untranslatable(what)

    def optimizer(self, entry: Any) -> Optional[Dict[str, Any]]:
        if not isinstance(entry, dict) or not isinstance(entry.get("class_name"), str):
            return None
        name = entry["class_name"].split(">")[-1]  # Keras 2's "Custom>Adam"
        config = dict(entry.get("config") or {})
        if "inner_optimizer" in config:  # mixed precision: Keras 2's LossScaleOptimizerV3 too
            config["inner_optimizer"] = self.optimizer(config["inner_optimizer"])
            return {"class_name": "LossScaleOptimizer", "config": config}
        if "lr" in config:  # Keras 2's legacy spelling
            config.setdefault("learning_rate", config.pop("lr"))
        for key, defaults in _OPTIMIZER_ONLY_IN[self.source].items():
            if key not in config:
                continue
            value = config.pop(key)
            if defaults is not None and value not in defaults:
                self.notes.append(f"the optimizer's {key}={value!r} has no {_SPOKEN[self.target]} "
                                  "equivalent and is left out")
        return {"class_name": name, "config": config}


def _numbers(text: str) -> List[float]:
    """The numbers of an array both lines record as its printed form (AUC's label weights:
    "[0.5 1.  2. ]" by Keras 2, "tf.Tensor([0.5 1.  2. ], shape=(3,), ...)" by Keras 3)."""
    inside = text[text.find("[") + 1:text.find("]")] if "[" in text else text
    return [float(part) for part in inside.replace(",", " ").split()]


def translate_training_config(config: Dict[str, Any], target: str,
                              custom_names: FrozenSet[str] = frozenset(),
                              writer: Optional[str] = None) -> CompileArguments:
    """The compile arguments `config` (a parsed `training_config`) records, for `target`
    ("keras2" or "keras3"); `custom_names`: names the reader resolves to objects of its own
    (the trial's custom losses and metrics), passed through unchanged; `writer`: the line
    that recorded it, where known (a metric both lines compute differently is then
    computed as the writer did)."""
    notes: List[str] = []
    translator = _Translator(target, frozenset(custom_names), notes, writer)
    result = CompileArguments(notes=notes, loss_weights=config.get("loss_weights"))
    try:
        result.loss = translator.entries(config.get("loss"), "losses")
    except _Untranslatable:
        result.compile = False
        return result
    for key in ("metrics", "weighted_metrics"):
        value = translator.entries(config.get(key), "metrics")
        setattr(result, key, value)
    result.optimizer = translator.optimizer(config.get("optimizer_config"))
    return result
