"""The seam between the SDK's objects and whatever keeps the records: the SDK imports
nothing of localdet and finds its backend through the entry point group
`determined.client_backends` (localdet registers `localdet.operations.sdk_backend`), as
`determined.core._reporting` finds its reporters.

A backend answers named operations with JSON-able data, so one that talks to another
process (HTTP, say) could plug in later without the objects changing:

    backend().call("experiment.get", experiment_id=7)      # -> a dict
    backend().call("checkpoint.list", experiment_id=7, max_results=1)

and raises `determined.common.api.errors.NotFoundException` for what does not exist and
`determined.common.api.errors.APIException` for what cannot be done, each with one
sentence.
"""

from __future__ import annotations

import functools
from typing import Any, Protocol

BACKEND_GROUP = "determined.client_backends"


class ClientBackend(Protocol):
    """What a backend plugs in: the entry point names a class, made once per process with
    no arguments."""

    def call(self, operation: str, **arguments: Any) -> Any:
        """Do `operation` (e.g. "experiment.pause") with keyword `arguments`; returns
        JSON-able data."""
        ...


@functools.lru_cache(maxsize=1)
def backend() -> ClientBackend:
    """The installed backend, looked up once per process."""
    from determined._plugin import only_plugin

    return only_plugin(BACKEND_GROUP, "records backend", "serve determined.experimental")


def call(operation: str, **arguments: Any) -> Any:
    """`backend().call(operation, **arguments)`."""
    return backend().call(operation, **arguments)
