# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A null hypeman_vgpu_* inventory variable means unset in every role and playbook.

Role argument validation lets a null string through (as unset), so a role
default chained to a hypeman_vgpu_* variable must not hand None on: a null
``hypeman_vgpu_metrics_url`` once failed every host of an audit on
``length`` of None. Renders the roles' own defaults and vars files and the
playbooks' ``become`` with Ansible's templating, with each chained variable
null, absent and set.
"""

from __future__ import annotations

import glob
import os
import re

import pytest
import yaml

from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

COLLECTION = os.path.join(os.path.dirname(__file__), "..", "..", "..")
ROLES = os.path.join(COLLECTION, "roles")
INVENTORY_VARIABLE = re.compile(r"\bhypeman_vgpu_\w+")
CHAINED = re.compile(r"^\{\{ (hypeman_vgpu_\w+) \| default\(''")


def _load(path):
    with open(path) as handle:
        return yaml.safe_load(handle) or {}


def _trusted(values):
    return dict((name, trust_as_template(value) if isinstance(value, str) else value) for name, value in values.items())


def _render(variables, name):
    return Templar(loader=DataLoader(), variables=_trusted(variables)).template(trust_as_template("{{ %s }}" % name))


def _chains():
    """(role, role variable, hypeman_vgpu_* variable) for each default chained to an empty-string fallback."""
    found = []
    for path in sorted(glob.glob(os.path.join(ROLES, "*", "defaults", "main.yml"))):
        role = path.split(os.sep)[-3]
        for name, value in _load(path).items():
            match = CHAINED.match(value) if isinstance(value, str) else None
            if match:
                found.append((role, name, match.group(1)))
    return found


def test_every_role_with_an_api_url_chains_it():
    # The parametrized test below must not pass by finding nothing.
    roles = set(role for role, name, _source in _chains() if name.endswith("_api_url"))
    assert roles >= {"clear_quarantine", "fleet_reconcile", "gpu_drain", "sr_iov_cycle", "store_edit", "vgpu_canary", "vgpu_host"}


@pytest.mark.parametrize("role,name,source", _chains(), ids=str)
def test_a_null_inventory_variable_gives_the_empty_default(role, name, source):
    defaults = _load(os.path.join(ROLES, role, "defaults", "main.yml"))
    assert _render(dict(defaults, **{source: None}), name) == ""
    assert _render(defaults, name) == ""
    assert _render(dict(defaults, **{source: "https://hypeman.example:8443"}), name) == "https://hypeman.example:8443"


@pytest.mark.parametrize("setting", ["audit_prometheus_dir", "hypeman_vgpu_metrics_url",
                                     "fleet_reconcile_prometheus_dir", "fleet_reconcile_metrics_url"])
def test_the_audit_extras_treat_a_null_setting_as_unset(setting):
    role = os.path.join(ROLES, "fleet_reconcile")
    variables = dict(_load(os.path.join(role, "defaults", "main.yml")), **_load(os.path.join(role, "vars", "main.yml")))
    assert _render(dict(variables, **{setting: None}), "fleet_reconcile_audit_extras_possible") is False
    assert _render(dict(variables, **{setting: None}), "fleet_reconcile_prometheus_path") == ""
    value = "/var/lib/node_exporter" if "prometheus" in setting else "http://127.0.0.1:8080/metrics"
    assert _render(dict(variables, **{setting: value}), "fleet_reconcile_audit_extras_possible") is True
    if "prometheus" in setting:
        assert _render(dict(variables, **{setting: value}), "fleet_reconcile_prometheus_path") == value + "/hypeman_vgpu.prom"


def _service_chains():
    found = []
    for path in sorted(glob.glob(os.path.join(ROLES, "*", "defaults", "main.yml"))):
        for name, value in _load(path).items():
            if name.endswith("_service") and isinstance(value, str) and "hypeman_vgpu_service" in value:
                found.append((path.split(os.sep)[-3], name))
    return found


def test_every_role_chains_its_service():
    assert len(_service_chains()) == 7


@pytest.mark.parametrize("role,name", _service_chains(), ids=str)
def test_a_null_service_means_hypeman_and_an_empty_one_no_unit(role, name):
    defaults = _load(os.path.join(ROLES, role, "defaults", "main.yml"))
    assert _render(defaults, name) == "hypeman"
    assert _render(dict(defaults, hypeman_vgpu_service=None), name) == "hypeman"
    assert _render(dict(defaults, hypeman_vgpu_service=""), name) == ""
    assert _render(dict(defaults, hypeman_vgpu_service="hypeman-canary"), name) == "hypeman-canary"


def _role_variables(role):
    variables = {}
    for kind in ("defaults", "vars"):
        path = os.path.join(ROLES, role, kind, "main.yml")
        if os.path.exists(path):
            variables.update(_load(path))
    return variables


def _inventory_chains():
    """(role, role variable, hypeman_vgpu_* variable) for every role value that reads one."""
    found = []
    for role in sorted(os.listdir(ROLES)):
        for name, value in sorted(_role_variables(role).items()):
            if isinstance(value, str):
                found.extend((role, name, source) for source in sorted(set(INVENTORY_VARIABLE.findall(value))))
    return found


def test_the_host_paths_and_choices_are_among_the_chains():
    sources = set(source for _role, _name, source in _inventory_chains())
    assert sources >= {"hypeman_vgpu_data_dir", "hypeman_vgpu_sysfs_root", "hypeman_vgpu_state_dir",
                       "hypeman_vgpu_proc_root", "hypeman_vgpu_config_path", "hypeman_vgpu_sentinel_mode",
                       "hypeman_vgpu_allowed_gpus", "hypeman_vgpu_service", "hypeman_vgpu_api_url"}


@pytest.mark.parametrize("role,name,source", _inventory_chains(), ids=str)
def test_a_null_inventory_variable_is_the_variable_left_out(role, name, source):
    variables = _role_variables(role)
    assert _render(dict(variables, **{source: None}), name) == _render(variables, name)


def _become_chains():
    found = []
    for path in sorted(glob.glob(os.path.join(COLLECTION, "playbooks", "*.yml"))):
        for index, play in enumerate(_load(path) or []):
            if "hypeman_vgpu_become" in str(play.get("become", "")):
                found.append((os.path.basename(path), index, play["become"]))
    return found


def test_every_playbook_chains_become():
    assert set(playbook for playbook, _index, _become in _become_chains()) >= {
        "audit.yml", "provision.yml", "reconcile.yml", "recover_gpu.yml"}


@pytest.mark.parametrize("playbook,index,become", _become_chains(), ids=str)
def test_a_null_become_means_become(playbook, index, become):
    def render(variables):
        return Templar(loader=DataLoader(), variables=variables).template(trust_as_template(become))

    assert render({}) is True and render({"hypeman_vgpu_become": None}) is True
    assert render({"hypeman_vgpu_become": False}) is False and render({"hypeman_vgpu_become": True}) is True
