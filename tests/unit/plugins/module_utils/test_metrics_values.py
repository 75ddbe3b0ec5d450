# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_metrics: sample values read as Go's ParseFloat reads them; a value no count can have is unreadable
metrics (named), never an OverflowError in the audit or an Infinity in its result."""

from __future__ import annotations

import json
import math
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import given, strategies as st

from ansible_collections.hypeman.vgpu.plugins.module_utils import _audit, _metrics
from ansible_collections.hypeman.vgpu.tests.sim.hosttree import HostTree
from ansible_collections.hypeman.vgpu.tests.unit.hostile import property_settings

COUNTS = (_metrics.CHECKS, _metrics.INIT_FAILURES, _metrics.QUARANTINES, _metrics.QUARANTINED_VFS,
          _metrics.STORE_UNAVAILABLE)


def _value(text):
    (value,) = [v for _labels, v in _metrics.parse("%s %s\n" % (_metrics.UPTIME, text))[_metrics.UPTIME]]
    return value


# Go's strconv.ParseFloat specials: inf/infinity in any ASCII case with an optional sign, nan without one.
@pytest.mark.parametrize("text, expected", [
    ("inf", math.inf), ("Inf", math.inf), ("+Inf", math.inf), ("-Inf", -math.inf), ("INF", math.inf),
    ("infinity", math.inf), ("Infinity", math.inf), ("+Infinity", math.inf), ("-infinity", -math.inf),
    ("iNfInItY", math.inf), ("-INFINITY", -math.inf),
    ("1.", 1.0), (".5", 0.5), ("+1", 1.0), ("-0", 0.0), ("1E5", 1e5), ("007", 7.0), ("1e-400", 0.0),
    ("1.7976931348623157e308", 1.7976931348623157e308),
])
def test_values_go_reads_are_read(text, expected):
    assert _value(text) == expected


@pytest.mark.parametrize("text", ["nan", "NaN", "NAN", "nAn"])
def test_nan_in_any_case_is_read(text):
    assert math.isnan(_value(text))


@pytest.mark.parametrize("text", [
    "+nan", "-NaN", "infin", "infinit", "infinityy", "in", "+", "-", "inf1", "++inf",
    "0x10", "0x1p3", "1p3", "1_000", "1e", "e5", ".", "1e+", "\u0131nf", "\u0130nf", "\u221e", "Inf\u0131nity",
    "1e400", "-1e400", "1.8e308"])
def test_values_go_refuses_are_errors_naming_the_line(text):
    with pytest.raises(_metrics.MetricsError, match="line 1: value "):
        _value(text)


# --- a value no count can have --------------------------------------------------------------------


def _sample(text):
    return _metrics.sentinel_sample(_metrics.parse(text))


@pytest.mark.parametrize("series", COUNTS)
@pytest.mark.parametrize("value, shown", [("+Inf", "+Inf"), ("-Inf", "-Inf"), ("Infinity", "+Inf"), ("-1", "-1.0"),
                                          ("2.5", "2.5")])
def test_a_count_that_is_not_a_whole_number_of_0_or_more_is_refused_by_name(series, value, shown):
    labels = '{result="rpc_error"}' if series == _metrics.CHECKS else ""
    with pytest.raises(_metrics.MetricsError) as caught:
        _sample("%s%s %s\n%s 100\n" % (series, labels, value, _metrics.UPTIME))
    assert str(caught.value) == "series %s%s has the value %s; expected a finite count (a whole number, 0 or more)" % (
        series, labels, shown)


@pytest.mark.parametrize("value", ["+Inf", "-inf", "-0.5"])
def test_an_uptime_that_is_infinite_or_negative_is_refused_and_a_fraction_is_not(value):
    with pytest.raises(_metrics.MetricsError, match="series hypeman_uptime_seconds has the value"):
        _sample("%s %s\n" % (_metrics.UPTIME, value))
    assert _sample("%s 2.5\n" % _metrics.UPTIME)["uptime_seconds"] == 2.5


def test_nan_is_still_skipped_and_a_sum_past_float64_is_refused():
    assert _sample('%s{result="ok"} NaN\n%s{result="ok",x="1"} 3\n' % (_metrics.CHECKS, _metrics.CHECKS))[
        "checks"] == {"ok": 3.0}
    with pytest.raises(_metrics.MetricsError, match="values of %s add up" % _metrics.QUARANTINES):
        _sample('%s{a="1"} 1e308\n%s{a="2"} 1e308\n' % (_metrics.QUARANTINES, _metrics.QUARANTINES))


@pytest.mark.parametrize("data", [
    b'{"taken_at": 1' + b"0" * 400 + b"}",  # past float64: math.isfinite raised OverflowError
    b'{"taken_at": 1, "checks": {"rpc_error": -1e308}}', b'{"taken_at": 1, "quarantined_vfs": 2.5}',
    b'{"taken_at": 1, "uptime_seconds": -1}', b'{"taken_at": 1, "init_failures": 1' + b"0" * 400 + b"}"])
def test_a_stored_sample_sentinel_sample_cannot_give_is_ignored(data):
    sample, error = _metrics.decode_sample(data)
    assert sample is None and error == "not a sentinel metrics sample"


# --- the audit: metrics_unreadable, everything else still answered --------------------------------


class _Server(object):
    def __init__(self, text):
        body = text.encode()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):  # noqa: N802 (http.server's naming)
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = "http://127.0.0.1:%d/metrics" % self.httpd.server_address[1]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def tree(tmp_path):
    tree = HostTree(tmp_path / "host")
    tree.add_card("A100", "0000:82:00.0")
    tree.write_config(threshold=2)
    tree.write_store([{"vf_address": "0000:82:00.4", "quarantined_at": "2026-08-22T00:00:00Z"}])
    return tree


def _audit_with(tree, text, previous=None):
    if previous is not None:
        os.makedirs(tree.state_dir, exist_ok=True)
        with open(os.path.join(tree.state_dir, _metrics.SAMPLE_FILE), "w") as handle:
            json.dump(previous, handle)
    paths = _audit.Paths(tree.data_dir, tree.store_path, tree.sysfs_root, tree.proc_root, tree.dev_root,
                         tree.state_dir, tree.config_path)
    with _Server(text) as server:
        result, _warnings = _audit.audit_host(paths, hypeman_expected=False, metrics={"url": server.url, "timeout": 5})
    json.dumps(result, allow_nan=False)  # no Infinity reaches the result
    return result, server.url


@pytest.mark.parametrize("text, previous, named", [
    # hypeman's quarantined-VF gauge at +Inf: classify's int() raised OverflowError
    ('%s{otel_scope_name="x"} +Inf\n%s 100\n' % (_metrics.QUARANTINED_VFS, _metrics.UPTIME), None,
     '%s{otel_scope_name="x"} has the value +Inf' % _metrics.QUARANTINED_VFS),
    # a blind check counter at +Inf with a kept sample: coverage_problems' "%d" raised OverflowError
    ('%s{result="rpc_error"} +Inf\n%s 100\n' % (_metrics.CHECKS, _metrics.UPTIME),
     {"taken_at": 1000, "uptime_seconds": 10, "checks": {"rpc_error": 1}},
     '%s{result="rpc_error"} has the value +Inf' % _metrics.CHECKS),
    ("%s Infinity\n" % _metrics.UPTIME, None, "%s has the value +Inf" % _metrics.UPTIME),
])
def test_an_unusable_value_is_metrics_unreadable_and_the_audit_still_answers(tree, text, previous, named):
    result, url = _audit_with(tree, text, previous)
    metrics = result["metrics"]
    assert metrics["sample"] is None and metrics["error"].startswith("GET %s: not hypeman's sentinel metrics: " % url)
    assert named in metrics["error"]
    (unreadable,) = [i for i in result["issues"] if i["code"] == "metrics_unreadable"]
    assert unreadable["message"] == metrics["error"]
    assert result["store"]["quarantined"] == ["0000:82:00.4"] and result["placement"] is not None
    assert result["errors"] == []


_SPECIALS = st.sampled_from(["+Inf", "-Inf", "Infinity", "-infinity", "NaN", "1e308", "-1", "0.5", "3"])
_NUMBERS = st.floats(allow_nan=False, allow_infinity=False).map(repr)


@property_settings(30)
@given(st.dictionaries(st.sampled_from(COUNTS + (_metrics.UPTIME,)), st.one_of(_SPECIALS, _NUMBERS), min_size=1),
       st.integers(0, 5))
def test_any_value_gives_a_usable_sample_or_a_named_error(values, targets):
    text = "".join('%s{result="rpc_error"} %s\n' % (name, value) if name == _metrics.CHECKS else
                   "%s %s\n" % (name, value) for name, value in values.items())
    try:
        sample = _sample(text)
    except _metrics.MetricsError as err:
        assert str(err).startswith(("series ", "the values of ", "line "))
        return
    assert _metrics.valid_sample(sample)
    json.dumps(sample, allow_nan=False)
    previous = {"taken_at": 0.0, "uptime_seconds": 1.0, "checks": {"rpc_error": 0.0}}
    _metrics.coverage_problems(previous, sample, targets)  # the "%d" formats hold
    if sample["quarantined_vfs"] is not None:
        int(sample["quarantined_vfs"])
