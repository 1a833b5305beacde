"""determined.common.api: of Determined's master client, localdet serves the error classes
(`determined.common.api.errors`) that the SDK (`determined.experimental.client`) raises, so
that code catching `errors.NotFoundException` or `errors.APIException` works as before.
Any other name refuses, in one sentence, when used.
"""

import importlib
from typing import Any

from determined import _refused

_refuse = _refused.refusing_getattr("common.api", "only errors")


def __getattr__(name: str) -> Any:
    if name == "errors":  # `from determined.common.api import errors` before its import
        return importlib.import_module("determined.common.api.errors")
    return _refuse(name)
