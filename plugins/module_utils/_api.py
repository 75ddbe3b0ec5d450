# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A small client for hypeman's API (``GET /resources``, ``GET /instances``)
and the cross-check of ``/resources`` against our own placement view.

Kept apart from the host-file helpers because ``ansible.module_utils.urls``
is costly to import on the host and only runs that set ``api_url`` need it:
modules import this file only then. docs/hypeman-interface.md §2.4, §2.5, §3.4.
"""

from __future__ import annotations

import json
import socket
import threading
from urllib.error import HTTPError, URLError

from ansible.module_utils.urls import open_url

from ansible_collections.hypeman.vgpu.plugins.module_utils import _sysfs

# Fields an older hypeman does not send: missing, not a mismatch.
_NEWER_GPU_FIELDS = ("allocatable_slots", "quarantined_slots")
# hypeman's answers are KiB (/instances of a thousand instances about 1 MiB) and a few levels deep;
# past these an answer is not hypeman's, and a deeper one could not even be returned as a result.
RESPONSE_LIMIT = 16 * 1024 * 1024
MAX_DEPTH = 32
_CHUNK = 65536


def api_get(base_url, path, token=None, validate_certs=True, timeout=10, ca_path=None):
    """GET ``base_url + path`` and decode JSON: :func:`api_request` with method GET."""
    return api_request("GET", base_url, path, token, validate_certs, timeout, ca_path)


def api_request(method, base_url, path, token=None, validate_certs=True, timeout=10, ca_path=None, body=None):
    """``method`` ``base_url + path`` (with ``body`` sent as JSON) and decode the JSON answer.

    Never raises for HTTP or network trouble.

    Returns ``{url, reachable, status, error, data}``: ``reachable`` is True
    when the server answered at all (even 401); ``error`` says what went wrong
    in words an operator can act on. The token is sent as a bearer token to
    ``url`` only and never appears in a result: a redirect (3xx) is not
    followed but is an ``error`` naming its status and ``Location``.

    ``timeout`` bounds the whole request, not each socket read: a server that
    answers one byte at a time, or never ends its answer, is cut off after
    ``timeout`` seconds. An answer over :data:`RESPONSE_LIMIT` bytes, not
    JSON, or nested deeper than :data:`MAX_DEPTH` levels is an ``error``.
    An empty answer to a method other than GET (``204 No Content``) has
    ``data`` None. An HTTP error's ``error`` quotes hypeman's error body
    (``{code, message}``) when it sent one; ``status`` tells a 404 from a
    refusal.
    """
    url = base_url.rstrip("/") + path
    result = {"url": url, "reachable": False, "status": None, "error": None, "data": None}
    # The request runs in a daemon thread the caller stops waiting for at the deadline;
    # a thread still reading then ends with the process (its socket times out first).
    payload = None if body is None else json.dumps(body, sort_keys=True).encode("utf-8")
    worker = threading.Thread(target=_request, args=(result, method, url, token, validate_certs, timeout, ca_path,
                                                     payload),
                              name="hypeman-api", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        # A partial answer is no answer: the same words as a socket timeout.
        return dict(result, data=None, error="%s %s: no answer within %s seconds" % (method, url, timeout))
    return result


def _read_body(response, what):
    """The answer's body, refusing more than :data:`RESPONSE_LIMIT` bytes."""
    chunks, total = [], 0
    while True:
        chunk = response.read(min(_CHUNK, RESPONSE_LIMIT + 1 - total))
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > RESPONSE_LIMIT:
            raise _TooLarge("%s: the answer is larger than %d bytes; expected hypeman's JSON" % (what, RESPONSE_LIMIT))
        chunks.append(chunk)


class _TooLarge(Exception):
    pass


