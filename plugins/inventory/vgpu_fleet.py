# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: vgpu_fleet
short_description: hypeman vGPU hosts grouped by what the fleet audit found
version_added: 0.1.0
description:
  - Builds an inventory of hypeman vGPU hosts grouped by their state, from the newest fleet audit report
    (C(fleet-audit.json), written by C(hypeman.vgpu.audit)), from an AWX job artifact of the audit saved to a
    file, or live from each host's hypeman API (C(GET /resources)).
  - 'Groups: C(vgpu_needs_recovery) (a card the audit classified as ready for an SR-IOV cycle, draining,
    overflow-only or without VFs; live: quarantined slots), C(vgpu_ready_for_cycle) (a card drained and idle:
    C(playbooks/recover_gpu.yml) can cycle it), C(vgpu_overflow_only), C(vgpu_store_unavailable) (hypeman cannot
    load the VF health store: placement disabled), C(vgpu_sentinel_coverage_lost), C(vgpu_ok) (the audit found
    nothing needing action) and C(vgpu_needs_action) (every other host).'
  - Membership comes from the report's own per-host status and per-card issue codes
    (see C(docs/audit-report.md)); the plugin does not re-judge the hosts.
  - 'Host vars: C(vgpu_cards) (each card with C(address), C(vf_total), C(quarantined), C(allocatable),
    C(claimed), C(state)), C(vgpu_ready_cards) (addresses, for C(target_gpu)), C(vgpu_issue_codes),
    C(vgpu_issues), C(vgpu_status), C(vgpu_severity), C(vgpu_slots), C(vgpu_quarantined_vfs),
    C(vgpu_report_time), C(vgpu_report_age) (seconds when the inventory was built), C(vgpu_audited_at),
    C(vgpu_source) (report, artifact or live), C(vgpu_origin) (the file or API URL), C(vgpu_complete)
    and C(vgpu_groups).'
  - An AWX artifact holds only the report's summary, so it names only hosts needing action and cards ready
    for a cycle; C(vgpu_ok) and C(vgpu_overflow_only) stay empty and C(vgpu_complete) is false.
  - Live mode knows only what C(/resources) says; it cannot see cards (C(vgpu_ready_for_cycle),
    C(vgpu_overflow_only) stay empty), the sentinel (C(vgpu_sentinel_coverage_lost) stays empty) or store
    details (owners, pending quarantines, stale records). A host with quarantined slots is in
    C(vgpu_needs_recovery) and C(vgpu_needs_action) with the issue code C(quarantined_slots).
  - The configuration file name must end with C(vgpu_fleet.yml) or C(vgpu_fleet.yaml).
author:
  - hypeman.vgpu contributors (!UNKNOWN)
extends_documentation_fragment:
  - constructed
  - inventory_cache
options:
  plugin:
    description: The name of this plugin; it marks the file as this plugin's configuration.
    type: str
    required: true
    choices: [hypeman.vgpu.vgpu_fleet]
  source:
    description:
      - V(report) reads O(report); V(live) asks the API of each host in O(hosts).
    type: str
    choices: [report, live]
    default: report
  report:
    description:
      - The fleet report (C(fleet-audit.json) or C(fleet-reconcile.json)), a directory holding
        C(fleet-audit.json), or an AWX job artifact saved to a file (the job's C(artifacts) object, the whole job
        as C(GET /api/v2/jobs/N/) returns it, or ansible-runner's C(playbook_on_stats) event).
      - With several paths the newest by the document's own time wins (a report's C(generated_at), a job's
        C(finished), an event's C(created); else the file's modification time). Every path must be readable.
      - Required with O(source=report).
    type: list
    elements: path
  max_report_size:
    description: Refuse a report file larger than this many bytes.
    type: int
    default: 67108864
  max_age:
    description:
      - Seconds after which the report (or a cached live answer) is stale; see O(on_stale). Unset, any age is
        accepted (the age is in C(vgpu_report_age)).
      - A report dated more than 300 seconds after this controller's clock is stale too, with or without
        O(max_age), and never the newest of several.
    type: int
  on_stale:
    description: V(error) fails the inventory on a stale report, V(warn) builds it and warns.
    type: str
    choices: [error, warn]
    default: error
  hosts:
    description:
      - Live mode; the hosts to ask, as a mapping of inventory host name to its settings (or null for the
        defaults below), or a list of host names.
      - Per host C(api_url), C(api_token_file) and C(api_token_env) override the options of the same name.
    type: raw
  api_url:
    description:
      - Live mode; hypeman's API base URL. A Jinja template with C(inventory_hostname) set to the host.
    type: str
    default: "http://{{ inventory_hostname }}:8080"
  api_token_file:
    description:
      - Live mode; a file holding hypeman's API token (a JWT from C(hypeman-token)). A Jinja template with
        C(inventory_hostname). Read first; the token is never shown or kept in host vars.
    type: str
  api_token_env:
    description:
      - Live mode; the environment variable holding the token when no O(api_token_file) is set
        (an AWX credential injects it).
    type: str
    default: HYPEMAN_VGPU_API_TOKEN
  validate_certs:
    description: Live mode; verify the API's TLS certificate.
    type: bool
    default: true
  timeout:
    description: Live mode; seconds for each host's whole answer (1 or more).
    type: int
    default: 10
  api_error:
    description:
      - Live mode; V(fail) fails the inventory when a host's API does not answer (naming the host, URL and what
        went wrong); V(host) keeps the host in C(vgpu_needs_action) with the issue code C(api_unreachable) and
        warns.
    type: str
    choices: [fail, host]
    default: fail
  workers:
    description: Live mode; how many hosts are asked at once (1 or more).
    type: int
    default: 8
