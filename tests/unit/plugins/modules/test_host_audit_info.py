# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""host_audit_info: the module end to end on a host tree."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, strategies as st

from ansible_collections.hypeman.vgpu.plugins.modules import host_audit_info
from ansible_collections.hypeman.vgpu.tests.sim.hosttree import HostTree
from ansible_collections.hypeman.vgpu.tests.unit.hostile import (
    hang_detector, property_settings, replace_with, tree_fingerprint)
from ansible_collections.hypeman.vgpu.tests.unit.plugins.modules.module_results import run_module

Q_AT = "2026-08-22T00:00:00Z"


def run(tree, capsys, **args):
    params = {"data_dir": tree.data_dir, "sysfs_root": tree.sysfs_root, "proc_root": tree.proc_root,
              "dev_root": tree.dev_root, "config_path": tree.config_path, "state_dir": tree.state_dir}
    params.update(args)
    return run_module(host_audit_info.main, params, capsys)


@pytest.fixture
def tree(tmp_path):
    tree = HostTree(tmp_path)
    card = tree.add_card("A100", "0000:82:00.0")
    tree.add_card("A100", "0000:83:00.0")
    tree.add_instance("vm", vf=card.vfs[0], profile="NVIDIA A100-4C")
    tree.write_store([{"vf_address": vf, "quarantined_at": Q_AT} for vf in tree.cards["0000:83:00.0"].vfs])
    return tree


def test_audit(tree, capsys):
    result = run(tree, capsys)
    assert result["changed"] is False
    assert [i["code"] for i in result["issues"]] == ["card_ready_for_cycle", "hypeman_not_running", "quarantined_vfs"]
    assert result["needs_action"] is True
    assert result["capacity"]["lost_pct"] == 50.0
    assert result["prerequisites"] is None and result["api"] is None
    assert result["sentinel"] == {
        "findings": [], "unreported": [], "skipped_instances": [], "unattributed": 0, "history": 0, "warnings": [],
        "sentinel_mode": "unknown", "sentinel_mode_reason": result["sentinel"]["sentinel_mode_reason"],
        "instance_modes": [{"instance_id": "vm", "sentinel_mode": "unknown",
                            "sentinel_mode_reason": result["sentinel"]["instance_modes"][0]["sentinel_mode_reason"]}],
        "log_evidence": "none", "log_evidence_reason": result["sentinel"]["log_evidence_reason"],
        "watched_instances": 1}
    assert "metrics_url" in result["sentinel"]["sentinel_mode_reason"] and result["metrics"] is None


def test_options(tree, capsys):
    result = run(tree, capsys, sentinel=False, hypeman_expected=False, prerequisites=True,
                 sriov_manage="/nonexistent/sriov-manage", _ansible_check_mode=True)
    assert result["sentinel"] is None
    assert "hypeman_not_running" not in [i["code"] for i in result["issues"]]
    assert [c["name"] for c in result["prerequisites"]] == [
        "iommu", "vfio_modules", "nvidia_vgpu_driver", "sriov_manage", "vendor_vfio", "dcgm_units"]


def test_bad_threshold_fails_cleanly(tree, capsys):
    result = run(tree, capsys, threshold=0)
    assert result["failed"] is True
    assert result["msg"] == "threshold is 0; expected a whole number >= 1"


def test_host_paths_that_point_nowhere_are_flagged(tmp_path, capsys):
    # A first inventory with wrong paths: the audit must not call the host "ok".
    (tmp_path / "proc").mkdir()
    result = run_module(host_audit_info.main, {
        "data_dir": str(tmp_path / "hypeman"), "sysfs_root": str(tmp_path / "sys"), "proc_root": str(tmp_path / "proc"),
        "dev_root": str(tmp_path / "dev"), "config_path": str(tmp_path / "config.yaml"),
        "state_dir": str(tmp_path / "state"), "hypeman_expected": False}, capsys)
    assert [i["code"] for i in result["issues"]] == ["host_not_vgpu"]
    assert result["needs_action"] is True
    assert result["footprint"]["not_vgpu"] is True
    assert str(tmp_path / "hypeman") in result["issues"][0]["message"]


def test_footprint_of_a_vgpu_host(tree, capsys):
    footprint = run(tree, capsys)["footprint"]
    assert footprint["nvidia_sriov_cards"] == 2 and footprint["data_dir_exists"] is True
    assert footprint["not_vgpu"] is False


# --- hypeman's own sentinel metrics (docs/hypeman-versions.md) --------------------------------


