# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""hypeman_config.set_threshold: one line changes, everything else stays; unsafe edits are refused."""

from __future__ import annotations

import pytest
import yaml

from ansible_collections.hypeman.vgpu.plugins.module_utils._hypeman import parse_quarantine_threshold
from ansible_collections.hypeman.vgpu.plugins.plugin_utils.hypeman_config import ConfigEditError, set_threshold

INSTALLER = """# hypeman config, written by install.sh
port: "8080"
jwt_secret: "abc123"  # rotate yearly
caddy:
  admin_port: 2019
  internal_dns_port: 5353
"""


def changed_lines(old, new):
    return [line for line in new.splitlines() if line not in old.splitlines()]


def test_replaces_the_value_and_keeps_its_comment():
    old = INSTALLER + "gpu:\n  profile_cache_ttl: 30m\n  vf_quarantine_threshold: 3   # lowered after INC-42\nlogging:\n  max_files: 1\n"
    new = set_threshold(old, 2)
    assert new == old.replace("vf_quarantine_threshold: 3   #", "vf_quarantine_threshold: 2   #")
    assert parse_quarantine_threshold(new) == 2


def test_inserts_into_the_gpu_block_at_its_indentation():
    old = INSTALLER + "gpu:\n    profile_cache_ttl: 30m\n    # comment inside the block\nlogging:\n  max_files: 1\n"
    new = set_threshold(old, 4)
    assert changed_lines(old, new) == ["    vf_quarantine_threshold: 4"]
    assert new.index("vf_quarantine_threshold") < new.index("logging:")
    assert yaml.safe_load(new)["gpu"] == {"profile_cache_ttl": "30m", "vf_quarantine_threshold": 4}
    assert yaml.safe_load(new)["logging"] == {"max_files": 1}


def test_inserts_into_an_empty_gpu_block():
    old = "gpu:\nport: \"8080\"\n"
    new = set_threshold(old, 2)
    assert new == "gpu:\n  vf_quarantine_threshold: 2\nport: \"8080\"\n"


def test_appends_a_gpu_block_when_there_is_none():
    assert set_threshold(INSTALLER, 2) == INSTALLER + "gpu:\n  vf_quarantine_threshold: 2\n"
    no_newline = INSTALLER.rstrip("\n")
    assert set_threshold(no_newline, 5) == no_newline + "\ngpu:\n  vf_quarantine_threshold: 5\n"
    assert set_threshold("", 2) == "gpu:\n  vf_quarantine_threshold: 2\n"


def test_last_line_of_the_block_without_newline():
    old = "port: 1\ngpu:\n  profile_cache_ttl: 30m"
    assert set_threshold(old, 2) == "port: 1\ngpu:\n  profile_cache_ttl: 30m\n  vf_quarantine_threshold: 2\n"


def test_unchanged_when_already_set():
    old = INSTALLER + "gpu:\n  vf_quarantine_threshold: 2 # keep\n"
    assert set_threshold(old, 2) is old


def test_quoted_value_becomes_a_number():
    old = 'gpu:\n  vf_quarantine_threshold: "3"\n'
    assert set_threshold(old, 3) == "gpu:\n  vf_quarantine_threshold: 3\n"


def test_nested_key_of_the_same_name_elsewhere_is_not_touched():
    old = "other:\n  vf_quarantine_threshold: 9\ngpu:\n  profile_cache_ttl: 30m\n"
    new = set_threshold(old, 2)
    assert yaml.safe_load(new) == {"other": {"vf_quarantine_threshold": 9},
                                   "gpu": {"profile_cache_ttl": "30m", "vf_quarantine_threshold": 2}}


@pytest.mark.parametrize("text, message", [
    ("gpu: {profile_cache_ttl: 30m}\n", "inline"),
    ("gpu:\n\tvf_quarantine_threshold: 2\n", "tabs"),
    ("a: 1\n---\nb: 2\n", "2 YAML documents"),
    ("gpu: 3\n", "gpu is int, not a mapping"),
    ("- a\n- b\n", "not a YAML mapping"),
    ("gpu:\n  x: [1, 2\n", "not valid YAML"),
    ("gpu:\n  vf_quarantine_threshold: 1\n  vf_quarantine_threshold: 3\n", "appears twice"),
    ("gpu:\n  vf_quarantine_threshold: |\n    3\n", "cannot edit"),
])
def test_refuses_what_a_line_edit_cannot_do_safely(text, message):
    with pytest.raises(ConfigEditError, match=message):
        set_threshold(text, 2)


@pytest.mark.parametrize("value", [0, -1, True, "2", None])
def test_threshold_must_be_a_whole_number_of_one_or_more(value):
    with pytest.raises(ConfigEditError, match="expected a whole number >= 1"):
        set_threshold(INSTALLER, value)
