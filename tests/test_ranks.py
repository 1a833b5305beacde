"""Tests of localdet.processes.ranks: the supervisor that runs a trial's rank processes as one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from conftest import wait_for

from localdet.pids import alive

SUPERVISOR = [sys.executable, "-P", "-m", "localdet.processes.ranks"]  # as the launcher runs it

# Every rank writes its pid to PIDS/<rank> first, so that tests can check it is gone later.
PREAMBLE = textwrap.dedent("""\
    import os, pathlib, signal, sys, time
    RANK = int(os.environ["LOCALDET_RANK"])
    PIDS = pathlib.Path(sys.argv[1])
    (PIDS / f"{RANK}.tmp").write_text(str(os.getpid()))
    (PIDS / f"{RANK}.tmp").rename(PIDS / str(RANK))
""")


# The supervisor as a warm process runs it (localdet/processes/warm_process.py): forking its ranks.
FORKING_SUPERVISOR = [sys.executable, "-P", "-c", "import sys; from localdet.processes import "
                      "ranks, warm_process; sys.exit(ranks.main(sys.argv[1:], "
                      "run_forked=warm_process._run_and_exit))"]


@pytest.fixture(params=["started", "forked"])
def how(request) -> str:
    """How the supervisor makes its ranks: started anew, or forked from it (as in a warm
    process)."""
    return request.param


def supervisor(size: int, script: str, *args: str, options: tuple = (), env=None,
               how: str = "started"):
    """`python -m localdet.processes.ranks` running `python -c PREAMBLE+script ARGS` in its own
    session, as the launcher starts it; `how="forked"`: the same script run from a file by
    ranks forked from the supervisor."""
    code = PREAMBLE + textwrap.dedent(script)
    if how == "forked":
        path = Path(tempfile.mkdtemp(prefix="ranks-")) / "rank.py"
        path.write_text(code)
        argv = [*FORKING_SUPERVISOR, "--size", str(size), *options, "--",
                sys.executable, str(path), *args]
    else:
        argv = [*SUPERVISOR, "--size", str(size), *options, "--", sys.executable, "-c", code,
                *args]
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        env={**{k: v for k, v in os.environ.items() if k != "LOCALDET_SLOTS"}, **(env or {})})


def finish(proc: subprocess.Popen, timeout: float = 30) -> tuple[int, str, float]:
    """Exit status, output and seconds taken; the ranks sleep 60 s, so a quick end means
    they were stopped."""
    start = time.monotonic()
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the supervisor and its ranks
        raise
    return proc.returncode, out.decode(), time.monotonic() - start


def rank_pids(folder, size: int) -> list[int]:
    wait_for(lambda: all((folder / str(r)).exists() for r in range(size)), 120,
             "every rank to write its pid", interval=0.05)
    return [int((folder / str(r)).read_text()) for r in range(size)]


def test_ranks_reach_each_other_and_every_line_names_its_rank(tmp_path, how):
    code, out, _ = finish(supervisor(2, """
        from determined.core import DistributedContext
        distributed = DistributedContext.from_environment()
        print("gathered", distributed.allgather(distributed.get_rank()))
        print("forked", "localdet.processes.warm_process" in sys.modules, os.getppid())
        print("to stderr", file=sys.stderr)
        sys.stdout.flush()
        sys.stdout.buffer.write(b"bad \\xff byte, no newline")
    """, str(tmp_path), how=how))
    assert code == 0, out
    lines = out.splitlines()
    if how == "forked":
        assert lines.pop(0) == "[localdet] 2 ranks forked from a warm process", out
    assert all(line.startswith(("[rank 0] ", "[rank 1] ")) for line in lines), out
    # Forked: the supervisor's modules are the rank's without importing them again.
    forked = {line.split(" forked ")[1] for line in lines if " forked " in line}
    assert len(forked) == 1 and forked.pop().startswith(str(how == "forked")), out
    for rank in (0, 1):
        assert f"[rank {rank}] gathered [0, 1]" in lines
        assert f"[rank {rank}] to stderr" in lines
        assert f"[rank {rank}] bad \ufffd byte, no newline" in lines


def test_a_failing_rank_stops_the_others_and_gives_its_status(tmp_path, how):
    proc = supervisor(2, """
        if RANK == 1:
            while not (PIDS / "0").exists():
                time.sleep(0.02)
            print("giving up")
            sys.exit(3)
        time.sleep(60)
    """, str(tmp_path), how=how)
    code, out, took = finish(proc)
    assert code == 3, out
    assert took < 20
    lines = out.splitlines()
    failure = "[localdet] rank 1 exited with status 3; stopping the other ranks"
    assert lines.index(failure) > lines.index("[rank 1] giving up")
    assert not any(map(alive, rank_pids(tmp_path, 2)))


def test_a_rank_killed_by_a_signal_gives_128_plus_the_signal(tmp_path, how):
    # Rank 1 waits for rank 0's pid: killed before rank 0 wrote it, rank 0 never would.
    code, out, _ = finish(supervisor(2, """
        if RANK == 1:
            while not (PIDS / "0").exists():
                time.sleep(0.02)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
    """, str(tmp_path), how=how))
    assert code == 128 + signal.SIGKILL, out
    assert "[localdet] rank 1 was killed by SIGKILL" in out
    assert not any(map(alive, rank_pids(tmp_path, 2)))


def test_sigterm_to_the_supervisor_stops_every_rank_even_one_that_ignores_it(tmp_path, how):
    proc = supervisor(2, """
        if RANK == 1:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        time.sleep(60)
    """, str(tmp_path), options=("--grace", "0.5"), how=how)
    pids = rank_pids(tmp_path, 2)
    proc.send_signal(signal.SIGTERM)
    code, out, took = finish(proc)
    assert code == -signal.SIGTERM, out  # it dies by the signal it was sent, as a rank would
    assert took < 20
    assert "[localdet] received SIGTERM; stopping the ranks" in out
    assert not any(map(alive, pids))


def test_ranks_die_with_a_supervisor_killed_alone(tmp_path, how):
    proc = supervisor(2, "time.sleep(60)", str(tmp_path), how=how)
    try:
        pids = rank_pids(tmp_path, 2)
        proc.kill()  # the supervisor only, not its group: PR_SET_PDEATHSIG takes the ranks
        proc.wait()
        wait_for(lambda: not any(map(alive, pids)), 60, "the ranks to die", interval=0.05)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # on failure, what is left of its session
        except ProcessLookupError:
            pass


def test_each_rank_gets_its_own_slot_and_gpu(tmp_path):
    script = """
        print("env", os.environ["LOCALDET_SLOTS"], repr(os.environ["CUDA_VISIBLE_DEVICES"]))
    """
    code, out, _ = finish(supervisor(2, script, str(tmp_path), env={
        "LOCALDET_SLOTS": "2,3", "CUDA_VISIBLE_DEVICES": "5,7"}))
    assert code == 0, out
    assert "[rank 0] env 2 '5'" in out and "[rank 1] env 3 '7'" in out
    for folder in (tmp_path / "cpu", tmp_path / "mismatch"):
        folder.mkdir()
    code, out, _ = finish(supervisor(2, script, str(tmp_path / "cpu"), env={
        "LOCALDET_SLOTS": "0,1", "CUDA_VISIBLE_DEVICES": ""}))
    assert code == 0, out
    assert "[rank 0] env 0 ''" in out and "[rank 1] env 1 ''" in out
    code, out, _ = finish(supervisor(2, script, str(tmp_path / "mismatch"), env={
        "LOCALDET_SLOTS": "0,1,2"}))
    assert code == 2 and "LOCALDET_SLOTS=0,1,2 lists 3 slots but --size is 2" in out


def test_tf_config_describes_a_localhost_worker_per_rank(tmp_path, how):
    code, out, _ = finish(supervisor(2, """
        from determined.core import DistributedContext
        print("config", os.environ["TF_CONFIG"])
        print("rank from TF_CONFIG", DistributedContext._ranks_from_tf_config().get_rank())
    """, str(tmp_path), options=("--tf-config",), how=how))
    assert code == 0, out
    configs = {}
    for line in out.splitlines():
        prefix, _, rest = line.partition(" config ")
        if rest:
            configs[int(prefix[len("[rank "):-1])] = json.loads(rest)
    assert sorted(configs) == [0, 1]
    workers = configs[0]["cluster"]["worker"]
    assert configs[1]["cluster"]["worker"] == workers and len(workers) == 2
    assert all(worker.startswith("127.0.0.1:") for worker in workers)
    assert len({worker.rsplit(":", 1)[1] for worker in workers}) == 2
    for rank in (0, 1):
        assert configs[rank]["task"] == {"type": "worker", "index": rank}
        assert f"[rank {rank}] rank from TF_CONFIG {rank}" in out


def test_size_one_runs_the_command_itself_unprefixed(tmp_path):
    proc = subprocess.Popen(
        [*SUPERVISOR, "--size", "1", "--", sys.executable, "-c",
         "import os; print('pid', os.getpid(), 'LOCALDET_RANK' in os.environ); exit(4)"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    code, out, _ = finish(proc)
    assert code == 4
    assert out == f"pid {proc.pid} False\n"  # exec: the same process, nothing added


def test_a_missing_program_is_named(tmp_path):
    for size in ("1", "2"):
        result = subprocess.run(
            [*SUPERVISOR, "--size", size, "--", "no-such-program"],
            check=False, capture_output=True, text=True, timeout=15)
        assert result.returncode == 127
        assert "cannot start 'no-such-program': No such file or directory" in result.stdout


def test_ranks_on_several_machines_meet_at_the_chief_machine_and_each_listens_on_its_own():
    import json as json_module

    from localdet.processes.launcher import supervised_argv, unsupervised_argv
    from localdet.processes.ranks import cluster_rank_environments

    base = {"LOCALDET_SLOTS": "3,0", "LOCALDET_TRIAL_ID": "7", "PATH": "/bin"}
    envs = cluster_rank_environments(base, [{"host": "10.0.0.2", "ports": [4000, 4001]},
                                            {"host": "10.0.0.3", "ports": [5000]}])
    assert [env["LOCALDET_RANK"] for env in envs] == ["0", "1"]
    assert [env["LOCALDET_SLOTS"] for env in envs] == ["3", "0"]
    assert {env["LOCALDET_CHIEF_ADDR"] for env in envs} == {"10.0.0.2:4000"}
    assert len({env["LOCALDET_DIST_AUTHKEY"] for env in envs}) == 1
    configs = [json_module.loads(env["TF_CONFIG"]) for env in envs]
    assert [c["cluster"]["worker"] for c in configs] == [["10.0.0.2:4001", "10.0.0.3:5000"]] * 2
    assert [c["task"]["index"] for c in configs] == [0, 1]
    assert all(env["PATH"] == "/bin" and env["LOCALDET_TRIAL_ID"] == "7" for env in envs)
    # A cluster launcher starts each rank's own command, not the supervisor.
    argv = [sys.executable, "train.py"]
    assert unsupervised_argv(supervised_argv(argv, "multi_worker_mirrored", 2)) == argv
    assert unsupervised_argv(argv) == argv


def test_horovod_ranks_on_several_machines_are_named_by_machine_in_rank_order():
    from localdet.processes.ranks import horovod_host_spec, horovod_hosts

    nodes = [{"node": n} for n in ("b1", "b1", "a7", "c3")]
    assert horovod_hosts(nodes) == ["node0", "node0", "node1", "node2"]
    assert horovod_host_spec(horovod_hosts(nodes)) == "node0:2,node1:1,node2:1"
    with pytest.raises(ValueError, match="consecutive"):
        horovod_hosts([{"node": n} for n in ("a", "b", "a")])
