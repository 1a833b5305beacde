"""Hyperparameter search: `methods/` are the search methods (which trials, how long each
trains; pure functions of config, seed and events), `driver.py` records what happened to
trials and carries out what a method answers."""
