# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_metrics: hypeman's Prometheus endpoint read with bounds, parsed strictly, compared between samples."""

from __future__ import annotations

import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ansible_collections.hypeman.vgpu.plugins.module_utils import _metrics
from ansible_collections.hypeman.vgpu.tests.sim import metrics as sim_metrics

settings.register_profile("metrics-quick", max_examples=80, deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
settings.register_profile("fuzz", max_examples=3000, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or "metrics-quick")


def _counters(checks=None, failures=0, quarantines=0):
    counters = sim_metrics.SentinelCounters()
    counters.checks.update(checks or {})
    counters.init_failures, counters.quarantines = failures, quarantines
    return counters


def test_hypemans_exposition_gives_the_sentinel_sample():
    text = sim_metrics.render(_counters({"ok": 7, "rpc_error": 2}, 3, 1), "v0.9.1", 120.5, 2, False)
    sample = _metrics.sentinel_sample(_metrics.parse(text), taken_at=1.0)
    assert sample == {"taken_at": 1.0, "version": "v0.9.1", "uptime_seconds": 120.5,
                      "checks": {"ok": 7.0, "rpc_error": 2.0}, "init_failures": 3.0, "quarantines": 1.0,
                      "quarantined_vfs": 2.0, "store_unavailable": 0.0}


def test_a_marker_era_exposition_has_no_check_counter():
    text = sim_metrics.render(_counters(), "v0.5.0", 10, 0, False, vsock=False)
    sample = _metrics.sentinel_sample(_metrics.parse(text))
    assert sample["checks"] is None and sample["init_failures"] is None and sample["quarantined_vfs"] == 0


def test_labels_with_escapes_and_timestamps_parse():
    text = ('hypeman_info{service_version="a\\"b\\\\c\\nd",x="}"} 1 1700000000000\n'
            'hypeman_uptime_seconds +Inf\n# EOF\n')
    families = _metrics.parse(text)
    assert families["hypeman_info"] == [({"service_version": 'a"b\\c\nd', "x": "}"}, 1.0)]


@pytest.mark.parametrize("line", [
    "hypeman_info{service_version=\"x} 1", "hypeman_info 1 2 3", "9bad 1", "hypeman_info{a=b} 1",
    "hypeman_info notanumber", "hypeman_info{a=\"1\" b=\"2\"} 1", "<html>", "hypeman_info{a=\"\\q\"} 1",
    # Python's float() takes these, Go's ParseFloat does not; a label or a series twice is no exposition.
    "hypeman_info 1_000", "hypeman_info \u0661\u0662", "hypeman_info{a=\"1\",a=\"2\"} 1",
    "hypeman_info{a=\"1\"} 1\nhypeman_info{a=\"1\"} 2"])
def test_a_malformed_line_is_an_error_naming_it(line):
    with pytest.raises(_metrics.MetricsError, match="line %d" % (2 + line.count("\n"))):
        _metrics.parse("# TYPE hypeman_info gauge\n" + line + "\n")


def test_blanks_before_a_line_are_allowed():
    text = "  # HELP hypeman_uptime_seconds up\n\thypeman_uptime_seconds 5\n"
    assert _metrics.parse(text)["hypeman_uptime_seconds"] == [({}, 5.0)]


@given(st.text(max_size=2000))
def test_any_text_parses_or_fails_with_metrics_error(text):
    try:
        families = _metrics.parse(text)
    except _metrics.MetricsError as err:
        assert str(err)
    else:
        try:
            _metrics.sentinel_sample(families)
        except _metrics.MetricsError as err:  # a value no count can have (+Inf, -1, 2.5): named
            assert str(err).startswith(("series ", "the values of "))


_COUNTS = st.dictionaries(st.sampled_from(_metrics.CHECK_RESULTS), st.integers(1, 50), max_size=6)


@given(_COUNTS, st.integers(0, 5), st.integers(0, 5), st.integers(0, 64), st.booleans(),
       st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF, blacklist_characters='"\\'), max_size=20))
def test_rendered_counters_round_trip(checks, failures, quarantines, quarantined, unavailable, version):
    text = sim_metrics.render(_counters(checks, failures, quarantines), version, 5, quarantined, unavailable)
    sample = _metrics.sentinel_sample(_metrics.parse(text))
    assert sample["checks"] == (dict((k, float(v)) for k, v in checks.items()) or None)
    assert sample["init_failures"] == (failures or None) and sample["quarantines"] == (quarantines or None)
    assert sample["quarantined_vfs"] == quarantined and sample["store_unavailable"] == (1 if unavailable else 0)
    assert sample["version"] == version or (version == "" and sample["version"] is None)


