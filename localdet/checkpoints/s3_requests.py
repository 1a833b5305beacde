"""Requests to S3 for `localdet.checkpoints.s3_store`: boto3 asked for by name, what a
failure means, the server's clock, and many small requests kept in flight at once.

    for data in in_flight(download, chunks, limit=8):   # in the chunks' order
        out.write(data)
"""
from __future__ import annotations

import email.utils
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterable, Iterator, Mapping, TypeVar

from localdet.checkpoints.store import StoreError

Item = TypeVar("Item")
Result = TypeVar("Result")


def import_boto3() -> Any:
    """The boto3 module, or one StoreError sentence saying how to install it."""
    try:
        import boto3
    except ImportError:
        raise StoreError("checkpoint_storage.type 's3' needs boto3, which is not installed; "
                         "run `pip install localdet[s3]`") from None
    return boto3


def missing(error: Exception) -> bool:
    """Whether a client error says the key is not there."""
    code = str(getattr(error, "response", {}).get("Error", {}).get("Code", ""))
    return code in ("404", "NoSuchKey", "NotFound")


def server_now(response: Mapping[str, Any]) -> float:
    """The S3 server's clock, from the response's Date header (the local clock if absent):
    ages are judged on one clock, the one that wrote `LastModified`."""
    date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    if date:
        with_tz = email.utils.parsedate_to_datetime(date)
        if with_tz is not None:
            return with_tz.timestamp()
    return time.time()


def in_flight(work: Callable[[Item], Result], items: Iterable[Item], limit: int
              ) -> Iterator[Result]:
    """``work(item)`` for each item, results in the items' order, `limit` running at once in
    threads (a boto3 client is thread-safe; a resource is not) and as many queued. Items are
    drawn only as room frees, so a generator of them runs beside the requests and few are
    held in memory. The first failure is raised once the calls running have ended; the
    queued ones never start. A pool per call: no thread outlives it, and a forked child
    inherits none. `limit` 1 calls `work` in this thread, one item after another."""
    if limit <= 1:
        yield from map(work, items)
        return
    with ThreadPoolExecutor(limit, thread_name_prefix="localdet-s3") as pool:
        pending: deque[Future[Result]] = deque()
        try:
            for item in items:
                pending.append(pool.submit(work, item))
                if len(pending) >= 2 * limit:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()
