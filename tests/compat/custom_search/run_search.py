"""Run one of this folder's search methods the way Determined's users ran theirs:

    python run_search.py asha SEARCHER_DIR      # or: random

It prints the experiment's id when the search has ended. Started again with the same
SEARCHER_DIR (after being killed, say), it resumes that search."""

import logging
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from determined import searcher  # noqa: E402

METHODS = {
    "asha": lambda: __import__("asha").ASHASearchMethod(max_trials=4, num_rungs=3,
                                                        min_length=2, divisor=2, seed=11),
    "random": lambda: __import__("random_early_exits").RandomWithEarlyExits(
        max_trials=6, length=3, concurrency=2, seed=5),
}

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    searcher._search_runner.POLL_SECONDS = 0.1  # tiny trials: look for their news often
    method = METHODS[sys.argv[1]]()
    config = str(HERE / "experiment" / "config.yaml")
    runner = searcher.LocalSearchRunner(method, searcher_dir=Path(sys.argv[2]))
    experiment_id = runner.run(config, model_dir=str(HERE / "experiment"))
    print(f"experiment {experiment_id} ended", flush=True)
