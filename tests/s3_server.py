"""moto's S3 server as the tests' stand-in for S3, and the store and client that reach it
(test_storage.py, test_s3_chunks.py)."""
from __future__ import annotations

import socket
import sys
import time
import uuid as uuidlib

BUCKET = "localdet-checkpoints"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1"}


def start_in_process():
    """(server, endpoint): moto's server in threads of this process, the bucket made."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client(endpoint).create_bucket(Bucket=BUCKET)
    return server, endpoint


def start_process(processes) -> str:
    """moto's server in a process of its own (started by conftest's `processes`, so ended
    with the test), for tests that fork: a child of a process serving in threads could
    inherit a lock one of them held. Returns its endpoint, the bucket made."""
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = processes([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", port],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not _answers(port):
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"moto's server did not start (exit {server.poll()})")
        time.sleep(0.1)
    endpoint = f"http://127.0.0.1:{port}"
    client(endpoint).create_bucket(Bucket=BUCKET)
    return endpoint


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def client(endpoint: str):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing")


def s3_config(endpoint: str, prefix: str) -> dict:
    """An experiment's `checkpoint_storage` in the bucket, under `prefix`."""
    return {"type": "s3", "bucket": BUCKET, "prefix": prefix, "endpoint_url": endpoint,
            "access_key": "testing", "secret_key": "testing"}


def s3_store(endpoint: str, prefix: str | None = None, grace_seconds: float = 0):
    """An `S3Store` under `prefix` (a fresh one if not given)."""
    from localdet.checkpoints.s3_store import S3Store

    return S3Store(BUCKET, prefix or f"t-{uuidlib.uuid4().hex[:8]}/", endpoint_url=endpoint,
                   access_key="testing", secret_key="testing", grace_seconds=grace_seconds)


def blob_keys(store) -> list[str]:
    return [item["Key"] for item, _ in store._list(f"{store.prefix}objects/")]
