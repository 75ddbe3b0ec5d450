# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_api: hypeman's API never redirects; a 3xx is an error and the token goes nowhere but api_url."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from ansible_collections.hypeman.vgpu.plugins.module_utils import _api

TOKEN = "SECRET-TOKEN-123"


class _Server(object):
    """Answers every request (any method) with ``status``, ``Location: location`` (none when None) and
    ``body`` as JSON; keeps each request's method, path and Authorization header in ``requests``."""

    def __init__(self, status, location=None, body=None):
        self.requests = []
        outer = self
        data = b"" if body is None else json.dumps(body).encode("utf-8")

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                outer.requests.append((self.command, self.path, self.headers.get("Authorization")))
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                self.send_response(status)
                if location is not None:
                    self.send_header("Location", location)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

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


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("method", ["GET", "DELETE", "POST"])
def test_a_redirect_is_an_error_and_the_token_stays_home(status, method):
    with _Server(200, body=[{"id": "elsewhere"}]) as other:
        target = other.url + "/instances"
        with _Server(status, target) as api:
            answer = _api.api_request(method, api.url, "/instances", TOKEN, timeout=5,
                                      body={"name": "x"} if method == "POST" else None)
    assert other.requests == []  # nothing, least of all the token, went to the other host
    assert [request[2] for request in api.requests] == ["Bearer %s" % TOKEN]
    assert answer["reachable"] is True and answer["status"] == status and answer["data"] is None
    assert answer["error"].startswith("%s %s/instances: HTTP %d " % (method, api.url, status))
    assert "redirects to %s" % json.dumps(target) in answer["error"] and "never redirects" in answer["error"]
    assert TOKEN not in json.dumps(answer)


def test_a_redirect_without_location_and_a_300_are_errors_too():
    for status, location in ((302, None), (300, "/elsewhere")):
        with _Server(status, location) as api:
            answer = _api.api_get(api.url, "/resources", TOKEN, timeout=5)
        assert answer["status"] == status and answer["data"] is None and "never redirects" in answer["error"]


def test_resources_check_reports_a_redirect_as_its_error():
    # The section every caller (audit's api_unreachable, placement's warning, the inventory) reads.
    with _Server(200, body={"gpu": None}) as other:
        with _Server(302, other.url + "/resources") as api:
            section = _api.resources_check(None, api.url, TOKEN, timeout=5)
    assert other.requests == []
    assert section["status"] == 302 and section["gpu"] is None
    assert section["error"] == "GET %s/resources: HTTP 302 Found redirects to %s; hypeman's API never redirects " \
        "(check api_url)" % (api.url, json.dumps(other.url + "/resources"))
