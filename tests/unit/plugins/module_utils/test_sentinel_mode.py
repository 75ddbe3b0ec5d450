# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_sentinel_mode: which hypeman sentinel watches a host, from guests' console lines and hypeman's metrics."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings, strategies as st

from ansible_collections.hypeman.vgpu.plugins.module_utils import _sentinel_mode
from ansible_collections.hypeman.vgpu.tests.sim import guestlog

NS = 1788177600123456789
settings.register_profile("sentinel-mode-quick", max_examples=60, deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture])
settings.register_profile("fuzz", max_examples=2000, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or "sentinel-mode-quick")


def _logs(tmp_path, name="inst-a", content=b"", log="app.log"):
    logs = tmp_path / "guests" / name / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    if content is not None:
        (logs / log).write_bytes(content)
    return str(logs)


def test_each_era_is_recognised_from_its_own_lines():
    assert _sentinel_mode.classify_text(guestlog.failed_line(NS).encode()) == (True, False)
    assert _sentinel_mode.classify_text(guestlog.ok_line(NS).encode()) == (True, False)
    assert _sentinel_mode.classify_text(guestlog.vsock_ok_line(NS).encode()) == (False, True)
    assert _sentinel_mode.classify_text(guestlog.vsock_failed_line(NS).encode()) == (False, True)


def test_lines_inside_other_output_or_without_the_agent_prefix_do_not_count():
    for line in (b"echo '[guest-agent] GPU driver initialized'\n",
                 b"[guest-agent] GPU driver initialized\n",
                 b"2026/08/20 15:04:05 [guest-agent] GPU driver initialized and more\n",
                 b"2026/08/20 15:04:05 [workload] HYPEMAN-GPU-INIT-OK ts=x\n",
                 guestlog.noise(50, seed=3).encode()):
        assert _sentinel_mode.classify_text(line) == (False, False), line


_LINES = [b"", guestlog.vsock_ok_line(NS).encode(), guestlog.ok_line(NS).encode()]


@given(st.binary(max_size=4096), st.sampled_from(_LINES))
def test_garbage_around_a_line_never_hides_it_or_invents_one(garbage, line):
    # A line counts at a line start: put it after garbage ending in a newline.
    data = garbage + b"\n" + line + garbage
    markers, vsock = _sentinel_mode.classify_text(data)
    if line == guestlog.ok_line(NS).encode():
        assert markers
    if line == guestlog.vsock_ok_line(NS).encode():
        assert vsock
    alone_markers, alone_vsock = _sentinel_mode.classify_text(garbage + b"\n" + garbage)
    assert (markers, vsock) >= (alone_markers, alone_vsock)


def test_instance_mode_from_the_log(tmp_path):
    vsock = _sentinel_mode.instance_mode("a", _logs(tmp_path, "a", guestlog.vsock_failed_line(NS).encode()))
    assert vsock["sentinel_mode"] == "vsock"
    markers = _sentinel_mode.instance_mode("b", _logs(tmp_path, "b", guestlog.failed_line(NS).encode()))
    assert markers["sentinel_mode"] == "markers"
    nothing = _sentinel_mode.instance_mode("c", _logs(tmp_path, "c", b"booting\n"))
    assert nothing["sentinel_mode"] == "unknown" and "no GPU init line" in nothing["sentinel_mode_reason"]
    both = _sentinel_mode.instance_mode(
        "d", _logs(tmp_path, "d", (guestlog.ok_line(NS) + guestlog.vsock_ok_line(NS)).encode()))
    assert both["sentinel_mode"] == "unknown" and "both" in both["sentinel_mode_reason"]
    # The scan already attributed markers beyond the windows read here.
    assert _sentinel_mode.instance_mode("c", _logs(tmp_path, "c", None), True)["sentinel_mode"] == "markers"


