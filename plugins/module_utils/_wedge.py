# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Wedge-risk signals: VFs that may be wedged before any guest fails on them (stdlib only).

A vGPU VF wedges when its QEMU is SIGKILLed while the vGPU plugin initialises
it (docs/hypeman-interface.md §8). Two host logs show such kills:

* hypeman's own warning when it had to hard-kill a hypervisor that ignored
  SIGTERM (``lib/instances``: "hypervisor with VFIO devices did not exit on
  SIGTERM; hard-killing, device may wedge if the guest driver was
  initializing", attributes ``instance_id`` and ``device_path``; GPU.md calls
  it ``VF may wedge``). hypeman logs JSON lines (slog) to stdout, so the
  journal of its unit holds them; a log file can be given instead.
* the kernel's OOM killer ("Out of memory: Killed process <pid> (<comm>)",
  "Memory cgroup out of memory: Killed process ...", the older
  "Killed process <pid> (<comm>) total-vm:..." line, and the one-line summary
  "oom-kill:...,task=<comm>,pid=<pid>,uid=..." since Linux 4.19): read from
  ``journalctl -k`` or a kernel log file. The killed process is attributed
  to a VF through the instance metadata that recorded it as the instance's
  hypervisor (``HypervisorPID``, same boot) and claims a VF
  (``GPUDevicePath``) since before the kill.

Signals are warnings with evidence, never a quarantine. One counts only when
it is from the current boot (a reboot resets the GPU), inside the look-back
window, and newer than the VF's latest ``clear`` or ``repair`` entry in this
collection's ledger (a recovery or a manual clear after the signal).

Every source is optional and bounded: a missing journal, a FIFO, a gigabyte
log or garbage lines give a source error or skipped lines, never a traceback
or a hang.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import time

from ansible_collections.hypeman.vgpu.plugins.module_utils import _cmd, _gotime, _hypeman, _sysfs
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.plugins.module_utils._fileio import open_regular, read_bytes

REASON_WEDGE_LOG = "vf_may_wedge"
REASON_OOM = "oom_killed_qemu"

DEFAULT_UNIT = "hypeman.service"
DEFAULT_JOURNALCTL = "/usr/bin/journalctl"
DEFAULT_WINDOW_HOURS = 168
# The most of a log file's end read, and the most journal entries asked for (newest first).
TAIL_LIMIT = 32 * 1024 * 1024
JOURNAL_ENTRIES = 50000
JOURNAL_TIMEOUT = 60
# A longer line is no line hypeman or the kernel writes: skipped, never parsed.
LINE_MAX = 64 * 1024
# How many evidence lines a VF keeps (the newest).
EVIDENCE_MAX = 5

# hypeman's wording (current code) and GPU.md's name for it.
WEDGE_MARKERS = ("device may wedge", "VF may wedge")

