# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""tests/browser/check_report.py's page checks catch what they are for (without a browser: on the page text)."""

from __future__ import annotations

import json
import re

import pytest

from ansible_collections.hypeman.vgpu.plugins.plugin_utils import fleet_pictures as fp
from ansible_collections.hypeman.vgpu.plugins.plugin_utils import fleet_report as fr
from ansible_collections.hypeman.vgpu.tests.browser import check_report
from ansible_collections.hypeman.vgpu.tests.unit.plugins.plugin_utils.test_fleet_pictures import _report


@pytest.fixture
def report():
    built = _report({"a": (["q1", "q2", "q3"], ["overflow_only", "healthy", "ready_for_cycle"]), "b": None,
                     "c": ([], ["healthy", "below_threshold"])})
    fp.attach_history(built, "/nonexistent/hypeman-vgpu-test", 5)
    return json.loads(fr.to_json(built))


def failures(page_text, report, no_css=False):
    del check_report.FAILURES[:]
    page = check_report.parse(page_text)
    (check_report.check_without_css if no_css else check_report.check_page)(page, report, "test")
    return list(check_report.FAILURES)


def test_a_correct_page_passes(report):
    page = fr.render_html(report)
    assert failures(page, report) == []
    assert failures(check_report.strip_css(page), report, no_css=True) == []


@pytest.mark.parametrize("break_it, expected", [
    (lambda p: re.sub(r'<li class="cell[^>]*data-card="0000:81:00.0".*?</li>', "", p, count=1), "map cells"),
    (lambda p: p.replace("16 VFs, 3 quarantined", "16 VFs, 4 quarantined", 1), "hover numbers"),
    (lambda p: p.replace('data-state="ready_for_cycle"', 'data-state="healthy"', 1), "the report says"),
    (lambda p: p.replace("<span class=\"vh\"> 0000:80:00.0: overflow-only", "<span class=\"vh\"> 0000:80:00.0: ", 1),
     "beside its colour"),
    (lambda p: re.sub(r'(data-card="[^"]*" title="[^"]*"><a href=")#host-[0-9]+', r"\1#nowhere", p, count=1),
     "no section"),
    (lambda p: p.replace("</head>", "<script src=\"https://cdn.example/x.js\"></script></head>"), "outside itself"),
    (lambda p: p.replace("<th>Fleet</th><td>80</td>", "<th>Fleet</th><td>79</td>"), "capacity fleet row"),
    (lambda p: p.replace("first audit in the history", "first audit"), "what changed"),
])
def test_a_broken_page_fails(report, break_it, expected):
    page = fr.render_html(report)
    broken = break_it(page)
    assert broken != page, expected
    assert any(expected in failure for failure in failures(broken, report)), failures(broken, report)


def test_a_map_that_needs_css_fails_without_it(report):
    page = check_report.strip_css(fr.render_html(report))
    broken = re.sub(r'<span class="vh">[^<]*</span>', "", page)
    assert any("is not in the map's text" in f for f in failures(broken, report, no_css=True))
