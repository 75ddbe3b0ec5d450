# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Set ``gpu.vf_quarantine_threshold`` in hypeman's YAML config as a line edit.

Loading and dumping YAML would drop the operator's comments, quoting and key
order, so the edit touches one line (or inserts one) and leaves every other
byte alone. The result is proven before it is returned: the collection's own
reader (``module_utils/_hypeman.py``, the one modules use) must read the new
value back, and a YAML parser must see the same document apart from that key.
Anything the line edit cannot do safely is refused with the reason.
"""

from __future__ import annotations

import copy
import re

import yaml

from ansible_collections.hypeman.vgpu.plugins.module_utils import _hypeman
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError

KEY = "vf_quarantine_threshold"
_LINE_RE = re.compile(r"^(?P<indent>[ ]*)(?P<key>[^\s:#][^:#]*?)[ ]*:(?P<rest>(?:[ \t].*)?)$")
_VALUE_RE = re.compile(r"^(?P<space>[ \t]*)(?P<value>'[^']*'|\"[^\"]*\"|[^\s#]+)(?P<tail>.*)$")


class ConfigEditError(ValueError):
    """The edit cannot be made safely."""


def _content(line):
    """A line without its comment and trailing space ('' for blank/comment lines)."""
    return _hypeman._strip_comment(line).rstrip()


def _parse(text, where):
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as err:
        raise ConfigEditError("%s is not valid YAML: %s" % (where, err))
    if len(docs) > 1:
        raise ConfigEditError("%s holds %d YAML documents; hypeman reads one" % (where, len(docs)))
    data = docs[0] if docs else None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigEditError("%s is not a YAML mapping" % where)
    return data


def set_threshold(text, threshold, where="config"):
    """Return ``text`` with ``gpu.vf_quarantine_threshold: threshold``; unchanged text when already set."""
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
        raise ConfigEditError("threshold is %r; expected a whole number >= 1" % (threshold,))
    if "\t" in "".join(line[:len(line) - len(line.lstrip())] for line in text.splitlines()):
        raise ConfigEditError("%s indents with tabs, which YAML forbids" % where)
    before = _parse(text, where)
    gpu = before.get("gpu")
    if gpu is not None and not isinstance(gpu, dict):
        raise ConfigEditError("%s: gpu is %s, not a mapping" % (where, type(gpu).__name__))
    if gpu is not None and gpu.get(KEY) == threshold and not isinstance(gpu.get(KEY), bool):
        new = text
    else:
        new = _edit(text, threshold, where)
    _prove(text, new, before, threshold, where)
    return new


def _edit(text, threshold, where):
    lines = text.splitlines(True)
    gpu_index = None
    for index, line in enumerate(lines):
        match = _LINE_RE.match(_content(line))
        if match and not match.group("indent") and match.group("key").strip("'\"") == "gpu":
            if gpu_index is not None:
                raise ConfigEditError("%s has more than one top-level gpu key" % where)
            gpu_index = index
    if gpu_index is None:
        sep = "" if not text or text.endswith("\n") else "\n"
        return text + sep + "gpu:\n  %s: %d\n" % (KEY, threshold)
    rest = _LINE_RE.match(_content(lines[gpu_index])).group("rest").strip()
    if rest:
        raise ConfigEditError("%s: gpu is written inline (%r); write it as a block to let this role edit it"
                              % (where, rest))
    # The gpu block: the following lines indented deeper (blank and comment lines inside it too).
    child_indent = None
    end = gpu_index + 1
    key_index = None
    for index in range(gpu_index + 1, len(lines)):
        content = _content(lines[index])
        if not content.strip():
            continue
        indent = len(content) - len(content.lstrip(" "))
        if indent == 0:
            break
        end = index + 1
        if child_indent is None:
            child_indent = indent
        match = _LINE_RE.match(content)
        if indent == child_indent and match and match.group("key").strip("'\"") == KEY:
            if key_index is not None:
                raise ConfigEditError("%s: gpu.%s appears twice" % (where, KEY))
            key_index = index
    if key_index is not None:
        line = lines[key_index]
        newline = "\n" if line.endswith("\n") else ""
        body = line[:-1] if newline else line
        head, _colon, after = body.partition(":")
        value = _VALUE_RE.match(after)
        if not value or not value.group("value") or value.group("value") in ("|", ">", "&", "*"):
            raise ConfigEditError("%s: cannot edit the value of gpu.%s in %r" % (where, KEY, body))
        lines[key_index] = "%s:%s%d%s%s" % (head, value.group("space") or " ", threshold, value.group("tail"), newline)
        return "".join(lines)
    indent = " " * (child_indent or 2)
    if end > 0 and not lines[end - 1].endswith("\n"):
        lines[end - 1] += "\n"
    lines.insert(end, "%s%s: %d\n" % (indent, KEY, threshold))
    return "".join(lines)


def _prove(old, new, before, threshold, where):
    try:
        read_back = _hypeman.parse_quarantine_threshold(new, source=where)
    except VgpuError as err:
        raise ConfigEditError("the edited %s would not read back: %s" % (where, err.msg))
    if read_back != threshold:
        raise ConfigEditError("the edited %s reads back as %r, not %d; refusing to write it" % (where, read_back, threshold))
    expected = copy.deepcopy(before)
    if not isinstance(expected.get("gpu"), dict):
        expected["gpu"] = {}
    expected["gpu"][KEY] = threshold
    if _parse(new, where) != expected:
        raise ConfigEditError("the line edit of %s would change other keys; refusing to write it" % where)
    if new != old:
        kept_new = [line for line in new.splitlines() if KEY not in line]
        kept_old = [line for line in old.splitlines() if KEY not in line]
        appended_block = "gpu" not in before and kept_new == kept_old + ["gpu:"]
        if kept_new != kept_old and not appended_block:
            raise ConfigEditError("the line edit of %s would change other lines; refusing to write it" % where)