notes:
  - The report must be one this collection wrote (schema 1); every field the plugin uses is checked, and a bad
    one fails the inventory with the file and the field named.
  - The API token is sent only as a bearer token; errors name the host and URL, never the token.
  - A host name that is also a group name (C(all), C(ungrouped), one of the groups above, or a group of the
    inventory or of O(groups)/O(keyed_groups)) fails the inventory naming the host; Ansible would take it for
    the group.
  - With O(cache=true) the documents (report entries, API answers) are cached, not the groups, so
    O(compose), O(groups) and the ages are computed each time.
  - What each issue code and card state means is in the collection's C(docs/audit-report.md); the plugin's
    guide is C(docs/fleet-inventory.md).
"""

EXAMPLES = r"""
# inventories/fleet/hypeman.vgpu_fleet.yml: groups from the newest audit report
plugin: hypeman.vgpu.vgpu_fleet
report: /srv/reports                 # its fleet-audit.json
max_age: 7200                        # an hourly audit: older than two hours fails the inventory
compose:
  target_gpu: vgpu_ready_cards | first | default(omit)   # recover_gpu.yml reads it per host
keyed_groups:
  - key: vgpu_status
    prefix: vgpu_status

---
# Live, from hypeman's API on each host (token from the environment, e.g. an AWX credential)
plugin: hypeman.vgpu.vgpu_fleet
source: live
hosts:
  gpu-01:
  gpu-02:
    api_url: https://gpu-02.example.com:8443
    api_token_file: /etc/hypeman-vgpu/gpu-02.jwt
api_url: "http://{{ inventory_hostname }}.example.com:8080"
api_token_env: HYPEMAN_VGPU_API_TOKEN
api_error: host
groups:
  vgpu_capacity_low: (vgpu_slots.lost_pct | default(0)) > 25