def test_too_many_series_is_an_error():
    with pytest.raises(_metrics.MetricsError, match="more than 3 series"):
        _metrics.parse("a 1\nb 1\nc 1\nd 1\n", max_series=3)


# --- fetching: every hostile endpoint is an error, within the deadline ------------------------


class _Server(object):
    def __init__(self, behaviour):
        behaviour_of = behaviour

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):  # noqa: N802
                behaviour_of(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.url = "http://127.0.0.1:%d/metrics" % self.httpd.server_address[1]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _answer(body, status=200):
    def behaviour(handler):
        handler.send_response(status)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)
    return behaviour


def _endless(handler):
    handler.send_response(200)
    handler.end_headers()
    try:
        while True:
            handler.wfile.write(b"hypeman_info 1\n" * 4096)
    except OSError:
        pass


def _trickle(handler):
    handler.send_response(200)
    handler.send_header("Content-Length", "100000")
    handler.end_headers()
    try:
        for _count in range(100000):
            handler.wfile.write(b"#")
            handler.wfile.flush()
            time.sleep(0.05)
    except OSError:
        pass


@pytest.mark.parametrize("behaviour, words", [
    (_answer(sim_metrics.render(_counters({"ok": 1}), "v1", 1, 0, False).encode()), None),
    (_answer(b"not metrics at all\n"), "not Prometheus metrics: line 1"),
    (_answer(b"\xff\xfe garbage"), "not UTF-8"),
    (_answer(b"oops", 500), "HTTP 500"),
    (_answer(b"", 404), "HTTP 404"),
    (_endless, "larger than"),
    (_trickle, "within 1 seconds"),
])
def test_hostile_endpoints_give_an_error_in_words_within_the_deadline(behaviour, words, monkeypatch):
    monkeypatch.setattr(_metrics, "RESPONSE_LIMIT", 256 * 1024)
    server = _Server(behaviour)
    try:
        done = []
        worker = threading.Thread(target=lambda: done.append(_metrics.read_sentinel_metrics(server.url, 1)))
        worker.start()
        worker.join(30)  # a hang detector, not a timing assertion
        assert done, "read_sentinel_metrics hung"
        result = done[0]
    finally:
        server.close()
    if words is None:
        assert result["error"] is None and result["sample"]["checks"] == {"ok": 1.0}
    else:
        assert words in result["error"] and server.url in result["error"] and result["sample"] is None


def test_nothing_listening_and_bad_urls_are_errors():
    assert "Connection refused" in _metrics.read_sentinel_metrics("http://127.0.0.1:9/metrics", 2)["error"]
    for url in ("file:///etc/passwd", "ftp://x/", "http://", "http://a b/", "http://h/\x00", 5):
        assert "not an http:// or https:// URL" in _metrics.fetch(url)["error"]


# --- coverage lost ----------------------------------------------------------------------------


def _sample(checks, uptime=100.0, taken_at=1000.0):
    return {"taken_at": taken_at, "version": "v", "uptime_seconds": uptime, "checks": checks, "init_failures": None,
            "quarantines": None, "quarantined_vfs": 0, "store_unavailable": 0}


def test_growing_blind_checks_are_coverage_lost():
    previous = _sample({"ok": 10, "rpc_error": 1})
    current = _sample({"ok": 20, "rpc_error": 4, "unsupported_agent": 2}, uptime=160)
    assert _metrics.coverage_problems(previous, current, 2) == [
        "3 rpc_error check(s) since the previous sample", "2 unsupported_agent check(s) since the previous sample"]


def test_checks_that_stop_while_guests_run_are_coverage_lost_and_idle_hosts_are_not():
    previous, current = _sample({"ok": 10}), _sample({"ok": 10}, uptime=200)
    assert _metrics.coverage_problems(previous, current, 1) == [
        "no sentinel check in 100 s although 1 instance(s) hold a vendor-VFIO vGPU"]
    assert _metrics.coverage_problems(previous, current, 0) == []
    assert _metrics.coverage_problems(previous, _sample({"ok": 10}, uptime=105), 1) == []  # too soon to tell
    assert _metrics.coverage_problems(previous, _sample(None, uptime=200), 3)[0].startswith("hypeman no longer")


