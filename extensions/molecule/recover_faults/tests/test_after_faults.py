# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""recover_faults verify: after three failed attempts (checked in converge) the last run recovered the card."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "recover_common"))

import checks  # noqa: E402


def test_card_healthy_in_sysfs_store_api_and_units(sh):
    checks.assert_healthy_end_state(sh)


def test_other_card_and_its_instances_untouched(sh):
    checks.assert_other_card_untouched(sh)


def test_sriov_manage_ran_only_in_attempt_c_and_the_final_run(sh):
    gpu = checks.GPU
    # C: one disable, two enables that did nothing (retries=1); the final run: the enable only.
    assert checks.sriov_manage_calls(sh) == ["-d %s" % gpu] + ["-e %s" % gpu] * 3


def test_dcgm_exporter_accepts_stops_again(sh):
    assert not sh.file("/run/systemd/system/nvidia-dcgm-exporter.service.d").exists
    assert sh.check_output("systemctl show -p RefuseManualStop --value nvidia-dcgm-exporter") == "no"
