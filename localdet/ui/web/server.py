"""Run the dashboard with uvicorn:

    serve(layout, host="127.0.0.1", port=8080)          # blocks; prints its address, token too
    server, url = start_in_thread(layout, host, port)   # the daemon's --web

The dashboard requires a token, made here and printed in the address
(`http://127.0.0.1:8090/?token=...`, as Jupyter does); `token=False` (`--no-token`) leaves it
out, on a loopback address only. The app (localdet/ui/web/app.py) also refuses foreign Host
headers and state-changing requests that do not come from its own page.
"""

from __future__ import annotations

import secrets
import socket
import threading

import uvicorn
from uvicorn.config import LOGGING_CONFIG

from localdet.paths import Layout
from localdet.ui.web.app import create_app, is_loopback

DEFAULT_PORT = 8090


class WebError(RuntimeError):
    """The dashboard cannot be served as asked; the message says what to change."""


def _check_address(host: str, port: int) -> None:
    # uvicorn would only log a failed bind (and, in a thread, end silently).
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except (OSError, OverflowError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise WebError(f"cannot serve the dashboard on {host}:{port} ({reason}); choose "
                       "another address with --host or port with --port") from None


def _server(layout: Layout, host: str, port: int, token: bool,
            in_thread: bool = False) -> tuple[uvicorn.Server, str]:
    if not token and not is_loopback(host):
        raise WebError(f"--no-token is allowed only on a loopback address such as 127.0.0.1, "
                       f"not on {host}, which others may reach; drop --no-token")
    _check_address(host, port)
    secret = secrets.token_urlsafe(24) if token else None
    app = create_app(layout, token=secret, host=host)
    # From a thread, uvicorn must leave the process's logging as it is: its dictConfig closes
    # every handler there is, and absl's (TensorFlow's) closes a stream that is no longer
    # sys.stderr, such as the one a notebook or a test runner swapped out.
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                            log_config=None if in_thread else LOGGING_CONFIG)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/" + (f"?token={secret}" if secret else "")
    return uvicorn.Server(config), url


def serve(layout: Layout, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
          announce=print, token: bool = True) -> None:
    server, url = _server(layout, host, port, token)
    announce(f"dashboard at {url}")
    server.run()


def start_in_thread(layout: Layout, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                    token: bool = True) -> tuple[uvicorn.Server, str]:
    """The dashboard in a background thread; `server.should_exit = True` stops it."""
    server, url = _server(layout, host, port, token, in_thread=True)
    threading.Thread(target=server.run, name="dashboard", daemon=True).start()
    return server, url
