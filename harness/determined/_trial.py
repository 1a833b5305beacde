"""`det.Trial` (Determined's base of every trial class, named `LegacyTrial` from 0.27 on) and
`det.TrialController`, which localdet does not expose."""

from __future__ import annotations

from typing import Any

from determined import errors
from determined._trial_context import TrialContext


class TrialController:
    """Determined's driver of a trial; localdet's runner drives trials itself."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise errors.refuse("det.TrialController", "localdet's runner drives the trial; "
                            "run it with `localdet run CONFIG MODEL_DIR` or `localdet submit`")


class Trial:
    """The base of trial classes: `trial_context_class` builds its context."""

    trial_context_class: Any = TrialContext
    trial_controller_class: Any = TrialController

    def __init__(self, context: TrialContext) -> None:
        self.context = context


LegacyTrial = Trial
