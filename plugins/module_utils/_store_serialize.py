# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The VF health store's bytes as hypeman writes them (stdlib only).

Go's ``encoding/json`` (HTML-safe escaping) through ``json.MarshalIndent``
with two spaces, byte for byte. ``_store.HealthStore.to_bytes`` and
``marshal_error`` import this helper when called: readers such as the audit
never serialize a store and need not compile it (docs/performance.md, "Audit
cost per host").
"""

from __future__ import annotations

import re

from ansible_collections.hypeman.vgpu.plugins.module_utils import _gotime


_NEEDS_ESCAPE = re.compile("[\x00-\x1f\"\\\\<>&\u2028\u2029\ud800-\udfff]")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(match):
    char = match.group(0)
    escaped = _ESCAPES.get(char)
    if escaped is not None:
        return escaped
    code = ord(char)
    if 0xD800 <= code <= 0xDFFF:
        return "\\ufffd"
    return "\\u%04x" % code


def go_json_string(text):
    """A Go-encoded JSON string: escapes ``< > &``, U+2028/U+2029 and controls; raw UTF-8 otherwise."""
    if _NEEDS_ESCAPE.search(text) is None:
        return '"' + text + '"'
    return '"' + _NEEDS_ESCAPE.sub(_escape_char, text) + '"'


_FAILURE_TEXT = ('\n        {\n          "instance_id": "%s",\n          "assigned_at": "%s",'
                 '\n          "reported_at": "%s"\n        }')


def serialize_records(records):
    """Bytes hypeman writes for ``records`` (already sorted by address); ValueError
    with Go's text for a time Go cannot marshal."""
    if not records:
        return b'{\n  "version": 1,\n  "records": []\n}'
    go_format = _gotime.format_rfc3339nano

    def fmt(value, go_type="time.Time"):
        try:
            return go_format(value)
        except ValueError as err:
            # Go's encoding/json wraps a Marshaler's error (MarshalerError).
            raise ValueError("json: error calling MarshalJSON for type %s: %s" % (go_type, err))

    # When no string needs Go's escaping (checked at once) and no failure omits a
    # field, each failure is one template; else the general, per-string way.
    strings = [record.vf_address for record in records]
    strings.extend(text for record in records for failure in record.failures for text in failure[:2])
    simple = _NEEDS_ESCAPE.search("".join(strings)) is None and all(strings)
    failure_text = _FAILURE_TEXT
    parts = ['{\n  "version": 1,\n  "records": [']
    first = True
    for record in records:
        parts.append("\n    {\n      \"vf_address\": " if first else ",\n    {\n      \"vf_address\": ")
        first = False
        parts.append('"%s"' % record.vf_address if simple else go_json_string(record.vf_address))
        if record.failures:
            parts.append(',\n      "failures": [')
            if simple:
                parts.append(",".join([failure_text % (failure.instance_id, failure.assigned_at, fmt(failure.reported_at))
                                       for failure in record.failures]))
            else:
                for index, failure in enumerate(record.failures):
                    parts.append("\n        {" if index == 0 else ",\n        {")
                    if failure.instance_id:
                        parts.append('\n          "instance_id": ')
                        parts.append(go_json_string(failure.instance_id))
                        parts.append(",")
                    if failure.assigned_at:
                        parts.append('\n          "assigned_at": ')
                        parts.append(go_json_string(failure.assigned_at))
                        parts.append(",")
                    parts.append('\n          "reported_at": "')
                    parts.append(fmt(failure.reported_at))
                    parts.append('"\n        }')
            parts.append("\n      ]")
        if record.quarantined_at is not None:
            parts.append(',\n      "quarantined_at": "')
            parts.append(fmt(record.quarantined_at, "*time.Time"))
            parts.append('"')
        parts.append("\n    }")
    parts.append("\n  ]\n}")
    return "".join(parts).encode("utf-8")
