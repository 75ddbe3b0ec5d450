# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Running a module's main() in the module tests and reading its result."""

from __future__ import annotations

import json
from unittest import mock

import pytest

from ansible.module_utils.common import warnings as ansible_warnings
from ansible.module_utils.testing import patch_module_args


def run_module(main, params, capsys):
    """Run ``main`` with ``params`` as its module arguments; return the result it printed."""
    ansible_warnings._global_warnings.clear()  # module warnings are process-global
    with patch_module_args(params):
        with pytest.raises(SystemExit):
            main()
    return json.loads(capsys.readouterr().out)


def warning_texts(result):
    """The warning texts of a module result, as the module printed them.

    Read from the result itself, not from ansible's process-global warning list,
    which controller-side imports in the same pytest process reroute.
    ansible-core 2.19+ prints each warning as a WarningSummary ({"event": {"msg": ...}}),
    older cores as a plain string.
    """
    texts = []
    for warning in result.get("warnings", []):
        if isinstance(warning, dict):
            warning = (warning.get("event") or {}).get("msg", warning.get("msg"))
        texts.append(warning)
    return texts


class _SpecCaptured(Exception):
    pass


def argument_spec(main):
    """The argument spec ``main`` builds its AnsibleModule with (the module is not run)."""
    captured = {}

    def capture(self, *args, **kwargs):
        captured.update(kwargs.get("argument_spec") or args[0])
        raise _SpecCaptured()

    # As ansible-test's validate-modules does: no arguments to load, AnsibleModule never built.
    with mock.patch("ansible.module_utils.basic._load_params", lambda: {}), \
            mock.patch("ansible.module_utils.basic.AnsibleModule.__init__", capture):
        with pytest.raises(_SpecCaptured):
            main()
    return captured
