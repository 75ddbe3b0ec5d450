# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which hypeman sentinel watches a host: console markers or the vsock poll (stdlib only).

hypeman's GPU init evidence changed channel (docs/hypeman-interface.md §5.5):
the marker era's guest agent prints ``HYPEMAN-GPU-INIT-*`` lines that the
host reads from ``app.log``; the vsock era's agent prints no markers and
hypeman's sentinel polls ``GetGPUInitStatus`` and records into the store by
itself. No file says which era a host runs (instance metadata carries no
agent version), so this helper decides from what does show it:

* the ``sentinel_mode`` option, when the operator knows;
* hypeman's metrics: ``hypeman_instances_vgpu_sentinel_checks_total`` is
  counted only by the vsock sentinel;
* each guest's own console: the agent of each era prints its own lines
  (``[guest-agent] HYPEMAN-GPU-INIT-...`` or ``[guest-agent] GPU driver
  initialized`` / ``GPU init failure detected: ...``). hypeman builds the
  agent into the guest's initrd, so a guest shows the era of the hypeman
  that booted it.

The console is shared with the workload, so a guest's lines decide only the
mode (what to look at), never a verdict. Only bounded head and tail windows
of ``app.log`` and ``app.log.1`` are read.
"""

from __future__ import annotations

import os
import re

from ansible_collections.hypeman.vgpu.plugins.module_utils import _fileio, _sentinel

MARKERS = "markers"
VSOCK = "vsock"
UNKNOWN = "unknown"
MODES = (MARKERS, VSOCK, UNKNOWN)
OPTION_CHOICES = ("auto", MARKERS, VSOCK)

# Bytes read from the start and from the end of each log: the agent's GPU lines come a few
# seconds to ten minutes after boot (head) or are the newest output (tail).
WINDOW_BYTES = 256 * 1024
LOG_NAMES = ("app.log", "app.log.1")

_PREFIX = rb"(?m)^[0-9]{4}/[0-9]{2}/[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2} \[guest-agent\] "
_MARKER_ERA_RE = re.compile(_PREFIX + rb"HYPEMAN-GPU-INIT-(?:FAILED|OK) ts=")
# Lines only the vsock-era agent prints (lib/system/guest_agent gpu init reporter).
_VSOCK_ERA_RE = re.compile(_PREFIX + rb"(?:GPU init failure detected: |GPU driver initialized\r?$"
                                     rb"|GPU init probe disabled; driver init success cannot be reported"
                                     rb"|GPU init probe attempt failed: )")


def classify_text(data):
    """``(saw_markers, saw_vsock_lines)`` for a chunk of console bytes."""
    return bool(_MARKER_ERA_RE.search(data)), bool(_VSOCK_ERA_RE.search(data))


def _windows(fd, size, window):
    """The head and tail windows of an open file (one read when they overlap)."""
    if size <= 2 * window:
        return [os.pread(fd, size, 0)]
    return [os.pread(fd, window, 0), os.pread(fd, window, size - window)]


def read_evidence(log_dir, window=WINDOW_BYTES):
    """``(saw_markers, saw_vsock_lines, error)`` from an instance's console logs.

    Never follows a symlink, never blocks on a FIFO, reads at most
    ``2 * window`` bytes per file. ``error`` is a sentence when the logs
    could not be read (the mode is then unknown for that reason).
    """
    markers = vsock = False
    try:
        dir_fd = _sentinel.open_log_dir(log_dir)
    except _sentinel.LogError as err:
        return False, False, str(err)
    try:
        for name in LOG_NAMES:
            path = os.path.join(log_dir, name)
            try:
                fd, st = _fileio.open_regular(name, follow=False, dir_fd=dir_fd)
            except FileNotFoundError:
                continue
            except OSError as err:  # a symlink, FIFO, socket, directory, no permission
                return markers, vsock, "cannot read %s: %s" % (path, err.strerror or err)
            try:
                for chunk in _windows(fd, st.st_size, window):
                    found_markers, found_vsock = classify_text(chunk)
                    markers = markers or found_markers
                    vsock = vsock or found_vsock
            except OSError as err:
                return markers, vsock, "cannot read %s: %s" % (path, err.strerror or err)
            finally:
                os.close(fd)
    finally:
        os.close(dir_fd)
    return markers, vsock, None


def instance_mode(instance_id, log_dir, has_marker_findings=False, window=WINDOW_BYTES):
    """``{instance_id, sentinel_mode, sentinel_mode_reason}`` for one scanned instance.

    ``has_marker_findings``: the scan already attributed markers to it (they
    may sit in the middle of a long log, outside the windows read here).
    """
    markers, vsock, error = read_evidence(log_dir, window)
    markers = markers or has_marker_findings
    if markers and vsock:
        mode, reason = UNKNOWN, ("its console shows both GPU init markers and vsock-era guest agent lines "
                                 "(a workload may print either)")
    elif markers:
        mode, reason = MARKERS, "its guest agent prints HYPEMAN-GPU-INIT markers on the console"
    elif vsock:
        mode, reason = VSOCK, ("its guest agent prints vsock-era GPU init lines and no markers: hypeman "
                               "polls it over vsock")
    elif error:
        mode, reason = UNKNOWN, error
    else:
        mode, reason = UNKNOWN, ("no GPU init line of either era in its console log yet (guest booting, "
                                 "no nvidia-smi in the image, or the lines rotated away)")
    return {"instance_id": instance_id, "sentinel_mode": mode, "sentinel_mode_reason": reason}


def scanned_modes(report, instances, log_dir_of):
    """:func:`instance_mode` of each guest a sentinel scan ``report`` read (skipped ones have no log to judge)."""
    skipped = set(entry["instance_id"] for entry in report.skipped)
    with_markers = set(finding["instance_id"] for finding in report.findings)
    known = set(instance["id"] for instance in instances)
    scanned = sorted(iid for iid in set(entry["instance_id"] for entry in report.scanned) | with_markers
                     if iid in known and iid not in skipped)
    return [instance_mode(iid, log_dir_of(iid), iid in with_markers) for iid in scanned]


def host_mode(option="auto", instance_modes=(), metrics=None):
    """``(mode, reason)`` of the host's hypeman sentinel.

    ``option``: ``auto``, ``markers`` or ``vsock``. ``metrics``: None when
    hypeman's metrics were not read, else the parsed sample of
    :func:`_metrics.sentinel_sample` (``checks`` is None when hypeman exports
    no sentinel check counter).
    """
    if option in (MARKERS, VSOCK):
        return option, "set by the sentinel_mode option"
    if metrics is not None and metrics.get("checks") is not None:
        return VSOCK, ("hypeman exports hypeman_instances_vgpu_sentinel_checks_total, which only its vsock "
                       "sentinel counts")
    by_mode = dict((mode, sorted(entry["instance_id"] for entry in instance_modes
                                 if entry["sentinel_mode"] == mode)) for mode in (MARKERS, VSOCK))
    if by_mode[MARKERS] and by_mode[VSOCK]:
        return UNKNOWN, ("guests disagree: %s print markers, %s print vsock-era lines (hypeman was probably "
                         "upgraded while they ran); read hypeman's metrics (metrics_url) or set sentinel_mode"
                         % (_names(by_mode[MARKERS]), _names(by_mode[VSOCK])))
    for mode in (MARKERS, VSOCK):
        if by_mode[mode]:
            return mode, "%d guest(s) show %s-era GPU init lines: %s" % (
                len(by_mode[mode]), "marker" if mode == MARKERS else "vsock", _names(by_mode[mode]))
    if metrics is not None:
        return UNKNOWN, ("no guest shows GPU init lines of either era and hypeman's metrics have no sentinel "
                         "check counter (a marker-era hypeman, or a vsock-era one with nothing to poll yet)")
    return UNKNOWN, ("no guest shows GPU init lines of either era and hypeman's metrics were not read "
                     "(set metrics_url or sentinel_mode)")


def _names(ids, limit=5):
    shown = ", ".join(ids[:limit])
    return shown if len(ids) <= limit else "%s and %d more" % (shown, len(ids) - limit)


def log_evidence(mode, instance_modes):
    """``(coverage, reason)``: how far the console logs can show GPU init failures on this host.

    ``complete``: a marker-era host whose guests all print markers (or have
    not shown either era yet); ``partial``: some guests cannot be seen in
    the logs; ``none``: nothing in the logs can show a failure, so an empty
    finding list means "could not look", never "healthy".
    """
    blind = sorted(entry["instance_id"] for entry in instance_modes if entry["sentinel_mode"] == VSOCK)
    if mode == VSOCK:
        return "none", ("hypeman's vsock sentinel records GPU init failures itself and guests print no markers: "
                        "no findings here does not mean healthy; read the store (vf_health_info) and hypeman's "
                        "sentinel metrics (host_audit_info metrics_url)")
    if mode == MARKERS:
        if blind:
            return "partial", ("%d guest(s) print no markers (vsock-era agent) on a marker-era host; neither "
                               "hypeman nor this scan sees their GPU init: %s" % (len(blind), _names(blind)))
        return "complete", "marker-era host: every guest's GPU init markers are in its console log"
    seen = [entry["instance_id"] for entry in instance_modes if entry["sentinel_mode"] == MARKERS]
    if seen:
        return "partial", ("sentinel mode unknown: only the %d guest(s) printing markers can be judged from the "
                           "logs" % len(seen))
    return "none", "sentinel mode unknown: no finding here does not mean healthy"
