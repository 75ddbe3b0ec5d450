# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A small client for hypeman's API (``GET /resources``, ``GET /instances``).

Kept apart from the host-file helpers because ``ansible.module_utils.urls``
is costly to import on the host and only runs that set ``api_url`` need it:
modules import this file only then. Reference §2.4, §2.5, §3.4.
"""

from __future__ import annotations

import json
import socket
from urllib.error import HTTPError, URLError

from ansible.module_utils.urls import open_url


def api_get(base_url, path, token=None, validate_certs=True, timeout=10, ca_path=None):
    """GET ``base_url + path`` and decode JSON. Never raises for HTTP or network trouble.

    Returns ``{url, reachable, status, error, data}``: ``reachable`` is True
    when the server answered at all (even 401); ``error`` says what went wrong
    in words an operator can act on. The token is sent as a bearer token and
    never appears in a result.
    """
    url = base_url.rstrip("/") + path
    result = {"url": url, "reachable": False, "status": None, "error": None, "data": None}
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = "Bearer %s" % token
    try:
        response = open_url(url, method="GET", headers=headers, validate_certs=validate_certs,
                            timeout=timeout, ca_path=ca_path, follow_redirects="safe")
        body = response.read()
        result["status"] = response.getcode()
        result["reachable"] = True
    except HTTPError as err:
        result["reachable"] = True
        result["status"] = err.code
        hint = {401: " (check api_token)", 403: " (the token is not allowed to read this)"}.get(err.code, "")
        result["error"] = "GET %s: HTTP %d %s%s" % (url, err.code, err.reason, hint)
        return result
    except socket.timeout:
        result["error"] = "GET %s: no answer within %s seconds" % (url, timeout)
        return result
    except URLError as err:
        reason = err.reason
        if isinstance(reason, socket.timeout):
            result["error"] = "GET %s: no answer within %s seconds" % (url, timeout)
        else:
            result["error"] = "GET %s: %s" % (url, getattr(reason, "strerror", None) or reason)
        return result
    except Exception as err:  # pylint: disable=broad-except  # ssl, http.client, ConnectionError
        result["error"] = "GET %s: %s" % (url, err)
        return result
    try:
        result["data"] = json.loads(body.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        result["error"] = "GET %s: response is not JSON: %s" % (url, err)
    return result


def api_instances(data):
    """The instance list from ``GET /instances`` (a JSON array, or an object wrapping one)."""
    if isinstance(data, list):
        return data
    if isinstance(data, dict):
        for key in ("instances", "data", "items"):
            if isinstance(data.get(key), list):
                return data[key]
    return None
