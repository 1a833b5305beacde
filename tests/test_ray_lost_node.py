"""How a Ray launch's end is judged: a node that went away is not the trial's failure.

When a node goes, its trial's program may die first, by a signal, while its actor still
answers for a moment (CI saw it: the launch's status came back -9, the node alive still in
the cluster's table, and the trial was failed). So a launch killed by a signal is the
trial's failure only once its actor proves alive after it; a rank whose node may have gone
holds its launch's judgement. Ray is replaced by a fake whose calls the test completes; the
launch classes are the real ones (the end-to-end case is test_ray_cluster's node test)."""

from __future__ import annotations

import types

import pytest

from localdet.scheduling import ray_cluster
from localdet.scheduling.ray_cluster import LOST_EXIT, RayRanks, RayTrial


class _ActorError(Exception):
    pass


class _Ref:
    def __init__(self, value=None, ready=False):
        self.value, self.ready = value, ready

    def set(self, value) -> None:
        self.value, self.ready = value, True


class _Method:
    def __init__(self, make):
        self.make = make

    def remote(self, *args):
        return self.make(*args)


class _Actor:
    def __init__(self):
        self.ended = _Ref()
        self.alive_checks: list[_Ref] = []
        self.wait = _Method(lambda: self.ended)
        self.read_output = _Method(lambda offset: _Ref((offset, b""), ready=True))
        self.__ray_ready__ = _Method(self._check)
        self.signal = _Method(lambda signum: _Ref(None, ready=True))

    def _check(self):
        self.alive_checks.append(_Ref())
        return self.alive_checks[-1]


def _get(ref, timeout=None):
    if isinstance(ref.value, Exception):
        raise ref.value
    return ref.value


_FAKE_RAY = types.SimpleNamespace(
    wait=lambda refs, timeout=None: ([r for r in refs if r.ready],
                                     [r for r in refs if not r.ready]),
    get=_get, kill=lambda actor, no_restart=True: None,
    exceptions=types.SimpleNamespace(RayActorError=_ActorError),
    util=types.SimpleNamespace(remove_placement_group=lambda group: None))


class _Cluster:
    def __init__(self):
        self.dead: set[str] = set()

    def node_alive(self, node: str) -> bool:
        return node not in self.dead


class _Log:
    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture
def cluster(monkeypatch):
    monkeypatch.setattr(ray_cluster, "_ray", lambda: _FAKE_RAY)
    monkeypatch.setattr(ray_cluster, "KILLED_CONFIRM_SECONDS", 0.0)
    return _Cluster()


def launch(cluster, node="n1") -> tuple[RayTrial, _Actor]:
    actor = _Actor()
    return RayTrial(cluster, actor, "trial", 1, node, "127.0.0.1", _Log()), actor


def test_a_launch_killed_as_its_node_goes_is_lost_not_failed(cluster):
    trial, actor = launch(cluster)
    actor.ended.set(-9)  # the program first, the actor still answering
    assert trial.poll() is None and trial.settling
    cluster.dead.add("n1")  # the cluster's table catches up
    assert trial.poll() == LOST_EXIT and trial.lost


def test_a_launch_killed_on_a_live_node_fails_once_its_actor_answers(cluster):
    trial, actor = launch(cluster)
    actor.ended.set(-9)  # the kernel's memory killer, say
    assert trial.poll() is None
    (check,) = actor.alive_checks
    check.set(None)  # the actor answers after its program's death
    assert trial.poll() == -9 and not trial.lost and not trial.settling


def test_a_launch_whose_actor_dies_after_its_program_waits_for_the_node(cluster):
    trial, actor = launch(cluster)
    actor.ended.set(-9)
    assert trial.poll() is None
    actor.alive_checks[0].set(_ActorError("the actor died"))
    assert trial.poll() is None  # its node may be going: the table is asked again
    cluster.dead.add("n1")
    assert trial.poll() == LOST_EXIT and trial.lost


def test_a_clean_or_failed_exit_is_judged_at_once(cluster):
    for code in (0, 1):
        trial, actor = launch(cluster)
        actor.ended.set(code)
        assert trial.poll() == code and not trial.lost and not actor.alive_checks


def test_a_ranks_failure_waits_for_a_rank_whose_node_may_be_gone(cluster):
    (chief, chief_actor), (worker, worker_actor) = launch(cluster, "n1"), launch(cluster, "n2")
    ranks = RayRanks(cluster, "trial", [chief, worker], group=None, log=_Log())
    worker_actor.ended.set(-9)  # its node going
    chief_actor.ended.set(1)  # its collective op failed with the peer
    assert ranks.poll() is None  # not judged a failure on the chief's status
    cluster.dead.add("n2")
    assert ranks.poll() == LOST_EXIT and ranks.lost
