"""The one error an operation raises for what a user can fix (beside `NotFound`)."""

from __future__ import annotations

from localdet.records.db import NotFound

__all__ = ["NotFound", "OperationError"]


class OperationError(ValueError):
    """The operation cannot be done; the message says why, in one sentence."""
