"""A trial launch's requests to the daemon's report server, retried until they get through.

    transport = ReportTransport("http://10.0.0.1:41234", trial_id=7, launch=1, token=token)
    facts = transport._call("GET", "info")          # JSON in, JSON out
    transport._exchange("PUT", "chunks", lambda: body, transport._answer, headers)

Each thread keeps one keep-alive connection. Every request of the report wire is idempotent,
so a lost connection or a 5xx answer (a daemon restarting, a busy database) is simply sent
again, with backoff, for `retry_seconds`; then the trial gives up (`ReportError`) and the
daemon restarts it from its latest checkpoint. Refusals become exceptions: `StaleLaunch`
(this process must exit), `DiskFull`, `MissingBlobs` (upload them, commit again),
`ReportError`. Imports only the standard library and the wire: it runs on nodes without the
daemon's state.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from typing import Any, Callable, Dict, Optional
from urllib.parse import urlsplit

from localdet.reporting.report_wire import (
    API,
    INSUFFICIENT_STORAGE,
    LAUNCH_HEADER,
    MISSING_BLOBS,
    NOT_RUNNING,
    PGRP_HEADER,
    STALE,
    TOKEN_HEADER,
)

DEFAULT_RETRY_SECONDS = 600.0


class ReportError(RuntimeError):
    """The daemon could not be reached, or refused a report; the message says which."""


class StaleLaunch(SystemExit):
    """This process's launch is no longer the trial's running one: it exits, so that only
    one process trains the trial."""

    status: int  # the report server's answer: NOT_RUNNING or STALE


class MissingBlobs(ReportError):
    """The store lacks these blobs (or they arrived changed): upload them, commit again."""

    def __init__(self, missing: list, message: str):
        super().__init__(message)
        self.missing = missing


class _Retry(Exception):
    pass


class ReportTransport:
    """Requests of one trial launch to the report server at `url`, with `token`; `pgrp`: a
    local launch's process group, which the daemon checks against its launch record."""

    def __init__(self, url: str, trial_id: int, launch: int, token: str, *,
                 retry_seconds: float = DEFAULT_RETRY_SECONDS, pgrp: Optional[int] = None):
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ReportError(f"LOCALDET_REPORT_URL {url!r} is not an http://HOST:PORT "
                              "address; the launcher sets it from `trial_environment`")
        self.url, self.trial_id, self.launch = url, trial_id, launch
        self._host, self._port = parts.hostname, parts.port
        self._headers = {TOKEN_HEADER: f"Bearer {token}", LAUNCH_HEADER: str(launch),
                         "Content-Type": "application/json"}
        if pgrp is not None:
            self._headers[PGRP_HEADER] = str(pgrp)
        self.retry_seconds = retry_seconds
        self._local = threading.local()  # one keep-alive connection per thread

    def _connection(self) -> http.client.HTTPConnection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = http.client.HTTPConnection(self._host, self._port, timeout=60)
            self._local.connection = connection
        return connection

    def _drop_connection(self) -> None:
        connection = getattr(self._local, "connection", None)
        self._local.connection = None
        if connection is not None:
            connection.close()

    def _exchange(self, method: str, path: str, body: Callable[[], Any],
                  handle: Callable[[http.client.HTTPResponse], Any],
                  headers: Optional[Dict[str, str]] = None) -> Any:
        """Send a request (`body()` gives its body afresh for each try) and `handle` the
        answer; connection failures and 5xx answers are retried with backoff."""
        deadline = time.monotonic() + self.retry_seconds
        delay, last = 0.05, ""
        while True:
            try:
                connection = self._connection()
                connection.request(method, f"{API}/{self.trial_id}/{path}", body=body(),
                                   headers={**self._headers, **(headers or {})})
                response = connection.getresponse()
                if response.status >= 500 and response.status != INSUFFICIENT_STORAGE:
                    raise _Retry(f"it answered {response.status}: {_message(response.read())}")
                return handle(response)
            except (OSError, http.client.HTTPException, _Retry) as error:
                self._drop_connection()
                last = str(error) or type(error).__name__
                if time.monotonic() + delay > deadline:
                    raise ReportError(
                        f"trial {self.trial_id} could not report to the localdet daemon at "
                        f"{self.url} for {self.retry_seconds:.0f} s (last: {last}); it stops "
                        "here and the daemon restarts it from its latest checkpoint") from None
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _call(self, method: str, path: str, payload: Any = None) -> Any:
        data = None if payload is None else json.dumps(payload).encode()
        return self._exchange(method, path, lambda: data, self._answer)

    def _answer(self, response: http.client.HTTPResponse) -> Any:
        data = response.read()
        if response.status == 200:
            return json.loads(data) if data else None
        message = _message(data)
        if response.status in (NOT_RUNNING, STALE):
            refused = StaleLaunch(message)
            refused.status = response.status
            raise refused
        if response.status == INSUFFICIENT_STORAGE:
            from localdet.checkpoints.disk_space import (
                DiskFull,  # the daemon tells a full disk apart
            )

            raise DiskFull(message)
        if response.status == MISSING_BLOBS:
            raise MissingBlobs(json.loads(data).get("missing", []), message)
        raise ReportError(message)


def _message(data: bytes) -> str:
    try:
        return str(json.loads(data)["error"])
    except (ValueError, KeyError, TypeError):
        return data.decode("utf-8", "replace").strip() or "no message"
