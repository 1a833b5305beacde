"""Which queued trials start now, on which slots. Pure: plain data in, assignments out.

    waiting = [Waiting(trial_id=4, experiment_id=1, slots_needed=1, priority=None, order=4),
               Waiting(trial_id=5, experiment_id=1, slots_needed=1, priority=None, order=5),
               Waiting(trial_id=9, experiment_id=2, slots_needed=1, priority=None, order=9)]
    assign(waiting, free_slots=[0, 1], busy_by_experiment={})
    # [(4, [0]), (9, [1])]: each experiment gets a slot before either gets a second

Experiments share the slots fairly: the next slots go to the experiment with the fewest slots
in use (counting what this round already gave it); ties go to the lower `resources.priority`
(Determined's convention: lower is more important, None means 42), then to the experiment
whose next trial was queued first (lower `order`). An experiment's own trials start in
`order`. `resources.max_slots` caps what an experiment holds at once; an experiment at its
cap is passed over. When the chosen trial does not fit in the free slots, nothing more starts
this round: smaller trials never overtake it, so a big trial is not starved by a stream of
small ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEFAULT_PRIORITY = 42  # Determined's default for resources.priority


@dataclass(frozen=True)
class Waiting:
    trial_id: int
    experiment_id: int
    slots_needed: int
    priority: int | None = None  # the experiment's resources.priority; lower goes first
    order: int = 0               # place in the queue (e.g. the trial id): lower goes first
    spans_nodes: bool = False    # its ranks may run on several machines (on a cluster)


def _pick_slots(free: list[int], needed: int, node_of: dict[int, Any] | None = None,
                spans_nodes: bool = False) -> list[int] | None:
    """The lowest run of `needed` consecutive free slots, else the lowest free slots. With
    `node_of` (slot -> its machine's key, on a cluster), only slots of one machine, the one
    with the lowest key that has enough; when none has, None, or with `spans_nodes` the
    fewest machines that together have enough (the fullest first)."""
    if needed <= 0:
        return []
    if node_of is not None:
        by_node: dict[Any, list[int]] = {}
        for slot in free:
            by_node.setdefault(node_of[slot], []).append(slot)
        fitting = [node for node, slots in by_node.items() if len(slots) >= needed]
        if fitting:
            return _pick_slots(by_node[min(fitting)], needed)
        if not spans_nodes or len(free) < needed:
            return None
        taken: list[int] = []
        for node in sorted(by_node, key=lambda node: (-len(by_node[node]), node)):
            taken += by_node[node][:needed - len(taken)]
            if len(taken) == needed:
                return taken
        return None
    for start in range(len(free) - needed + 1):
        run = free[start:start + needed]
        if run[-1] - run[0] == needed - 1:
            return run
    return free[:needed]


def assign(waiting: list[Waiting], free_slots: list[int],
           busy_by_experiment: dict[int, int],
           max_slots_by_experiment: dict[int, int | None] | None = None,
           node_of: dict[int, Any] | None = None,
           ) -> list[tuple[int, list[int]]]:
    """(trial id, slots) for each trial to start now, in the order they were chosen.

    `busy_by_experiment`: experiment id -> slots its running trials hold.
    `max_slots_by_experiment`: experiment id -> resources.max_slots (None or absent: no cap).
    `node_of`: slot -> a key of the machine it is on, on a cluster: a trial's slots are on
    one machine, the one with the lowest key that has room (a key orders the machines),
    unless it `spans_nodes` and no one machine has room.
    """
    free = sorted(set(free_slots))
    caps = max_slots_by_experiment or {}
    in_use = dict(busy_by_experiment)
    queues: dict[int, list[tuple[int, int, Waiting]]] = {}
    for position, trial in enumerate(waiting):
        queues.setdefault(trial.experiment_id, []).append((trial.order, position, trial))
    for queue in queues.values():
        queue.sort(key=lambda entry: entry[:2])
        queue.reverse()  # next trial last, so that taking it is a pop()

    def rank(experiment_id: int) -> tuple:
        order, position, head = queues[experiment_id][-1]
        priority = DEFAULT_PRIORITY if head.priority is None else head.priority
        return in_use.get(experiment_id, 0), priority, order, position

    def under_cap(experiment_id: int) -> bool:
        cap = caps.get(experiment_id)
        needed = queues[experiment_id][-1][2].slots_needed
        return cap is None or in_use.get(experiment_id, 0) + needed <= cap

    assignments = []
    while free:
        candidates = [e for e, queue in queues.items() if queue and under_cap(e)]
        if not candidates:
            break
        chosen = min(candidates, key=rank)
        trial = queues[chosen][-1][2]
        taken = _pick_slots(free, trial.slots_needed, node_of, trial.spans_nodes) \
            if trial.slots_needed <= len(free) else None
        if taken is None:
            break  # no backfilling past it
        queues[chosen].pop()
        free = [slot for slot in free if slot not in taken]
        in_use[chosen] = in_use.get(chosen, 0) + trial.slots_needed
        assignments.append((trial.trial_id, taken))
    return assignments
