"""Trial processes: how one is launched, supervised (ranks, warm forks, capped logs, memory
limit), and how its exit is read."""
