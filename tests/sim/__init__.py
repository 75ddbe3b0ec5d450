# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Test equipment: a simulated hypeman vGPU host (standard library only).

``tests.sim.hosttree`` builds realistic host trees (sysfs, /proc, /dev,
hypeman's data dir and config) under a root directory. Unit tests,
integration targets and the simulator share it. No module or module_utils
file imports this package.
"""
