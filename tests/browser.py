"""What the dashboard's browser tests share: Debian's Chromium with the flags a closed
network wants, a free port, and the dashboard served from a thread.

    with served(create_app(layout, token=None)) as url:
        page.goto(url)
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

CHROMIUM = "/usr/bin/chromium"
# As the machine's notes advise for a closed network: no background connections.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def served(app) -> Iterator[str]:
    """`app` served by uvicorn on a free loopback port from a thread; yields its address."""
    import uvicorn

    port = free_port()
    # log_config=None: uvicorn's dictConfig would close absl's handler, whose stream is
    # pytest's capture file once capsys has swapped sys.stderr (every later test errors)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", log_config=None))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    if not server.started:
        raise RuntimeError("the dashboard did not start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
