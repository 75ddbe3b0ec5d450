# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A small client for hypeman's API (``GET /resources``, ``GET /instances``)
and the cross-check of ``/resources`` against our own placement view.

Kept apart from the host-file helpers because ``ansible.module_utils.urls``
is costly to import on the host and only runs that set ``api_url`` need it:
modules import this file only then. Reference §2.4, §2.5, §3.4.
"""

from __future__ import annotations

import json
import socket
from urllib.error import HTTPError, URLError

from ansible.module_utils.urls import open_url

from ansible_collections.hypeman.vgpu.plugins.module_utils import _sysfs

# Fields an older hypeman does not send: missing, not a mismatch.
_NEWER_GPU_FIELDS = ("allocatable_slots", "quarantined_slots")


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


def resources_check(view, base_url, token=None, validate_certs=True, timeout=10):
    """``GET /resources`` compared with a placement view (``None``: fetch only).

    Returns ``{url, reachable, status, error, gpu, mismatches, missing_fields}``:
    ``gpu`` is hypeman's raw object; ``error`` also covers an answer that is
    not a JSON object; an answer without ``gpu`` lists it in ``missing_fields``.
    """
    answer = api_get(base_url, "/resources", token, validate_certs, timeout)
    section = {"url": answer["url"], "reachable": answer["reachable"], "status": answer["status"],
               "error": answer["error"], "gpu": None, "mismatches": [], "missing_fields": []}
    data = answer["data"]
    if answer["error"] is None:
        if not isinstance(data, dict):
            section["error"] = "GET %s: expected a JSON object, got %s" % (answer["url"], type(data).__name__)
        elif "gpu" not in data:
            section["missing_fields"] = ["gpu"]
        else:
            section["gpu"] = data["gpu"]
            if view is not None:
                section["mismatches"], section["missing_fields"] = compare_with_api(view, data["gpu"])
    return section


def compare_with_api(result, api_gpu):
    """Mismatches between our view and hypeman's ``/resources`` ``gpu`` object.

    Returns ``(mismatches, missing_fields)``: ``[{field, local, api}]`` and the
    newer fields an older hypeman does not send (not counted as mismatches).
    """
    mismatches, missing = [], []
    local_total = result["slots"]["total"]
    if api_gpu is None:
        if result["framework"] != _sysfs.FRAMEWORK_NONE and local_total:
            mismatches.append({"field": "gpu", "local": "vgpu", "api": None})
        return mismatches, missing
    if not isinstance(api_gpu, dict):
        mismatches.append({"field": "gpu", "local": "vgpu", "api": api_gpu})
        return mismatches, missing
    if result["framework"] == _sysfs.FRAMEWORK_NONE:
        mismatches.append({"field": "mode", "local": None, "api": api_gpu.get("mode")})
        return mismatches, missing
    if api_gpu.get("mode") != "vgpu":
        mismatches.append({"field": "mode", "local": "vgpu", "api": api_gpu.get("mode")})
    slots = result["slots"]
    for field, local in (("total_slots", slots["total"]), ("used_slots", slots["used"]),
                         ("allocatable_slots", slots["allocatable"]), ("quarantined_slots", slots["quarantined"])):
        if field not in api_gpu:
            if field in _NEWER_GPU_FIELDS:
                missing.append(field)
            else:
                mismatches.append({"field": field, "local": local, "api": None})
            continue
        if api_gpu[field] != local:
            mismatches.append({"field": field, "local": local, "api": api_gpu[field]})
    api_reason = api_gpu.get("placement_disabled_reason") or None
    if api_reason != result["placement_disabled_reason"]:
        mismatches.append({"field": "placement_disabled_reason", "local": result["placement_disabled_reason"],
                           "api": api_reason})
    api_profiles = {}
    for prof in api_gpu.get("profiles") or []:
        if isinstance(prof, dict) and "name" in prof:
            api_profiles[prof["name"]] = prof
    local_profiles = dict((p["name"], p) for p in result["profiles"])
    for name in sorted(set(api_profiles) | set(local_profiles)):
        local, api = local_profiles.get(name), api_profiles.get(name)
        for key in ("available", "framebuffer_mb"):
            lval = local.get(key) if local else None
            aval = api.get(key) if api else None
            if lval != aval:
                mismatches.append({"field": "profiles[%s].%s" % (name, key), "local": lval, "api": aval})
    return mismatches, missing
