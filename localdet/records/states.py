"""The states an experiment or a trial can be in, as the database stores them.

A module of its own so that the pure deciders (retention, the searchers' drivers) can test a
state without importing the database layer, which imports some of them in turn.
"""

EXPERIMENT_STATES = ("ACTIVE", "PAUSED", "COMPLETED", "CANCELED", "ERROR")
# WAITING: trained to its searcher length and validated; the searcher may still promote it
# (ASHA), or close it.
TRIAL_STATES = ("QUEUED", "RUNNING", "PAUSED", "WAITING", "COMPLETED", "CANCELED", "ERROR")
TERMINAL_STATES = ("COMPLETED", "CANCELED", "ERROR")
