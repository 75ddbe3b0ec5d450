# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""PCI address parsing: the one parser inputs, store records and sysfs names share."""

from __future__ import annotations

import pytest

from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.plugins.module_utils._pci import ADDRESS_RE, canonical_address, normalize_address


@pytest.mark.parametrize("text, expected", [
    ("0000:82:00.4", "0000:82:00.4"),
    ("0000:E3:00.5", "0000:e3:00.5"),
    ("82:00.4", "0000:82:00.4"),
    ("1:82:1f.7", "0001:82:1f.7"),
    ("  0000:82:00.4 ", "0000:82:00.4"),
])
def test_normalize_address(text, expected):
    assert normalize_address(text) == expected


@pytest.mark.parametrize("text", ["", "not-a-pci-address", "0000:82:00.8", "0000:82:00", "00000:82:00.4",
                                  "0000:8:00.4", "0000:82:00.4\n5", "g000:82:00.4", None, 5])
def test_normalize_rejects_with_value_and_expected_form(text):
    with pytest.raises(VgpuError) as err:
        normalize_address(text)
    assert repr(text) in err.value.msg
    assert "expected a PCI function address like 0000:82:00.4" in err.value.msg


@pytest.mark.parametrize("text, ok", [
    ("0000:82:00.4", True), ("0000:E3:00.4", False), ("0000:82:00.8", False),
    ("000:82:00.4", False), ("0000:82:00.4\n", False), ("ffff:ff:ff.7", True),
])
def test_vf_address_re_is_hypemans(text, ok):
    assert bool(ADDRESS_RE.match(text)) is ok


def test_canonical_address_normalises_addresses_and_keeps_other_names():
    # A sysfs name that is no address (or has a trailing newline) stays itself: it must not alias a real device.
    names = {"0000:82:00.4": "0000:82:00.4", "0000:E3:00.5": "0000:e3:00.5", "82:00.4": "0000:82:00.4",
             "virtfn0": "virtfn0", "0000:82:00.4\n": "0000:82:00.4\n"}
    assert dict((name, canonical_address(name)) for name in names) == names
