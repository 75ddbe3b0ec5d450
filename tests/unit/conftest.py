# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Shared fixtures of the unit tests: the fake ``journalctl`` every test gets first on PATH."""

from __future__ import annotations

from ansible_collections.hypeman.vgpu.tests.unit.fake_journalctl import fake_journalctl  # noqa: F401  pylint: disable=unused-import
