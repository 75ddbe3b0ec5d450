# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Property tests: hostile guest logs and cursor files never break the sentinel scan.

Hypothesis generates what a guest (log contents) or a broken host (log and
cursor kinds, cursor contents) can throw at the scan, between scans:
random bytes with and without markers, CR/LF mixes, lines around the 64 KiB
limit, markers cut across scans, copytruncate rotations, in-place
truncation, new boots, FIFOs/directories/symlinks in place of files, and
garbage, wrong-typed or deeply nested cursors. The properties:

* no exception: every case is a per-instance result (skip reason, rebuilt
  cursor with a warning);
* exactly once: over any sequence of appends, single rotations and scans,
  each complete marker line of the stream is counted by exactly one scan,
  including markers split across scan boundaries, and the verdict is the
  stream's last marker;
* idempotence: a rescan with nothing appended reads nothing and finds the same.

Example counts are small so the file runs in seconds; ``HYPOTHESIS_PROFILE=fuzz``
selects the long "fuzz" profile registered here.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import tempfile
import time

from hypothesis import given, strategies as st

from ansible_collections.hypeman.vgpu.plugins.module_utils import _sentinel
from ansible_collections.hypeman.vgpu.tests.sim import guestlog
from ansible_collections.hypeman.vgpu.tests.unit.plugins.module_utils.sentinel_host import SEC, MiniHost
from ansible_collections.hypeman.vgpu.tests.unit.hostile import property_settings, replace_with

