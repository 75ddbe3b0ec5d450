# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""recover_resume verify: the run after the killed one finished the recovery."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "recover_common"))

import checks  # noqa: E402


def test_card_healthy_in_sysfs_store_api_and_units(sh):
    checks.assert_healthy_end_state(sh)


def test_other_card_and_its_instances_untouched(sh):
    checks.assert_other_card_untouched(sh)


def test_resumed_with_the_enable_only(sh):
    # The killed run disabled and blocked in its enable; the resumed run did not disable again.
    gpu = checks.GPU
    assert checks.sriov_manage_calls(sh) == ["-d %s" % gpu, "-e %s" % gpu, "-e %s" % gpu]


def test_drain_and_clear_recorded_once(sh):
    entries = [e for e in checks.ledger(sh) if e.get("parent_gpu") == checks.GPU]
    assert len([e for e in entries if e["action"] == "quarantine"]) == 31
    assert len([e for e in entries if e["action"] == "clear"]) == 32
