# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Sentinel marker matching and block reading (hypeman's anchored L1 patterns)."""

from __future__ import annotations

import tracemalloc

import pytest

from ansible_collections.hypeman.vgpu.plugins.module_utils import _sentinel
from ansible_collections.hypeman.vgpu.tests.sim import guestlog

T0 = 1787411045123456789  # 2026-08-22T15:04:05.123456789Z
TS0 = "2026-08-22T15:04:05.123456789Z"
NVRM = guestlog.DEFAULT_NVRM


def _line(text):
    return text.rstrip("\n").encode("utf-8")


def test_failed_marker_matches_with_exact_fields():
    marker = _sentinel.match_marker(_line(guestlog.failed_line(T0)))
    assert (marker.verdict, marker.ts, marker.nvrm) == ("failed", TS0, NVRM)


def test_ok_marker_matches_with_exact_fields():
    marker = _sentinel.match_marker(_line(guestlog.ok_line(T0)))
    assert (marker.verdict, marker.ts, marker.nvrm) == ("ok", TS0, None)


def test_reference_example_line_matches():
    # The example from docs/hypeman-interface.md §5.1, verbatim.
    line = (b'2026/08/20 15:04:05 [guest-agent] HYPEMAN-GPU-INIT-FAILED ts=2026-08-20T15:04:05.123456789Z '
            b'nvrm="NVRM: GPU 0000:e3:00.4: RmInitAdapter failed! (0x22:0x65:884)"')
    marker = _sentinel.match_marker(line)
    assert marker.ts == "2026-08-20T15:04:05.123456789Z"
    assert marker.nvrm == "NVRM: GPU 0000:e3:00.4: RmInitAdapter failed! (0x22:0x65:884)"


def test_one_trailing_carriage_return_is_allowed_like_hypeman():
    assert _sentinel.match_marker(_line(guestlog.ok_line(T0)) + b"\r").verdict == "ok"
    assert _sentinel.match_marker(_line(guestlog.ok_line(T0)) + b"\r\r") is None


@pytest.mark.parametrize("name", sorted(guestlog.forged_lines(T0)))
def test_forged_and_malformed_lines_never_match(name):
    assert _sentinel.match_marker(_line(guestlog.forged_lines(T0)[name])) is None


@pytest.mark.parametrize("line", [
    b"\x00\xff\xfe HYPEMAN-GPU-INIT-FAILED \x00",
    b"2026/08/22 15:04:05 [guest-agent] HYPEMAN-GPU-INIT-OK ts=" + b"\xff" * 3 + b" ",
    b"2026/8/22 15:04:05 [guest-agent] HYPEMAN-GPU-INIT-OK ts=" + TS0.encode(),
    b"\x002026/08/22 15:04:05 [guest-agent] HYPEMAN-GPU-INIT-OK ts=" + TS0.encode(),
])
def test_binary_garbage_never_matches(line):
    assert _sentinel.match_marker(line) is None


def test_ts_uses_go_whitespace_class():
    # Go's \S excludes only \t \n \f \r and space: a \v inside ts still matches there.
    line = b"2026/08/22 15:04:05 [guest-agent] HYPEMAN-GPU-INIT-OK ts=a\x0bb"
    assert _sentinel.match_marker(line).ts == "a\x0bb"


def test_nul_in_ts_matches_like_hypeman_but_is_no_time():
    # hypeman's ts=\S+ accepts any non-space byte; attribution later refuses the ts.
    line = b"2026/08/22 15:04:05 [guest-agent] HYPEMAN-GPU-INIT-OK ts=" + TS0.encode() + b"\x00"
    assert _sentinel.match_marker(line).ts == TS0 + "\x00"