def test_a_restart_resets_the_counters_without_a_false_alarm():
    previous = _sample({"ok": 500, "rpc_error": 9}, uptime=5000)
    assert _metrics.coverage_problems(previous, _sample({"ok": 12}, uptime=60), 2) == []
    assert _metrics.coverage_problems(previous, _sample({"ok": 12, "rpc_error": 1}, uptime=60), 2) == [
        "1 rpc_error check(s) since the previous sample"]


def test_counter_growth_counts_from_zero_after_a_restart():
    previous = dict(_sample({"ok": 500}, uptime=5000), init_failures=7, quarantines=None)
    assert _metrics.counter_growth(previous, dict(_sample({"ok": 520}, uptime=5100), init_failures=9), "init_failures") == 2
    restarted = dict(_sample({"ok": 3}, uptime=60), init_failures=1, quarantines=1)
    assert _metrics.restarted(previous, restarted)
    assert _metrics.counter_growth(previous, restarted, "init_failures") == 1
    assert _metrics.counter_growth(previous, restarted, "quarantines") == 1  # None before counts as 0


@given(st.integers(0, 10**6), st.integers(0, 10**6), st.floats(0, 1e6), st.floats(0, 1e6))
def test_counter_growth_is_the_difference_or_the_new_value_after_a_restart(old, new, old_up, new_up):
    previous, current = (dict(_sample({"ok": 1}, old_up), init_failures=old),
                         dict(_sample({"ok": 1}, new_up), init_failures=new))
    growth = _metrics.counter_growth(previous, current, "init_failures")
    assert growth == (new if new_up < old_up or new < old else new - old) and growth >= 0


def test_a_counter_that_went_down_is_a_restart_even_when_the_uptime_went_up():
    # hypeman restarted and has run longer since than it had before: the uptime alone missed it,
    # the lost rpc_error checks were not reported and growth came out negative.
    previous = dict(_sample({"ok": 40, "rpc_error": 5}, uptime=100), init_failures=4, quarantines=2)
    current = dict(_sample({"ok": 180, "rpc_error": 3}, uptime=950), init_failures=1, quarantines=1)
    assert _metrics.restarted(previous, current)
    assert _metrics.coverage_problems(previous, current, 1) == ["3 rpc_error check(s) since the previous sample"]
    assert _metrics.counter_growth(previous, current, "init_failures") == 1
    assert _metrics.counter_growth(previous, current, "quarantines") == 1
    marker_era = dict(current, uptime_seconds=None, checks=None)
    assert _metrics.counter_growth(dict(previous, uptime_seconds=None, checks=None), marker_era, "init_failures") == 1


def test_no_previous_sample_cannot_tell():
    assert _metrics.coverage_problems(None, _sample({"rpc_error": 100}), 5) == []


@given(st.dictionaries(st.sampled_from(_metrics.CHECK_RESULTS), st.integers(0, 1000), max_size=6),
       st.dictionaries(st.sampled_from(_metrics.CHECK_RESULTS), st.integers(0, 1000), max_size=6),
       st.floats(0, 1e6), st.floats(0, 1e6), st.one_of(st.none(), st.integers(0, 10)))
def test_coverage_rules_never_fail_and_only_blame_blind_growth_or_silence(old, new, old_up, new_up, targets):
    problems = _metrics.coverage_problems(_sample(old, old_up), _sample(new, new_up), targets)
    for problem in problems:
        assert any(result in problem for result in _metrics.BLIND_RESULTS) or "no sentinel check" in problem \
            or "no longer exports" in problem


@pytest.mark.parametrize("data", [b"", b"[]", b"{}", b'{"taken_at": "x"}', b"\xff", b"[" * 100000,
                                  b'{"taken_at": 1, "checks": {"ok": "1"}}', b'{"taken_at": 1, "checks": []}'])
def test_a_bad_previous_sample_is_ignored_with_a_reason(data):
    sample, error = _metrics.decode_sample(data)
    assert sample is None and error


def test_a_sample_survives_its_own_json():
    import json
    sample = _metrics.sentinel_sample(_metrics.parse(
        sim_metrics.render(_counters({"ok": 2}), "v", 3, 1, False)))
    assert _metrics.decode_sample(json.dumps(sample).encode()) == (sample, None)
