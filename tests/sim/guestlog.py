# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Test equipment: guest serial-console output as hypeman's guest agent writes it.

The marker lines follow docs/hypeman-interface.md §5.1 byte for
byte: Go's default logger prefix ``YYYY/MM/DD HH:MM:SS ``, ``[guest-agent]``,
the marker, its fields, one newline; every report printed three times with the
same ``ts``. Noise lines imitate a booting Linux guest and a chatty workload.
Unit tests, the integration target, the benchmark and the simulator share these
helpers. Standard library only, and deliberately independent of the
collection's own code so that it can serve as an oracle for it.

CLI (integration targets, the simulator)::

    python3 -m tests.sim.guestlog report --path APP_LOG --verdict failed --ts-ns N [--noise 20]
    python3 -m tests.sim.guestlog forge --path APP_LOG --ts-ns N
    python3 -m tests.sim.guestlog copytruncate --path APP_LOG
    python3 -m tests.sim.guestlog archive --path APP_LOG [--ts-ns N]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

REPORT_REPEATS = 3  # gpuReportRepeats in the guest agent
DEFAULT_NVRM = "NVRM: GPU 0000:00:03.0: RmInitAdapter failed! (0x22:0x65:884)"

_NOISE = (
    "[    0.000000] Linux version 6.1.0-18-amd64 (debian-kernel@lists.debian.org)",
    "[    0.412345] pci 0000:00:03.0: [10de:26b9] type 00 class 0x030200",
    "[    1.234567] systemd[1]: Started Journal Service.",
    "[    2.345678] nvidia: loading out-of-tree module taints kernel.",
    "[   27.101112] NVRM: GPU 0000:00:03.0: RmInitAdapter failed! (0x22:0x65:884)",
    "{\"level\":\"info\",\"msg\":\"request handled\",\"path\":\"/v1/infer\",\"status\":200}",
    "worker 3: batch 1882 done in 41.7ms (tokens=512, gpu_util=0.93)",
    "2026-08-20 15:04:07,123 INFO train.py:88 epoch=3 step=1200 loss=0.4321",
    "INFO: 10.0.0.7:53422 - \"GET /healthz HTTP/1.1\" 200 OK",
    "[guest-agent] HYPEMAN-AGENT-READY ts=2026-08-20T15:04:01.5Z",
    "[guest-agent] HYPEMAN-PROGRAM-START ts=2026-08-20T15:04:02Z mode=exec",
)


def rfc3339nano(unix_ns):
    """Go's RFC3339Nano in UTC: fraction with trailing zeros trimmed, ``Z``."""
    sec, nsec = divmod(int(unix_ns), 1000000000)
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))
    if nsec:
        text += ("." + "%09d" % nsec).rstrip("0")
    return text + "Z"


