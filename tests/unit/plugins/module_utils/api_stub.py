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

    ``routes`` maps a path to ``(status, body)``; a dict or list body is sent as
    JSON, a str as is. ``delay`` seconds are slept before answering. Every
    request's path and Authorization header is kept in ``requests``.
    """

    def __init__(self, routes, token=None, delay=0.0):
        self.routes = routes
        self.token = token
        self.delay = delay
        self.requests = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's naming)
                stub.requests.append((self.path, self.headers.get("Authorization")))
                if stub.delay:
                    time.sleep(stub.delay)
                if stub.token is not None and self.headers.get("Authorization") != "Bearer %s" % stub.token:
                    status, body = 401, {"code": "unauthorized", "message": "invalid token"}
                else:
                    status, body = stub.routes.get(self.path, (404, {"message": "not found"}))
                data = body if isinstance(body, str) else json.dumps(body)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                try:
                    self.wfile.write(data.encode("utf-8"))
                except (BrokenPipeError, ConnectionResetError):
                    pass

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