MAX = _sentinel.MAX_LINE_BYTES
CLAIM_NS = (time.time_ns() // SEC - 3600) * SEC  # an hour ago: every file written now is newer
CLAIM_AT = guestlog.rfc3339nano(CLAIM_NS)


class Stream(object):
    """A MiniHost with one instance, the logical byte stream written to its console, and an oracle."""

    def __init__(self):
        self.root = tempfile.mkdtemp(prefix="sentinel-hostile-")
        self.host = MiniHost(self.root)
        self.app = self.host.instance("inst-a", claimed_at=CLAIM_AT)
        self.stream = b""
        self.markers = {}  # exact marker line (no terminator) -> (verdict, ts)
        self.counted = 0
        self.rotated_since_scan = False

    def close(self):
        shutil.rmtree(self.root, ignore_errors=True)

    def append(self, data):
        guestlog.append(self.app, data)
        self.stream += data

    def marker(self, verdict, offset_s, pad=0):
        """A marker line (bytes, no terminator) the oracle knows; ``pad`` lengthens a FAILED nvrm."""
        when = CLAIM_NS + offset_s * SEC
        if verdict == "ok":
            line = guestlog.ok_line(when)
        else:
            line = guestlog.failed_line(when, nvrm=guestlog.DEFAULT_NVRM + " " * pad)
        line = line.encode("utf-8")[:-1]
        self.markers[line] = (verdict, guestlog.rfc3339nano(when))
        return line

    def rotate(self):
        if self.rotated_since_scan:  # two rotations between scans may lose bytes (documented)
            self.scan()
        guestlog.copytruncate(self.app)
        self.rotated_since_scan = True

    def scan(self):
        report = self.host.scan()
        self.rotated_since_scan = False
        self.counted += sum(s["markers"] for s in report.scanned
                            if s["file"] in (self.app, self.app + ".1"))
        return report

    def expected(self):
        """Complete marker lines of the stream (hypeman: one trailing CR allowed, 64 KiB at most)."""
        found = []
        for line in self.stream.split(b"\n")[:-1]:
            bare = line[:-1] if line.endswith(b"\r") else line
            if bare in self.markers and len(line) + 1 <= MAX:  # the "\n" must fit too
                found.append(self.markers[bare])
        return found


_noise = st.one_of(
    st.binary(max_size=200),
    st.text(alphabet="ab [guest-agent]HYPEMAN-GPU-INIT-OK ts=\r\n\t\"\x00\xff", max_size=120).map(
        lambda text: text.encode("utf-8")),
)
_marker = st.tuples(st.sampled_from(["failed", "ok"]), st.integers(0, 10 ** 6), st.booleans())
_ops = st.lists(st.one_of(
    st.tuples(st.just("noise"), _noise),
    st.tuples(st.just("newline")),
    st.tuples(st.just("marker"), _marker),
    st.tuples(st.just("split"), _marker, st.integers(1, 150)),
    st.tuples(st.just("long"), st.integers(-3, 3)),  # a FAILED line around the 64 KiB limit
    st.tuples(st.just("overlong"), st.integers(1, 3 * MAX)),
    st.tuples(st.just("scan")),
    st.tuples(st.just("rotate")),
), max_size=14)


def _marker_bytes(stream, spec):
    verdict, offset_s, crlf = spec
    return stream.marker(verdict, offset_s) + (b"\r\n" if crlf else b"\n")


def _apply(stream, op):
    kind = op[0]
    if kind == "noise":
        stream.append(op[1])
    elif kind == "newline":
        stream.append(b"\n")
    elif kind == "marker":
        stream.append(_marker_bytes(stream, op[1]))
    elif kind == "split":
        data = _marker_bytes(stream, op[1])
        cut = min(op[2], len(data) - 1)
        stream.append(data[:cut])
        stream.scan()
        stream.append(data[cut:])
    elif kind == "long":
        base = len(stream.marker("failed", 1))
        line = stream.marker("failed", 1, pad=MAX - base + op[1])
        assert len(line) == MAX + op[1]
        stream.append(line + b"\n")
    elif kind == "overlong":
        stream.append(b"y" * op[1])
    elif kind == "scan":
        stream.scan()
    elif kind == "rotate":
        stream.rotate()


@property_settings(40)
@given(ops=_ops)
def test_every_complete_marker_is_counted_exactly_once_and_rescans_are_idempotent(ops):
    stream = Stream()
    try:
        stream.scan()  # the cursor exists before the first byte, as on a host scanned regularly
        for op in ops:
            _apply(stream, op)
        final = stream.scan()
        expected = stream.expected()
        assert stream.counted == len(expected)
        assert final.skipped == [] and final.warnings == []
        last = expected[-1] if expected else None
        assert [(f["verdict"], f["ts"]) for f in final.findings] == ([last] if last else [])
        again = stream.host.scan()
        assert [s["bytes_read"] for s in again.scanned] == [0]
        assert again.findings == final.findings and again.warnings == [] and again.unattributed == []
    finally:
        stream.close()


# --- the looser property: anything hostile, then calm -----------------------------------------


def _replace_app(stream, kind):
    how = {"directory": "dir"}.get(kind, kind)
    replace_with(stream.app, how, stream.host.metadata_path("inst-a") if how == "symlink" else b"")


def _restore_app(stream):
    if os.path.lexists(stream.app) and not (os.path.isfile(stream.app) and not os.path.islink(stream.app)):
        _replace_app(stream, "missing")
    if not os.path.exists(stream.app):
        with open(stream.app, "wb"):
            pass


_hostile_ops = st.lists(st.one_of(
    st.tuples(st.just("noise"), _noise),
    st.tuples(st.just("marker"), _marker),
    st.tuples(st.just("scan")),
    st.tuples(st.just("rotate")),
    st.tuples(st.just("double-rotate")),
    st.tuples(st.just("truncate"), st.integers(0, 400)),
    st.tuples(st.just("new-boot"), st.integers(1, 10 ** 5)),
    st.tuples(st.just("kind"), st.sampled_from(["fifo", "directory", "symlink", "dangling", "missing"])),
    st.tuples(st.just("restore")),
    st.tuples(st.just("cursor"), st.binary(max_size=64)),
), max_size=14)


def _apply_hostile(stream, op, seen_ts):
    kind = op[0]
    if kind in ("noise", "marker"):
        if not os.path.isfile(stream.app) or os.path.islink(stream.app):
            return
        data = op[1] if kind == "noise" else _marker_bytes(stream, op[1])
        guestlog.append(stream.app, data)
    elif kind == "scan":
        report = stream.host.scan()
        for finding in report.findings:  # only ever a marker the test wrote
            assert finding["ts"] in seen_ts()
        for skip in report.skipped:
            assert isinstance(skip["reason"], str) and skip["instance_id"] == "inst-a"
    elif kind in ("rotate", "double-rotate"):
        if os.path.isfile(stream.app) and not os.path.islink(stream.app):
            guestlog.copytruncate(stream.app)
            if kind == "double-rotate":
                guestlog.copytruncate(stream.app)
    elif kind == "truncate":
        if os.path.isfile(stream.app) and not os.path.islink(stream.app):
            with open(stream.app, "r+b") as handle:
                handle.truncate(min(op[1], os.path.getsize(stream.app)))
    elif kind == "new-boot":
        _restore_app(stream)
        guestlog.archive_previous_boot(stream.app, CLAIM_NS + op[1] * SEC)
        stream.host.instance("inst-a", claimed_at=guestlog.rfc3339nano(CLAIM_NS + op[1] * SEC))
    elif kind == "kind":
        _replace_app(stream, op[1])
    elif kind == "restore":
        _restore_app(stream)
    elif kind == "cursor":
        path = stream.host.cursor_path("inst-a")
        if os.path.isdir(os.path.dirname(path)):
            with open(path + ".new", "wb") as handle:
                handle.write(op[1])
            os.rename(path + ".new", path)


@property_settings(40)
@given(ops=_hostile_ops)
def test_hostile_logs_between_scans_give_clean_results_and_a_calm_rescan_finds_nothing_new(ops):
    stream = Stream()
    try:
        def seen_ts():
            return set(ts for _verdict, ts in stream.markers.values())

        for op in ops:
            _apply_hostile(stream, op, seen_ts)
        _restore_app(stream)
        settled = stream.host.scan()
        assert settled.skipped == [] or all(isinstance(s["reason"], str) for s in settled.skipped)
        again = stream.host.scan()
        assert again.skipped == [] and again.warnings == []
        assert [s["bytes_read"] for s in again.scanned] == [0]
        assert again.findings == stream.host.scan().findings
    finally:
        stream.close()


# --- hostile cursors ----------------------------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12)


def _paths(value, prefix=()):
    """Every key path into a JSON value (dicts only: that is where a cursor's fields are)."""
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _paths(child, prefix + (key,))


_cursor_content = st.one_of(
    st.tuples(st.just("bytes"), st.binary(max_size=300)),
    st.tuples(st.just("json"), _json),
    st.tuples(st.just("mutate"), st.integers(0, 10 ** 6), _json),
    st.tuples(st.just("deep"), st.integers(1000, 200000), st.sampled_from(["[", '{"a":'])),
    st.tuples(st.just("base64-partial"), st.binary(max_size=80)),
    st.tuples(st.just("kind"), st.sampled_from(["fifo", "directory", "dangling", "symlink"])),
)


def _write_cursor(stream, content):
    path = stream.host.cursor_path("inst-a")
    with open(path) as handle:
        state = json.load(handle)
    kind = content[0]
    data = None
    if kind == "bytes":
        data = content[1]
    elif kind == "json":
        data = json.dumps(content[1]).encode("utf-8", "surrogatepass")
    elif kind == "mutate":
        paths = list(_paths(state))[1:]
        target = paths[content[1] % len(paths)]
        node = state
        for key in target[:-1]:
            node = node[key]
        node[target[-1]] = content[2]
        data = json.dumps(state).encode("utf-8", "surrogatepass")
    elif kind == "deep":
        data = content[2].encode("ascii") * content[1]
    elif kind == "base64-partial":  # a valid cursor whose line in progress is anything
        state["log"]["partial"] = base64.b64encode(content[1]).decode("ascii")
        data = json.dumps(state).encode("utf-8")
    os.unlink(path)
    if data is not None:
        with open(path, "wb") as handle:
            handle.write(data)
    elif content[1] == "fifo":
        os.mkfifo(path)
    elif content[1] == "directory":
        os.mkdir(path)
    elif content[1] == "dangling":
        os.symlink("/nonexistent", path)
    else:
        os.symlink(stream.app, path)


@property_settings(60)
@given(content=_cursor_content, noise=_noise)
def test_hostile_cursor_never_breaks_the_scan_nor_hides_new_evidence(content, noise):
    stream = Stream()
    try:
        stream.append(noise + b"\n" + stream.marker("failed", 27) + b"\n")
        stream.scan()
        _write_cursor(stream, content)
        report = stream.host.scan()
        is_dir = content == ("kind", "directory")
        if is_dir:
            assert [s["reason"] for s in report.skipped] == [
                "sentinel cursor %s is a directory, not a file; remove it" % stream.host.cursor_path("inst-a")]
            os.rmdir(stream.host.cursor_path("inst-a"))
        else:
            assert report.skipped == []
            with open(stream.host.cursor_path("inst-a"), "rb") as handle:  # ours again: a valid regular file
                assert _sentinel.valid_state(json.loads(handle.read()), "inst-a")
        # Whatever the cursor said, evidence written after it is found.
        stream.append(b"\n" + stream.marker("ok", 90) + b"\n")
        later = stream.host.scan()
        assert [(f["verdict"], f["ts"]) for f in later.findings] == [("ok", guestlog.rfc3339nano(CLAIM_NS + 90 * SEC))]
        again = stream.host.scan()
        assert [s["bytes_read"] for s in again.scanned] == [0] and again.warnings == []
        assert again.findings == later.findings
    finally:
        stream.close()