def test_the_rotated_log_counts_and_only_the_windows_are_read(tmp_path):
    logs = _logs(tmp_path, "a", b"x" * 10 + b"\n")
    with open(os.path.join(logs, "app.log.1"), "wb") as handle:
        handle.write(guestlog.vsock_ok_line(NS).encode())
    assert _sentinel_mode.instance_mode("a", logs)["sentinel_mode"] == "vsock"
    middle = b"n" * 5000 + b"\n" + guestlog.vsock_ok_line(NS).encode() + b"n" * 5000 + b"\n"
    logs = _logs(tmp_path, "b", middle)
    assert _sentinel_mode.instance_mode("b", logs, window=1024)["sentinel_mode"] == "unknown"
    assert _sentinel_mode.instance_mode("b", logs, window=8192)["sentinel_mode"] == "vsock"


def test_hostile_logs_give_a_reason_never_an_exception(tmp_path):
    outside = tmp_path / "outside.log"
    outside.write_bytes(guestlog.vsock_ok_line(NS).encode())
    logs = _logs(tmp_path, "link", None)
    os.symlink(str(outside), os.path.join(logs, "app.log"))
    entry = _sentinel_mode.instance_mode("link", logs)
    assert entry["sentinel_mode"] == "unknown" and "app.log" in entry["sentinel_mode_reason"]
    logs = _logs(tmp_path, "fifo", None)
    os.mkfifo(os.path.join(logs, "app.log"))
    entry = _sentinel_mode.instance_mode("fifo", logs)
    assert entry["sentinel_mode"] == "unknown" and "app.log" in entry["sentinel_mode_reason"]
    logs = _logs(tmp_path, "dir", None)
    os.mkdir(os.path.join(logs, "app.log"))
    assert _sentinel_mode.instance_mode("dir", logs)["sentinel_mode"] == "unknown"
    missing = str(tmp_path / "guests" / "missing" / "logs")
    entry = _sentinel_mode.instance_mode("missing", missing)
    assert entry["sentinel_mode"] == "unknown" and "does not exist" in entry["sentinel_mode_reason"]
    (tmp_path / "guests" / "symdir").mkdir()
    os.symlink(str(tmp_path), str(tmp_path / "guests" / "symdir" / "logs"))
    entry = _sentinel_mode.instance_mode("symdir", str(tmp_path / "guests" / "symdir" / "logs"))
    assert entry["sentinel_mode"] == "unknown" and "symlink" in entry["sentinel_mode_reason"]


def _entry(instance_id, mode):
    return {"instance_id": instance_id, "sentinel_mode": mode, "sentinel_mode_reason": "r"}


_ENTRIES = st.lists(st.tuples(st.text("abc", min_size=1, max_size=3), st.sampled_from(_sentinel_mode.MODES)),
                    max_size=8, unique_by=lambda item: item[0])
_METRICS = st.one_of(st.none(), st.just({"checks": None}), st.just({"checks": {"ok": 3.0}}))


@given(st.sampled_from(_sentinel_mode.OPTION_CHOICES), _ENTRIES, _METRICS)
def test_host_mode_rules(option, entries, metrics):
    modes = [_entry(i, m) for i, m in entries]
    mode, reason = _sentinel_mode.host_mode(option, modes, metrics)
    assert mode in _sentinel_mode.MODES and reason
    seen = set(m for _i, m in entries)
    if option != "auto":
        assert mode == option
    elif metrics and metrics["checks"] is not None:
        assert mode == "vsock"
    elif "markers" in seen and "vsock" in seen:
        assert mode == "unknown" and "disagree" in reason
    elif "markers" in seen or "vsock" in seen:
        assert mode == ({"markers", "vsock"} & seen).pop()
    else:
        assert mode == "unknown"
    coverage, why = _sentinel_mode.log_evidence(mode, modes)
    assert why
    # Silence is never health unless the logs are the channel hypeman reads and every guest prints there.
    assert (coverage == "complete") == (mode == "markers" and "vsock" not in seen)
    if mode == "vsock":
        assert coverage == "none"
