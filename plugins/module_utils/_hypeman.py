# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""hypeman's host layout: config file, data dir, instances, API (stdlib only)."""

from __future__ import annotations

import errno
import re

from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError

DEFAULT_QUARANTINE_THRESHOLD = 2  # hypeman's defaultVFQuarantineThreshold

_KEY_RE = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z0-9_.-]+)\s*:\s*(?P<value>.*?)\s*$")
_FLOW_RE = re.compile(r"(?:^|[{,])\s*vf_quarantine_threshold\s*:\s*(?P<value>[^,}]*)")


def _strip_comment(line):
    # A '#' starts a comment only at line start or after whitespace (YAML rule).
    for idx, char in enumerate(line):
        if char == "#" and (idx == 0 or line[idx - 1] in " \t"):
            return line[:idx]
    return line


def _scalar(text):
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    return text


def parse_quarantine_threshold(text, source="config"):
    """Return ``gpu.vf_quarantine_threshold`` from hypeman YAML text, or None.

    hypeman's config is plain block YAML; this reads the one key we need
    without a YAML library (modules run on the host with the stdlib only).
    """
    in_gpu = False
    gpu_indent = 0
    for raw in text.splitlines():
        line = _strip_comment(raw).rstrip()
        if not line.strip():
            continue
        match = _KEY_RE.match(line)
        if not match:
            continue
        indent = len(match.group("indent").expandtabs())
        key, value = match.group("key"), match.group("value")
        if in_gpu and indent <= gpu_indent:
            in_gpu = False
        if not in_gpu and key == "gpu" and indent == 0:
            if value.startswith("{"):
                flow = _FLOW_RE.search(value)
                return _threshold_value(_scalar(flow.group("value")), source) if flow else None
            in_gpu, gpu_indent = True, indent
            continue
        if in_gpu and key == "vf_quarantine_threshold":
            return _threshold_value(_scalar(value), source)
    return None


def _threshold_value(text, source):
    try:
        value = int(text, 10)
    except ValueError:
        raise VgpuError(
            "%s: gpu.vf_quarantine_threshold is %r; expected a whole number >= 1" % (source, text)
        )
    if value < 1:
        raise VgpuError(
            "%s: gpu.vf_quarantine_threshold is %d; expected a whole number >= 1 "
            "(a threshold below 1 would quarantine every VF with a record)" % (source, value)
        )
    return value


def read_quarantine_threshold(config_path):
    """The threshold hypeman uses: the config key, else hypeman's default 2.

    A missing config file means defaults, exactly as for hypeman. Returns
    ``(threshold, source)`` where source says where the value came from.
    """
    try:
        with open(config_path, "r", encoding="utf-8") as handle:
            text = handle.read()
    except (IOError, OSError) as err:
        if err.errno == errno.ENOENT:
            return DEFAULT_QUARANTINE_THRESHOLD, "default"
        raise VgpuError("cannot read hypeman config %s: %s" % (config_path, err.strerror or err))
    value = parse_quarantine_threshold(text, source=config_path)
    if value is None:
        return DEFAULT_QUARANTINE_THRESHOLD, "default"
    return value, config_path


def resolve_threshold(explicit, config_path):
    """An explicit module threshold wins; it must be >= 1 like the config's."""
    if explicit is not None:
        if explicit < 1:
            raise VgpuError("threshold is %d; expected a whole number >= 1" % explicit)
        return explicit, "option"
    return read_quarantine_threshold(config_path)
