"""determined.common: Determined's shared internals (the master's API client, its
configuration and argument-checking helpers, its checkpoint storage). localdet serves what
user code and Determined's own test material touch:

- `determined.common.storage`: `SharedFSStorageManager` and its base class, for an
  off-cluster checkpoint context (`core.DummyCheckpointContext(distributed, manager)`);
- `determined.common.check`: `CheckFailedError`, the error Determined's argument checks
  raised (the Keras data adapters raise it here too);
- `determined.common.util`: importable, with no names;
- `determined.common.experimental`: the SDK's classes (`determined.experimental` re-exports
  them), over localdet's records;
- `determined.common.api`: its `errors` only (`NotFoundException`, `APIException`), which
  the SDK raises.

Any other module or name of it refuses, in one sentence, when used.
"""

import importlib
from typing import Any

from determined import _refused

_SUBMODULES = ("storage", "check", "util", "experimental", "api")
_refuse = _refused.refusing_getattr(
    "common", "only storage, check, util, experimental and api.errors")


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:  # `from determined.common import storage` before its import
        return importlib.import_module(f"determined.common.{name}")
    return _refuse(name)
