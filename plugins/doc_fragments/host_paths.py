# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    """Host-path and API options shared by every module of the action group.

    One fragment with every option: Ansible passes every group/hypeman.vgpu.host
    module default to every module of the group, so each module must accept
    them all (it ignores the paths it does not read).
    """

    DOCUMENTATION = r"""
options:
  data_dir:
    description:
      - hypeman's data directory. The VF health store is C(<data_dir>/gpu/vf-health.json)
        and instances live under C(<data_dir>/guests/).
      - A O(data_dir) that is a symlink to another disk is normal and is followed.
    type: path
    default: /var/lib/hypeman
  path:
    description:
      - Full path of the VF health store, overriding the one derived from O(data_dir).
    type: path
  sysfs_root:
    description:
      - Root of the sysfs tree; C(<sysfs_root>/bus/pci/devices) must exist on a real host.
    type: path
    default: /sys
  proc_root:
    description:
      - Root of the proc filesystem, read for process liveness and open file descriptors.
    type: path
    default: /proc
  dev_root:
    description:
      - Root of the device node tree (C(nvidia*), C(vfio/*)).
    type: path
    default: /dev
  state_dir:
    description:
      - This collection's own state directory on the managed host (ledger, sentinel
        cursors, recovery markers). Never inside hypeman's data directory.
    type: path
    default: /var/lib/hypeman-vgpu
  config_path:
    description:
      - hypeman's YAML configuration file, read for C(gpu.vf_quarantine_threshold).
      - A missing file or a missing key means hypeman's default threshold, 2.
    type: path
    default: /etc/hypeman/config.yaml
  api_url:
    description:
      - Base URL of hypeman's API, for example V(http://127.0.0.1:8080).
      - When set, the module cross-checks its local view with hypeman's answer.
      - An C(http://) or C(https://) URL without spaces or control characters, at most 2048 characters.
    type: str
  api_token:
    description:
      - Bearer token (JWT) for hypeman's API, as minted by C(hypeman-token). One line, without control characters.
    type: str
  validate_certs:
    description:
      - Verify the API's TLS certificate when O(api_url) is HTTPS.
    type: bool
    default: true
  api_timeout:
    description:
      - Seconds each API request may take as a whole (connect, TLS, headers and the answer). A server that has
        not sent its whole answer by then counts as not answering.
      - More than 0 and at most V(3600).
    type: float
    default: 10
notes:
  - Every path option defaults to the real location on a hypeman host. Tests and the
    simulated host point them at a fake tree.
  - Every path option must be an absolute path without NUL bytes, at most 4096 bytes long, with no name in it
    longer than 255 bytes. Anything else fails before any file is read, naming the option.
  - Every module of the action group C(group/hypeman.vgpu.host) accepts every host-path
    and API option, so one C(module_defaults) block sets them for a whole play; a module
    ignores the ones it does not read.
  - An option given as V(null) (an inventory variable with no value, passed on by a role) is the same as one left
    out, so its default applies. A null required option still fails, naming it.
"""
