# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A tiny stand-in for hypeman's API, for unit tests (not a test module itself)."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer


class ApiStub(object):
    """Serve canned answers on 127.0.0.1.

    ``routes`` maps a path to ``(status, body)`` or ``(status, body, headers)``;
    a path not listed gets ``default``. A dict or list body is sent as JSON, a
    str as is, None as nothing. ``delay`` seconds are slept before answering.
    Every request's path and Authorization header is kept in ``requests``, and
    with its method in ``calls`` (GET, POST and DELETE are answered alike).
    """

    def __init__(self, routes, token=None, delay=0.0, default=(404, {"message": "not found"})):
        self.routes = routes
        self.token = token
        self.delay = delay
        self.requests = []
        self.calls = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                auth = self.headers.get("Authorization")
                stub.requests.append((self.path, auth))
                stub.calls.append((self.command, self.path, auth))
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                if stub.delay:
                    time.sleep(stub.delay)
                if stub.token is not None and auth != "Bearer %s" % stub.token:
                    answer = (401, {"code": "unauthorized", "message": "invalid token"})
                else:
                    answer = stub.routes.get(self.path, default)
                status, body, headers = (tuple(answer) + ({},))[:3]
                data = "" if body is None else body if isinstance(body, str) else json.dumps(body)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                try:
                    self.wfile.write(data.encode("utf-8"))
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = do_POST = do_DELETE = _answer  # noqa: N815 (http.server's naming)

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def closed_port_url():
    """A URL on which nothing listens (the API is down)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return "http://127.0.0.1:%d" % port
