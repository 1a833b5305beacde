"""A server localdet runs from a thread (the dashboard's `start_in_thread`, the daemon's
report server) leaves the process's logging as it was.

uvicorn's own logging set-up is `logging.config.dictConfig`, which closes every handler the
process has; absl's handler (made when TensorFlow is imported) closes its stream on close
unless that stream is sys.stderr now. Where sys.stderr was swapped after TensorFlow's import
(a notebook's, pytest's capsys), that closed the swapped-out stream: in this suite, pytest's
capture file, and every later test of the worker errored."""

from __future__ import annotations

import io
import logging
import socket
import time

from absl import logging as absl_logging

from localdet.paths import Layout
from localdet.reporting.report_server import ReportServer
from localdet.ui.web.server import start_in_thread


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def kept_handler() -> tuple[logging.Logger, logging.Handler, io.StringIO]:
    """A logger with absl's handler on a stream that is not sys.stderr."""
    stream = io.StringIO()
    handler = absl_logging.PythonHandler(stream)
    logger = logging.getLogger(f"kept.{id(stream)}")
    logger.addHandler(handler)
    return logger, handler, stream


def test_the_dashboard_in_a_thread_leaves_logging_handlers_open(tmp_path):
    logger, handler, stream = kept_handler()
    server, _ = start_in_thread(Layout(tmp_path), "127.0.0.1", free_port(), token=False)
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    server.should_exit = True
    assert server.started
    assert not stream.closed and logger.handlers == [handler]


def test_the_report_server_leaves_logging_handlers_open(tmp_path):
    logger, handler, stream = kept_handler()
    server = ReportServer(Layout(tmp_path).ensure(), "127.0.0.1", log=lambda line: None).start()
    try:
        assert not stream.closed and logger.handlers == [handler]
    finally:
        server.close()