def log_prefix(unix_ns):
    """Go's default logger prefix (the guest's local time; UTC here)."""
    return time.strftime("%Y/%m/%d %H:%M:%S ", time.gmtime(int(unix_ns) // 1000000000))


def failed_line(unix_ns, nvrm=DEFAULT_NVRM, prefix_ns=None):
    """One HYPEMAN-GPU-INIT-FAILED line (with its newline) for a report at ``unix_ns``."""
    return "%s[guest-agent] HYPEMAN-GPU-INIT-FAILED ts=%s nvrm=\"%s\"\n" % (
        log_prefix(unix_ns if prefix_ns is None else prefix_ns), rfc3339nano(unix_ns), nvrm)


def ok_line(unix_ns, prefix_ns=None):
    """One HYPEMAN-GPU-INIT-OK line (with its newline) for a report at ``unix_ns``."""
    return "%s[guest-agent] HYPEMAN-GPU-INIT-OK ts=%s\n" % (
        log_prefix(unix_ns if prefix_ns is None else prefix_ns), rfc3339nano(unix_ns))


def vsock_ok_line(unix_ns):
    """The vsock-era agent's one line when driver init succeeds (it prints no marker)."""
    return "%s[guest-agent] GPU driver initialized\n" % log_prefix(unix_ns)


def vsock_failed_line(unix_ns, nvrm=DEFAULT_NVRM):
    """The vsock-era agent's one line when it first sees the NVRM init failure (the host ignores it)."""
    return "%s[guest-agent] GPU init failure detected: %s\n" % (log_prefix(unix_ns), nvrm)


def report(verdict, unix_ns, nvrm=DEFAULT_NVRM, repeats=REPORT_REPEATS):
    """A whole report as the agent prints it: the same line ``repeats`` times."""
    line = failed_line(unix_ns, nvrm) if verdict == "failed" else ok_line(unix_ns)
    return line * repeats


def noise(count, seed=0, unix_ns=None):
    """``count`` realistic console lines (boot messages, workload output)."""
    rng = random.Random(seed)
    lines = []
    for _index in range(count):
        line = rng.choice(_NOISE)
        if unix_ns is not None and rng.random() < 0.3:
            line = log_prefix(unix_ns) + line
        lines.append(line + "\n")
    return "".join(lines)


def forged_lines(unix_ns):
    """Marker-shaped lines that hypeman's anchored patterns reject, by name."""
    ts = rfc3339nano(unix_ns)
    prefix = log_prefix(unix_ns)
    good_failed = "[guest-agent] HYPEMAN-GPU-INIT-FAILED ts=%s nvrm=\"%s\"" % (ts, DEFAULT_NVRM)
    return {
        "raw_nvrm": "[   27.101112] %s\n" % DEFAULT_NVRM,
        "bare_marker": "HYPEMAN-GPU-INIT-FAILED ts=%s nvrm=\"%s\"\n" % (ts, DEFAULT_NVRM),
        "bare_ok": "HYPEMAN-GPU-INIT-OK ts=%s\n" % ts,
        "mid_line": "worker said: %s%s\n" % (prefix, good_failed),
        "echoed_command": "%s[guest-agent] exec: echo 'HYPEMAN-GPU-INIT-FAILED ts=%s nvrm=\"%s\"'\n"
                          % (prefix, ts, DEFAULT_NVRM),
        "trailing_text": "%s%s extra\n" % (prefix, good_failed),
        "ok_trailing_text": "%s[guest-agent] HYPEMAN-GPU-INIT-OK ts=%s done\n" % (prefix, ts),
        "wrong_nvrm": "%s[guest-agent] HYPEMAN-GPU-INIT-FAILED ts=%s nvrm=\"NVRM: GPU 0000:00:03.0: "
                      "RmInitAdapter succeeded\"\n" % (prefix, ts),
        "nvrm_without_prefix": "%s[guest-agent] HYPEMAN-GPU-INIT-FAILED ts=%s nvrm=\"GPU 0000:00:03.0: "
                               "RmInitAdapter failed! (0x22:0x65:884)\"\n" % (prefix, ts),
        "wrong_tag": "%s[workload] HYPEMAN-GPU-INIT-FAILED ts=%s nvrm=\"%s\"\n" % (prefix, ts, DEFAULT_NVRM),
        "short_prefix": "%s %s\n" % (prefix[:10], good_failed),
        "no_ts": "%s[guest-agent] HYPEMAN-GPU-INIT-OK\n" % prefix,
        "empty_ts": "%s[guest-agent] HYPEMAN-GPU-INIT-OK ts= \n" % prefix,
        "tab_after_ok": "%s[guest-agent] HYPEMAN-GPU-INIT-OK ts=%s\t\n" % (prefix, ts),
        "quote_in_nvrm": "%s[guest-agent] HYPEMAN-GPU-INIT-FAILED ts=%s nvrm=\"NVRM: a\"b RmInitAdapter "
                         "failed!\"\n" % (prefix, ts),
    }


def append(path, text, mode=0o644):
    """Append ``text`` (str or bytes) to ``path`` as one write, like a console writer."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def copytruncate(path, max_files=1):
    """hypeman's rotation: shift backups, copy ``path`` to ``path.1``, truncate ``path``."""
    for index in range(max_files, 0, -1):
        older = "%s.%d" % (path, index)
        if index == max_files:
            if os.path.exists(older):
                os.unlink(older)
        elif os.path.exists(older):
            os.rename(older, "%s.%d" % (path, index + 1))
    with open(path, "rb") as src, open(path + ".1", "wb") as dst:
        while True:
            chunk = src.read(1 << 20)
            if not chunk:
                break
            dst.write(chunk)
    with open(path, "r+b") as handle:
        handle.truncate(0)


def archive_previous_boot(path, unix_ns=None):
    """hypeman's create/start: rename ``app.log`` to ``app.log.prev.<unix-ns>``."""
    if unix_ns is None:
        unix_ns = time.time_ns()
    target = "%s.prev.%d" % (path, unix_ns)
    if os.path.exists(path):
        os.rename(path, target)
    return target


def write_sized_log(path, size, seed=0, markers=()):
    """Write a realistic log of about ``size`` bytes, ``markers`` spread through it.

    ``markers`` is a sequence of text blocks (e.g. :func:`report` output),
    each placed at a line start at evenly spaced positions. Returns the number
    of bytes written.
    """
    rng = random.Random(seed)
    block = noise(4000, seed=seed).encode("utf-8")
    starts = [0] + [i + 1 for i in range(len(block) - 1) if block[i] == 0x0A]
    slots = [int(size * (i + 1) / (len(markers) + 1)) for i in range(len(markers))]
    pending = list(zip(slots, markers))
    written = 0
    with open(path, "wb") as handle:
        while written < size:
            # A run of whole lines from a random line start: never a cut line.
            begin = rng.choice(starts)
            piece = block[begin:begin + min(1 << 20, size - written)]
            cut = piece.rfind(b"\n") + 1
            piece = piece[:cut] if cut else block[begin:block.index(b"\n", begin) + 1]
            handle.write(piece)
            written += len(piece)
            while pending and written >= pending[0][0]:
                text = pending.pop(0)[1]
                data = text.encode("utf-8") if isinstance(text, str) else text
                handle.write(data)
                written += len(data)
        for _slot, text in pending:
            data = text.encode("utf-8") if isinstance(text, str) else text
            handle.write(data)
            written += len(data)
    return written


def main(argv=None):
    """CLI for integration targets and the simulator; see ``--help``."""
    parser = argparse.ArgumentParser(prog="python3 -m tests.sim.guestlog",
                                     description="Write guest serial-console output as hypeman's guest agent does.")
    sub = parser.add_subparsers(dest="command")
    rep = sub.add_parser("report", help="append a marker report (3 copies) to a log")
    rep.add_argument("--path", required=True)
    rep.add_argument("--verdict", choices=("failed", "ok"), required=True)
    rep.add_argument("--ts-ns", type=int, required=True, help="marker time, Unix nanoseconds")
    rep.add_argument("--nvrm", default=DEFAULT_NVRM)
    rep.add_argument("--repeats", type=int, default=REPORT_REPEATS)
    rep.add_argument("--noise", type=int, default=0, help="noise lines written before the report")
    forge = sub.add_parser("forge", help="append marker-shaped lines hypeman rejects")
    forge.add_argument("--path", required=True)
    forge.add_argument("--ts-ns", type=int, required=True)
    rot = sub.add_parser("copytruncate", help="rotate a log as hypeman does (app.log -> app.log.1)")
    rot.add_argument("--path", required=True)
    arc = sub.add_parser("archive", help="archive a log as hypeman does at start (app.log.prev.<ns>)")
    arc.add_argument("--path", required=True)
    arc.add_argument("--ts-ns", type=int, help="archive suffix, Unix nanoseconds (default: now)")
    args = parser.parse_args(argv)
    if args.command == "report":
        append(args.path, noise(args.noise, seed=args.ts_ns) + report(args.verdict, args.ts_ns, args.nvrm, args.repeats))
    elif args.command == "forge":
        append(args.path, "".join(forged_lines(args.ts_ns)[name] for name in sorted(forged_lines(args.ts_ns))))
    elif args.command == "copytruncate":
        copytruncate(args.path)
    elif args.command == "archive":
        sys.stdout.write(archive_previous_boot(args.path, args.ts_ns) + "\n")
    else:
        parser.print_help()
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
