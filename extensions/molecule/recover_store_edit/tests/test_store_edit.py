# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""recover_store_edit verify: the disciplined edit is in the file and in hypeman's memory."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "recover_common"))

import checks  # noqa: E402


def test_disciplined_edit_kept_control_edit_lost(sh):
    quarantined = checks.quarantined(sh)
    assert "0000:82:01.2" in quarantined
    assert "0000:82:01.0" not in quarantined


def test_hypeman_counts_the_disciplined_quarantine(sh):
    # hypeman loaded the edit at its restart: its quarantine set is the file's.
    assert checks.api_gpu(sh)["quarantined_slots"] == len(checks.quarantined(sh))


def test_hypeman_running_and_no_stop_left_behind(sh):
    assert checks.unit_active(sh, "hypeman")
    assert not sh.file(checks.STATE_DIR + "/store-edit/hypeman.stopped").exists


def test_ledger_records_both_edits_with_who_and_why(sh):
    entries = [e for e in checks.ledger(sh) if e.get("action") == "quarantine"]
    by_vf = dict((e["vf_address"], e) for e in entries)
    assert by_vf["0000:82:01.2"]["reason"] == "edit made through the discipline"
    assert by_vf["0000:82:01.0"]["reason"] == "control edit made while hypeman runs"
    assert by_vf["0000:82:01.2"]["user"]