def test_line_length_limit_is_64_kib_including_the_newline():
    # hypeman reads lines with bufio.Reader.ReadSlice on a 64 KiB buffer: the line
    # and its "\n" must fit, so the text of a counted line is at most 65,535 bytes.
    head = b"2026/08/22 15:04:05 [guest-agent] HYPEMAN-GPU-INIT-FAILED ts=" + TS0.encode() + b' nvrm="NVRM: '
    tail = b' RmInitAdapter failed!"'
    fill = _sentinel.MAX_LINE_BYTES - 1 - len(head) - len(tail)
    at_limit = head + b"x" * fill + tail
    assert len(at_limit + b"\n") == 64 * 1024
    assert _sentinel.match_marker(at_limit).verdict == "failed"
    assert _sentinel.match_marker(head + b"x" * (fill + 1) + tail) is None  # 65,536 bytes + "\n": skipped
    with_cr = head + b"x" * (fill - 1) + tail + b"\r"  # the CR counts too
    assert _sentinel.match_marker(with_cr).verdict == "failed"
    assert _sentinel.match_marker(head + b"x" * fill + tail + b"\r") is None
    for line, found in ((at_limit, 1), (head + b"x" * (fill + 1) + tail, 0)):
        assert len(_feed_all(line + b"\n" + line[:10], 4096).markers) == found


def _feed_all(data, block):
    reader = _sentinel.MarkerReader()
    for start in range(0, len(data), block):
        chunk = data[start:start + block]
        buf = bytearray(block)
        buf[:len(chunk)] = chunk
        reader.feed(buf, len(chunk))
    return reader


STREAM = (guestlog.noise(40, seed=3) + guestlog.report("failed", T0) + "junk " * 30 + "\n"
          + guestlog.forged_lines(T0)["mid_line"] + guestlog.report("ok", T0 + 10 ** 9)
          + guestlog.noise(5, seed=4)).encode("utf-8")


@pytest.mark.parametrize("block", [1, 2, 3, 5, 16, 17, 18, 100, 4096, len(STREAM)])
def test_block_size_never_changes_what_is_found(block):
    reader = _feed_all(STREAM, block)
    assert [(m.verdict, m.ts) for m in reader.markers] == [("failed", TS0)] * 3 + [
        ("ok", "2026-08-22T15:04:06.123456789Z")] * 3


def test_marker_split_at_every_position_is_found_once():
    line = guestlog.ok_line(T0).encode("utf-8")
    data = b"boot\n" + line + b"after\n"
    for cut in range(1, len(data)):
        reader = _sentinel.MarkerReader()
        first, second = bytearray(data[:cut]), bytearray(data[cut:])
        reader.feed(first, len(first))
        reader.feed(second, len(second))
        assert len(reader.markers) == 1, cut


def test_unterminated_last_line_is_not_a_complete_line():
    line = guestlog.ok_line(T0).encode("utf-8")
    reader = _sentinel.MarkerReader()
    buf = bytearray(b"boot\n" + line[:-1])  # no newline yet
    reader.feed(buf, len(buf))
    assert reader.markers == []
    assert reader.partial == line[:-1]
    reader.feed(bytearray(b"\n"), 1)
    assert [m.verdict for m in reader.markers] == ["ok"]


def test_overlong_line_is_skipped_and_the_next_line_still_counts():
    good = guestlog.failed_line(T0).encode("utf-8")
    # A marker-shaped line padded past the limit, then a real one.
    data = b"x" * (_sentinel.MAX_LINE_BYTES + 10) + good + good
    reader = _feed_all(data, 4096)
    assert len(reader.markers) == 1
    assert reader.partial == b"" and reader.overlong is False


def test_ten_megabyte_line_is_never_held_in_memory():
    block = 1 << 20
    filler = bytearray(b"A" * block)
    reader = _sentinel.MarkerReader()
    tracemalloc.start()
    try:
        for _block in range(10):
            reader.feed(filler, block)
            assert len(reader.partial) <= _sentinel.MAX_LINE_BYTES
        end = bytearray(b"tail HYPEMAN-GPU-INIT-OK\n" + guestlog.ok_line(T0).encode("utf-8"))
        reader.feed(end, len(end))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [m.verdict for m in reader.markers] == ["ok"]
    assert peak < 512 * 1024  # the carried line is bounded by 64 KiB, not 10 MB
