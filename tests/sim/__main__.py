# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``python3 -m tests.sim``: the simulated host's command line (see cli.py)."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
