"""What a search method does given the metrics this folder's trial reports, without a
daemon: the events a daemon would record, one at a time, fed to the method through a
SearchRunner, and every operation it answered, with request UUIDs replaced by the order the
trials were created in (so two runs compare)."""

import collections
import importlib.util
import json
from pathlib import Path
from typing import Any, Dict, List

from determined import searcher


def _trial_module():
    """The experiment's train.py, under a name of its own: imported as `train` it would
    stand in for every other folder's train.py in this process (pytest runs many)."""
    path = Path(__file__).resolve().parent / "experiment" / "train.py"
    spec = importlib.util.spec_from_file_location("custom_search_experiment_train", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


loss = _trial_module().loss


def normalized(operations: List[Dict[str, Any]], names: Dict[str, int]) -> List[tuple]:
    """Operation dicts (as posted) as tuples, UUIDs named by creation order."""
    found = []
    for op in operations:
        op = dict(op)
        if op["type"] == "create":
            names.setdefault(op["request_id"], len(names) + 1)
        if "request_id" in op:
            op["request_id"] = names[op["request_id"]]
        if op["type"] == "progress":
            op["progress"] = round(op["progress"], 6)
        found.append(tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in op.items())))
    return found


def simulate(method: searcher.SearchMethod) -> List[List[tuple]]:
    """The method's answers, event by event, until it shuts the search down."""
    runner = searcher.SearchRunner(method)
    pending = collections.deque([{"kind": "initial_operations"}])
    hparams: Dict[str, dict] = {}
    names: Dict[str, int] = {}
    answers = []
    shut = False
    while pending and not shut:
        event = pending.popleft()
        event["id"] = len(answers) + 1
        operations = [op._to_dict() for op in runner._operations_for(event)]
        answers.append(normalized(operations, names))
        for op in operations:
            request = op.get("request_id")
            if op["type"] == "create":
                hparams[request] = op["hparams"]
                pending.append({"kind": "trial_created", "request_id": request})
            elif op["type"] == "validate_after" and hparams[request].get("fail"):
                pending.append({"kind": "trial_exited_early", "request_id": request,
                                "exited_reason": "ERRORED"})
            elif op["type"] == "validate_after":
                pending.append({"kind": "validation_completed", "request_id": request,
                                "metric": loss(hparams[request], op["length"]),
                                "length": op["length"]})
            elif op["type"] == "close":
                pending.append({"kind": "trial_closed", "request_id": request})
            elif op["type"] == "shutdown":
                shut = True
    return answers
