# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""AnsibleModule glue: the only helper that imports AnsibleModule machinery.

Keeps the host-path argument specs in one place so every module accepts the
same options with the same defaults as the doc fragments document.
"""

from __future__ import annotations

import os

from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError

HOST_PATH_SPECS = {
    "data_dir": {"data_dir": dict(type="path", default="/var/lib/hypeman"),
                 "path": dict(type="path")},
    "sysfs_root": {"sysfs_root": dict(type="path", default="/sys")},
    "proc_root": {"proc_root": dict(type="path", default="/proc")},
    "dev_root": {"dev_root": dict(type="path", default="/dev")},
    "state_dir": {"state_dir": dict(type="path", default="/var/lib/hypeman-vgpu")},
    "config_path": {"config_path": dict(type="path", default="/etc/hypeman/config.yaml")},
    "api": {"api_url": dict(type="str"),
            "api_token": dict(type="str", no_log=True),
            "validate_certs": dict(type="bool", default=True),
            "api_timeout": dict(type="float", default=10)},
}


def host_path_spec(**extra):
    """Argument spec with every host-path and API option plus module options.

    module_defaults for group/hypeman.vgpu.host hands every default to every
    module of the group, so each module accepts them all and ignores the
    paths it does not read.
    """
    spec = {}
    for group in HOST_PATH_SPECS.values():
        spec.update({k: dict(v) for k, v in group.items()})
    spec.update(extra)
    return spec


def store_path(params):
    """The VF health store path: ``path`` when given, else under ``data_dir``."""
    return params.get("path") or os.path.join(params["data_dir"], "gpu", "vf-health.json")


def run_module(module, body):
    """Run ``body(module)`` and exit; a VgpuError becomes a clean failure."""
    try:
        result = body(module)
    except VgpuError as err:
        module.fail_json(msg=err.msg, **err.details)
    module.exit_json(**result)
