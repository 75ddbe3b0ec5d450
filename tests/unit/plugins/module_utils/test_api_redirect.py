# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_api: hypeman's API never redirects; a 3xx is an error and the token goes nowhere but api_url."""

from __future__ import annotations

import json

import pytest

from ansible_collections.hypeman.vgpu.plugins.module_utils import _api
from ansible_collections.hypeman.vgpu.tests.unit.plugins.module_utils.api_stub import ApiStub

TOKEN = "SECRET-TOKEN-123"


def _server(status, location=None, body=None):
    """Answers every request with ``status``, ``Location: location`` (none when None) and ``body``."""
    return ApiStub({}, default=(status, body, {} if location is None else {"Location": location}))


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("method", ["GET", "DELETE", "POST"])
def test_a_redirect_is_an_error_and_the_token_stays_home(status, method):
    with _server(200, body=[{"id": "elsewhere"}]) as other:
        target = other.url + "/instances"
        with _server(status, target) as api:
            answer = _api.api_request(method, api.url, "/instances", TOKEN, timeout=5,
                                      body={"name": "x"} if method == "POST" else None)
    assert other.calls == []  # nothing, least of all the token, went to the other host
    assert [request[2] for request in api.calls] == ["Bearer %s" % TOKEN]
    assert answer["reachable"] is True and answer["status"] == status and answer["data"] is None
    assert answer["error"].startswith("%s %s/instances: HTTP %d " % (method, api.url, status))
    assert "redirects to %s" % json.dumps(target) in answer["error"] and "never redirects" in answer["error"]
    assert TOKEN not in json.dumps(answer)


def test_a_redirect_without_location_and_a_300_are_errors_too():
    for status, location in ((302, None), (300, "/elsewhere")):
        with _server(status, location) as api:
            answer = _api.api_get(api.url, "/resources", TOKEN, timeout=5)
        assert answer["status"] == status and answer["data"] is None and "never redirects" in answer["error"]


def test_resources_check_reports_a_redirect_as_its_error():
    # The section every caller (audit's api_unreachable, placement's warning, the inventory) reads.
    with _server(200, body={"gpu": None}) as other:
        with _server(302, other.url + "/resources") as api:
            section = _api.resources_check(None, api.url, TOKEN, timeout=5)
    assert other.calls == []
    assert section["status"] == 302 and section["gpu"] is None
    assert section["error"] == "GET %s/resources: HTTP 302 Found redirects to %s; hypeman's API never redirects " \
        "(check api_url)" % (api.url, json.dumps(other.url + "/resources"))
