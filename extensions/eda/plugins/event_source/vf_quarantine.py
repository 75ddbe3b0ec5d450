# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vf_quarantine: an ansible-rulebook event source watching hypeman's vGPU VF health.

Polls each host named in ``hosts`` and puts one event on the queue, once, for:

* ``vf_quarantined``: a VF newly quarantined (from the store file: per VF, with
  its card; from ``GET /resources``: a rise of ``quarantined_slots``, no VF named);
* ``vf_failure_below_threshold``: a recorded driver-init failure on a VF that is
  not quarantined (store file: per failure; metrics: a rise of
  ``init_failures_total`` not matched by ``quarantines_total``);
* ``store_unavailable``: a store hypeman cannot load (store file, the API's
  ``placement_disabled_reason``, or the ``vf_health_store_unavailable`` gauge);
* ``sentinel_coverage_lost``: hypeman's sentinel lost sight of guests
  (``vgpu_sentinel_checks_total{result=rpc_error|list_error|unsupported_agent}``
  grew, or no check at all while VFs are in use);
* ``source_error``: a host or answer that cannot be read.

Arguments (docs/eda.md has the full table):
  hosts: list of {name, api_url, api_token, metrics_url, store_path, sysfs_root, validate_certs}
  state_path: the cursor file (default ~/.local/state/hypeman-vgpu/vf_quarantine.json)
  interval: seconds between polls (30); debounce: seconds a condition must last (60)
  timeout: seconds per request (10); threshold: hypeman's quarantine threshold (2)
  fire_existing: fire for conditions already present at the first poll of a host (false)
  max_polls: stop after this many polls (unset: run until cancelled)

Example:
  sources:
    - hypeman.vgpu.vf_quarantine:
        hosts:
          - {name: gpu-07, store_path: /var/lib/hypeman/gpu/vf-health.json}
        debounce: 60

The parsing is the collection's own (module_utils ``_store``, ``_metrics``,
``_api``, ``_sysfs``); ansible-rulebook loads this file by path without
Ansible's collection loader, so the directory holding ``ansible_collections``
is put on ``sys.path`` when the collection is not importable already.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import fcntl
import json
import logging
import math
import os
import sys
import time

LOGGER = logging.getLogger("hypeman.vgpu.vf_quarantine")


def _collection_root():
    """The directory holding ``ansible_collections`` for this file, or None."""
    path = os.path.abspath(__file__)
    for _level in range(7):  # event_source, plugins, eda, extensions, vgpu, hypeman, ansible_collections
        path = os.path.dirname(path)
    if os.path.basename(path) != "ansible_collections":
        return None
    return os.path.dirname(path)


def _import_helpers():
    try:
        # pylint: disable-next=import-outside-toplevel,unused-import
        from ansible_collections.hypeman.vgpu.plugins.module_utils import _metrics  # noqa: F401
    except ImportError:
        root = _collection_root()
        if root is None:
            raise
        # A PEP 420 namespace package: importable once its parent directory is on the path.
        sys.path.append(root)
    # pylint: disable=import-outside-toplevel
    from ansible_collections.hypeman.vgpu.plugins.module_utils import (
        _fileio, _hypeman, _metrics, _safedir, _store, _sysfs)
    return _fileio, _hypeman, _metrics, _safedir, _store, _sysfs


_fileio, _hypeman, _metrics, _safedir, _store, _sysfs = _import_helpers()

EVENT_KEY = "vf_quarantine"
STATE_VERSION = 1
STATE_LIMIT = 4 * 1024 * 1024  # hundreds of hosts with hundreds of VFs each stay far below
MAX_KEYS_PER_HOST = 20000
MAX_HOSTS = 5000
DEFAULT_STATE_PATH = "~/.local/state/hypeman-vgpu/vf_quarantine.json"
_HOST_KEYS = frozenset(("name", "api_url", "api_token", "metrics_url", "store_path", "sysfs_root",
                        "validate_certs"))
_now = time.time  # the clock for debounce and event times (tests replace it)