---
# An AWX job artifact saved to a file (awx jobs get 42 -f json > job-42.json)
plugin: hypeman.vgpu.vgpu_fleet
report: /srv/reports/job-42.json
cache: true
cache_plugin: ansible.builtin.jsonfile
cache_connection: /var/cache/ansible-inventory
cache_timeout: 600
"""

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

from ansible.errors import AnsibleParserError
from ansible.module_utils.common.text.converters import to_native
from ansible.plugins.inventory import BaseInventoryPlugin, Cacheable, Constructable

from ansible_collections.hypeman.vgpu.plugins.module_utils import _api
from ansible_collections.hypeman.vgpu.plugins.module_utils import _fileio
from ansible_collections.hypeman.vgpu.plugins.plugin_utils import fleet_inventory as _fleet
from ansible_collections.hypeman.vgpu.plugins.plugin_utils import fleet_report as _report

from ansible.template import trust_as_template

REPORT_NAME = "fleet-audit.json"
_TOKEN_LIMIT = 65536
_HOST_KEYS = ("api_url", "api_token_file", "api_token_env")
_HOST_KEY_WORDS = {"api_url": "hypeman's API base URL", "api_token_file": "the path of a file holding the token",
                   "api_token_env": "the name of an environment variable holding the token"}
# Seconds a report's own time may be ahead of this controller's clock (clocks a little apart); beyond it
# the time is wrong (a bad clock, a copied or forged file) and the report is stale.
CLOCK_SKEW = 300


class InventoryModule(BaseInventoryPlugin, Constructable, Cacheable):
    NAME = "hypeman.vgpu.vgpu_fleet"

    def __init__(self):
        super().__init__()
        self._config_path = None

    def verify_file(self, path):
        return super().verify_file(path) and path.endswith(("vgpu_fleet.yml", "vgpu_fleet.yaml"))

    def parse(self, inventory, loader, path, cache=True):
        super().parse(inventory, loader, path, cache)
        self._read_config_data(path)
        self._config_path = path
        cache_key = self.get_cache_key(path)
        use_cache = self.get_option("cache")
        state = None
        if use_cache and cache:
            try:
                state = self._checked_cached(self._cache[cache_key])
            except KeyError:
                state = None
        update_cache = use_cache and state is None
        if state is None:
            state = self._read_report() if self.get_option("source") == "report" else self._ask_hosts()
        if update_cache:
            self._cache[cache_key] = state
        self._check_age(state)
        self._populate(state)

    # --- sources --------------------------------------------------------------------------------

    def _fail(self, what):
        raise AnsibleParserError("%s (inventory source %s)" % (what, self._config_path))

    def _count_option(self, name, minimum, what="seconds"):
        """An int option (None when unset), refused below ``minimum``."""
        value = self.get_option(name)
        if value is not None and value < minimum:
            self._fail("option %s is %d; expected %s, %d or more" % (name, value, what, minimum))
        return value

    def _checked_cached(self, state):
        """A cached state, checked like a file (a cache is a file too); None to read the source again."""
        try:
            if not isinstance(state, dict) or state.get("source") not in ("report", "artifact", "live"):
                return None
            checked = _fleet.fleet_state({"schema": _report.REPORT_SCHEMA, "kind": state.get("kind") or "audit",
                                          "generated_at": state.get("time"), "hosts": state.get("entries")})
        except _fleet.FleetInputError as err:
            self.display.warning("vgpu_fleet: ignoring the cached inventory (%s); reading the source again" % err)
            return None
        origins = state.get("origins") if isinstance(state.get("origins"), dict) else {}
        checked.update(source=state["source"], kind=state.get("kind"), complete=bool(state.get("complete")),
                       origins=dict((k, v) for k, v in origins.items() if isinstance(v, str)),
                       path=state.get("path") if isinstance(state.get("path"), str) else None)
        return checked

    def _read_report(self):
        paths = self.get_option("report")
        if not paths:
            self._fail("option report is not set; expected the path of fleet-audit.json (or a directory holding "
                       "it, or an AWX job artifact file) with source: report")
        states, now = [self._read_one(path) for path in paths], time.time()

        def rank(state):
            when = _fleet.parse_time(state["time"]) or 0
            # A time from the future proves nothing about being new: such a report ranks below every other.
            return (0, -when) if when > now + CLOCK_SKEW else (1, when)

        newest = max(states, key=rank)  # the first of equals, in the order given
        for state in states:
            if state is not newest and rank(state)[0] == 0:
                self.display.warning("vgpu_fleet: %s; using%s instead"
                                     % (_future_words(state, now), _path_words(newest)))
        return newest

    def _read_one(self, path):
        if os.path.isdir(path):
            path = os.path.join(path, REPORT_NAME)
        limit = self._count_option("max_report_size", 1, "a size in bytes")
        try:
            fd, stat_result = _fileio.open_regular(path)
            try:
                data = _fileio.read_fd(fd, path, limit)
            finally:
                os.close(fd)
        except _fileio.HostFileError as err:
            self._fail("cannot read the fleet report %s: it %s; expected a JSON file of at most %d bytes "
                       "(max_report_size)" % (path, err.strerror, limit))
        except OSError as err:
            self._fail("cannot read the fleet report %s: %s; expected fleet-audit.json written by "
                       "hypeman.vgpu.audit, or an AWX job artifact saved to a file" % (path, err.strerror or err))
        try:
            document = _report_json(data)
            state = _fleet.fleet_state(document)
        except ValueError as err:
            self._fail("the fleet report %s is not usable: %s" % (path, err))
        if _fleet.parse_time(state["time"]) is None:
            # Without a time of its own (a bare artifact object): the file's modification time.
            state["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stat_result.st_mtime))
        state["origins"] = dict((entry["host"], path) for entry in state["entries"])
        state["path"] = path
        return state

    def _live_hosts(self):
        hosts = self.get_option("hosts")
        if isinstance(hosts, list):
            hosts = dict((name, None) for name in hosts)
        if not isinstance(hosts, dict) or not hosts:
            given = "not set" if hosts is None else "a %s" % type(hosts).__name__
            self._fail("option hosts is %s; expected, with source: live, a mapping of host names to their settings "
                       "(%s) or a list of host names" % (given, ", ".join(_HOST_KEYS)))
        found = []
        for name, settings in hosts.items():
            try:
                name = _fleet.host_name("hosts", name)
            except _fleet.FleetInputError as err:
                self._fail("option %s" % err)
            settings = settings or {}
            if not isinstance(settings, dict) or set(settings) - set(_HOST_KEYS):
                self._fail("option hosts.%s is %r; expected a mapping with some of %s (or null)" % (
                    name, sorted(settings) if isinstance(settings, dict) else type(settings).__name__,
                    ", ".join(_HOST_KEYS)))
            for key, value in settings.items():
                if value is not None and not (isinstance(value, str) and value):
                    self._fail("option hosts.%s.%s is %s; expected %s (a string)" % (
                        name, key, _described(value), _HOST_KEY_WORDS[key]))
            found.append((name, settings))
        return found

    def _host_setting(self, name, settings, key):
        value = settings.get(key, self.get_option(key))
        if value is None or key == "api_token_env":
            return value
        try:
            self.templar.available_variables = {"inventory_hostname": name}
            return to_native(self.templar.template(trust_as_template(value)))
        except Exception as err:  # pylint: disable=broad-except  # any template error, reported with the host
            self._fail("cannot template %s for host %s: %s" % (key, name, to_native(err)))

    def _token(self, name, settings):
        token_file = self._host_setting(name, settings, "api_token_file")
        if token_file:
            try:
                token = _fileio.read_bytes(token_file, _TOKEN_LIMIT).decode("utf-8").strip()
            except (OSError, UnicodeDecodeError) as err:
                # The error of a read names the path and the reason, never the content.
                self._fail("cannot read the API token file %s for host %s: %s; expected a file holding hypeman's "
                           "API token" % (token_file, name, getattr(err, "strerror", None) or type(err).__name__))
            if not token:
                self._fail("the API token file %s for host %s is empty; expected hypeman's API token" % (
                    token_file, name))
            return token
        env = self._host_setting(name, settings, "api_token_env")
        return os.environ.get(env) if env else None

    def _ask_hosts(self):
        targets = []
        for name, settings in self._live_hosts():
            url = self._host_setting(name, settings, "api_url")
            if not url or not url.startswith(("http://", "https://")):
                self._fail("api_url for host %s is %r; expected an http:// or https:// URL of hypeman's API" % (
                    name, url))
            targets.append((name, url, self._token(name, settings)))
        timeout, validate = self._count_option("timeout", 1), self.get_option("validate_certs")
        workers = self._count_option("workers", 1, "a number of hosts")
        checked_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

        def ask(target):
            return _api.resources_check(None, target[1], target[2], validate, timeout)

        with ThreadPoolExecutor(max_workers=min(workers, len(targets))) as pool:
            answers = list(pool.map(ask, targets))
        entries = []
        for (name, url, _token), section in zip(targets, answers):
            if section["error"] is None and section["missing_fields"]:
                section["error"] = "GET %s: the answer has no %s; expected hypeman's /resources" % (
                    section["url"], ", ".join(section["missing_fields"]))
            if section["error"]:
                if self.get_option("api_error") == "fail":
                    self._fail("hypeman's API of host %s did not answer as expected: %s; expected GET /resources "
                               "to answer with its JSON (check api_url, the token and that hypeman runs), or set "
                               "api_error: host to list such hosts in vgpu_needs_action" % (name, section["error"]))
                self.display.warning("vgpu_fleet: host %s: %s" % (name, section["error"]))
            entries.append(_fleet.live_entry(name, section, checked_at))
        return {"source": "live", "kind": None, "time": checked_at, "complete": True, "entries": entries,
                "origins": dict((name, url) for name, url, _token in targets)}

    # --- the inventory --------------------------------------------------------------------------

    def _check_age(self, state):
        max_age = self._count_option("max_age", 0)
        when, now = _fleet.parse_time(state["time"]), time.time()
        if when is not None and when > now + CLOCK_SKEW:
            what = _future_words(state, now)
        elif max_age is None:
            return
        else:
            age = None if when is None else now - when
            if age is not None and age <= max_age:
                return
            what = "the fleet %s from %s is %s; expected at most max_age=%d seconds" % (
                "state" if state["source"] == "live" else "report%s" % _path_words(state),
                state["time"] or "an unknown time", "of unknown age" if age is None else "%d seconds old" % age,
                max_age)
        if self.get_option("on_stale") == "error":
            self._fail(what + " (run the audit again, or set on_stale: warn)")
        self.display.warning("vgpu_fleet: " + what)

    def _group_clash(self, state, index, host):
        """Fail for a host whose name is also a group (Ansible would take it for the group)."""
        if host in self.inventory.groups:
            self._fail("the fleet %s%s names host %r%s, which is also a group of the inventory; expected a host "
                       "name that is no group name (Ansible takes such a name for the group and would put the "
                       "group's hosts where this host belongs)" % (
                           "state" if state["source"] == "live" else "report", _path_words(state), host,
                           " (hosts[%d].host)" % index if state["source"] == "report" else ""))

    def _populate(self, state):
        now = time.time()
        strict = self.get_option("strict")
        # Every name is checked before the inventory changes: a failed source leaves no half of itself.
        for index, entry in enumerate(state["entries"]):
            self._group_clash(state, index, entry["host"])
        for group in _fleet.GROUPS:
            self.inventory.add_group(group)
        origins = state.get("origins") or {}
        for entry in state["entries"]:
            host = entry["host"]
            self.inventory.add_host(host)
            variables = _fleet.host_vars(entry, state, now, origins.get(host))
            for key, value in variables.items():
                self.inventory.set_variable(host, key, value)
            for group in variables["vgpu_groups"]:
                self.inventory.add_host(host, group=group)  # as a host, never taken for a group
        for index, entry in enumerate(state["entries"]):
            host = entry["host"]
            # groups/keyed_groups may have made a group of this host's name (constructed adds by add_child).
            self._group_clash(state, index, host)
            host_vars = self.inventory.get_host(host).get_vars()
            self._set_composite_vars(self.get_option("compose"), host_vars, host, strict=strict)
            self._add_host_to_composed_groups(self.get_option("groups"), host_vars, host, strict=strict)
            self._add_host_to_keyed_groups(self.get_option("keyed_groups"), host_vars, host, strict=strict)
        for index, entry in enumerate(state["entries"]):
            self._group_clash(state, index, entry["host"])


def _described(value):
    """A value from the configuration in words: its kind and (shortened) value."""
    for kind, words in ((bool, "a boolean"), ((int, float), "a number"), (str, "a string"), (dict, "a mapping"),
                        (list, "a list")):
        if isinstance(value, kind):
            return "%s (%s)" % (words, repr(value)[:80])
    return type(value).__name__


def _path_words(state):
    return " %s" % state["path"] if state.get("path") else ""


def _future_words(state, now):
    """Why a report dated after this controller's clock (beyond CLOCK_SKEW) is stale."""
    return ("the fleet report%s is dated %s, %d seconds after this controller's clock; expected a time no later "
            "than now (%d seconds of clock skew allowed): check the clocks, or whether the file was copied or "
            "forged" % (_path_words(state), state["time"], _fleet.parse_time(state["time"]) - now, CLOCK_SKEW))


def _report_json(data):
    """The decoded document; ValueError in words for bytes that are not JSON text."""
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ValueError("it is not UTF-8 text (%s); expected JSON" % err.reason) from None
    except RecursionError:
        raise ValueError("it is JSON nested too deeply to decode; expected a fleet report") from None
    except ValueError as err:
        raise ValueError("it is not JSON (%s); expected a fleet report" % err) from None
