"""Run the dashboard with uvicorn:

    url = serve(layout, host="127.0.0.1", port=8080)              # blocks
    server, url = start_in_thread(layout, host, port)              # the daemon's --web

On a loopback address anyone on this machine may look, as with any local tool; bound to any
other address the dashboard requires a token, made here and printed in the address.
"""

from __future__ import annotations

import ipaddress
import secrets
import socket
import threading

import uvicorn

from localdet.paths import Layout
from localdet.web.app import create_app

DEFAULT_PORT = 8090


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost: may be reachable from elsewhere


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


def _server(layout: Layout, host: str, port: int) -> tuple[uvicorn.Server, str]:
    _check_address(host, port)
    token = None if is_loopback(host) else secrets.token_urlsafe(24)
    app = create_app(layout, token=token)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/" + (f"?token={token}" if token else "")
    return uvicorn.Server(config), url


def serve(layout: Layout, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
          announce=print) -> None:
    server, url = _server(layout, host, port)
    announce(f"dashboard at {url}")
    server.run()


def start_in_thread(layout: Layout, host: str = "127.0.0.1",
                    port: int = DEFAULT_PORT) -> tuple[uvicorn.Server, str]:
    """The dashboard in a background thread; `server.should_exit = True` stops it."""
    server, url = _server(layout, host, port)
    threading.Thread(target=server.run, name="dashboard", daemon=True).start()
    return server, url
