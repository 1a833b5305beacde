"""determined.common.check: of Determined's argument checks, the error they raised, which
code catches (`except check.CheckFailedError`); the checks themselves are internal and
refuse, in one sentence, when used."""

from determined import _refused


class CheckFailedError(ValueError):
    """An argument Determined's API was given is not acceptable; the message says which."""


__getattr__ = _refused.refusing_getattr("common.check", "only CheckFailedError")