class _MetricsServer(object):
    """hypeman's /metrics as tests/sim/metrics.py renders it."""

    def __init__(self, text):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        body = text.encode()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):  # noqa: N802
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = "http://127.0.0.1:%d/metrics" % self.httpd.server_address[1]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _vsock_guest(tree):
    from ansible_collections.hypeman.vgpu.tests.sim import guestlog
    logs = os.path.join(tree.data_dir, "guests", "vm", "logs")
    os.makedirs(logs, exist_ok=True)
    guestlog.append(os.path.join(logs, "app.log"), guestlog.vsock_ok_line(1788177627000000000))


def _text(checks, quarantined_vfs=16, uptime=600):
    from ansible_collections.hypeman.vgpu.tests.sim import metrics as sim_metrics
    counters = sim_metrics.SentinelCounters()
    counters.checks.update(checks)
    return sim_metrics.render(counters, "v0.9.0", uptime, quarantined_vfs, False)


def _codes(result):
    return [i["code"] for i in result["issues"]]


def test_vsock_guests_without_metrics_are_an_incomplete_sentinel(tree, capsys):
    _vsock_guest(tree)
    result = run(tree, capsys)
    assert result["sentinel"]["sentinel_mode"] == "vsock" and result["sentinel"]["log_evidence"] == "none"
    assert "sentinel_evidence_incomplete" in _codes(result)


def test_metrics_decide_the_mode_and_cover_the_host(tree, capsys):
    _vsock_guest(tree)
    server = _MetricsServer(_text({"ok": 30}))
    try:
        result = run(tree, capsys, metrics_url=server.url)
    finally:
        server.close()
    assert result["metrics"]["error"] is None
    assert result["metrics"]["sample"]["checks"] == {"ok": 30.0}
    assert result["metrics"]["sample"]["version"] == "v0.9.0"
    assert result["sentinel"]["sentinel_mode"] == "vsock" and "checks_total" in result["sentinel"]["sentinel_mode_reason"]
    assert result["metrics"]["store_quarantined"] == len(tree.cards["0000:83:00.0"].vfs) == 16
    codes = _codes(result)
    assert "sentinel_evidence_incomplete" not in codes and "sentinel_coverage_lost" not in codes
    assert "quarantine_count_mismatch" not in codes


def test_growing_rpc_errors_since_the_kept_sample_are_coverage_lost(tree, capsys):
    import json
    _vsock_guest(tree)
    previous = {"taken_at": 1.0, "version": "v0.9.0", "uptime_seconds": 100.0, "checks": {"ok": 10.0},
                "init_failures": None, "quarantines": None, "quarantined_vfs": 16.0, "store_unavailable": 0.0}
    os.makedirs(tree.state_dir, exist_ok=True)
    with open(os.path.join(tree.state_dir, "sentinel-metrics.json"), "w") as handle:
        json.dump(previous, handle)
    server = _MetricsServer(_text({"ok": 10, "unsupported_agent": 40}, quarantined_vfs=3))
    try:
        result = run(tree, capsys, metrics_url=server.url)
    finally:
        server.close()
    assert result["metrics"]["previous"] == previous
    assert result["metrics"]["coverage_problems"] == ["40 unsupported_agent check(s) since the previous sample"]
    codes = _codes(result)
    assert "sentinel_coverage_lost" in codes and "quarantine_count_mismatch" in codes
    assert result["needs_action"] is True


def test_unreachable_metrics_are_an_issue_and_a_bad_url_fails(tree, capsys):
    result = run(tree, capsys, metrics_url="http://127.0.0.1:9/metrics", metrics_timeout=2)
    assert "metrics_unreadable" in _codes(result) and result["metrics"]["sample"] is None
    failed = run(tree, capsys, metrics_url="file:///etc/passwd")
    assert failed["failed"] and "metrics_url 'file:///etc/passwd' is not an http://" in failed["msg"]
    failed = run(tree, capsys, metrics_url="http://127.0.0.1:9/metrics", metrics_timeout=0)
    assert failed["failed"] and "metrics_timeout is 0" in failed["msg"]


def test_a_hostile_previous_sample_is_ignored_with_a_warning(tree, capsys):
    os.makedirs(tree.state_dir, exist_ok=True)
    os.mkfifo(os.path.join(tree.state_dir, "sentinel-metrics.json"))
    server = _MetricsServer(_text({"ok": 1}))
    try:
        result = run(tree, capsys, metrics_url=server.url)
    finally:
        server.close()
    assert result["metrics"]["previous"] is None and "sentinel-metrics.json" in result["metrics"]["previous_error"]