class SourceArgumentError(ValueError):
    """The rulebook gave this source arguments it cannot use; the message names them."""


def _text_ok(value, limit=4096):
    return isinstance(value, str) and value != "" and "\x00" not in value and len(value) <= limit


def _number_arg(args, name, default, minimum, integer=False):
    value = args.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < minimum or (
            integer and int(value) != value) or value > 10 ** 9:
        raise SourceArgumentError("vf_quarantine: %s=%r is not a number >= %s%s" % (
            name, value if not isinstance(value, str) else value[:80], minimum, " (a whole number)" if integer else ""))
    return int(value) if integer else float(value)


def parse_args(args):
    """The source's settings from the rulebook's ``args``; :class:`SourceArgumentError` names a bad one."""
    if not isinstance(args, dict):
        raise SourceArgumentError("vf_quarantine: expected a mapping of arguments, got %s" % type(args).__name__)
    hosts = args.get("hosts")
    if not isinstance(hosts, list) or not hosts or len(hosts) > MAX_HOSTS:
        raise SourceArgumentError("vf_quarantine: hosts must be a list of 1 to %d host mappings "
                                  "({name, api_url, metrics_url, store_path, ...})" % MAX_HOSTS)
    settings = {
        "interval": _number_arg(args, "interval", 30, 0.01),
        "debounce": _number_arg(args, "debounce", 60, 0),
        "timeout": _number_arg(args, "timeout", 10, 0.1),
        "threshold": _number_arg(args, "threshold", _hypeman.DEFAULT_QUARANTINE_THRESHOLD, 1, integer=True),
        "max_polls": None if args.get("max_polls") is None else _number_arg(args, "max_polls", 0, 1, integer=True),
        "fire_existing": args.get("fire_existing", False),
        "hosts": [],
    }
    if not isinstance(settings["fire_existing"], bool):
        raise SourceArgumentError("vf_quarantine: fire_existing=%r is not true or false" % (settings["fire_existing"],))
    state_path = args.get("state_path", DEFAULT_STATE_PATH)
    if not _text_ok(state_path):
        raise SourceArgumentError("vf_quarantine: state_path=%r is not a file path" % (state_path,))
    settings["state_path"] = os.path.abspath(os.path.expanduser(state_path))
    names = set()
    for index, host in enumerate(hosts):
        if not isinstance(host, dict) or not _text_ok(host.get("name"), 255):
            raise SourceArgumentError("vf_quarantine: hosts[%d] needs a name (text of at most 255 characters)" % index)
        name = host["name"]
        unknown = sorted(str(key)[:40] for key in host if key not in _HOST_KEYS)
        if unknown:
            raise SourceArgumentError("vf_quarantine: hosts[%d] (%s): unknown key(s) %s; expected %s" % (
                index, name, ", ".join(unknown), ", ".join(sorted(_HOST_KEYS))))
        if name in names:
            raise SourceArgumentError("vf_quarantine: host %r is listed twice" % name)
        names.add(name)
        for key in ("api_url", "metrics_url"):
            value = host.get(key)
            if value is not None and _metrics.url_problem(value):
                raise SourceArgumentError("vf_quarantine: hosts[%d] (%s): %s=%r is not an http(s) URL" % (
                    index, name, key, value if not isinstance(value, str) else value[:200]))
        for key in ("store_path", "sysfs_root"):
            value = host.get(key)
            if value is not None and not (_text_ok(value) and value.startswith("/")):
                raise SourceArgumentError("vf_quarantine: hosts[%d] (%s): %s=%r is not an absolute path" % (
                    index, name, key, value if not isinstance(value, str) else value[:200]))
        token = host.get("api_token")
        if token is not None and not (_text_ok(token, 65536) and "\n" not in token and "\r" not in token):
            raise SourceArgumentError("vf_quarantine: hosts[%d] (%s): api_token is not a single line of text" % (
                index, name))
        if not any(host.get(key) for key in ("api_url", "metrics_url", "store_path")):
            raise SourceArgumentError("vf_quarantine: hosts[%d] (%s): give at least one of api_url, metrics_url, "
                                      "store_path" % (index, name))
        validate = host.get("validate_certs", True)
        if not isinstance(validate, bool):
            raise SourceArgumentError("vf_quarantine: hosts[%d] (%s): validate_certs=%r is not true or false" % (
                index, name, validate))
        settings["hosts"].append(dict(host, validate_certs=validate, sysfs_root=host.get("sysfs_root") or "/sys"))
    return settings


