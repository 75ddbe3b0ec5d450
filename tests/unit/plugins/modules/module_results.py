# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reading module results in the module tests."""

from __future__ import annotations


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
