# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""extensions/grafana/hypeman-vgpu-fleet.json: a Grafana dashboard whose every PromQL metric, label and label
value is one the audit's textfile writer really emits, read from its output for a real audit of simulated hosts."""

from __future__ import annotations

import json
import os
import re

import pytest

from ansible_collections.hypeman.vgpu.plugins.plugin_utils import fleet_report as fr
from ansible_collections.hypeman.vgpu.tests.browser import sim_fleet

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
DASHBOARD = os.path.join(ROOT, "extensions", "grafana", "hypeman-vgpu-fleet.json")
# Labels Prometheus adds to every scraped series.
TARGET_LABELS = {"instance", "job"}
# node_exporter's own series about the textfile (its modification time: how old the audit is).
NODE_EXPORTER = {"node_textfile_mtime_seconds": {"file"}}
PROMQL_WORDS = {"sum", "max", "min", "count", "avg", "by", "without", "or", "and", "unless", "vector", "time",
                "rate", "increase", "on", "ignoring", "bool"}
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"')


@pytest.fixture(scope="module")
def emitted(tmp_path_factory):
    """``{metric: {label: {values}}}`` from the textfile writer's output for a real audit of a simulated fleet."""
    # Host 1 is audited with hypeman's /metrics (sim_fleet.METRICS_HOST).
    problems = ("overflow", "ok", "drained", "legacy")
    with sim_fleet.metrics_server() as url:
        entries = sim_fleet.audit_round(str(tmp_path_factory.mktemp("fleet")), problems, "2026-12-02T06:00:00Z",
                                        url, unreachable=())
    found = {}
    for entry in entries:
        for line in fr.render_prometheus(entry).splitlines():
            if line.startswith("#"):
                continue
            match = _SAMPLE.match(line)
            assert match, line
            labels = found.setdefault(match.group(1), {})
            for name, value in _LABEL.findall(match.group(2) or ""):
                labels.setdefault(name, set()).add(value)
    return found


@pytest.fixture(scope="module")
def dashboard():
    with open(DASHBOARD) as handle:
        return json.load(handle)


def _targets(dashboard):
    for panel in dashboard["panels"]:
        for target in panel.get("targets") or []:
            yield panel, target


def test_dashboard_shape(dashboard):
    assert dashboard["title"] and dashboard["uid"] and isinstance(dashboard["schemaVersion"], int)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = dict((v["name"], v) for v in dashboard["templating"]["list"])
    assert variables["DS_PROMETHEUS"]["type"] == "datasource" and variables["DS_PROMETHEUS"]["query"] == "prometheus"
    for panel in dashboard["panels"]:
        assert set(panel["gridPos"]) == {"x", "y", "w", "h"} and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
    targets = list(_targets(dashboard))
    assert len(targets) >= 15
    for panel, target in targets:
        assert target["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]
    types = set(p["type"] for p in dashboard["panels"])
    assert {"state-timeline", "table", "timeseries", "stat", "bargauge"} <= types


def test_every_metric_and_label_is_emitted(dashboard, emitted):
    # The writer's output holds the families the dashboard is about (else this test proves nothing).
    for name in ("hypeman_vgpu_card_health", "hypeman_vgpu_slots", "hypeman_vgpu_hypeman_sentinel_checks",
                 "hypeman_vgpu_hypeman_sentinel_quarantines"):
        assert name in emitted, sorted(emitted)
    used = set()
    for panel, target in _targets(dashboard):
        expr = target["expr"]
        labels_in_expr = set(TARGET_LABELS)
        # Metric names: the identifiers left once strings, selectors and by/without clauses are gone.
        bare = re.sub(r'\b(?:by|without)\s*\([^)]*\)', " ", re.sub(r'\{[^}]*\}', " ", expr))
        for word in re.findall(r'[a-zA-Z_:][a-zA-Z0-9_:]*', bare):
            if word in PROMQL_WORDS or re.match(r"^[0-9]", word):
                continue
            if word in NODE_EXPORTER:
                known = dict((label, None) for label in NODE_EXPORTER[word])
            else:
                assert word in emitted, "%s: %s is not a metric the textfile writer emits (%s)" % (
                    panel["title"], word, expr)
                known = emitted[word]
                used.add(word)
            labels_in_expr.update(known)
        for metric, selector in re.findall(r'([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}', expr):
            known = emitted.get(metric) or dict((label, None) for label in NODE_EXPORTER.get(metric, ()))
            for label, op, value in _MATCHER.findall(selector):
                if label in TARGET_LABELS:
                    continue
                assert label in known, "%s: label %s of %s is not emitted (%s)" % (panel["title"], label, metric, expr)
                if known[label] is None or "$" in value or op in ("!=", "!~"):
                    continue
                values = value.split("|") if op == "=~" else [value]
                for one in values:
                    assert one in known[label], "%s: %s{%s=%r} is never emitted; it emits %s" % (
                        panel["title"], metric, label, one, sorted(known[label]))
        for clause in re.findall(r'\b(?:by|without)\s*\(([^)]*)\)', expr):
            for label in (part.strip() for part in clause.split(",")):
                assert label in labels_in_expr, "%s: by (%s) is not a label of %s" % (panel["title"], label, expr)
        for label in re.findall(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}", target.get("legendFormat", "")):
            assert label in labels_in_expr, "%s: legend {{%s}} is not a label of %s" % (panel["title"], label, expr)
    # The health map, capacity, trends and hypeman's own sentinel are all on the dashboard.
    assert {"hypeman_vgpu_card_health", "hypeman_vgpu_slots", "hypeman_vgpu_vfs", "hypeman_vgpu_audit_needs_action",
            "hypeman_vgpu_hypeman_sentinel_checks"} <= used


def test_card_health_codes_match_the_map(dashboard, emitted):
    # The state timeline's value mappings name the same codes the textfile writer gives each card state.
    timeline = [p for p in dashboard["panels"] if p["type"] == "state-timeline"][0]
    options = timeline["fieldConfig"]["defaults"]["mappings"][0]["options"]
    assert sorted(int(v) for v in options) == sorted(c for k, c in fr.CARD_HEALTH_CODES.items() if k != "unreachable")
    assert len(emitted["hypeman_vgpu_card_health"]["card"]) >= 2