# --- what one poll of one host shows -----------------------------------------------------------------

class Observation(object):
    """The conditions one poll of one host saw.

    ``conditions``: key -> event body (kept while the condition lasts, debounced);
    ``instant``: event bodies of counter rises (an event as soon as seen);
    ``read``: the sources read successfully (only their keys may be forgotten).
    """

    def __init__(self, host):
        self.host = host
        self.conditions = {}
        self.instant = []
        self.read = set()
        self.updates = {}  # host state to keep once the poll's events are out
        self.after_fired = {}  # key -> host state to keep once that condition's event is out (or baselined)

    def add(self, key, kind, source, reason, evidence, card=None, vf=None):
        # One condition seen by several sources (an unloadable store): the first reader's words, the
        # most detailed (store file, then /resources, then metrics).
        self.conditions.setdefault(key, _body(self.host, kind, source, reason, evidence, card, vf, key))


def _body(host, kind, source, reason, evidence, card, vf, key):
    # host_card: one string a rulebook condition can look up in an allowlist ("gpu-07/0000:82:00.0").
    return {"kind": kind, "host": host, "card": card, "vf": vf, "reason": reason, "evidence": evidence,
            "source": source, "key": key, "host_card": "%s/%s" % (host, card) if card else None}


def _read_store(host, threshold, seen):
    store = _store.load_store(host["store_path"])
    if not store.valid:
        seen.add("store_unavailable", "store_unavailable", "store",
                 "hypeman cannot load the VF health store %s: %s" % (host["store_path"], store.error),
                 {"store_path": host["store_path"], "format": store.format, "error": store.error})
        return  # an unloadable store shows no records: keep what was known about them
    seen.read.add("store")
    for record in store.to_data():
        vf = record["vf_address"]
        card = _sysfs.parent_of(host["sysfs_root"], vf)
        evidence = {"store_path": host["store_path"], "record": record, "threshold": threshold,
                    "card_from": "physfn link under %s" % host["sysfs_root"] if card else None}
        if record["quarantined_at"] is not None:
            seen.add("vf_quarantined|store|%s|%s" % (vf, record["quarantined_at"]), "vf_quarantined", "store",
                     "VF %s%s is quarantined since %s after %d recorded failure(s)" % (
                         vf, " on card %s" % card if card else "", record["quarantined_at"], len(record["failures"])),
                     evidence, card, vf)
            continue
        count = len(record["failures"])
        for failure in record["failures"]:
            seen.add("vf_failure_below_threshold|store|%s|%s|%s" % (vf, failure["instance_id"], failure["assigned_at"]),
                     "vf_failure_below_threshold", "store",
                     "VF %s%s: driver-init failure of instance %s (%d of %d failures that quarantine it%s)" % (
                         vf, " on card %s" % card if card else "", failure["instance_id"] or "(none)", count,
                         threshold, "; hypeman quarantines it at its next load" if count >= threshold else ""),
                     dict(evidence, failure=failure), card, vf)


