"""determined.workload: the messages Determined's runner sent its trial controller. localdet's
runner drives a trial itself, so only the type names code annotates with are served
(`Stream`, `Metrics`, `Response`, `ResponseFunc`, as Determined defined their shape); every
other name (workloads, `WorkloadResponseInterceptor`, ...) refuses, in one sentence, when
used."""

from typing import Any, Callable, Dict, Iterator, Tuple

from determined import _refused

Metrics = Dict[str, Any]
Response = Any  # a Metrics or Determined's InvalidHP marker
ResponseFunc = Callable[[Response], None]
Stream = Iterator[Tuple[Any, ResponseFunc]]  # (a workload, where its response goes)

__getattr__ = _refused.refusing_getattr("workload", "only its type names")
