"""The built-in losses and metrics of the Keras line this process runs, for
tests/test_cross_line.py: which classes and names it has, each test case built and
serialised as its `.h5` records it (`training_config`), and the value each computes on
the shared data; and the other line's serialised cases translated, built here and
computed. The test runs it in its own (Keras 3) process and in one Keras 2 subprocess.

    answer = side({"data": npz_path, "cases": [...], "metric_names": {...},
                   "loss_names": {...}, "other": the other line's answer or None})
"""

from __future__ import annotations

import inspect
import json
from typing import Any, Dict, List

import numpy as np
import tensorflow as tf

# The abstract bases both lines export: not losses or metrics one compiles with.
ABSTRACT = {"losses": {"Loss"}, "metrics": {"Metric"}}
SPECIAL_METRIC_NAMES = ["acc", "accuracy", "ce", "crossentropy"]


def line() -> str:
    from determined.keras._line import keras_line

    return keras_line()


def enumerate_line() -> Dict[str, Any]:
    """Classes (their constructor's parameters and defaults) and the lower-case names this line's
    loss and metric modules export (`candidates`; see `resolvable`)."""
    out: Dict[str, Any] = {}
    for kind, module, base in (("losses", tf.keras.losses, tf.keras.losses.Loss),
                               ("metrics", tf.keras.metrics, tf.keras.metrics.Metric)):
        out[kind] = {name: {p: _plain(parameter.default) for p, parameter in
                            inspect.signature(obj.__init__).parameters.items()
                            if p not in ("self", "name", "dtype", "kwargs")}
                     for name, obj in vars(module).items() if inspect.isclass(obj)
                     and issubclass(obj, base) and name not in ABSTRACT[kind]
                     and not name.startswith("_")}
    out["candidates"] = sorted(
        name for module in (tf.keras.losses, tf.keras.metrics) for name in dir(module)
        if not name.startswith("_") and not name[0].isupper()
        and name not in ("get", "serialize", "deserialize", "experimental"))
    return out


def _plain(default: Any) -> Any:
    """A parameter's default as JSON holds it (None where it has none)."""
    if default is inspect.Parameter.empty:
        return None
    return default if isinstance(default, (bool, int, float, str, type(None))) else \
        repr(default)


def resolvable(candidates: List[str]) -> Dict[str, List[str]]:
    """Which of `candidates` this line takes by name as a loss, and as a metric in
    `compile` (`metrics.get`, and the names `compile` resolves from the shapes)."""
    special = SPECIAL_METRIC_NAMES if line() == "keras2" else ["acc", "accuracy"]
    out: Dict[str, List[str]] = {"loss_names": [], "metric_names": []}
    for key, module in (("loss_names", tf.keras.losses), ("metric_names", tf.keras.metrics)):
        for name in sorted(set(candidates) | set(special)):
            if key == "metric_names" and name in special:
                out[key].append(name)
                continue
            try:
                obj = module.get(name)
            except (ValueError, TypeError):
                continue
            if callable(obj):  # Keras 2's metrics.get returns an unknown name as it is
                out[key].append(name)
    return out


def _value(obj: Any, kind: str, y: np.ndarray, p: np.ndarray) -> float:
    if kind == "losses":
        return float(np.sum(obj(y, p)))
    if y.ndim == 1 and not y.any() and y.dtype.kind == "f":  # "values": Mean, Sum
        obj.update_state(p)
    else:
        obj.update_state(y, p)
    return float(np.asarray(obj.result()).sum())


def _serialised(obj: Any) -> Any:
    """The entry as this line's `.h5` writer records a compiled loss or metric: serialised,
    then written as JSON (arrays and tensors as the writer turns them into JSON)."""
    if line() == "keras2":
        from tf_keras.src.saving.legacy import saving_utils
        from tf_keras.src.saving.legacy.saved_model import json_utils
    else:
        from keras.src.legacy.saving import json_utils, saving_utils
    from determined.keras._saved_compile import complete_entry

    entry = json.loads(json.dumps(saving_utils._serialize_nested_config(obj),
                                  default=json_utils.get_json_type))
    complete_entry(obj, entry)  # as the harness completes what Keras 3 leaves out
    return entry


def _instance(kind: str, class_name: str, kwargs: Dict[str, Any]) -> Any:
    module = tf.keras.losses if kind == "losses" else tf.keras.metrics
    kwargs = dict(kwargs)
    if "fn" in kwargs:  # MeanMetricWrapper of a built-in function
        kwargs["fn"] = tf.keras.losses.get(kwargs["fn"])
    return getattr(module, class_name)(**kwargs)


def serialise_cases(cases: List[Dict[str, Any]], data: Any) -> Dict[str, Any]:
    """Each class case this line has, built here: its recorded entry and its value (none
    for a class of this line only: the other line names it and leaves it out)."""
    out = {}
    for case in cases:
        if case.get("only", line()) != line():
            continue
        obj = _instance(case["kind"], case["class"], case["kwargs"])
        y, p = data[case["data"] + "_y"], data[case["data"] + "_p"]
        value = None if "only" in case else _value(obj, case["kind"], y, p)
        try:
            out[case["id"]] = {"entry": _serialised(obj), "value": value}
        except TypeError as error:  # this line's .h5 writer cannot record it either
            out[case["id"]] = {"entry": None, "value": value, "unsaveable": str(error)}
    return out