def _depth_exceeds(value, limit):
    """Whether a decoded JSON value nests deeper than ``limit`` levels (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        elif not isinstance(item, list):
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in item)
    return False


def _request(result, method, url, token, validate_certs, timeout, ca_path, payload=None):
    """Fill ``result`` (see :func:`api_request`) from one request."""
    what = "%s %s" % (method, url)
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = "Bearer %s" % token
    if payload is not None:
        headers["Content-Type"] = "application/json"
    try:
        response = open_url(url, method=method, headers=headers, validate_certs=validate_certs, data=payload,
                            timeout=timeout, ca_path=ca_path, follow_redirects="none")
        result["status"] = response.getcode()
        result["reachable"] = True
        body = _read_body(response, what)
    except _TooLarge as err:
        result["error"] = str(err)
        return
    except HTTPError as err:
        result["reachable"] = True
        result["status"] = err.code
        if 300 <= err.code < 400:
            # hypeman never redirects: following one would send the token elsewhere and take that
            # host's answer for hypeman's.
            location = err.headers.get("Location") if err.headers is not None else None
            result["error"] = "%s: HTTP %d %s redirects to %s; hypeman's API never redirects (check api_url)" % (
                what, err.code, err.reason,
                "nowhere (no Location)" if location is None else json.dumps(location[:_ERROR_MESSAGE_SHOWN]))
            return
        hint = {401: " (check api_token)",
                403: " (the token is not allowed to %s this)" % ("read" if method == "GET" else "do")}.get(err.code, "")
        detail = _error_detail(err, what)
        result["error"] = "%s: HTTP %d %s%s%s" % (what, err.code, err.reason, hint, detail)
        return
    except socket.timeout:
        result["error"] = "%s: no answer within %s seconds" % (what, timeout)
        return
    except URLError as err:
        reason = err.reason
        if isinstance(reason, socket.timeout):
            result["error"] = "%s: no answer within %s seconds" % (what, timeout)
        else:
            result["error"] = "%s: %s" % (what, getattr(reason, "strerror", None) or reason)
        return
    except Exception as err:  # pylint: disable=broad-except  # ssl, http.client, ConnectionError
        result["error"] = "%s: %s" % (what, err)
        return
    if not body.strip() and method != "GET":
        return  # 204 No Content (DELETE)
    data, error = _decode(body, what)
    result["data"], result["error"] = data, error


def _decode(body, what):
    """``(data, error)`` from an answer's bytes: JSON within :data:`MAX_DEPTH` levels."""
    try:
        data = json.loads(body.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        return None, "%s: response is not JSON: %s" % (what, err)
    except RecursionError:
        return None, "%s: response is JSON nested too deeply to decode; expected hypeman's JSON" % what
    if _depth_exceeds(data, MAX_DEPTH):
        return None, "%s: response is JSON nested deeper than %d levels; expected hypeman's JSON" % (what, MAX_DEPTH)
    return data, None


# hypeman's error body is {"code": ..., "message": ...}; more than this of it is not worth quoting.
_ERROR_BODY_LIMIT = 64 * 1024
_ERROR_MESSAGE_SHOWN = 500


def _error_detail(err, what):
    """``": <code>: <message>"`` from hypeman's error body, or ``""`` when there is none to read."""
    try:
        body = err.read(_ERROR_BODY_LIMIT)
    except Exception:  # pylint: disable=broad-except  # a body that cannot be read adds nothing
        return ""
    if not body:
        return ""
    data, error = _decode(body, what)
    if error or not isinstance(data, dict):
        return ""
    parts = [str(data[key])[:_ERROR_MESSAGE_SHOWN] for key in ("code", "message") if isinstance(data.get(key), str)]
    return (": " + ": ".join(parts)) if parts else ""


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


def _kind(value):
    """A JSON value of the wrong type, for a mismatch: scalars as they are, containers by type."""
    if isinstance(value, dict):
        return "a JSON object"
    if isinstance(value, list):
        return "a JSON array"
    return value


def compare_with_api(result, api_gpu):
    """Mismatches between our view and hypeman's ``/resources`` ``gpu`` object.

    Returns ``(mismatches, missing_fields)``: ``[{field, local, api}]`` and the
    newer fields an older hypeman does not send (not counted as mismatches).
    """
    mismatches, missing = [], []
    local_total = result["slots"]["total"]
    if result["framework"] == _sysfs.FRAMEWORK_NONE and (api_gpu is None or isinstance(api_gpu, dict)):
        # No vGPU framework: hypeman's passthrough mode (or no gpu at all).
        from ansible_collections.hypeman.vgpu.plugins.module_utils import _passthrough

        return _passthrough.compare(result.get("passthrough"), api_gpu, _NEWER_GPU_FIELDS)
    if api_gpu is None:
        if result["framework"] != _sysfs.FRAMEWORK_NONE and local_total:
            mismatches.append({"field": "gpu", "local": "vgpu", "api": None})
        return mismatches, missing
    if not isinstance(api_gpu, dict):
        local = "vgpu" if result["framework"] != _sysfs.FRAMEWORK_NONE else (
            "passthrough" if result.get("passthrough") else None)
        mismatches.append({"field": "gpu", "local": local, "api": api_gpu})
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
    listed = api_gpu.get("profiles")
    if listed is not None and not isinstance(listed, list):
        mismatches.append({"field": "profiles", "local": "a list", "api": _kind(listed)})
        listed = None
    for prof in listed or []:
        # Anything but {"name": "<text>", ...} is no profile: hypeman never sends one.
        if isinstance(prof, dict) and isinstance(prof.get("name"), str):
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
