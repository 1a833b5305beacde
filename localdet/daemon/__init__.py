"""The daemon: the loop that watches the queue, drives searches, places and launches trials
and notices them end, and its intake (queue folders become experiments and jobs)."""
