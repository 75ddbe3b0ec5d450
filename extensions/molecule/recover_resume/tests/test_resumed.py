# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""recover_resume verify: the run after the interrupted one waited for its job and finished the recovery."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "recover_common"))

import checks  # noqa: E402


def test_card_healthy_in_sysfs_store_api_and_units(sh):
    checks.assert_healthy_end_state(sh)


def test_other_card_and_its_instances_untouched(sh):
    checks.assert_other_card_untouched(sh)


def test_the_interrupted_enable_finished_and_nothing_ran_beside_it(sh):
    # The Ctrl-C'd run disabled and started its enable; the enable kept running on the host and
    # finished once released. The resumed run waited for it and ran no sriov-manage of its own.
    gpu = checks.GPU
    assert checks.sriov_manage_calls(sh) == ["-d %s" % gpu, "-e %s" % gpu]
    done = sh.file("/run/recover-test/sriov-manage.done").content_string.splitlines()
    assert [line.split(None, 1)[1] for line in done] == ["-d %s rc=0" % gpu, "-e %s rc=0" % gpu]


def test_the_clear_came_after_the_enable_finished(sh):
    enabled_at = float(sh.file("/run/recover-test/sriov-manage.done").content_string.splitlines()[-1].split()[0])
    clears = [e for e in checks.ledger(sh) if e.get("parent_gpu") == checks.GPU and e["action"] == "clear"]
    assert clears and min(checks.rfc3339_ns(e["time"]) for e in clears) > enabled_at * 10 ** 9


def test_drain_and_clear_recorded_once(sh):
    entries = [e for e in checks.ledger(sh) if e.get("parent_gpu") == checks.GPU]
    assert len([e for e in entries if e["action"] == "quarantine"]) == 31
    assert len([e for e in entries if e["action"] == "clear"]) == 32


def test_the_interrupted_job_is_over(sh):
    wrapper, module = sh.file("/run/recover-test/blocked.pids").content_string.split()
    assert not sh.file("/proc/%s" % wrapper).exists and not sh.file("/proc/%s" % module).exists
