"""Rewrite the architecture a Keras 3 `.h5` records (its `model_config` attribute) in the
form Keras 2 reads. Pure Python, tested without TensorFlow.

    config = keras3_model_config_for_keras2(json.loads(h5.attrs["model_config"]))

Keras 2 reads Keras 3's nested objects (`module`/`class_name`/`config`/`registered_name`)
itself, but not: a dtype policy object (Keras 2 takes the dtype's name), an `InputLayer`'s
`batch_shape` (Keras 2: `batch_input_shape`), the call records of a functional model
(Keras 3: `{"args": [tensors], "kwargs": ...}`; Keras 2: `[[layer, node, tensor, kwargs]]`),
and arguments Keras 3 added (`optional`, `quantization_config`, an initializer's axes) that
hold their defaults. (Keras 3 reads Keras 2's `.h5` as it is.)
"""

from __future__ import annotations

from typing import Any, Dict, List

# Arguments Keras 3 added to built-in classes, left out where they hold these values.
_KERAS3_ONLY_DEFAULTS: Dict[str, tuple] = {
    "optional": (False,), "quantization_config": (None,), "input_axes": (None,),
    "output_axes": (None,), "lora_rank": (None,), "lora_alpha": (None,),
}
_TENSOR = "__keras_tensor__"


class ArchitectureNotTranslatable(ValueError):
    """An argument Keras 3 added holds a value Keras 2 has no form for."""


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