def _read_api(host, timeout, seen, state):
    # _api needs ansible-core's urls helper: imported only for hosts with api_url.
    from ansible_collections.hypeman.vgpu.plugins.module_utils import _api  # pylint: disable=import-outside-toplevel

    answer = _api.resources_check(None, host["api_url"], host.get("api_token"), host["validate_certs"], timeout)
    if answer["error"] or answer["missing_fields"]:
        seen.add("source_error|api", "source_error", "api",
                 answer["error"] or "GET %s: the answer has no gpu object; expected hypeman's /resources" % answer["url"],
                 {"url": answer["url"], "status": answer["status"]})
        return
    gpu = answer["gpu"]
    if gpu is not None and not isinstance(gpu, dict):
        seen.add("source_error|api", "source_error", "api",
                 "GET %s: gpu is not a JSON object; expected hypeman's /resources" % answer["url"],
                 {"url": answer["url"], "status": answer["status"]})
        return
    seen.read.add("api")
    gpu = gpu or {}
    reason = gpu.get("placement_disabled_reason")
    if isinstance(reason, str) and reason:
        seen.add("store_unavailable", "store_unavailable", "api",
                 "hypeman disabled vGPU placement: %s" % reason[:2000],
                 {"url": answer["url"], "placement_disabled_reason": reason[:2000]})
    slots = gpu.get("quarantined_slots")
    if isinstance(slots, int) and not isinstance(slots, bool) and slots >= 0:
        seen.updates["used_slots"] = gpu.get("used_slots") if isinstance(gpu.get("used_slots"), int) else None
        high = state.get("quarantined_slots")
        high = high if isinstance(high, int) else None
        # At the first read of the API the count is a condition too (until it is out of debounce): decide()
        # makes it the baseline, or fires it with fire_existing (a lost cursor).
        first = high is None and ("api" not in (state.get("baselined") or ()) or any(
            key.startswith("vf_quarantined|api|") for key in state.get("pending") or ()))
        if host.get("store_path") is None and slots > (high or 0) and (first or high is not None):
            key = "vf_quarantined|api|%d" % slots
            seen.add(key, "vf_quarantined", "api",
                     "hypeman reports %d quarantined VF slot(s), %s (the VF and card are not in "
                     "/resources: read the store on the host)" % (
                         slots, "at the first read" if high is None else "up from %d" % high),
                     {"url": answer["url"], "quarantined_slots": slots, "previous": high})
            # The mark stays while the rise is debounced (each poll sees it again) and moves once its
            # event is out: a later fall and rise back is then a new quarantine, a fall alone is none.
            seen.after_fired[key] = {"quarantined_slots": slots}
        else:
            seen.updates["quarantined_slots"] = slots


def _read_metrics(host, timeout, seen, state):
    answer = _metrics.read_sentinel_metrics(host["metrics_url"], timeout)
    if answer["error"]:
        seen.add("source_error|metrics", "source_error", "metrics", answer["error"], {"url": host["metrics_url"]})
        return
    sample = answer["sample"]
    if not _metrics.valid_sample(sample):
        # An infinite or NaN value (legal Prometheus text) has no growth to compare and cannot be kept in
        # the JSON cursor: this sample is an error, the previous one stays the baseline.
        bad = sorted("%s=%r" % (name, value) for name, value in _numbers(sample)
                     if isinstance(value, float) and not math.isfinite(value))
        seen.add("source_error|metrics", "source_error", "metrics",
                 "GET %s: the sample has %s; expected finite numbers" % (
                     host["metrics_url"], ", ".join(bad[:8]) or "no usable numbers"), {"url": host["metrics_url"]})
        return
    seen.read.add("metrics")
    seen.updates["metrics"] = sample
    previous = state.get("metrics")
    if sample["store_unavailable"]:
        seen.add("store_unavailable", "store_unavailable", "metrics",
                 "hypeman's gauge %s is %s" % (_metrics.STORE_UNAVAILABLE, sample["store_unavailable"]),
                 {"url": host["metrics_url"], "sample": sample})
    if not _metrics.valid_sample(previous):
        return
    targets = state.get("used_slots") if isinstance(state.get("used_slots"), int) else None
    problems = _metrics.coverage_problems(previous, sample, targets)
    if problems:
        seen.add("sentinel_coverage_lost", "sentinel_coverage_lost", "metrics",
                 "hypeman's sentinel lost sight of guests: %s" % "; ".join(problems),
                 {"url": host["metrics_url"], "problems": problems, "previous": previous, "sample": sample})
    if host.get("store_path") is None:
        failures = _metrics.counter_growth(previous, sample, "init_failures")
        quarantines = _metrics.counter_growth(previous, sample, "quarantines")
        if failures > quarantines:
            seen.instant.append(_body(
                host["name"], "vf_failure_below_threshold", "metrics",
                "hypeman recorded %d VF init failure(s) that quarantined nothing since the previous sample "
                "(the VF is not in the metrics: read the store on the host)" % (failures - max(quarantines, 0)),
                {"url": host["metrics_url"], "previous": previous, "sample": sample}, None, None,
                "vf_failure_below_threshold|metrics|%s" % sample["taken_at"]))


