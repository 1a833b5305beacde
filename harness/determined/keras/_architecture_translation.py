"""Rewrite the architecture an `.h5` records (its `model_config` attribute) in the form the
other Keras line reads. Pure Python, tested without TensorFlow.

    config = keras3_model_config_for_keras2(json.loads(h5.attrs["model_config"]))
    config = keras2_model_config_for_keras3(json.loads(h5.attrs["model_config"]), custom)

Keras 2 reads Keras 3's nested objects (`module`/`class_name`/`config`/`registered_name`)
itself, but not: a dtype policy object (Keras 2 takes the dtype's name), an `InputLayer`'s
`batch_shape` (Keras 2: `batch_input_shape`), the call records of a functional model
(Keras 3: `{"args": [tensors], "kwargs": ...}`; Keras 2: `[[layer, node, tensor, kwargs]]`),
and arguments Keras 3 added (`optional`, `quantization_config`, an initializer's axes) that
hold their defaults.

Keras 3 reads Keras 2's nested objects, but its built-in layers refuse arguments only Keras 2
has: which TensorFlow generator a random layer draws from (`rng_type`, which Keras 2 records
once `enable_tf_random_generator()` ran, as in every trial process), and arguments Keras 3
dropped (`time_major`, a transposed convolution's `groups`, the build shapes
`MultiHeadAttention` records...). Where they hold values Keras 3 behaves by, they are left
out; another value is named. A class of the trial's own (`custom_names`) keeps all of its.
Keras 3 also reads a tensor passed by keyword only in its own form of a call record, and
means another function by `hard_sigmoid`.
"""

from __future__ import annotations

from typing import Any, Dict, FrozenSet, List, Optional

# Arguments Keras 3 added to built-in classes, left out where they hold these values.
_KERAS3_ONLY_DEFAULTS: Dict[str, tuple] = {
    "optional": (False,), "quantization_config": (None,), "input_axes": (None,),
    "output_axes": (None,), "lora_rank": (None,), "lora_alpha": (None,),
}
_TENSOR = "__keras_tensor__"

_ANY = None  # an argument left out whatever it holds
_TRANSPOSED = ("Conv1DTranspose", "Conv2DTranspose", "Conv3DTranspose", "DepthwiseConv1D",
               "DepthwiseConv2D")
_SEPARABLE = ("SeparableConv1D", "SeparableConv2D")
_SPATIAL_DROPOUT = ("SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D")
# Arguments Keras 2 records that Keras 3's built-in classes do not take, by class ("*": any),
# with the values at which leaving them out keeps the model's behaviour.
_KERAS2_ONLY: Dict[str, Dict[str, Optional[tuple]]] = {
    # Keras 3's random layers draw from their own seed generators.
    "*": {"rng_type": _ANY, "time_major": (False,)},
    **{name: {"groups": (1,)} for name in _TRANSPOSED},
    # Keras 2 records its convolution base's `kernel_*`, which a separable one never uses.
    **{name: {"groups": (1,), "kernel_initializer": _ANY, "kernel_regularizer": _ANY,
              "kernel_constraint": _ANY} for name in _SEPARABLE},
    # Keras 3 builds it from its first call, not from recorded shapes.
    "MultiHeadAttention": {"query_shape": _ANY, "key_shape": _ANY, "value_shape": _ANY,
                           "softmax_robust_masking": (False,)},
    # Weightless layers whose Keras 3 constructors take no `trainable`.
    **{name: {"trainable": _ANY, "noise_shape": (None,)} for name in _SPATIAL_DROPOUT},
    "Discretization": {"trainable": _ANY},
    # Keras 3's `.h5` reader turns the string "dot" into its function `dot`; it is the
    # default anyway.
    "Attention": {"score_mode": ("dot",)},
}


class ArchitectureNotTranslatable(ValueError):
    """An argument one Keras line has holds a value the other has no form for."""


def _history(value: Any) -> List[List[Any]]:
    """The Keras 2 input records of a call's argument (a tensor or a list of them)."""
    if isinstance(value, dict) and value.get("class_name") == _TENSOR:
        name, node, tensor = value["config"]["keras_history"]
        return [[name, node, tensor, {}]]
    if isinstance(value, (list, tuple)):
        return [entry for item in value for entry in _history(item)]
    return []


def _node(node: Any) -> Any:
    if not isinstance(node, dict) or "args" not in node:
        return node  # already Keras 2's form
    inputs = _history(node.get("args") or [])
    kwargs = {key: value for key, value in (node.get("kwargs") or {}).items()
              if value is not None and not _history(value)}
    if inputs and kwargs:
        inputs[0][3] = kwargs
    return inputs


def _endpoints(value: Any) -> Any:
    """Keras 3 writes one input or output as a bare `[name, node, tensor]`."""
    if isinstance(value, list) and len(value) == 3 and isinstance(value[0], str):
        return [value]
    return value


