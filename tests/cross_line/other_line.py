"""The Keras 2 side of tests/test_cross_line.py, in one subprocess: catalogue.py's cases
and names (the Keras 3 side's translated), checkpoints trained here as the harness writes
them, and the Keras 3 side's checkpoints loaded here.

    TF_USE_LEGACY_KERAS=1 python other_line.py REQUEST.json ANSWER.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import catalogue  # noqa: E402
import checkpoints  # noqa: E402


def main(request_path: str, answer_path: str) -> None:
    request = json.loads(Path(request_path).read_text())
    answer = catalogue.side(request)
    scratch = Path(request["scratch"])
    folder, recorded = checkpoints.script_checkpoint(scratch / "script")
    answer["script"] = {"folder": str(folder), "recorded": recorded}
    answer["trials"] = {}
    for name in request["trials"]:
        folder, recorded = checkpoints.trial_checkpoint(scratch / name, f"model_def:{name}")
        answer["trials"][name] = {"folder": str(folder), "recorded": recorded}
    answer["optimizer"] = checkpoints.optimizer_of(Path(request["other_script"]))
    answer["loaded"] = {
        "other_script": checkpoints.evaluate_loaded(Path(request["other_script"]),
                                                    checkpoints.script_data(1, 64)),
        "HeadsTrial": checkpoints.evaluate_loaded(Path(answer["trials"]["HeadsTrial"]["folder"]),
                                                  checkpoints.trial_validation()),
    }
    Path(answer_path).write_text(json.dumps(answer, default=str))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