_RFC3339_PREFIX = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d))\s")
_SYSLOG_PREFIX = re.compile(r"^([A-Z][a-z]{2}) +(\d{1,2}) (\d\d):(\d\d):(\d\d)\s")
_MONOTONIC = re.compile(r"\[\s*(\d{1,10})\.(\d{1,9})\]")
_MONTHS = dict((name, index + 1) for index, name in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")))
# comm is at most 15 bytes (TASK_COMM_LEN 16); the kernel prints it between parentheses.
_OOM_KILLED = re.compile(r"(?:^|[\s:\]])Killed process (\d{1,10}) \(([^\n]{0,64}?)\)")
_OOM_SUMMARY = re.compile(r"\boom-kill:\S*?\btask=([^,\n]{0,64}),pid=(\d{1,10})\b")
_KV = re.compile(r"\b(instance_id|device_path|time)=(\"(?:[^\"\\]|\\.){0,4096}\"|\S{1,4096})")


def _utc_text(ns):
    return _gotime.format_utc_rfc3339nano(_gotime.from_unix_ns(ns)) if ns is not None else None


def _usable_ns(ns):
    """``ns``, or None when it does not render in UTC (a year outside 0..9999): a line without a usable time."""
    try:
        _utc_text(ns)
    except ValueError:
        return None
    return ns


def _rfc3339_ns(text):
    try:
        return _usable_ns(_gotime.to_unix_ns(_gotime.parse_rfc3339(text)))
    except (ValueError, TypeError, OverflowError):
        return None


def _syslog_ns(match, now_ns):
    """Local-time ``Mon DD HH:MM:SS`` (no year): this year, or last year when that would be in the future."""
    month = _MONTHS.get(match.group(1))
    if month is None:
        return None
    year = time.localtime(now_ns / 1e9).tm_year
    for candidate in (year, year - 1):
        try:
            stamp = time.mktime((candidate, month, int(match.group(2)), int(match.group(3)), int(match.group(4)),
                                 int(match.group(5)), 0, 0, -1))
        except (OverflowError, ValueError):
            return None
        ns = int(stamp) * 1000000000
        if ns <= now_ns + 86400 * 1000000000:
            return ns
    return None


def line_time(line, now_ns, boot_ns=None):
    """The wall time a log line carries: an RFC 3339 or syslog prefix, else dmesg's ``[seconds]`` since boot."""
    match = _RFC3339_PREFIX.match(line)
    if match:
        return _rfc3339_ns(match.group(1))
    match = _SYSLOG_PREFIX.match(line)
    if match:
        return _syslog_ns(match, now_ns)
    match = _MONOTONIC.search(line[:64])
    if match and boot_ns is not None:
        return _usable_ns(boot_ns + int(match.group(1)) * 1000000000 + int(match.group(2).ljust(9, "0")))
    return None


def _unquote(value):
    if value.startswith('"'):
        try:
            decoded = json.loads(value)
        except ValueError:
            return value.strip('"')
        return decoded if isinstance(decoded, str) else value
    return value


def parse_hypeman_line(line, now_ns, fallback_ns=None):
    """A ``vf_may_wedge`` signal from one hypeman log line, or None.

    hypeman writes slog JSON (``{"time":..., "level":"WARN", "msg":..., "instance_id":...,
    "device_path":...}``); a text line (``key=value`` attributes, as hypeman's per-instance
    log writes them) is read too. The time is the line's own, else ``fallback_ns`` (the
    journal's receive time).
    """
    if not isinstance(line, str) or len(line) > LINE_MAX or not any(marker in line for marker in WEDGE_MARKERS):
        return None
    text = line.strip()
    fields = None
    start = text.find("{")
    if start >= 0:
        try:
            data = json.loads(text[start:])
        except (ValueError, RecursionError):
            data = None
        if isinstance(data, dict) and isinstance(data.get("msg"), str) \
                and any(marker in data["msg"] for marker in WEDGE_MARKERS):
            fields = dict((key, data.get(key)) for key in ("time", "instance_id", "device_path"))
    if fields is None:
        fields = dict((key, _unquote(value)) for key, value in _KV.findall(text))
    stamp = None
    if isinstance(fields.get("time"), str):
        stamp = _rfc3339_ns(fields["time"])
    if stamp is None:
        stamp = line_time(text, now_ns)
    if stamp is None:
        stamp = fallback_ns
    instance_id = fields.get("instance_id") if isinstance(fields.get("instance_id"), str) else None
    device_path = fields.get("device_path") if isinstance(fields.get("device_path"), str) else None
    return {"reason": REASON_WEDGE_LOG, "time_ns": stamp, "instance_id": instance_id or None,
            "device_path": device_path or None, "pid": None, "comm": None, "line": text[:2000]}


def parse_kernel_line(line, now_ns, boot_ns=None, fallback_ns=None):
    """An OOM kill (``{pid, comm, time_ns, line}``) from one kernel log line, or None."""
    if not isinstance(line, str) or len(line) > LINE_MAX:
        return None
    match = _OOM_KILLED.search(line)
    if match:
        pid, comm = match.group(1), match.group(2)
    else:
        match = _OOM_SUMMARY.search(line)
        if not match:
            return None
        comm, pid = match.group(1), match.group(2)
    pid = int(pid)
    if pid <= 0:
        return None
    text = line.strip()
    stamp = line_time(text, now_ns, boot_ns)
    if stamp is None:
        stamp = fallback_ns
    return {"reason": REASON_OOM, "time_ns": stamp, "instance_id": None, "device_path": None, "pid": pid,
            "comm": comm, "line": text[:2000]}


# --- reading the sources --------------------------------------------------------------------


def _decode(data):
    return data.decode("utf-8", "replace")


def read_tail(path, limit=TAIL_LIMIT):
    """The last ``limit`` bytes of the regular file ``path`` as lines: ``(lines, truncated)``.

    A FIFO, socket, device or directory raises OSError (never blocks); a file
    bigger than ``limit`` is read from ``limit`` bytes before its end, its
    first (partial) line dropped.
    """
    fd, info = open_regular(path)
    try:
        size = info.st_size
        truncated = size > limit
        if truncated:
            os.lseek(fd, size - limit, os.SEEK_SET)
        chunks, total = [], 0
        while total < limit:
            chunk = os.read(fd, min(1024 * 1024, limit - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as err:
        raise OSError(err.errno, err.strerror, path) from err
    finally:
        os.close(fd)
    lines = _decode(b"".join(chunks)).split("\n")
    if truncated and lines:
        lines = lines[1:]
    return lines, truncated


def _journal_message(entry):
    """MESSAGE of a journal JSON entry (a string, or an array of bytes for binary data) and its time."""
    if not isinstance(entry, dict):
        return None, None
    message = entry.get("MESSAGE")
    if isinstance(message, list):
        if len(message) > LINE_MAX or not all(isinstance(b, int) and 0 <= b < 256 for b in message):
            return None, None
        message = _decode(bytes(message))
    if not isinstance(message, str):
        return None, None
    stamp = entry.get("__REALTIME_TIMESTAMP")
    try:
        stamp = int(stamp) * 1000 if isinstance(stamp, str) and stamp.isdigit() and len(stamp) < 20 else None
    except ValueError:
        stamp = None
    return message, _usable_ns(stamp)


def find_journalctl():
    """``journalctl`` on the module's PATH, else where systemd installs it."""
    return shutil.which("journalctl") or DEFAULT_JOURNALCTL


def read_journal(journalctl, selector, since_ns, timeout=None, entries=JOURNAL_ENTRIES):
    """``(messages, truncated)`` from ``journalctl <selector> -b 0`` since ``since_ns``, newest first.

    ``messages`` are ``(text, realtime_ns)``. Raises VgpuError naming the
    command when it cannot run, times out (``timeout``, default
    :data:`JOURNAL_TIMEOUT` seconds) or fails.
    """
    timeout = JOURNAL_TIMEOUT if timeout is None else timeout
    argv = [journalctl] + list(selector) + [
        "--boot=0", "--since=@%d" % max(since_ns // 1000000000, 0), "--output=json", "--reverse",
        "--lines=%d" % entries, "--no-pager", "--quiet", "--output-fields=MESSAGE,__REALTIME_TIMESTAMP"]
    result = _cmd.run(argv, timeout=timeout)
    shown = " ".join(argv)
    if result.timed_out:
        raise VgpuError("%s: timed out after %ss" % (shown, timeout))
    if result.rc != 0:
        raise VgpuError("%s: exit %s: %s" % (shown, result.rc, result.brief(500) or "no output"))
    messages, truncated = [], False
    for raw in result.stdout.split("\n"):
        if raw.startswith("[... ") and raw.endswith(" more bytes not kept]"):
            truncated = True  # --reverse: what was cut off is the oldest part
            continue
        if not raw.strip() or len(raw) > 4 * LINE_MAX:
            continue
        try:
            entry = json.loads(raw)
        except (ValueError, RecursionError):
            continue
        message, stamp = _journal_message(entry)
        if message is not None:
            messages.append((message, stamp))
    return messages, truncated


def boot_time_ns(proc_root):
    """The boot time from ``<proc_root>/stat`` (``btime``), or None when it cannot be read."""
    try:
        data = read_bytes(os.path.join(proc_root, "stat"), limit=1024 * 1024)
    except OSError:
        return None
    for line in _decode(data).split("\n"):
        if line.startswith("btime "):
            value = line[6:].strip()
            if value.isdigit() and len(value) < 12:
                return int(value) * 1000000000
    return None


def current_boot_id(proc_root):
    try:
        return _decode(read_bytes(os.path.join(proc_root, "sys", "kernel", "random", "boot_id"), limit=4096)).strip()
    except OSError:
        return ""


class Options(object):
    """Where the signals are read from (module options ``wedge_*``)."""

    def __init__(self, enabled=True, hypeman_log=None, kernel_log=None, unit=DEFAULT_UNIT,
                 journalctl=None, window_hours=DEFAULT_WINDOW_HOURS):
        self.enabled = enabled
        self.hypeman_log = hypeman_log
        self.kernel_log = kernel_log
        self.unit = unit or DEFAULT_UNIT
        self.journalctl = journalctl or find_journalctl()
        self.window_hours = DEFAULT_WINDOW_HOURS if window_hours is None else window_hours

    @classmethod
    def from_params(cls, params):
        hours = params.get("wedge_window_hours")
        if hours is not None and not 1 <= hours <= 24 * 3650:
            raise VgpuError("wedge_window_hours is %s; expected hours from 1 to 87600" % hours)
        unit = params.get("hypeman_unit")
        if unit is not None and (not unit or "/" in unit or any(ord(c) < 33 or ord(c) == 127 for c in unit)
                                 or len(unit) > 255):
            raise VgpuError("hypeman_unit %r is not a systemd unit name; expected a name such as hypeman.service"
                            % unit[:80])
        return cls(params.get("wedge_signals", True), params.get("hypeman_log_path"), params.get("kernel_log_path"),
                   unit, params.get("journalctl_path"), hours)


# The argument spec of the options above (doc fragment hypeman.vgpu.wedge_signals).
ARGUMENT_SPEC = {
    "wedge_signals": dict(type="bool", default=True),
    "hypeman_log_path": dict(type="path"),
    "kernel_log_path": dict(type="path"),
    "hypeman_unit": dict(type="str", default=DEFAULT_UNIT),
    "journalctl_path": dict(type="path"),
    "wedge_window_hours": dict(type="int", default=DEFAULT_WINDOW_HOURS),
}


def argument_spec():
    return dict((name, dict(spec)) for name, spec in ARGUMENT_SPEC.items())


def _source(kind, where):
    return {"source": kind, "from": where, "read": False, "error": None, "truncated": False, "lines": 0,
            "signals": 0}


def _read_source(options, kind, since_ns, now_ns, boot_ns):
    """One source's ``(section, signals)``."""
    path = options.hypeman_log if kind == "hypeman" else options.kernel_log
    if path:
        section = _source(kind, path)
        try:
            lines, section["truncated"] = read_tail(path)
        except OSError as err:
            section["error"] = "read %s: %s" % (path, err.strerror or err)
            return section, []
        pairs = [(line, None) for line in lines]
    else:
        selector = ["--unit=%s" % options.unit] if kind == "hypeman" else ["--dmesg"]
        section = _source(kind, "journal (%s)" % (options.unit if kind == "hypeman" else "kernel"))
        try:
            pairs, section["truncated"] = read_journal(options.journalctl, selector, since_ns)
        except VgpuError as err:
            section["error"] = err.msg
            return section, []
    section["read"] = True
    section["lines"] = len([line for line, _stamp in pairs if line.strip()])
    signals = []
    for line, stamp in pairs:
        if kind == "hypeman":
            signal = parse_hypeman_line(line, now_ns, stamp)
        else:
            signal = parse_kernel_line(line, now_ns, boot_ns, stamp)
        if signal is not None:
            signal["source"] = section["from"]
            signals.append(signal)
    section["signals"] = len(signals)
    return section, signals


# --- attribution -----------------------------------------------------------------------------


def _claim_ns(inst):
    return _rfc3339_ns(inst["assigned_at"]) if inst.get("assigned_at") else None


def attribute(signals, instances, vf_parents, cleared_ns, sysfs_root, boot_id, boot_ns, since_ns):
    """Signals to VFs: ``(at_risk_vfs, unattributed, superseded)``.

    ``vf_parents``: VF -> parent GPU of the discovered VFs; ``cleared_ns``: VF
    -> time of its latest ledger clear/repair. A signal older than the boot,
    the window or the VF's latest clear does not count (``superseded`` lists
    those with a VF and why).
    """
    by_pid = {}
    for inst in instances:
        pid = inst.get("pid")
        if isinstance(pid, int) and pid > 0:
            by_pid.setdefault(pid, []).append(inst)
    by_id = dict((inst["id"], inst) for inst in instances if inst.get("id"))
    per_vf, unattributed, superseded = {}, [], []
    for signal in signals:
        stamp = _usable_ns(signal["time_ns"])
        vf, instance_id, why = None, signal.get("instance_id"), None
        if signal["reason"] == REASON_WEDGE_LOG:
            vf = _hypeman.device_path_vf(signal.get("device_path"), functools.partial(_sysfs.mdev_vf, sysfs_root))
            if vf is None and instance_id in by_id:
                vf = by_id[instance_id].get("vf_address")
            if vf is None:
                why = "no VF in the line's device_path %s" % json.dumps(signal.get("device_path"))
        else:
            candidates = by_pid.get(signal["pid"], [])
            matched = []
            for inst in candidates:
                if inst.get("boot_id") and boot_id and inst["boot_id"] != boot_id:
                    continue  # recorded in another boot: not this process
                claimed = _claim_ns(inst)
                if not inst.get("vf_address") or (stamp is not None and claimed is not None and claimed > stamp):
                    continue
                matched.append(inst)
            if len(matched) == 1:
                vf, instance_id = matched[0]["vf_address"], matched[0]["id"]
            elif matched:
                why = "pid %d is recorded by several instances with a VF: %s" % (
                    signal["pid"], ", ".join(sorted(inst["id"] for inst in matched)))
            else:
                why = "pid %d is no instance's recorded hypervisor with a VF claimed before the kill" % signal["pid"]
        entry = {"reason": signal["reason"], "time": _utc_text(stamp), "line": signal["line"],
                 "source": signal.get("source"), "instance_id": instance_id, "device_path": signal.get("device_path"),
                 "pid": signal.get("pid"), "comm": signal.get("comm")}
        if stamp is None:
            why = why or "the line carries no time"
        too_old = stamp is not None and ((boot_ns is not None and stamp < boot_ns) or stamp < since_ns)
        if vf is not None and too_old:
            superseded.append(dict(entry, vf=vf, why="before this boot" if boot_ns is not None and stamp < boot_ns
                                   else "older than the look-back window"))
            continue
        if vf is not None and stamp is not None and cleared_ns.get(vf) is not None and stamp <= cleared_ns[vf]:
            superseded.append(dict(entry, vf=vf, why="the ledger clears the VF after it, at %s" % _utc_text(
                cleared_ns[vf])))
            continue
        if vf is None or stamp is None:
            if too_old:
                continue
            unattributed.append(dict(entry, why=why))
            continue
        per_vf.setdefault(vf, []).append(entry)
    at_risk = []
    for vf in sorted(per_vf):
        entries = sorted(per_vf[vf], key=lambda e: e["time"])
        latest = entries[-1]
        at_risk.append({"vf": vf, "card": vf_parents.get(vf), "reasons": sorted(set(e["reason"] for e in entries)),
                        "reason": latest["reason"], "time": latest["time"], "instance_id": latest["instance_id"],
                        "signals": len(entries), "evidence": entries[-EVIDENCE_MAX:]})
    return at_risk, unattributed, superseded


def dedupe(signals):
    """One signal per event: the kernel logs an OOM kill in two lines (``oom-kill:`` and ``Killed process``)."""
    seen, out = {}, []
    for signal in signals:
        if signal["reason"] == REASON_OOM:
            key = (REASON_OOM, signal["pid"])
        else:
            key = (REASON_WEDGE_LOG, signal["instance_id"], signal["device_path"], signal["time_ns"])
        if key in seen:
            kept = out[seen[key]]
            if "Killed process" in signal["line"] and "Killed process" not in kept["line"]:
                out[seen[key]] = dict(signal, time_ns=kept["time_ns"] if signal["time_ns"] is None
                                      else signal["time_ns"])
            continue
        seen[key] = len(out)
        out.append(signal)
    return out


def ledger_clears(ledger, store=None):
    """VF -> Unix ns of its latest ``clear`` or ``repair`` entry in the ledger (None ledger: none)."""
    cleared = {}
    if ledger is None:
        return cleared
    for entry in ledger.effective(store):
        if entry.get("action") not in ("clear", "repair") or not entry.get("vf_address"):
            continue
        stamp = _rfc3339_ns(entry.get("time")) if isinstance(entry.get("time"), str) else None
        if stamp is not None and stamp > cleared.get(entry["vf_address"], -1):
            cleared[entry["vf_address"]] = stamp
    return cleared


def collect(options, sysfs_root, proc_root, instances, vf_parents, ledger=None, store=None, now_ns=None):
    """The ``wedge_signals`` section: sources read, ``at_risk_vfs``, ``unattributed``, ``superseded``.

    Never raises for what a source holds: a source that cannot be read has its
    ``error`` set and ``complete`` is false, so no signal is never read as health.
    """
    now_ns = time.time_ns() if now_ns is None else now_ns
    since_ns = now_ns - options.window_hours * 3600 * 1000000000
    boot_ns = boot_time_ns(proc_root)
    section = {"enabled": bool(options.enabled), "since": _utc_text(since_ns), "boot_time": _utc_text(boot_ns),
               "sources": [], "complete": False, "at_risk_vfs": [], "unattributed": [], "superseded": []}
    if not options.enabled:
        return section
    signals = []
    for kind in ("hypeman", "kernel"):
        source, found = _read_source(options, kind, since_ns, now_ns, boot_ns)
        section["sources"].append(source)
        signals.extend(found)
    section["complete"] = all(source["error"] is None for source in section["sources"])
    signals = dedupe(signals)
    cleared = ledger_clears(ledger, store)
    section["at_risk_vfs"], section["unattributed"], section["superseded"] = attribute(
        signals, instances, vf_parents, cleared, sysfs_root, current_boot_id(proc_root), boot_ns, since_ns)
    return section


def host_section(options, sysfs_root, proc_root, state_dir, instances, vfs):
    """:func:`collect` for a placement view: the ledger read from ``state_dir`` (unreadable: no clears, said so)."""
    from ansible_collections.hypeman.vgpu.plugins.module_utils import _ledger

    ledger, ledger_error = None, None
    if options.enabled:
        try:
            ledger = _ledger.read_ledger(state_dir)
        except VgpuError as err:
            ledger_error = err.msg
    section = collect(options, sysfs_root, proc_root, instances, dict((vf["address"], vf["parent"]) for vf in vfs),
                      ledger)
    section["ledger_error"] = ledger_error
    return section


def add_to_view(result, section):
    """Put a section into a placement view: ``wedge_signals``, ``at_risk_vfs`` and ``vfs[].at_risk``."""
    result["wedge_signals"] = section
    result["at_risk_vfs"] = section["at_risk_vfs"]
    at_risk = set(entry["vf"] for entry in section["at_risk_vfs"])
    for vf in result.get("vfs") or []:
        vf["at_risk"] = vf["address"] in at_risk


def warnings(section):
    """One line per at-risk VF, and one per source that could not be read."""
    lines = []
    for entry in section["at_risk_vfs"]:
        lines.append("VF %s (card %s) may be wedged: %s at %s (%d signal(s)); evidence: %s" % (
            entry["vf"], entry["card"], entry["reason"], entry["time"], entry["signals"],
            entry["evidence"][-1]["line"][:300]))
    for source in section["sources"]:
        if source["error"]:
            lines.append("wedge-risk signals not read from %s: %s" % (source["from"], source["error"]))
    return lines