def _rewrite(value: Any) -> Any:
    if isinstance(value, list):
        return [_rewrite(item) for item in value]
    if not isinstance(value, dict):
        return value
    if value.get("class_name") in ("DTypePolicy", "FloatDTypePolicy") and "module" in value:
        return (value.get("config") or {}).get("name", "float32")
    out = {key: _rewrite(item) for key, item in value.items()}
    config = out.get("config")
    if isinstance(config, dict):
        for key, defaults in _KERAS3_ONLY_DEFAULTS.items():
            if key in config:
                setting = config.pop(key)
                if setting not in defaults:
                    raise ArchitectureNotTranslatable(
                        f"'{config.get('name') or out.get('class_name')}' has "
                        f"{key}={setting!r}, which Keras 2 has no form for")
        if out.get("class_name") == "InputLayer" and "batch_shape" in config:
            config["batch_input_shape"] = config.pop("batch_shape")
        for key in ("input_layers", "output_layers"):
            if key in config:
                config[key] = _endpoints(config[key])
    if "inbound_nodes" in out:
        out["inbound_nodes"] = [_node(node) for node in out["inbound_nodes"] or []]
    return out


def keras3_model_config_for_keras2(model_config: Dict[str, Any]) -> Dict[str, Any]:
    """`model_config` (parsed from a Keras 3 `.h5`) in the form Keras 2 reads."""
    return _rewrite(model_config)


# Keras 2's `hard_sigmoid` is clip(0.2 x + 0.5, 0, 1); Keras 3's, by the same name, is
# clip(x / 6 + 0.5, 0, 1). A Keras 2 architecture names Keras 2's by this name in Keras 3
# (the reader supplies the function: `_load`).
KERAS2_HARD_SIGMOID = "keras2_hard_sigmoid"


def _is_history(value: Any) -> bool:
    """Keras 2's record of a tensor passed to a call: [layer, node, tensor]."""
    return isinstance(value, list) and len(value) == 3 and isinstance(value[0], str) \
        and all(isinstance(index, int) for index in value[1:])


def _keras3_tensor(history: List[Any]) -> Dict[str, Any]:
    # Keras 3 replaces it by the output of `history` it has built: shape and dtype unused.
    return {"class_name": _TENSOR,
            "config": {"shape": [], "dtype": "float32", "keras_history": list(history)}}


def _tensors_in_keyword_arguments(value: Any) -> Any:
    if _is_history(value):
        return _keras3_tensor(value)
    if isinstance(value, list):
        return [_tensors_in_keyword_arguments(item) for item in value]
    if isinstance(value, dict):
        return {key: _tensors_in_keyword_arguments(item) for key, item in value.items()}
    return value


def _keras3_node(node: Any) -> Any:
    """A Keras 2 call record that passes tensors by keyword (`MultiHeadAttention`'s
    `value`) in Keras 3's form: Keras 3 reads Keras 2's form but passes those on as lists."""
    if not isinstance(node, list) or not all(isinstance(entry, list) and len(entry) == 4
                                             for entry in node) or not node:
        return node
    kwargs = node[0][3]
    if not isinstance(kwargs, dict) or _tensors_in_keyword_arguments(kwargs) == kwargs:
        return node
    tensors = [_keras3_tensor(entry[:3]) for entry in node]
    return {"args": [tensors[0] if len(tensors) == 1 else tensors],
            "kwargs": _tensors_in_keyword_arguments(kwargs)}


def _without_keras2_only(value: Any, custom_names: FrozenSet[str]) -> Any:
    if isinstance(value, list):
        return [_without_keras2_only(item, custom_names) for item in value]
    if not isinstance(value, dict):
        return value
    out = {key: _without_keras2_only(item, custom_names) for key, item in value.items()}
    if isinstance(out.get("inbound_nodes"), list):
        out["inbound_nodes"] = [_keras3_node(node) for node in out["inbound_nodes"]]
    class_name, config = out.get("class_name"), out.get("config")
    if not isinstance(config, dict) or class_name in custom_names:
        return out
    rules = {**_KERAS2_ONLY["*"], **_KERAS2_ONLY.get(str(class_name), {})}
    for key, kept_at in rules.items():
        if key not in config:
            continue
        setting = config.pop(key)
        if kept_at is not _ANY and setting not in kept_at:
            raise ArchitectureNotTranslatable(
                f"'{config.get('name') or class_name}' has {key}={setting!r}, which Keras 3 "
                "has no form for")
    for key, setting in config.items():
        if key.endswith("activation") and setting == "hard_sigmoid":
            config[key] = KERAS2_HARD_SIGMOID
    dtype = config.get("dtype")
    if isinstance(dtype, dict) and dtype.get("class_name") == "Policy":
        # Keras 2's mixed-precision policy object; Keras 3 takes the policy's name.
        config["dtype"] = (dtype.get("config") or {}).get("name", "float32")
    return out


def keras2_model_config_for_keras3(model_config: Dict[str, Any],
                                   custom_names: FrozenSet[str] = frozenset()) -> Dict[str, Any]:
    """`model_config` (parsed from a Keras 2 `.h5`) in the form Keras 3 reads; the classes
    `custom_names` names are the trial's own, and keep their arguments."""
    return _without_keras2_only(model_config, custom_names)


def without_generator_choice(model_config: Dict[str, Any]) -> bool:
    """Leave out of a Keras 2 architecture, in place, the generator choice the trial
    process made for every random layer (`enable_tf_random_generator()` has each record
    `rng_type: "stateful"`): it is the harness's, not the model's, and Keras 3 refuses it.
    True where any was left out."""
    changed = False
    stack: List[Any] = [model_config]
    while stack:
        value = stack.pop()
        if isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, dict):
            config = value.get("config")
            if "class_name" in value and isinstance(config, dict) \
                    and config.get("rng_type") == "stateful":
                del config["rng_type"]
                changed = True
            stack.extend(value.values())
    return changed
