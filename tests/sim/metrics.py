# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""hypeman's ``/metrics`` as its OTel Prometheus exporter renders it (test equipment).

docs/hypeman-interface.md §5.4, §5.6: hypeman serves its OTel meters for
Prometheus on ``metrics.listen_address:metrics.port`` (127.0.0.1:9464), path
``/metrics``. The exporter writes ``# HELP``/``# TYPE`` lines, a
``target_info`` series, and adds ``otel_scope_name``/``otel_scope_version``
labels to every series; counters keep their ``_total`` name. Standard library
only, independent of the collection.
"""

from __future__ import annotations

import threading

CHECK_RESULTS = ("ok", "failed", "unknown", "rpc_error", "list_error", "unsupported_agent")
_SCOPE = 'otel_scope_name="hypeman",otel_scope_version=""'


class SentinelCounters(object):
    """The vsock sentinel's instruments (counters only grow; the gauges are callbacks)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.checks = {}
        self.init_failures = 0
        self.quarantines = 0

    def check(self, result):
        with self.lock:
            self.checks[result] = self.checks.get(result, 0) + 1

    def failure(self, quarantined):
        with self.lock:
            self.init_failures += 1
            self.quarantines += 1 if quarantined else 0


def render(counters, version, uptime_seconds, quarantined_vfs, store_unavailable, vsock=True):
    """The exposition text. A counter without any recorded value is not exported (OTel behaviour)."""
    out = ['# HELP target_info Target metadata', '# TYPE target_info gauge',
           'target_info{service_name="hypeman",service_version="%s"} 1' % version,
           '# HELP hypeman_info Hypeman build information', '# TYPE hypeman_info gauge',
           'hypeman_info{%s,service_version="%s",telemetry_sdk_language="go"} 1' % (_SCOPE, version),
           '# HELP hypeman_uptime_seconds Process uptime in seconds', '# TYPE hypeman_uptime_seconds gauge',
           'hypeman_uptime_seconds{%s} %r' % (_SCOPE, float(uptime_seconds))]
    with counters.lock:
        checks = dict(counters.checks)
        init_failures, quarantines = counters.init_failures, counters.quarantines
    if init_failures:
        out += ["# HELP hypeman_instances_vgpu_sentinel_init_failures_total Total guest-reported vGPU driver init "
                "failures recorded by the sentinel (one per instance assignment)",
                "# TYPE hypeman_instances_vgpu_sentinel_init_failures_total counter",
                "hypeman_instances_vgpu_sentinel_init_failures_total{%s} %d" % (_SCOPE, init_failures)]
    if quarantines:
        out += ["# HELP hypeman_instances_vgpu_sentinel_quarantines_total Total VFs quarantined by the vGPU sentinel",
                "# TYPE hypeman_instances_vgpu_sentinel_quarantines_total counter",
                "hypeman_instances_vgpu_sentinel_quarantines_total{%s} %d" % (_SCOPE, quarantines)]
    if vsock and checks:
        out += ["# HELP hypeman_instances_vgpu_sentinel_checks_total Total vGPU sentinel checks by result",
                "# TYPE hypeman_instances_vgpu_sentinel_checks_total counter"]
        out += ['hypeman_instances_vgpu_sentinel_checks_total{%s,result="%s"} %d' % (_SCOPE, result, count)
                for result, count in sorted(checks.items())]
    out += ["# HELP hypeman_instances_vgpu_quarantined_vfs Number of vGPU virtual functions currently quarantined",
            "# TYPE hypeman_instances_vgpu_quarantined_vfs gauge",
            "hypeman_instances_vgpu_quarantined_vfs{%s} %d" % (_SCOPE, quarantined_vfs),
            "# HELP hypeman_instances_vgpu_vf_health_store_unavailable 1 when the persisted VF health state failed "
            "to load or persist",
            "# TYPE hypeman_instances_vgpu_vf_health_store_unavailable gauge",
            "hypeman_instances_vgpu_vf_health_store_unavailable{%s} %d" % (_SCOPE, 1 if store_unavailable else 0)]
    return "\n".join(out) + "\n"
