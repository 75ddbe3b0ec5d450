# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    """Attributes shared by the collection's modules."""

    DOCUMENTATION = r"""
attributes:
  action_group:
    description: Use C(group/hypeman.vgpu.host) in C(module_defaults) to set the host paths once.
    support: full
    membership:
      - hypeman.vgpu.host
  platform:
    description: Runs on the hypeman host; standard library only.
    support: full
    platforms: posix
"""

    INFO_MODULE = r"""
attributes:
  check_mode:
    description: Never changes anything, so it runs the same in check mode.
    support: full
  diff_mode:
    description: Returns no diff; it changes nothing.
    support: N/A
"""

    STATE_MODULE = r"""
attributes:
  check_mode:
    description: Computes every outcome and reports what would change without writing.
    support: full
  diff_mode:
    description: Shows the state this module owns before and after.
    support: full
"""
