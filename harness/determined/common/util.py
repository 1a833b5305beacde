"""determined.common.util: Determined's internal helpers. It imports (Determined's test
helpers import it at their top); every name in it refuses, in one sentence, when used."""

from determined import _refused

__getattr__ = _refused.refusing_getattr("common.util", "no names")
