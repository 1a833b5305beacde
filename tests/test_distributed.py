"""DistributedContext across real processes.

Each multi-process test starts this file as a script once per rank (`python
test_distributed.py SCENARIO`) with the LOCALDET_* variables the launcher would set; the
scenario asserts on its own rank and prints a JSON result, and the test checks every rank's
exit status and result. No TensorFlow here: `determined.core` does not need it.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from typing import Any, Dict, List

import numpy as np
import pytest

from determined.core import (
    DistributedContext,
    DistributedEnvironment,
    _process_group,
    distributed_environments,
    read_distributed_environment,
)

PROCESS_TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def rank_environments(size: int, key: str = "") -> List[Dict[str, str]]:
    """The launcher's contract, spelled out: the variable names are the API."""
    address, key = f"127.0.0.1:{free_port()}", key or secrets.token_hex(32)
    return [{"LOCALDET_RANK": str(rank), "LOCALDET_SIZE": str(size),
             "LOCALDET_CHIEF_ADDR": address, "LOCALDET_DIST_AUTHKEY": key}
            for rank in range(size)]


def start(scenario: str, env: Dict[str, str]) -> subprocess.Popen:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("LOCALDET_") and k != "TF_CONFIG"}
    return subprocess.Popen([sys.executable, __file__, scenario], env={**base, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen) -> Dict[str, Any]:
    try:
        out, err = process.communicate(timeout=PROCESS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise AssertionError(f"a rank hung:\n{err}") from None
    assert process.returncode == 0, f"a rank failed:\n{err}"
    return json.loads(out.strip().splitlines()[-1])


def run_ranks(scenario: str, envs: List[Dict[str, str]]) -> List[Dict[str, Any]]:
    processes = [start(scenario, env) for env in envs]
    return [finish(process) for process in processes]


# -- scenarios: run in the rank processes -----------------------------------------------------

def scenario_collectives() -> Dict[str, Any]:
    d = DistributedContext.from_environment()
    r, n = d.get_rank(), d.get_size()
    assert (d.rank, d.size, d.local_rank, d.local_size, d.cross_rank, d.cross_size) == \
        (r, n, r, n, 0, 1)
    assert (d.get_local_rank(), d.get_num_agents()) == (r, 1)
    assert d._group is None  # nothing opened before the first collective

    assert d.allgather(r * 10) == [i * 10 for i in range(n)]
    assert d.allgather({"rank": r, "tag": f"r{r}"}) == \
        [{"rank": i, "tag": f"r{i}"} for i in range(n)]
    arrays = d.allgather(np.arange(3.0) + r)
    for i, array in enumerate(arrays):
        np.testing.assert_array_equal(array, np.arange(3.0) + i)
    assert d.allgather(None) == [None] * n
    gathered = d.gather(("g", r))
    assert gathered == ([("g", i) for i in range(n)] if r == 0 else None)
    assert d.broadcast(f"from {r}") == "from 0"
    big = d.broadcast(np.full(300_000, float(r)))  # several MB: past the small-message path
    np.testing.assert_array_equal(big, np.zeros(300_000))

    # On one machine the local collectives are the global ones.
    assert d.allgather_local(r) == d.allgather(r) == list(range(n))
    local = d.gather_local({"r": r})
    assert local == ([{"r": i} for i in range(n)] if r == 0 else None)
    assert d.broadcast_local(f"local {r}") == "local 0"
    assert d.broadcast_local() is None  # the default: local rank 0 sends None

    for step in range(30):  # many in a row, alternating kinds
        assert d.allgather(step + r) == [step + i for i in range(n)]
        assert d.broadcast(step * 100 + r) == step * 100
        assert d.gather(step) == ([step] * n if r == 0 else None)
    d.close()
    return {"rank": r}


def scenario_tf_config() -> Dict[str, Any]:
    # Four workers on two "machines" (two host spellings): local differs from global.
    d = DistributedContext._ranks_from_tf_config()
    r = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    machine = r // 2
    assert (d.rank, d.size, d.local_rank, d.local_size, d.cross_rank, d.cross_size) == \
        (r, 4, r % 2, 2, machine, 2)
    assert d.get_num_agents() == 2
    assert d.allgather(r) == [0, 1, 2, 3]
    assert d.allgather_local(r) == [2 * machine, 2 * machine + 1]
    local = d.gather_local(f"r{r}")
    assert local == ([f"r{2 * machine}", f"r{2 * machine + 1}"] if r % 2 == 0 else None)
    assert d.broadcast_local(f"machine {machine} rank {r}") == \
        f"machine {machine} rank {2 * machine}"
    assert d.gather(r) == ([0, 1, 2, 3] if r == 0 else None)
    assert d.broadcast(r) == 0
    return {"rank": r}


def _fails_promptly(d: DistributedContext) -> Dict[str, Any]:
    began = time.monotonic()
    try:
        d.allgather("second")
    except RuntimeError as error:
        message = str(error)
    else:
        raise AssertionError("the second allgather succeeded without the rank that left")
    elapsed = time.monotonic() - began
    try:  # and stays failed
        d.broadcast(1)
    except RuntimeError:
        pass
    else:
        raise AssertionError("collectives went on after a failure")
    return {"rank": d.rank, "error": message, "elapsed": elapsed}


def scenario_early_exit() -> Dict[str, Any]:
    d = DistributedContext.from_environment()
    assert d.allgather("first") == ["first"] * d.size
    if d.rank == int(os.environ["LEAVER"]):
        return {"rank": d.rank, "left": True}  # exits; its connection closes
    return _fails_promptly(d)


def scenario_crash() -> Dict[str, Any]:
    d = DistributedContext.from_environment()
    d.allgather("first")
    if d.rank == int(os.environ["LEAVER"]):
        sys.stdout.write(json.dumps({"rank": d.rank, "left": True}) + "\n")
        sys.stdout.flush()
        os._exit(0)  # no clean-up at all, as when killed
    return _fails_promptly(d)


def scenario_wrong_order() -> Dict[str, Any]:
    d = DistributedContext.from_environment()
    try:
        d.allgather(1) if d.rank == 0 else d.broadcast(1)
    except RuntimeError as error:
        return {"rank": d.rank, "error": str(error)}
    raise AssertionError("different collectives on different ranks went unnoticed")


def scenario_join() -> Dict[str, Any]:
    d = DistributedContext.from_environment()
    try:
        return {"rank": d.rank, "allgather": d.allgather(d.rank)}
    except RuntimeError as error:
        return {"rank": d.rank, "error": str(error)}


SCENARIOS = {name[len("scenario_"):]: function for name, function in list(globals().items())
             if name.startswith("scenario_")}


# -- tests --------------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [2, 3])
def test_collectives_on_every_rank(size):
    results = run_ranks("collectives", rank_environments(size))
    assert [result["rank"] for result in results] == list(range(size))


def test_from_tf_config_across_two_machines():
    workers = ["127.0.0.1:20001", "127.0.0.1:20002", "localhost:20003", "localhost:20004"]
    shared = rank_environments(4)[0]
    envs = [{"LOCALDET_CHIEF_ADDR": shared["LOCALDET_CHIEF_ADDR"],
             "LOCALDET_DIST_AUTHKEY": shared["LOCALDET_DIST_AUTHKEY"],
             "TF_CONFIG": json.dumps({"cluster": {"worker": workers},
                                      "task": {"type": "worker", "index": index}})}
            for index in range(4)]
    assert [result["rank"] for result in run_ranks("tf_config", envs)] == [0, 1, 2, 3]


@pytest.mark.parametrize("scenario,leaver", [("early_exit", 2), ("crash", 1), ("crash", 0)])
def test_a_rank_that_leaves_fails_the_others_promptly(scenario, leaver):
    envs = [{**env, "LEAVER": str(leaver)} for env in rank_environments(3)]
    results = run_ranks(scenario, envs)
    assert results[leaver] == {"rank": leaver, "left": True}
    for result in results:
        if result["rank"] != leaver:
            assert f"rank {leaver} of 3" in result["error"], result
            assert "went away in allgather (collective #2)" in result["error"], result
            assert result["elapsed"] < 5, result


def test_ranks_calling_different_collectives_fail_saying_so():
    for result in run_ranks("wrong_order", rank_environments(2)):
        assert "rank 0 is at allgather (collective #1), rank 1 at broadcast" in \
            result["error"], result
        assert "same order" in result["error"]


def test_a_process_with_the_wrong_key_cannot_join():
    chief_env, member_env = rank_environments(2)
    chief = start("join", chief_env)
    intruder = finish(start("join", {**member_env,
                                     "LOCALDET_DIST_AUTHKEY": secrets.token_hex(32)}))
    assert "rank 0 rejected its key" in intruder["error"]
    member = finish(start("join", member_env))  # the real rank 1 still gets in
    assert member["allgather"] == [0, 1]
    assert finish(chief)["allgather"] == [0, 1]


def test_size_one_opens_no_socket(monkeypatch):
    for name in ("LOCALDET_RANK", "LOCALDET_SIZE", "LOCALDET_CHIEF_ADDR",
                 "LOCALDET_DIST_AUTHKEY"):
        monkeypatch.delenv(name, raising=False)

    def no_socket(*args, **kwargs):
        raise AssertionError("a one-process trial opened a socket")

    monkeypatch.setattr(socket, "socket", no_socket)
    with DistributedContext.from_environment() as d:
        assert (d.get_rank(), d.get_size(), d.get_local_rank(), d.get_num_agents()) == \
            (0, 1, 0, 1)
        assert d.allgather(5) == d.gather(5) == d.allgather_local(5) == d.gather_local(5) == [5]
        assert d.broadcast("x") == d.broadcast_local("x") == "x"
        assert d.broadcast_local() is None


def test_the_environment_contract():
    assert read_distributed_environment({}) == DistributedEnvironment(0, 1, None, None)
    assert read_distributed_environment({"LOCALDET_RANK": "0", "LOCALDET_SIZE": "1"}) == \
        DistributedEnvironment()
    key = secrets.token_hex(32)
    env = {"LOCALDET_RANK": "2", "LOCALDET_SIZE": "3",
           "LOCALDET_CHIEF_ADDR": "127.0.0.1:29500", "LOCALDET_DIST_AUTHKEY": key}
    assert read_distributed_environment(env) == \
        DistributedEnvironment(2, 3, ("127.0.0.1", 29500), bytes.fromhex(key))
    for change, words in [({"LOCALDET_CHIEF_ADDR": ""}, "LOCALDET_CHIEF_ADDR is not set"),
                          ({"LOCALDET_DIST_AUTHKEY": ""}, "LOCALDET_DIST_AUTHKEY is not set"),
                          ({"LOCALDET_RANK": "3"}, "LOCALDET_RANK must be in [0, 3)"),
                          ({"LOCALDET_SIZE": "three"}, "LOCALDET_SIZE must be an integer"),
                          ({"LOCALDET_SIZE": ""}, "LOCALDET_SIZE is not set"),
                          ({"LOCALDET_CHIEF_ADDR": "127.0.0.1"}, "must be HOST:PORT"),
                          ({"LOCALDET_DIST_AUTHKEY": "abcd"}, "at least 32 hex digits"),
                          ({"LOCALDET_DIST_AUTHKEY": "zz" * 16}, "hexadecimal")]:
        with pytest.raises(ValueError, match=words.replace("[", r"\[").replace(")", r"\)")):
            read_distributed_environment({**env, **change})

    envs = distributed_environments(3)
    parsed = [read_distributed_environment(env) for env in envs]
    assert [p.rank for p in parsed] == [0, 1, 2] and {p.size for p in parsed} == {3}
    assert len({(p.chief_addr, p.authkey) for p in parsed}) == 1
    assert distributed_environments(1) == [{"LOCALDET_RANK": "0", "LOCALDET_SIZE": "1"}]


def test_from_tf_config_reads_ranks(monkeypatch):
    cluster = {"chief": ["a:1"], "worker": ["a:2", "b:1", "b:2"]}
    d = DistributedContext._ranks_from_tf_config({"cluster": cluster,
                                           "task": {"type": "worker", "index": 1}})
    assert (d.rank, d.size, d.local_rank, d.local_size, d.cross_rank, d.cross_size) == \
        (2, 4, 0, 2, 1, 2)
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster,
                                                "task": {"type": "chief", "index": 0}}))
    d = DistributedContext._ranks_from_tf_config()
    assert (d.rank, d.local_rank, d.cross_rank) == (0, 0, 0)
    with pytest.raises(ValueError, match="'evaluator' does not train"):
        DistributedContext._ranks_from_tf_config({"cluster": cluster,
                                           "task": {"type": "evaluator", "index": 0}})
    with pytest.raises(ValueError, match="task index 3 is not in cluster.worker"):
        DistributedContext._ranks_from_tf_config({"cluster": cluster,
                                           "task": {"type": "worker", "index": 3}})
    monkeypatch.delenv("TF_CONFIG")
    with pytest.raises(ValueError, match="TF_CONFIG is not set"):
        DistributedContext._ranks_from_tf_config()