def _numbers(sample):
    """``(name, value)`` of every value of a sample, ``checks`` as ``checks.<result>``."""
    for name, value in (sample.items() if isinstance(sample, dict) else ()):
        if isinstance(value, dict):
            for result, count in value.items():
                yield "%s.%s" % (name, result), count
        else:
            yield name, value


def observe_host(host, settings, state):
    """One poll of one host (blocking; every read is bounded by ``timeout``). Never raises."""
    seen = Observation(host["name"])
    for source, reader, wanted in (("store", _read_store, host.get("store_path")),
                                   ("api", _read_api, host.get("api_url")),
                                   ("metrics", _read_metrics, host.get("metrics_url"))):
        if not wanted:
            continue
        try:
            if source == "store":
                reader(host, settings["threshold"], seen)
            else:
                reader(host, settings["timeout"], seen, state)
        except Exception as err:  # pylint: disable=broad-except  # one bad answer must not end the source
            LOGGER.exception("vf_quarantine: reading %s of host %s failed", source, host["name"])
            seen.add("source_error|%s" % source, "source_error", source,
                     "reading %s of host %s failed: %s: %s" % (source, host["name"], type(err).__name__, err), {})
    return seen


# --- the cursor: what was seen and fired, per host -----------------------------------------------------

def _host_state_problem(value):
    """Why one host's cursor entry is not usable, or None."""
    if not isinstance(value, dict):
        return "it is not an object"
    for table in ("fired", "pending"):
        entries = value.get(table, {})
        if not isinstance(entries, dict) or len(entries) > MAX_KEYS_PER_HOST or not all(
                isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) < 1e12
                for k, v in entries.items()):  # abs: also refuses NaN, infinities and ints no float can hold
            return "%s is not a table of at most %d keys to times" % (table, MAX_KEYS_PER_HOST)
    baselined = value.get("baselined", [])
    if not isinstance(baselined, list) or not all(isinstance(item, str) for item in baselined):
        return "baselined is not a list of sources"
    for key in ("quarantined_slots", "used_slots"):
        if value.get(key) is not None and (not isinstance(value[key], int) or isinstance(value[key], bool)):
            return "%s is not a count" % key
    try:
        sample_ok = value.get("metrics") is None or _metrics.valid_sample(value["metrics"])
    except OverflowError:  # an int too large for a float
        sample_ok = False
    if not sample_ok:
        return "metrics is not a sentinel sample of finite numbers"
    try:
        json.dumps(value, allow_nan=False)  # kept, it must be written back (save_state)
    except ValueError:
        return "it holds a number that is not finite"
    return None


def load_state(path):
    """``(hosts, problem, dropped)``: the cursor's per-host state (None: none usable), why it was not (all)
    usable (None: fine or missing), and host -> why, for the hosts whose entry was dropped (an entry that
    does not check out costs only its host)."""
    try:
        data = _fileio.read_bytes(path, STATE_LIMIT, follow=False)
    except OSError as err:
        if err.errno == errno.ENOENT and not isinstance(err, _fileio.HostFileError):
            return None, None, {}
        return None, "cannot read the cursor %s: %s" % (path, err.strerror or err), {}
    try:
        state = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        return None, "the cursor %s is not JSON: %s" % (path, err), {}
    if not (isinstance(state, dict) and state.get("version") == STATE_VERSION and isinstance(state.get("hosts"), dict)):
        return None, "the cursor %s is not a vf_quarantine cursor (version %d)" % (path, STATE_VERSION), {}
    hosts, dropped = {}, {}
    for name, value in state["hosts"].items():
        problem = _host_state_problem(value)
        if problem is None:
            hosts[name] = value
        else:
            dropped[name] = problem
    if not dropped:
        return hosts, None, {}
    return hosts, "the cursor %s has an unusable entry for host(s) %s" % (
        path, "; ".join("%s (%s)" % (name[:255], dropped[name]) for name in sorted(dropped)[:10])), dropped


