"""A trial that grows without end, for tests/test_memory_limit.py.

    python3 hog.py                       # 10 MB more every 20 ms
    python3 hog.py --wait FILE           # holds 50 MB until FILE exists, then grows
    python3 hog.py --children 4 --each 150   # 4 children hold 150 MB each; none grows
    python3 hog.py --release FILE        # holds 20 MB until FILE exists, then exits 0

Growth stops at --cap MB (then it sleeps): a test whose limit is not enforced times out
instead of exhausting the machine.
"""

import argparse
import os
import subprocess
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--wait")
parser.add_argument("--release")
parser.add_argument("--children", type=int, default=0)
parser.add_argument("--each", type=int, default=0)
parser.add_argument("--hold", type=int, default=0)
parser.add_argument("--cap", type=int, default=1500)
args = parser.parse_args()
held = []


def grab(megabytes: int) -> None:
    held.append(bytearray(megabytes << 20))  # zero-filled: every page is touched


def wait_for(path: str) -> None:
    while not os.path.exists(path):
        time.sleep(0.05)


if args.release:
    grab(20)
    print("waiting for release", flush=True)
    wait_for(args.release)
    print("released", flush=True)
elif args.hold:
    grab(args.hold)
    print(f"holding {args.hold} MB", flush=True)
    time.sleep(3600)
elif args.children:
    children = [subprocess.Popen([sys.executable, __file__, "--hold", str(args.each)])
                for _ in range(args.children)]
    for child in children:
        child.wait()
else:
    if args.wait:
        grab(50)
        print("holding 50 MB", flush=True)
        wait_for(args.wait)
    print("growing", flush=True)
    while len(held) * 10 < args.cap:
        grab(10)
        time.sleep(0.02)
    time.sleep(3600)
