"""The daemon's process facts, from psutil: a trial's process tree (its session and process
group, a process whose parent is gone included, zombies left out), the memory each holds
alone, whether a pid is alive and when it started, and the files a process holds open for
writing. Real processes, no daemon."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from conftest import wait_for

from localdet.daemon.submissions import _open_for_writing
from localdet.pids import alive, process_start
from localdet.processes.memory_limit import _members, _resident

# depth 2: the session's leader, which sleeps; depth 1: starts the leaf and exits unreaped
# (a zombie of the leader); depth 0: the leaf, its parent gone, holding 64 MiB it wrote.
TREE = r"""
import os, subprocess, sys, time
depth = int(sys.argv[1])
if depth:
    subprocess.Popen([sys.executable, "-c", sys.argv[2], str(depth - 1), sys.argv[2]])
    if depth == 2:
        time.sleep(600)
else:
    held = bytearray(64 << 20)
    for at in range(0, len(held), 4096):
        held[at] = 1  # written: pages of its own
    print(os.getpid(), flush=True)
    time.sleep(600)
"""
HOLDER = r"""
import sys, time
written, read = open(sys.argv[1], "w"), open(sys.argv[2])
print("open", flush=True)
time.sleep(600)
"""


def test_a_trees_members_are_its_session_with_a_reparented_leaf_and_no_zombie(processes):
    leader = processes([sys.executable, "-c", TREE, "2", TREE], stdout=subprocess.PIPE,
                       text=True, start_new_session=True)
    try:
        leaf = int(leader.stdout.readline())
        found = _members({leader.pid, os.getpid()})
        assert sorted(found[leader.pid]) == sorted([leader.pid, leaf])  # not the zombie
        assert leader.pid not in found[os.getpid()]  # another session's
        assert _resident(leaf) >= 64 << 20
        assert sum(_resident(pid) for pid in found[leader.pid]) >= 64 << 20
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
    leader.wait()
    wait_for(lambda: not alive(leaf), 30, "the leaf to die")  # gone, or a zombie of init's
    assert _members({leader.pid})[leader.pid] == []


def test_alive_and_the_start_time_a_launch_is_recorded_with(processes):
    child = processes([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(f"/proc/{child.pid}/stat") as stat:  # the kernel's own record, as the oracle
        ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
    assert alive(child.pid) and process_start(child.pid) == ticks
    child.kill()
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # a zombie, not yet reaped
    assert not alive(child.pid)
    child.wait()
    assert not alive(child.pid) and process_start(child.pid) is None
    assert not alive(0)


def test_files_held_open_for_writing_are_found_and_read_only_ones_are_not(processes,
                                                                          tmp_path):
    folder = tmp_path.resolve()
    written, read = folder / "copying.yaml", folder / "settled.yaml"
    read.write_text("done")
    holder = processes([sys.executable, "-c", HOLDER, written, read], stdout=subprocess.PIPE,
                       text=True)
    assert holder.stdout.readline() == "open\n"
    assert _open_for_writing(folder) == {str(written)}
    holder.kill()
    holder.wait()
    assert _open_for_writing(folder) == set()
