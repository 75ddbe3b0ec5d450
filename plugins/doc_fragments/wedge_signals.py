# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    """Options of the modules that read wedge-risk signals (vgpu_placement_info, host_audit_info)."""

    DOCUMENTATION = r"""
options:
  wedge_signals:
    description:
      - Read the wedge-risk signals - hypeman's C(device may wedge) warnings (GPU.md calls them C(VF may wedge))
        and kernel OOM kills of a VF's QEMU - and report the VFs they concern as RV(at_risk_vfs).
      - They are warnings with evidence, never a quarantine. A signal counts only from the current boot, within
        O(wedge_window_hours), and when newer than the VF's latest C(clear) or C(repair) entry in this
        collection's ledger (under O(state_dir)).
    type: bool
    default: true
  hypeman_log_path:
    description:
      - A file holding hypeman's log (its JSON lines), read instead of the journal of O(hypeman_unit). Only the
        last 32 MiB are read.
    type: path
  kernel_log_path:
    description:
      - A file holding the kernel log (for example C(/var/log/kern.log)), read instead of C(journalctl --dmesg).
        Lines may start with an RFC 3339 or a syslog time, or carry dmesg's seconds since boot. Only the last
        32 MiB are read.
    type: path
  hypeman_unit:
    description:
      - hypeman's systemd unit, whose journal holds its log (hypeman logs to stdout).
    type: str
    default: hypeman.service
  journalctl_path:
    description:
      - C(journalctl), used for the journal sources (current boot, newest 50,000 entries, 60 s at most each).
      - Defaults to the C(journalctl) found on the module's C(PATH), else C(/usr/bin/journalctl).
    type: path
  wedge_window_hours:
    description:
      - How far back signals count, in hours (1 to 87600).
    type: int
    default: 168
"""