def translated_values(cases: List[Dict[str, Any]], other: Dict[str, Any],
                      data: Any) -> Dict[str, Any]:
    """The other line's recorded entries translated and built here: values and notes."""
    from determined.keras._saved_compile import build_compile_arguments

    out = {}
    for case in cases:
        if case["id"] not in other or other[case["id"]]["entry"] is None:
            continue
        entry = other[case["id"]]["entry"]
        config = {"loss": entry} if case["kind"] == "losses" else \
            {"loss": None, "metrics": [entry]}
        args = build_compile_arguments(config, {}, writer=_other_line())
        y, p = data[case["data"] + "_y"], data[case["data"] + "_p"]
        if case["kind"] == "losses":
            built = args.loss if args.compile else None
        else:
            built = (args.metrics or [None])[0]
        out[case["id"]] = {"notes": args.notes,
                           "value": None if built is None or "only" in case
                           else _value(built, case["kind"], y, p)}
    return out


def _other_line() -> str:
    return "keras3" if line() == "keras2" else "keras2"


def _identity_model(width: int) -> Any:
    return tf.keras.Sequential([tf.keras.Input(shape=(width,)),
                                tf.keras.layers.Activation("linear")])


def name_values(groups: Dict[str, List[str]], data: Any,
                other: Dict[str, Any] | None = None) -> Dict[str, Any]:
    """Metric strings (those of `groups` this line has) compiled by name on a model whose
    output is the data's predictions, one model per data kind; with `other` (the other
    line's answer), its recorded compile arguments translated instead: as recorded after
    training ("values"), and its strings as given ("raw": as an `.h5` saved before any
    training records them). Returns values, and the recorded arguments."""
    from determined.keras._saved_compile import build_compile_arguments

    available = set(resolvable(sum(groups.values(), []))["metric_names"])
    out: Dict[str, Any] = {"values": {}, "raw": {}, "recorded": {}, "given": {},
                           "notes": []}
    for kind, all_names in groups.items():
        y, p = data[kind + "_y"], data[kind + "_p"]
        loss = "mse" if kind != "sparse" else "sparse_categorical_crossentropy"
        compiled = []
        if other is None:
            names = [name for name in all_names if name in available]
            compiled.append(("values", {"loss": loss, "metrics": names}))
            out["given"][kind] = names
        else:
            for key, recorded in (("values", other["recorded"][kind]),
                                  ("raw", {"loss": loss, "metrics": other["given"][kind]})):
                args = build_compile_arguments(recorded, {}, writer=_other_line())
                out["notes"].extend(args.notes)
                compiled.append((key, {"loss": args.loss, "metrics": args.metrics}))
        for key, arguments in compiled:
            model = _identity_model(p.shape[-1])
            model.compile(**arguments, run_eagerly=True)  # eight rows: no tracing
            values = model.evaluate(p, y, batch_size=len(p), verbose=0, return_dict=True)
            out[key][kind] = {k: float(v) for k, v in values.items()}
        if other is None:
            if line() == "keras2":
                recorded = model._get_compile_args(user_metrics=False)
            else:
                recorded = dict(model._compile_config.config)
            recorded.pop("optimizer", None)
            out["recorded"][kind] = _serialised(recorded)
    return out


def loss_name_values(names: Dict[str, str], data: Any) -> Dict[str, float]:
    """Each loss by name (`names`: name -> data kind), as the other line recorded it and
    translated for this one, resolved as `compile` resolves it; a name without equivalent
    here is left out."""
    from determined.keras._compile_translation import translate_training_config

    out = {}
    for name, kind in names.items():
        args = translate_training_config({"loss": name}, line(), writer=_other_line())
        if not args.compile:
            continue
        y, p = data[kind + "_y"], data[kind + "_p"]
        out[name] = float(tf.reduce_mean(tf.keras.losses.get(args.loss)(y, p)))
    return out


def side(request: Dict[str, Any]) -> Dict[str, Any]:
    """This line's part: enumerated, cases and names recorded, and the other line's
    (`request["other"]`, where given) translated."""
    data = np.load(request["data"])
    answer = {
        "line": line(),
        "enumerated": enumerate_line(),
        "cases": serialise_cases(request["cases"], data),
        "names": name_values(request["metric_names"], data),
        "loss_names": loss_name_values(request["loss_names"], data),
    }
    answer["resolvable"] = resolvable(answer["enumerated"]["candidates"]
                                      + request.get("candidates", []))
    if request.get("other"):
        answer["translated"] = translated_values(request["cases"], request["other"]["cases"],
                                                 data)
        answer["translated_names"] = name_values(request["metric_names"], data,
                                                 request["other"]["names"])
    return answer