def test_from_horovod_reads_ranks():
    class Horovod:
        rank, size, local_rank, local_size = (lambda: 3), (lambda: 4), (lambda: 1), (lambda: 2)
        cross_rank, cross_size = (lambda: 1), (lambda: 2)

    d = DistributedContext.from_horovod(Horovod, chief_ip="10.0.0.1")
    assert (d.get_rank(), d.get_size(), d.get_local_rank(), d.get_num_agents()) == (3, 4, 1, 2)
    with pytest.raises(ValueError, match="pass chief_ip or set DET_CHIEF_IP"):
        DistributedContext.from_horovod(Horovod)


def test_a_missing_rank_or_chief_times_out_naming_it(monkeypatch):
    monkeypatch.setattr(_process_group, "CONNECT_TIMEOUT_S", 0.5)
    env = rank_environments(2)
    for name, value in env[0].items():
        monkeypatch.setenv(name, value)
    with pytest.raises(TimeoutError, match=r"for rank\(s\) \[1\] to connect"):
        DistributedContext.from_environment().allgather(0)
    for name, value in env[1].items():
        monkeypatch.setenv(name, value)
    with pytest.raises(TimeoutError, match="could not reach the chief .rank 0. at "
                                           + env[1]["LOCALDET_CHIEF_ADDR"]):
        DistributedContext.from_environment().allgather(0)


def test_collectives_need_the_key(monkeypatch):
    monkeypatch.delenv("LOCALDET_CHIEF_ADDR", raising=False)
    monkeypatch.delenv("LOCALDET_DIST_AUTHKEY", raising=False)
    with pytest.raises(RuntimeError, match="allgather.. across 2 processes needs "
                                           "LOCALDET_DIST_AUTHKEY"):
        DistributedContext(rank=0, size=2).allgather(1)


if __name__ == "__main__":
    print(json.dumps(SCENARIOS[sys.argv[1]]()), flush=True)
