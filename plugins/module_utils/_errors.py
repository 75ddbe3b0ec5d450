# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Exceptions shared by the collection's helpers (standard library only)."""

from __future__ import annotations


class VgpuError(Exception):
    """An expected failure with an operator-facing message.

    Modules turn it into ``fail_json(msg=str(err))`` and never show a traceback.
    Extra keyword arguments become extra keys of the failure result.
    """

    def __init__(self, msg, **details):
        super().__init__(msg)
        self.msg = msg
        self.details = details
