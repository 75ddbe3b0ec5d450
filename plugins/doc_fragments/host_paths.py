# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    """Host-path options shared by every module that reads a hypeman host.

    Each option group is its own fragment so a module documents only the
    paths it really reads (C(hypeman.vgpu.host_paths.data_dir) and so on).
    """

    DOCUMENTATION = r"""
options: {}
notes:
  - Every path option defaults to the real location on a hypeman host. Tests and the
    simulated host point them at a fake tree. Set them once per play with
    C(module_defaults) for the action group C(group/hypeman.vgpu.host).
"""

    DATA_DIR = r"""
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
"""

    SYSFS_ROOT = r"""
options:
  sysfs_root:
    description:
      - Root of the sysfs tree; C(<sysfs_root>/bus/pci/devices) must exist on a real host.
    type: path
    default: /sys
"""

    PROC_ROOT = r"""
options:
  proc_root:
    description:
      - Root of the proc filesystem, read for process liveness and open file descriptors.
    type: path
    default: /proc
"""

    DEV_ROOT = r"""
options:
  dev_root:
    description:
      - Root of the device node tree (C(nvidia*), C(vfio/*)).
    type: path
    default: /dev
"""

    STATE_DIR = r"""
options:
  state_dir:
    description:
      - This collection's own state directory on the managed host (ledger, sentinel
        cursors, recovery markers). Never inside hypeman's data directory.
    type: path
    default: /var/lib/hypeman-vgpu
"""

    CONFIG_PATH = r"""
options:
  config_path:
    description:
      - hypeman's YAML configuration file, read for C(gpu.vf_quarantine_threshold).
      - A missing file or a missing key means hypeman's default threshold, 2.
    type: path
    default: /etc/hypeman/config.yaml
"""

    API = r"""
options:
  api_url:
    description:
      - Base URL of hypeman's API, for example V(http://127.0.0.1:8080).
      - When set, the module cross-checks its local view with hypeman's answer.
    type: str
  api_token:
    description:
      - Bearer token (JWT) for hypeman's API, as minted by C(hypeman-token).
    type: str
  validate_certs:
    description:
      - Verify the API's TLS certificate when O(api_url) is HTTPS.
    type: bool
    default: true
  timeout:
    description:
      - Seconds to wait for each API request.
    type: float
    default: 10
"""
