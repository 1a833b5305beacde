"""The daemon: the loop that watches the queue, drives searches, places and launches trials
and notices them end; `localdet run` runs the same loop in the foreground."""
