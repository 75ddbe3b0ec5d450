# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""hypeman's own sentinel metrics, read from its Prometheus endpoint (stdlib only).

hypeman always serves its OTel metrics for Prometheus on ``/metrics``
(``metrics.listen_address`` 127.0.0.1, ``metrics.port`` 9464) and, with
``otel.enabled``, also pushes them over OTLP; only the pull endpoint can be
read from the host (docs/hypeman-interface.md §5.4, §5.6). This helper GETs it
with a whole-request deadline and a size cap, parses the text exposition
format strictly (a malformed line is an error naming it, never a traceback),
and keeps the five sentinel series plus hypeman's version and uptime.

``coverage_problems`` compares a sample with the previous one (kept by the
fleet_reconcile role in ``<state_dir>/sentinel-metrics.json``) to tell
whether hypeman's sentinel lost sight of its guests.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from http.client import HTTPConnection, HTTPSConnection
from urllib.parse import urlsplit

RESPONSE_LIMIT = 8 * 1024 * 1024  # hypeman's /metrics is some hundred KiB (Go runtime, HTTP histograms)
MAX_SERIES = 200000
SAMPLE_FILE = "sentinel-metrics.json"
SAMPLE_LIMIT = 64 * 1024
_CHUNK = 65536

CHECKS = "hypeman_instances_vgpu_sentinel_checks_total"
INIT_FAILURES = "hypeman_instances_vgpu_sentinel_init_failures_total"
QUARANTINES = "hypeman_instances_vgpu_sentinel_quarantines_total"
QUARANTINED_VFS = "hypeman_instances_vgpu_quarantined_vfs"
STORE_UNAVAILABLE = "hypeman_instances_vgpu_vf_health_store_unavailable"
INFO = "hypeman_info"
UPTIME = "hypeman_uptime_seconds"
WANTED = (CHECKS, INIT_FAILURES, QUARANTINES, QUARANTINED_VFS, STORE_UNAVAILABLE, INFO, UPTIME)
CHECK_RESULTS = ("ok", "failed", "unknown", "rpc_error", "list_error", "unsupported_agent")
# Check results that mean the sentinel could not look at a guest (or at the instance list).
BLIND_RESULTS = ("rpc_error", "list_error", "unsupported_agent")
POLL_SECONDS = 5  # hypeman's sentinel polls every guest every 5 s

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE_RE = re.compile(r"(" + _NAME + r")(?:\{(.*)\})?[ \t]+(\S+)(?:[ \t]+(-?[0-9]+))?[ \t]*")
_LABEL_RE = re.compile(r"[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*\"((?:[^\"\\\n]|\\[\\\"n])*)\"[ \t]*(,|$)")
_UNESCAPE = {"\\\\": "\\", "\\\"": "\"", "\\n": "\n"}
# A sample value as Go's strconv.ParseFloat reads the exposition's (Inf and NaN apart): ASCII
# digits only; Python's float() would also take "1_000" and other scripts' digits.
_DECIMAL_RE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


class MetricsError(Exception):
    """The endpoint's answer is not Prometheus text; the message names the line."""


def url_problem(url):
    """Why ``url`` cannot be hypeman's metrics endpoint, or None."""
    if not isinstance(url, str) or "\x00" in url or not re.match(r"^https?://[^/\s]+(/\S*)?$", url):
        return "metrics_url %r is not an http:// or https:// URL; expected e.g. http://127.0.0.1:9464/metrics" % (
            url if not isinstance(url, str) else url[:200],)
    return None


