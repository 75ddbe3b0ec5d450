# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""hypeman config: gpu.vf_quarantine_threshold discovery."""

from __future__ import annotations

import pytest

from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.plugins.module_utils import _hypeman


@pytest.mark.parametrize("text, expected", [
    ("gpu:\n  vf_quarantine_threshold: 3\n", 3),
    ("port: \"8080\"\ngpu:\n  profile_cache_ttl: 30m  # cache\n  vf_quarantine_threshold: '4' # four\nlogging:\n  max_files: 1\n", 4),
    ("gpu: {profile_cache_ttl: 30m, vf_quarantine_threshold: 5}\n", 5),
    ("gpu:\n    vf_quarantine_threshold: 6\n", 6),
    ("gpu:\n  profile_cache_ttl: 30m\n", None),
    ("vf_quarantine_threshold: 9\n", None),  # not under gpu:
    ("gpu:\n  x: 1\nother:\n  vf_quarantine_threshold: 9\n", None),  # sibling section
    ("# gpu:\n#   vf_quarantine_threshold: 7\n", None),  # commented out
    ("", None),
])
def test_parse_threshold(text, expected):
    assert _hypeman.parse_quarantine_threshold(text) == expected


@pytest.mark.parametrize("value", ["0", "-1", "two", "2.5"])
def test_parse_threshold_rejects_bad_values(value):
    with pytest.raises(VgpuError) as err:
        _hypeman.parse_quarantine_threshold("gpu:\n  vf_quarantine_threshold: %s\n" % value, source="/etc/hypeman/config.yaml")
    assert "/etc/hypeman/config.yaml" in str(err.value)
    assert value in str(err.value)
    assert ">= 1" in str(err.value)


def test_read_threshold_missing_file_is_default(tmp_path):
    assert _hypeman.read_quarantine_threshold(str(tmp_path / "absent.yaml")) == (2, "default")


def test_read_threshold_from_file(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("gpu:\n  vf_quarantine_threshold: 3\n")
    assert _hypeman.read_quarantine_threshold(str(cfg)) == (3, str(cfg))


def test_read_threshold_unreadable_is_error(tmp_path):
    with pytest.raises(VgpuError) as err:
        _hypeman.read_quarantine_threshold(str(tmp_path))  # a directory
    assert str(tmp_path) in str(err.value)


def test_resolve_threshold_option_wins(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("gpu:\n  vf_quarantine_threshold: 3\n")
    assert _hypeman.resolve_threshold(5, str(cfg)) == (5, "option")
    assert _hypeman.resolve_threshold(None, str(cfg)) == (3, str(cfg))
    with pytest.raises(VgpuError, match="threshold is 0"):
        _hypeman.resolve_threshold(0, str(cfg))
