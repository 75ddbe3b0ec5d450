# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Shared fixtures of the unit tests: the fake ``journalctl`` every test gets first on PATH."""

from __future__ import annotations

import importlib.util
import os

# Loaded by path, not as ansible_collections.hypeman.vgpu...: importing the
# collection package here, before a controller test installs ansible's
# collection loader, leaves the package without its collection metadata.
_SPEC = importlib.util.spec_from_file_location(
    "_hypeman_vgpu_fake_journalctl", os.path.join(os.path.dirname(__file__), "fake_journalctl.py"))
_FAKE = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_FAKE)
fake_journalctl = _FAKE.fake_journalctl