def fetch(url, timeout=10, limit=RESPONSE_LIMIT):
    """``{url, reachable, status, error, text}`` of ``GET url``; never raises, never hangs.

    ``timeout`` bounds the whole request (a server that trickles bytes is cut
    off); more than ``limit`` bytes, a non-200 status, a non-HTTP(S) URL or
    an answer that is not UTF-8 is an ``error``.
    """
    result = {"url": url, "reachable": False, "status": None, "error": None, "text": None}
    problem = url_problem(url)
    if problem:
        result["error"] = problem
        return result
    worker = threading.Thread(target=_request, args=(result, url, timeout, limit), name="hypeman-metrics",
                              daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        return dict(result, text=None, error="GET %s: no complete answer within %s seconds" % (url, timeout))
    return result


def _request(result, url, timeout, limit):
    # http.client, not urllib: one plain GET, no redirects to follow, no proxy from the environment.
    parts = urlsplit(url)
    connection = None
    try:
        connection_class = HTTPSConnection if parts.scheme == "https" else HTTPConnection
        connection = connection_class(parts.hostname, parts.port, timeout=timeout)
        target = (parts.path or "/") + ("?" + parts.query if parts.query else "")
        connection.request("GET", target, headers={"Accept": "text/plain;version=0.0.4"})
        response = connection.getresponse()
        result["reachable"] = True
        result["status"] = response.status
        if response.status != 200:
            result["error"] = "GET %s: HTTP %d %s; expected hypeman's Prometheus metrics" % (
                url, response.status, response.reason)
            return
        chunks, total = [], 0
        while True:
            chunk = response.read(min(_CHUNK, limit + 1 - total))
            if not chunk:
                break
            total += len(chunk)
            if total > limit:
                result["error"] = "GET %s: the answer is larger than %d bytes; expected hypeman's metrics" % (
                    url, limit)
                return
            chunks.append(chunk)
        try:
            result["text"] = b"".join(chunks).decode("utf-8")
        except UnicodeDecodeError as err:
            result["error"] = "GET %s: the answer is not UTF-8 text (byte %d)" % (url, err.start)
    except Exception as err:  # pylint: disable=broad-except  # refused, reset, TLS, bad status line, timeout
        result["error"] = "GET %s: %s" % (url, getattr(err, "strerror", None) or err or type(err).__name__)
    finally:
        if connection is not None:
            connection.close()


def _parse_value(text, lineno):
    """A sample value as Go's ``strconv.ParseFloat`` reads it (expfmt refuses ``p``, ``P`` and ``_`` first).

    Its specials, in any ASCII case: ``inf`` or ``infinity`` with an optional sign, ``nan`` without one.
    A decimal beyond float64 is Go's range error, not infinity.
    """
    if text.isascii():  # str.lower() and re's IGNORECASE would also fold non-ASCII letters; Go does not
        lowered = text.lower()
        if (lowered[1:] if lowered[:1] in ("+", "-") else lowered) in ("inf", "infinity"):
            return -math.inf if lowered.startswith("-") else math.inf
        if lowered == "nan":
            return math.nan
    if not _DECIMAL_RE.fullmatch(text):
        raise MetricsError("line %d: value %r is not a number" % (lineno, text[:40]))
    value = float(text)
    if math.isinf(value):
        raise MetricsError("line %d: value %r is out of range for a float64" % (lineno, text[:40]))
    return value


def _parse_labels(text, lineno):
    labels = {}
    rest = text
    while rest.strip():
        match = _LABEL_RE.match(rest)
        if not match:
            raise MetricsError("line %d: cannot parse the labels {%s}" % (lineno, text[:80]))
        value = re.sub(r"\\[\\\"n]", lambda m: _UNESCAPE[m.group(0)], match.group(2))
        if match.group(1) in labels:
            raise MetricsError("line %d: label %s given twice" % (lineno, match.group(1)))
        labels[match.group(1)] = value
        rest = rest[match.end():]
        if match.group(3) == "":
            break
    if rest.strip():
        raise MetricsError("line %d: text after the labels: %r" % (lineno, rest[:40]))
    return labels


def _shown_labels(labels):
    return "{%s}" % ",".join("%s=%s" % (k, json.dumps(v)[:40]) for k, v in sorted(labels.items())) if labels else ""


def parse(text, wanted=WANTED, max_series=MAX_SERIES):
    """``{name: [(labels, value), ...]}`` of the ``wanted`` families in Prometheus text format.

    Every line is checked, not only the wanted ones: an answer with one
    malformed line, or a series given twice, is not hypeman's metrics.
    Blanks before a line's first token are allowed, as the format allows them.
    Raises :class:`MetricsError`.
    """
    families = dict((name, []) for name in wanted)
    series = 0
    seen = set()
    for lineno, line in enumerate(text.split("\n"), 1):
        line = line.rstrip("\r").lstrip(" \t")
        if not line.strip() or line.startswith("#"):
            continue
        match = _SAMPLE_RE.fullmatch(line)
        if not match:
            raise MetricsError("line %d is not a Prometheus sample: %r" % (lineno, line[:80]))
        series += 1
        if series > max_series:
            raise MetricsError("more than %d series; expected hypeman's metrics" % max_series)
        name, labels, value = match.group(1), match.group(2), match.group(3)
        labels = _parse_labels(labels, lineno) if labels else {}
        key = (name, tuple(sorted(labels.items())))
        if key in seen:
            raise MetricsError("line %d: series %s%s given twice" % (lineno, name, _shown_labels(labels)))
        seen.add(key)
        value = _parse_value(value, lineno)
        if name in families:
            families[name].append((labels, value))
    return families


def _shown_value(value):
    return "+Inf" if value == math.inf else "-Inf" if value == -math.inf else repr(value)


def _usable(value, count):
    """Whether a sample value can be used: finite and not negative, and for a count a whole number.

    hypeman's counters and these gauges count things; an infinite or negative value, or a fraction of
    a check, is not hypeman's, and the audit and the coverage rules do integer arithmetic on them.
    """
    return _number(value) and value >= 0 and (not count or float(value).is_integer())


def _total(name, series, count=True):
    """The sum of a family's values over its labels (NaN ones skipped); raises MetricsError for an unusable one."""
    values = []
    for labels, value in series:
        if math.isnan(value):
            continue
        if not _usable(value, count):
            raise MetricsError("series %s%s has the value %s; expected a finite %s" % (
                name, _shown_labels(labels), _shown_value(value),
                "count (a whole number, 0 or more)" if count else "number, 0 or more"))
        values.append(value)
    if not values:
        return None
    total = sum(values)
    if math.isinf(total):
        raise MetricsError("the values of %s add up to more than a float64 holds" % name)
    return total


def sentinel_sample(families, taken_at=None):
    """The sentinel's numbers from parsed families (None where hypeman exports nothing).

    ``checks`` maps each ``result`` to its count, summed over other labels
    (the OTel exporter adds ``otel_scope_*``); None when hypeman exports no
    check counter at all (a marker-era hypeman, or nothing polled yet).
    Raises :class:`MetricsError` naming the series for a value that is not a
    finite count (the uptime: a finite number), 0 or more; NaN is skipped.
    """
    checks = None
    if families.get(CHECKS):
        by_result = {}
        for labels, value in families[CHECKS]:
            by_result.setdefault(labels.get("result", ""), []).append((labels, value))
        checks = {}
        for result, series in by_result.items():
            total = _total(CHECKS, series)
            if total is not None:
                checks[result] = total
    version = None
    for labels, _value in families.get(INFO) or []:
        version = labels.get("service_version") or labels.get("version") or version
    return {
        "taken_at": time.time() if taken_at is None else taken_at,
        "version": version,
        "uptime_seconds": _total(UPTIME, families.get(UPTIME) or [], count=False),
        "checks": checks,
        "init_failures": _total(INIT_FAILURES, families.get(INIT_FAILURES) or []),
        "quarantines": _total(QUARANTINES, families.get(QUARANTINES) or []),
        "quarantined_vfs": _total(QUARANTINED_VFS, families.get(QUARANTINED_VFS) or []),
        "store_unavailable": _total(STORE_UNAVAILABLE, families.get(STORE_UNAVAILABLE) or []),
    }


def read_sentinel_metrics(url, timeout=10):
    """``{url, error, sample}``: hypeman's sentinel sample, or the error in words."""
    answer = fetch(url, timeout)
    if answer["error"]:
        return {"url": url, "error": answer["error"], "sample": None}
    try:
        families = parse(answer["text"])
    except MetricsError as err:
        return {"url": url, "error": "GET %s: not Prometheus metrics: %s" % (url, err), "sample": None}
    try:
        sample = sentinel_sample(families)
    except MetricsError as err:
        return {"url": url, "error": "GET %s: not hypeman's sentinel metrics: %s" % (url, err), "sample": None}
    return {"url": url, "error": None, "sample": sample}


def _number(value):
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # a JSON integer past float64 (a stored sample): none sentinel_sample gives
        return False


def valid_sample(sample):
    """Whether a stored previous sample has the shape :func:`sentinel_sample` gives (else it is ignored)."""
    if not isinstance(sample, dict) or not _number(sample.get("taken_at")):
        return False
    for key in ("uptime_seconds", "init_failures", "quarantines", "quarantined_vfs", "store_unavailable"):
        if sample.get(key) is not None and not _usable(sample[key], key != "uptime_seconds"):
            return False
    checks = sample.get("checks")
    if checks is not None and not (isinstance(checks, dict) and all(
            isinstance(key, str) and _usable(value, True) for key, value in checks.items())):
        return False
    return True


def decode_sample(data):
    """A previous sample from the bytes of ``SAMPLE_FILE``; ``(sample, error)``."""
    try:
        sample = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        return None, "not JSON: %s" % err
    if not valid_sample(sample):
        return None, "not a sentinel metrics sample"
    return sample, None


def coverage_problems(previous, current, targets):
    """Why hypeman's sentinel lost coverage between two samples (empty: nothing lost or cannot tell).

    ``targets``: vendor-VFIO vGPU instances the sentinel should poll (None:
    unknown). A counter that went down means hypeman restarted: the current
    values are then the growth since the restart.
    """
    if previous is None or current is None:
        return []
    problems = []
    was_restarted = restarted(previous, current)
    old_checks = {} if was_restarted else (previous.get("checks") or {})
    new_checks = current.get("checks")
    for result in BLIND_RESULTS:
        grew = (new_checks or {}).get(result, 0) - old_checks.get(result, 0)
        if grew > 0:
            problems.append("%d %s check(s) since the previous sample" % (grew, result))
    elapsed = _elapsed(previous, current, was_restarted)
    if targets and elapsed is not None and elapsed >= 3 * POLL_SECONDS:
        if new_checks is None and previous.get("checks") is not None:
            problems.append("hypeman no longer exports sentinel checks although %d instance(s) hold a "
                            "vendor-VFIO vGPU" % targets)
        elif new_checks is not None and sum(new_checks.values()) - sum(old_checks.values()) <= 0:
            problems.append("no sentinel check in %d s although %d instance(s) hold a vendor-VFIO vGPU"
                            % (elapsed, targets))
    return problems


def restarted(previous, current):
    """Whether hypeman restarted between two samples: its uptime or any counter went down.

    Counters only grow while hypeman runs, so one that went down is a restart even when the
    uptime since it already passed the previous one. A restart after which every counter and
    the uptime passed their old values cannot be told (its growth is then under-counted).
    """
    old, new = previous.get("uptime_seconds"), current.get("uptime_seconds")
    if _number(old) and _number(new) and new < old:
        return True
    for key in ("init_failures", "quarantines"):
        if _number(previous.get(key)) and _number(current.get(key)) and current[key] < previous[key]:
            return True
    old_checks, new_checks = previous.get("checks") or {}, current.get("checks") or {}
    return any(new_checks.get(result, 0) < value for result, value in old_checks.items())


def counter_growth(previous, current, key):
    """How much the counter ``key`` grew from ``previous`` to ``current``, counted from zero after a restart."""
    before = 0 if restarted(previous, current) else previous.get(key) or 0
    return (current.get(key) or 0) - before


def _elapsed(previous, current, was_restarted):
    old, new = previous.get("uptime_seconds"), current.get("uptime_seconds")
    if _number(old) and _number(new):
        return new if was_restarted else new - old
    if _number(previous.get("taken_at")) and _number(current.get("taken_at")):
        return current["taken_at"] - previous["taken_at"]
    return None
