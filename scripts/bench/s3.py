"""The checkpoint store on S3: a checkpoint-sized file put, put again, materialized and
verified against a local S3 server (moto's, in a process of its own, as the tests use it).

One file of new bytes (`--mb`, default 50: some 400 content-defined chunks, one object each)
in a checkpoint folder, `--repeats` times into a fresh prefix, each step timed on its own:

  put (new)        `S3Store.put_directory`: every chunk uploaded
  put (unchanged)  the same folder again: every chunk found and refreshed, none uploaded
  materialize      `S3Store.materialize` into an empty folder, each chunk checked
  verify           `S3Store.verify` from a fresh store object (every chunk downloaded)

with `requests_in_flight` 1 (one request at a time) and the store's default, alternating
which goes first. Prints medians, MB/s and the ratio of the two: once as moto answers (in a
few milliseconds, most of it moto's own CPU), and once with `--rtt-ms` (default 20) added
before each request is sent, as the round trip to an S3 region in another building takes.

    python scripts/bench/s3.py                  # 50 MB, 3 repeats
    python scripts/bench/s3.py --mb 70 --repeats 5 --rtt-ms 40
    python scripts/bench/s3.py --smoke          # 1 MB, one repeat, 5 ms
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from localdet.checkpoints.s3_store import REQUESTS_IN_FLIGHT, S3Store

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--mb", type=int, default=50, help="size of the checkpoint's file")
parser.add_argument("--repeats", type=int, default=3, help="timed runs of each step")
parser.add_argument("--rtt-ms", type=float, default=20,
                    help="a round trip added to each request in the second table")
parser.add_argument("--smoke", action="store_true", help="1 MB, one repeat, 5 ms")
args = parser.parse_args()
if args.smoke:
    args.mb, args.repeats, args.rtt_ms = 1, 1, 5

BUCKET = "bench"
KEYS = {"access_key": "bench", "secret_key": "bench"}


def start_server() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                               str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server, f"http://127.0.0.1:{port}"
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                sys.exit("moto's server did not start")
            time.sleep(0.1)


def timed(step) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def open_store(endpoint: str, prefix: str, in_flight: int, rtt: float) -> S3Store:
    store = S3Store(BUCKET, prefix, endpoint_url=endpoint, requests_in_flight=in_flight, **KEYS)
    if rtt:  # the handler's sleep lets go of the GIL, as waiting on a socket does
        store.client.meta.events.register("before-send.s3.*", lambda **_: time.sleep(rtt))
    return store


def run(endpoint: str, folder: Path, out: Path, in_flight: int, rtt: float
        ) -> dict[str, float]:
    prefix = f"r-{uuid.uuid4().hex[:8]}"
    store = open_store(endpoint, prefix, in_flight, rtt)
    times = {"put (new)": timed(lambda: store.put_directory(folder))}
    files = {}
    times["put (unchanged)"] = timed(lambda: files.update(store.put_directory(folder)))
    times["materialize"] = timed(lambda: store.materialize(files, out / prefix))
    fresh = open_store(endpoint, prefix, in_flight, rtt)
    times["verify"] = timed(lambda: fresh.verify(files))
    if fresh.verify(files) != []:
        sys.exit("verify found a bad chunk")
    return times


def table(endpoint: str, folder: Path, tmp: Path, rtt: float) -> None:
    sides = [1, REQUESTS_IN_FLIGHT]
    results: dict[int, dict[str, list[float]]] = {n: {} for n in sides}
    for repeat in range(args.repeats):
        for n in sides if repeat % 2 == 0 else sides[::-1]:
            for step, seconds in run(endpoint, folder, tmp, n, rtt).items():
                results[n].setdefault(step, []).append(seconds)
    added = f"{rtt * 1000:.0f} ms added to each request" if rtt else "as moto answers"
    print(f"{added:24} {'1 in flight':>18} {f'{REQUESTS_IN_FLIGHT} in flight':>18}   ratio")
    for step in results[1]:
        one, many = (statistics.median(results[n][step]) for n in sides)
        print(f"  {step:22} {one:7.2f} s {args.mb / one:5.0f} MB/s"
              f" {many:7.2f} s {args.mb / many:5.0f} MB/s   {many / one:.2f}")


def main() -> None:
    server, endpoint = start_server()
    try:
        S3Store(BUCKET, endpoint_url=endpoint, **KEYS).client.create_bucket(Bucket=BUCKET)
        with tempfile.TemporaryDirectory(prefix="localdet-s3-bench-") as tmp:
            folder = Path(tmp) / "checkpoint"
            (folder / "code").mkdir(parents=True)
            (folder / "code" / "model_def.py").write_text("class Trial: ...\n")
            (folder / "determined-keras-model.h5").write_bytes(os.urandom(args.mb << 20))
            files = S3Store(BUCKET, "count", endpoint_url=endpoint, **KEYS).put_directory(folder)
            chunks = len(files["determined-keras-model.h5"].chunks)
            print(f"{args.mb} MB file, {chunks} chunks, moto server at {endpoint}, "
                  f"{args.repeats} repeats (medians)")
            for rtt in (0.0, args.rtt_ms / 1000):
                table(endpoint, folder, Path(tmp), rtt)
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