def save_state(path, hosts):
    """Replace the cursor durably (tmp file, fsync, rename, fsync of the directory)."""
    # allow_nan=False: a non-finite number would write Infinity, which no JSON reader (nor load_state) takes.
    data = json.dumps({"version": STATE_VERSION, "hosts": hosts}, sort_keys=True, separators=(",", ":"),
                      allow_nan=False).encode()
    directory, name = os.path.split(path)
    dir_fd = _safedir.open_dir(directory, mode=0o700)
    try:
        _safedir.replace_file(dir_fd, name, name + ".tmp", data, 0o600)
    finally:
        os.close(dir_fd)


def lock_state(path):
    """An fd holding ``<state_path>.lock``: two sources on one cursor would each fire every event."""
    directory = os.path.dirname(path)
    dir_fd = _safedir.open_dir(directory, mode=0o700)
    try:
        fd = os.open(os.path.basename(path) + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise SourceArgumentError("vf_quarantine: another source holds the cursor %s (its .lock); give each "
                                  "source its own state_path" % path)
    return fd


def _forgettable(key, read):
    """Whether a condition not seen this poll is over (its source was read), so it may fire again later."""
    kind, _sep, rest = key.partition("|")
    if kind == "source_error":
        return True  # every configured source was tried
    if kind in ("store_unavailable", "sentinel_coverage_lost"):
        return bool(read) if kind == "store_unavailable" else "metrics" in read
    return rest.partition("|")[0] in read


_RECORD_KINDS = ("vf_quarantined", "vf_failure_below_threshold")


def decide(seen, host_state, now, debounce, fire_existing):
    """The events of one observation; updates ``host_state`` (``fired``, ``pending``, ``baselined``) in place.

    Records a source shows the first time it is read (quarantines, failures) are a baseline, not
    news, unless ``fire_existing``; a store that cannot be loaded, lost coverage and read errors
    always fire (they need someone now).
    """
    fired, pending = host_state.setdefault("fired", {}), host_state.setdefault("pending", {})
    baselined = set(host_state.get("baselined") or [])
    events = []
    for key, body in sorted(seen.conditions.items()):
        if key in fired:
            continue
        parts = key.split("|")
        kind, source = parts[0], parts[1] if len(parts) > 1 else None
        if kind in _RECORD_KINDS and source not in baselined and not fire_existing:
            fired[key] = now  # there before the source first read this host: not new
            continue
        since = pending.setdefault(key, now)
        if now - since >= debounce:
            events.append(dict(body, first_seen=since, fired_at=now))
            fired[key] = now
            pending.pop(key, None)
    for table in (fired, pending):
        for key in [key for key in table if key not in seen.conditions and _forgettable(key, seen.read)]:
            del table[key]
    events.extend(dict(body, first_seen=now, fired_at=now) for body in seen.instant)
    for table in (fired, pending):  # a bounded cursor: the oldest entries go first
        for key in sorted(table, key=table.get)[:max(0, len(table) - MAX_KEYS_PER_HOST)]:
            del table[key]
    host_state["baselined"] = sorted(baselined | seen.read)
    host_state.update(seen.updates)
    for key, updates in seen.after_fired.items():
        if key in fired:
            host_state.update(updates)
    return events


MAX_WORKERS = 256  # threads polling hosts at once; they wait on the network, not the CPU


async def poll_once(settings, hosts_state):
    """Poll every host at once; the events to put, in host order. Never raises for a host.

    Each host is read in a worker thread (``settings["executor"]``) under a deadline; a host whose
    previous read is still running (a hung mount) is not read again but reported until it ends.
    """
    loop = asyncio.get_running_loop()
    running = settings.setdefault("running", {})
    deadline = 3 * settings["timeout"] + 5

    async def one(host):
        name = host["name"]
        state = hosts_state.get(name)
        previous = running.get(name)
        seen = Observation(name)
        if previous is not None and not previous.done():
            seen.add("source_error|poll", "source_error", "poll",
                     "host %s: the previous read has not ended (more than %s seconds)" % (name, deadline), {})
        else:
            started = loop.time()
            future = running[name] = loop.run_in_executor(settings.get("executor"), observe_host, host, settings,
                                                          state or {})
            try:
                seen = await asyncio.wait_for(asyncio.shield(future), deadline)
            except asyncio.TimeoutError:
                seen.add("source_error|poll", "source_error", "poll",
                         "host %s: no complete poll within %s seconds" % (name, round(loop.time() - started, 1)), {})
        state = hosts_state.setdefault(name, {})
        return decide(seen, state, _now(), settings["debounce"],
                      settings["fire_existing"] or name in settings.get("refire", ()))

    results = await asyncio.gather(*(one(host) for host in settings["hosts"]))
    return [event for events in results for event in events]


async def main(queue, args):
    """ansible-rulebook's entry point: poll until cancelled (or ``max_polls``), one event per new condition."""
    settings = parse_args(args)
    lock_fd = lock_state(settings["state_path"])
    executor = concurrent.futures.ThreadPoolExecutor(min(MAX_WORKERS, len(settings["hosts"])),
                                                     thread_name_prefix="vf_quarantine")
    settings["executor"] = executor
    try:
        hosts_state, problem, dropped = load_state(settings["state_path"])
        if problem and hosts_state is None:
            # Losing a quarantine is worse than a repeated one: start without a baseline, so every current
            # condition fires (recover_gpu.yml is safe to run again: its preflight and breaker decide).
            LOGGER.error("vf_quarantine: %s; starting afresh and firing every current condition", problem)
            await queue.put({EVENT_KEY: _body(None, "source_error", "state", problem,
                                              {"state_path": settings["state_path"]}, None, None, "source_error|state")})
            settings["fire_existing"] = True
        elif problem:
            # The same, for the hosts whose entry did not check out only.
            LOGGER.error("vf_quarantine: %s; starting those hosts afresh and firing their current conditions",
                         problem)
            settings["refire"] = set(dropped)
            for name in [host["name"] for host in settings["hosts"] if host["name"] in dropped]:
                await queue.put({EVENT_KEY: _body(
                    name, "source_error", "state", "the cursor %s has an unusable entry for host %s (%s); the host "
                    "starts afresh: its current conditions fire again" % (settings["state_path"], name, dropped[name]),
                    {"state_path": settings["state_path"]}, None, None, "source_error|state")})
        hosts_state = dict(hosts_state or {})
        polls = 0
        while True:
            events = await poll_once(settings, hosts_state)
            for event in events:
                await queue.put({EVENT_KEY: event})
            # After the events: a crash in between repeats this poll's events (never loses one).
            try:
                names = set(host["name"] for host in settings["hosts"])
                hosts_state = dict((name, value) for name, value in hosts_state.items() if name in names)
                await asyncio.to_thread(save_state, settings["state_path"], hosts_state)
            except (OSError, ValueError) as err:
                # The events are out; the next write (or a restart from the older cursor) repeats, never loses.
                LOGGER.error("vf_quarantine: cannot write the cursor %s: %s", settings["state_path"], err)
            polls += 1
            if settings["max_polls"] is not None and polls >= settings["max_polls"]:
                return
            await asyncio.sleep(settings["interval"])
    finally:
        # A read stuck in a hung mount is not waited for here.
        executor.shutdown(wait=False, cancel_futures=True)
        os.close(lock_fd)


if __name__ == "__main__":
    class _PrintQueue(object):
        async def put(self, event):
            print(json.dumps(event, sort_keys=True))

    asyncio.run(main(_PrintQueue(), json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}))
