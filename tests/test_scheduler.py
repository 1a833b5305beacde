"""Tests of localdet.scheduling.placement.assign: fair sharing between experiments, priority, queue
order, max_slots, and no backfilling past a trial that does not fit."""

from __future__ import annotations

from localdet.scheduling.placement import Waiting, assign


def one_experiment(*slots_needed: int, experiment_id: int = 1, first_id: int = 1):
    """Trials of one experiment, queued in the order given (order = trial id)."""
    return [Waiting(first_id + i, experiment_id, n, None, first_id + i)
            for i, n in enumerate(slots_needed)]


# -- one experiment: its trials in order, on the lowest free slots ----------------------------
def test_one_trial_one_slot():
    assert assign([Waiting(4, 1, 1, None, 4)], free_slots=[0, 1], busy_by_experiment={}) == [
        (4, [0])]


def test_trials_start_in_queue_order_on_the_lowest_free_slots():
    waiting = [Waiting(9, 1, 1, None, 3), Waiting(3, 1, 1, None, 1), Waiting(5, 1, 1, None, 2)]
    assert assign(waiting, free_slots=[7, 2, 5], busy_by_experiment={}) == [
        (3, [2]), (5, [5]), (9, [7])]


def test_equal_order_keeps_the_order_given():
    waiting = [Waiting(9, 1, 1), Waiting(3, 1, 1), Waiting(5, 1, 1)]
    assert assign(waiting, free_slots=[0, 1, 2], busy_by_experiment={}) == [
        (9, [0]), (3, [1]), (5, [2])]


def test_slot_counts_are_honoured_and_slots_never_shared():
    waiting = one_experiment(2, 1, 3)
    result = assign(waiting, free_slots=list(range(8)), busy_by_experiment={})
    assert result == [(1, [0, 1]), (2, [2]), (3, [3, 4, 5])]
    given = [slot for _, slots in result for slot in slots]
    assert len(given) == len(set(given))


def test_stops_when_the_slots_run_out():
    assert assign(one_experiment(1, 1, 1), free_slots=[0, 1], busy_by_experiment={}) == [
        (1, [0]), (2, [1])]


def test_a_big_trial_blocks_the_smaller_ones_behind_it():
    # Trial 2 needs 4 of the 2 slots left after trial 1: trials 3 and 4 wait behind it,
    # though each would fit, so trial 2 is not starved by a stream of small trials.
    assert assign(one_experiment(1, 4, 1, 1), free_slots=[0, 1, 2],
                  busy_by_experiment={}) == [(1, [0])]


def test_a_big_trial_at_the_front_blocks_everything():
    assert assign(one_experiment(3, 1), free_slots=[0, 1], busy_by_experiment={}) == []


def test_no_free_slots_assigns_nothing():
    assert assign(one_experiment(1, 2), free_slots=[], busy_by_experiment={}) == []


def test_nothing_waiting_assigns_nothing():
    assert assign([], free_slots=[0, 1, 2], busy_by_experiment={1: 1}) == []


def test_inputs_are_not_modified():
    waiting, free, busy, caps = one_experiment(1, 1), [1, 0], {1: 0, 2: 3}, {1: 5}
    assign(waiting, free, busy, caps)
    assert waiting == one_experiment(1, 1) and free == [1, 0]
    assert busy == {1: 0, 2: 3} and caps == {1: 5}


# -- fairness between experiments -------------------------------------------------------------
def test_two_experiments_share_the_slots_however_many_trials_each_has():
    many = one_experiment(1, 1, 1, 1, 1, experiment_id=1, first_id=1)  # submitted first
    one = one_experiment(1, experiment_id=2, first_id=6)
    result = assign(many + one, free_slots=[0, 1], busy_by_experiment={})
    assert result == [(1, [0]), (6, [1])]


def test_slots_in_use_count_towards_fairness():
    # Experiment 1 already holds 2 slots; experiment 2 gets the next two before it gets more.
    waiting = (one_experiment(1, 1, experiment_id=1, first_id=1)
               + one_experiment(1, 1, 1, experiment_id=2, first_id=10))
    result = assign(waiting, free_slots=[2, 3, 4], busy_by_experiment={1: 2, 2: 0})
    assert result == [(10, [2]), (11, [3]), (1, [4])]


def test_slots_given_this_round_count_towards_fairness():
    # A 2-slot trial of experiment 1 counts as 2 in use: experiment 2 gets the next two.
    waiting = (one_experiment(2, 1, experiment_id=1, first_id=1)
               + one_experiment(1, 1, 1, experiment_id=2, first_id=10))
    result = assign(waiting, free_slots=list(range(5)), busy_by_experiment={})
    assert result == [(1, [0, 1]), (10, [2]), (11, [3]), (2, [4])]


def test_ties_go_to_the_lower_priority_number():
    waiting = [Waiting(1, 1, 1, 50, 1), Waiting(2, 2, 1, 10, 2), Waiting(3, 3, 1, None, 3)]
    # 10 before the default 42 before 50, though experiment 1 was queued first.
    assert assign(waiting, free_slots=[0, 1, 2], busy_by_experiment={}) == [
        (2, [0]), (3, [1]), (1, [2])]
    assert assign(waiting, free_slots=[0], busy_by_experiment={}) == [(2, [0])]


