# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""recover_happy verify: the card recovered, checked on the host itself."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "recover_common"))

import checks  # noqa: E402


def test_card_healthy_in_sysfs_store_api_and_units(sh):
    checks.assert_healthy_end_state(sh)


def test_other_card_and_its_instances_untouched(sh):
    checks.assert_other_card_untouched(sh)


def test_sriov_cycled_exactly_once(sh):
    # check mode ran nothing; the recovery one disable and one enable; the idempotence run nothing.
    assert checks.sriov_manage_calls(sh) == ["-d %s" % checks.GPU, "-e %s" % checks.GPU]


def test_drain_waited_for_the_tenants(sh):
    entries = checks.ledger(sh)
    quarantines = [e for e in entries if e.get("action") == "quarantine" and e.get("parent_gpu") == checks.GPU
                   and e.get("trigger") == "manual"]
    clears = [e for e in entries if e.get("action") == "clear" and e.get("parent_gpu") == checks.GPU]
    assert len(quarantines) == 31  # the wedged VF was quarantined by hypeman already
    assert len(clears) == 32
    data = checks.status(sh)
    for instance in ("inst-web-c", "inst-wedged-d"):
        assert data["instances"][instance].get("stopped")
    drained_at = max(checks.rfc3339_ns(e["time"]) for e in quarantines)
    stopped_at = min(checks.rfc3339_ns(checks.metadata(sh, i)["StoppedAt"]) for i in ("inst-web-c", "inst-wedged-d"))
    assert drained_at < stopped_at
