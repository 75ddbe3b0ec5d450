# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""PCI function addresses: the one parser every helper uses (standard library only).

Inputs, store records and sysfs entry names all compare in one canonical form,
``dddd:bb:dd.f`` (lowercase hex, 4-digit domain), the form of hypeman's
``vfHealthAddressPattern`` (docs/hypeman-interface.md §1).
"""

from __future__ import annotations

import re

from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError

# hypeman's vfHealthAddressPattern: lowercase hex, 4-digit domain, function 0-7.
# Go's "$" matches only at the very end, hence "\Z" (Python's "$" would accept a trailing newline).
ADDRESS_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\Z")
_INPUT_ADDRESS_RE = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{1,4}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})\.(?P<fn>[0-7])$"
)
# A sysfs entry name already in canonical form (the fast path of canonical_address).
_CANONICAL_NAME_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def normalize_address(text, what="VF", example="0000:82:00.4"):
    """Canonical PCI function address ``dddd:bb:dd.f`` (lowercase, 4-digit domain).

    Accepts an optional or short domain and any letter case (``82:00.4``,
    ``0000:E3:00.5``). Raises :class:`VgpuError` naming the value and the
    expected form for anything that is not a PCI function address; ``what``
    and ``example`` word it for the kind of device asked for (``GPU`` for a card).
    """
    match = _INPUT_ADDRESS_RE.match(text.strip()) if isinstance(text, str) else None
    if not match:
        raise VgpuError(
            "invalid %s address %r: expected a PCI function address like %s "
            "(domain:bus:device.function, hex, function 0-7)" % (what, text, example)
        )
    domain = (match.group("domain") or "0").lower().rjust(4, "0")
    return "%s:%s:%s.%s" % (domain, match.group("bus").lower(), match.group("dev").lower(), match.group("fn"))


def address_or_none(text):
    """Normalised PCI address of ``text`` (any value), or None when it is not one."""
    try:
        return normalize_address(text)
    except (VgpuError, ValueError, TypeError, AttributeError):
        return None


def canonical_address(name):
    """Normalised PCI address of a sysfs entry name, or the name itself if it is none."""
    if _CANONICAL_NAME_RE.match(name):
        return name  # already canonical: the common case, kept cheap for big hosts
    return address_or_none(name) or name