def test_priority_does_not_override_fairness():
    waiting = [Waiting(1, 1, 1, 1, 1), Waiting(2, 1, 1, 1, 2), Waiting(3, 2, 1, 99, 3)]
    assert assign(waiting, free_slots=[0, 1], busy_by_experiment={1: 1}) == [
        (3, [0]), (1, [1])]


def test_ties_in_priority_go_to_the_trial_queued_first():
    waiting = [Waiting(7, 2, 1, None, 7), Waiting(4, 1, 1, None, 4)]
    assert assign(waiting, free_slots=[0], busy_by_experiment={}) == [(4, [0])]
    assert assign(waiting, free_slots=[0, 1], busy_by_experiment={}) == [(4, [0]), (7, [1])]


# -- max_slots --------------------------------------------------------------------------------
def test_max_slots_caps_an_experiment_and_the_others_go_on():
    waiting = (one_experiment(1, 1, 1, experiment_id=1, first_id=1)
               + one_experiment(1, 1, experiment_id=2, first_id=10))
    result = assign(waiting, free_slots=list(range(6)), busy_by_experiment={1: 1},
                    max_slots_by_experiment={1: 2, 2: None})
    assert result == [(10, [0]), (1, [1]), (11, [2])]  # experiment 1 stops at 2 in all


def test_an_experiment_at_its_max_slots_does_not_block_the_queue():
    waiting = one_experiment(1, experiment_id=1, first_id=1) + one_experiment(
        1, experiment_id=2, first_id=5)
    # Experiment 1 ranks first (nothing in use, queued first) but is at its cap: skipped.
    assert assign(waiting, free_slots=[3], busy_by_experiment={1: 0, 2: 1},
                  max_slots_by_experiment={1: 0}) == [(5, [3])]


def test_a_trial_that_would_pass_max_slots_waits():
    waiting = one_experiment(2, experiment_id=1) + one_experiment(1, experiment_id=2,
                                                                  first_id=5)
    assert assign(waiting, free_slots=[0, 1, 2], busy_by_experiment={1: 1},
                  max_slots_by_experiment={1: 2}) == [(5, [0])]


# -- no backfilling, slot choice --------------------------------------------------------------
def test_no_backfilling_past_a_trial_that_does_not_fit():
    # Experiment 2's 3-slot trial is next (experiment 2 holds less); it does not fit in the 2
    # free slots, so experiment 1's 1-slot trials do not start either.
    waiting = one_experiment(1, 1, experiment_id=1) + one_experiment(3, experiment_id=2,
                                                                     first_id=5)
    assert assign(waiting, free_slots=[2, 3], busy_by_experiment={1: 2}) == []
    # Once three slots are free it starts first.
    assert assign(waiting, free_slots=[1, 2, 3], busy_by_experiment={1: 1}) == [
        (5, [1, 2, 3])]


def test_multi_slot_trials_get_the_lowest_contiguous_slots():
    assert assign(one_experiment(2, 2), free_slots=[5, 4, 0, 1, 2, 3],
                  busy_by_experiment={}) == [(1, [0, 1]), (2, [2, 3])]
    # With a gap, the lowest run that fits is taken and the lone slot stays for a 1-slot trial.
    assert assign(one_experiment(2, 1), free_slots=[0, 2, 3], busy_by_experiment={}) == [
        (1, [2, 3]), (2, [0])]
    # No run long enough: the lowest free slots.
    assert assign(one_experiment(2), free_slots=[1, 3, 5], busy_by_experiment={}) == [
        (1, [1, 3])]


# -- on a cluster: a trial's slots on one machine, unless its ranks may span machines ---------
NODES = {0: "a", 1: "a", 2: "b", 3: "c", 4: "c"}  # slot -> machine key ("a" orders first)


def test_on_a_cluster_a_trial_stays_on_the_first_machine_with_room():
    assert assign(one_experiment(2), [0, 2, 3, 4], {}, node_of=NODES) == [(1, [3, 4])]
    assert assign(one_experiment(2), [0, 1, 3, 4], {}, node_of=NODES) == [(1, [0, 1])]


def test_a_trial_that_fits_no_machine_waits_unless_its_ranks_may_span_machines():
    waiting = one_experiment(3)
    assert assign(waiting, [0, 2, 3, 4], {}, node_of=NODES) == []
    spanning = [Waiting(1, 1, 3, None, 1, spans_nodes=True)]
    # the fewest machines: the fullest first (c has two free), then the lowest key
    assert assign(spanning, [0, 2, 3, 4], {}, node_of=NODES) == [(1, [3, 4, 0])]
    # one machine with room is still preferred
    assert assign([Waiting(1, 1, 2, None, 1, spans_nodes=True)], [0, 2, 3, 4], {},
                  node_of=NODES) == [(1, [3, 4])]
    # not enough free slots in the whole cluster: it waits, and nothing passes it
    assert assign(spanning + one_experiment(1, first_id=2), [0, 2], {}, node_of=NODES) == []
