# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A real fleet report of a simulated fleet, without a playbook (test equipment).

Each host is a simulated tree from the fleet_audit target's fixture
(``fleet_fixture.build_host``: two A100 cards, instances, one problem class),
audited by the collection's own host audit (``_audit.audit_host``, what
``host_audit_info`` runs), turned into report entries and a report by
``fleet_report`` exactly as the role's filters do. One host's hypeman serves
``/metrics`` (the simulator's exposition text) so the report carries hypeman's
own sentinel figures too. Two rounds with different problems on the same host
names give a history and a "what changed".

Used by ``tests/browser/check_report.py`` and the Grafana dashboard unit test.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import sys
import threading

from ansible_collections.hypeman.vgpu.plugins.module_utils import _audit, _wedge
from ansible_collections.hypeman.vgpu.plugins.plugin_utils import fleet_pictures, fleet_report

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = os.path.join(HERE, "..", "integration", "targets", "fleet_audit")

# Round 1 and round 2: the same host names, the problem each has in that round.
ROUND_1 = ("ok", "ok", "overflow", "below", "ok", "drained", "ok", "legacy", "sentinel", "ok", "pending", "ok")
ROUND_2 = ("overflow", "ok", "drained", "ok", "draining", "ok", "ok", "legacy", "sentinel", "novfs", "pending",
           "wedge")
METRICS_HOST = 1  # host-01 is audited with hypeman's /metrics


def _fixture():
    if TARGET not in sys.path:
        sys.path.insert(0, TARGET)
    import fleet_fixture  # pylint: disable=import-error,import-outside-toplevel

    return fleet_fixture


@contextlib.contextmanager
def metrics_server():
    """hypeman's /metrics as the simulator renders it, on 127.0.0.1 (yields the URL)."""
    _fixture()  # puts the collection root on sys.path for tests.sim
    from tests.sim import metrics as sim_metrics  # pylint: disable=import-error,import-outside-toplevel

    counters = sim_metrics.SentinelCounters()
    for result in ("ok", "ok", "ok", "failed"):
        counters.check(result)
    counters.failure(quarantined=True)
    body = sim_metrics.render(counters, "v0.9.0", 120, 0, False).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802  (http.server's name)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield "http://127.0.0.1:%d/metrics" % server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def audit_round(directory, problems, generated_at, metrics_url=None, unreachable=("gone-00",)):
    """Build the trees of one round under ``directory`` and audit them: the report entries."""
    fixture = _fixture()
    entries = []
    for index, problem in enumerate(problems):
        host = "host-%02d" % index
        tree, _codes = fixture.build_host(os.path.join(directory, host), problem)
        paths = _audit.Paths(tree.data_dir, tree.store_path, tree.sysfs_root, tree.proc_root, tree.dev_root,
                             tree.state_dir, tree.config_path)
        wedge = _wedge.Options.from_params({"hypeman_log_path": tree.hypeman_log_path,
                                            "kernel_log_path": tree.kernel_log_path, "wedge_window_hours": 168})
        metrics = {"url": metrics_url, "timeout": 5} if metrics_url and index == METRICS_HOST else None
        result, _warnings = _audit.audit_host(paths, hypeman_expected=False, wedge=wedge, metrics=metrics)
        entries.append(fleet_report.host_entry(result, host, generated_at))
    for host in unreachable:
        entries.append(fleet_report.host_entry(
            {"unreachable": True, "msg": "ssh: connect to host %s port 22: No route to host" % host}, host))
    return entries


def report(entries, generated_at, report_dir=None, keep=0):
    """The fleet report as the role builds it (with its history when ``report_dir`` and ``keep``)."""
    reports = fleet_report.report_paths(report_dir, "audit", ["json", "markdown", "html"]) if report_dir else {}
    built = fleet_report.build_report(entries, "audit", generated_at, reports=reports)
    if report_dir and keep:
        fleet_pictures.attach_history(built, report_dir, keep)
    return built


def write_history(built):
    """Write a report's history record where the role would (the role uses copy, atomic)."""
    path = built["history"]["record_file"]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(fleet_pictures.to_json(fleet_pictures.history_record(built)))
    return path


def two_rounds(work, report_dir, keep=10):
    """Audit round 1 (its record goes to the history), then round 2: the second report, with trends."""
    with metrics_server() as url:
        first = report(audit_round(os.path.join(work, "round-1"), ROUND_1, "2026-12-01T06:00:00Z", url),
                       "2026-12-01T06:00:00Z", report_dir, keep)
        write_history(first)
        second = report(audit_round(os.path.join(work, "round-2"), ROUND_2, "2026-12-02T06:00:00Z", url),
                        "2026-12-02T06:00:00Z", report_dir, keep)
    return first, second