def test_wedge_risk_from_the_journal_of_the_given_unit(tree, capsys, fake_journalctl):
    """The audit reads hypeman's journal through journalctl (the fake first on PATH), never the machine's."""
    import json
    import time

    from ansible_collections.hypeman.vgpu.plugins.module_utils import _gotime

    vf = tree.cards["0000:82:00.0"].vfs[1]
    now = time.time_ns()
    line = json.dumps({"time": _gotime.format_utc_rfc3339nano(_gotime.from_unix_ns(now - 600 * 10 ** 9)),
                       "level": "WARN", "msg": "hypervisor with VFIO devices did not exit on SIGTERM; hard-killing, "
                       "device may wedge if the guest driver was initializing", "instance_id": "gone",
                       "device_path": "/sys/bus/pci/devices/%s" % vf, "subsystem": "INSTANCES"})
    fake_journalctl.answer("unit", [{"MESSAGE": line, "__REALTIME_TIMESTAMP": str(now // 1000)}])
    fake_journalctl.answer("dmesg", raw=b"\xff garbage\n")
    result = run(tree, capsys, hypeman_unit="hypeman", wedge_window_hours=2)
    calls = fake_journalctl.calls()
    assert [call[0] for call in calls] == ["--unit=hypeman", "--dmesg"]
    assert all("--output=json" in call and "--boot=0" in call for call in calls)
    since = [int(arg.split("@", 1)[1]) for arg in calls[0] if arg.startswith("--since=@")]
    assert len(since) == 1 and abs(since[0] - (now // 10 ** 9 - 7200)) < 600
    assert [(v["vf"], v["reason"]) for v in result["at_risk_vfs"]] == [(vf, "vf_may_wedge")]
    assert "vf_at_risk" in [i["code"] for i in result["issues"]]
    assert result["wedge_signals"]["complete"] is True


def test_an_unreadable_journal_is_said_not_read_as_health(tree, capsys, fake_journalctl):
    fake_journalctl.answer("unit", stderr="No journal files were opened due to insufficient permissions.", rc=1)
    result = run(tree, capsys)
    assert result["at_risk_vfs"] == [] and result["wedge_signals"]["complete"] is False
    assert "insufficient permissions" in result["wedge_signals"]["sources"][0]["error"]
    assert "wedge_signals_unread" in [i["code"] for i in result["issues"]]


# --- prometheus_textfile: the node_exporter textfile read back, never written -------------------


def test_the_textfile_is_read_back_and_nothing_is_written(tree, tmp_path, capsys):
    textfile = tmp_path / "prom" / "hypeman_vgpu.prom"
    textfile.parent.mkdir()
    textfile.write_bytes(b"hypeman_vgpu_up 1\n")
    textfile.chmod(0o600)
    before = tree_fingerprint(str(tmp_path))
    result = run(tree, capsys, prometheus_textfile=str(textfile))
    assert result["prometheus_textfile"] == {"path": str(textfile), "content": "hypeman_vgpu_up 1\n", "mode": "0600",
                                             "error": None}
    assert result["changed"] is False and tree_fingerprint(str(tmp_path)) == before
    assert run(tree, capsys)["prometheus_textfile"] is None
    missing = run(tree, capsys, prometheus_textfile=str(tmp_path / "nowhere.prom"))["prometheus_textfile"]
    assert missing == {"path": str(tmp_path / "nowhere.prom"), "content": None, "mode": None, "error": None}


@pytest.mark.parametrize("how", ["fifo", "dir", "symlink", "dangling"])
def test_a_textfile_that_is_not_a_regular_file_is_not_read(tmp_path, how):
    target = tmp_path / "target.prom"
    target.write_bytes(b"hypeman_vgpu_up 1\n")
    path = replace_with(str(tmp_path / "hypeman_vgpu.prom"), how, str(target).encode())
    with hang_detector(10, "reading a %s" % how):
        found = host_audit_info.read_textfile(path)
    assert found["content"] is None and found["mode"] is None
    assert found["error"].startswith(path + ": ")


def test_a_huge_textfile_is_not_read(tmp_path):
    path = tmp_path / "hypeman_vgpu.prom"
    with open(path, "wb") as handle:
        handle.truncate(host_audit_info.TEXTFILE_LIMIT + 1)
    found = host_audit_info.read_textfile(str(path))
    assert found["content"] is None and found["mode"] == "0644"
    assert "larger than %d bytes" % host_audit_info.TEXTFILE_LIMIT in found["error"]


@property_settings(60)
@given(st.binary(max_size=256), st.sampled_from([0o644, 0o600, 0o4755]))
def test_any_textfile_bytes_come_back_as_they_are_or_as_unknown(tmp_path_factory, data, mode):
    path = tmp_path_factory.mktemp("prom") / "hypeman_vgpu.prom"
    path.write_bytes(data)
    os.chmod(path, mode)
    found = host_audit_info.read_textfile(str(path))
    assert found["mode"] == "%04o" % mode
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        assert found["content"] is None and "not UTF-8 text" in found["error"]
    else:
        assert found["content"] == text and found["error"] is None
