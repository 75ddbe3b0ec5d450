# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet filters: thin wrappers, clean errors, hostvars collection and stale cached results."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from ansible.errors import AnsibleFilterError

from ansible_collections.hypeman.vgpu.plugins.filter import fleet


def entry(host, audited_at="2026-09-01T10:00:00Z"):
    result = {"store": {"valid": True}, "issues": [], "needs_action": False}
    return fleet.fleet_host_entry(result, host, audited_at)


def test_filters_are_registered():
    assert sorted(fleet.FilterModule().filters()) == [
        "fleet_host_entry", "fleet_hosts_overriding", "fleet_policy_check", "fleet_render", "fleet_repair_plan", "fleet_report",
        "hypeman_config_threshold"]


def test_report_from_hostvars_with_missing_and_stale_hosts():
    hostvars = {"fresh": {"fleet_reconcile_entry": entry("fresh")},
                "old": {"fleet_reconcile_entry": entry("old", "2026-09-01T08:00:00Z")},
                "never": {"ansible_host": "10.0.0.9"}}
    report = fleet.fleet_report(hostvars, ["fresh", "old", "never", "not-in-hostvars"],
                                generated_at="2026-09-01T10:30:00Z", max_age=3600, report_dir="/r")
    by_host = dict((e["host"], e) for e in report["hosts"])
    assert by_host["fresh"]["status"] == "ok"
    assert by_host["never"]["status"] == "no_data" and by_host["not-in-hostvars"]["status"] == "no_data"
    assert by_host["old"]["status"] == "no_data"
    assert "older than 3600 seconds" in by_host["old"]["issues"][0]["message"]
    assert report["reports"] == {"json": "/r/fleet-audit.json", "markdown": "/r/fleet-audit.md",
                                 "html": "/r/fleet-audit.html"}
    assert report["summary"]["reports"] == report["reports"]
    # Without max_age the cached result counts.
    report = fleet.fleet_report(hostvars, ["old"], generated_at="2026-09-01T10:30:00Z")
    assert report["hosts"][0]["status"] == "ok"


def test_errors_are_filter_errors():
    with pytest.raises(AnsibleFilterError, match="unknown policy"):
        fleet.fleet_policy_check(["nope"])
    with pytest.raises(AnsibleFilterError, match="unknown policy"):
        fleet.fleet_report({}, [], policies=["nope"])
    with pytest.raises(AnsibleFilterError, match="format 'pdf'"):
        fleet.fleet_render({}, "pdf")
    with pytest.raises(AnsibleFilterError, match="unknown repair"):
        fleet.fleet_repair_plan({}, ["all"])
    with pytest.raises(AnsibleFilterError, match="hypeman_config_threshold: .*inline"):
        fleet.hypeman_config_threshold("gpu: {a: 1}\n", 2)
    with pytest.raises(AnsibleFilterError, match="hypeman_config_threshold"):
        fleet.hypeman_config_threshold("gpu:\n", "two")


def test_policy_check_normalises():
    assert fleet.fleet_policy_check("store_unavailable, capacity_loss_pct > 5") == [
        "store_unavailable", "capacity_loss_pct > 5"]
    assert fleet.fleet_policy_check([]) == []


def test_config_threshold_filter():
    assert fleet.hypeman_config_threshold("port: 1\n", "3") == "port: 1\ngpu:\n  vf_quarantine_threshold: 3\n"


def test_repairs_from_a_survey_string():
    result = {"store": {"valid": False, "would_quarantine": []}, "hypeman": {"running": False}, "sentinel": {}}
    assert fleet.fleet_repair_plan(result, "store\nsentinel")["repair_store"] is True
    assert fleet.fleet_repair_plan(result, "sentinel,reevaluate")["repair_store"] is False


def test_entry_from_the_fact_cache_namespace():
    hostvars = {"cached": {"ansible_facts": {"fleet_reconcile_entry": entry("cached")}}}
    assert fleet.fleet_report(hostvars, ["cached"])["hosts"][0]["status"] == "ok"


class _BrokenVars(dict):
    """A host whose variable fails to template when read."""

    def __getitem__(self, name):
        raise ValueError("template error in %s" % name)


def test_hosts_overriding_lists_only_hosts_that_define_another_value():
    hostvars = {"same": {"audit_prometheus_dir": ""}, "unset": {"ansible_host": "10.0.0.1"},
                "other": {"audit_prometheus_dir": "/srv/prom"}, "typed": {"audit_cache_results": "false"},
                "broken": _BrokenVars(audit_prometheus_dir="{{ nope }}")}
    expected = {"audit_prometheus_dir": "", "audit_cache_results": False}
    hosts = ["same", "unset", "other", "typed", "broken", "not-in-hostvars"]
    # A string "false" is another value than False: the host is evaluated on its own (the safe side).
    assert fleet.fleet_hosts_overriding(hostvars, hosts, expected) == ["other", "typed", "broken"]
    assert fleet.fleet_hosts_overriding(hostvars, [], expected) == []
    # Nothing to compare: no host is read, so none is listed (not even the broken one).
    assert fleet.fleet_hosts_overriding(hostvars, hosts, {}) == []
    with pytest.raises(AnsibleFilterError, match="fleet_hosts_overriding: expected .*mapping"):
        fleet.fleet_hosts_overriding(hostvars, hosts, ["audit_prometheus_dir"])


_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from(["", "/srv/prom", "false"]))
_NAMES = st.sampled_from(["a", "b", "c"])


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["h1", "h2", "h3", "h4"]), st.dictionaries(_NAMES, _VALUES, max_size=3),
                       max_size=4),
       st.dictionaries(_NAMES, _VALUES, max_size=3))
def test_hosts_overriding_is_exactly_the_hosts_that_would_decide_differently(hostvars, expected):
    # Property: a host is listed if and only if one of the names has a value of its own that differs;
    # every other host would see exactly the expected values (so deciding for all of them once is exact).
    hosts = ["h1", "h2", "h3", "h4"]
    listed = fleet.fleet_hosts_overriding(hostvars, hosts, expected)
    for host in hosts:
        own = hostvars.get(host, {})
        seen = dict((name, own.get(name, value)) for name, value in expected.items())
        assert (host in listed) == (seen != expected), (host, own, expected)
    assert listed == [h for h in hosts if h in listed]
