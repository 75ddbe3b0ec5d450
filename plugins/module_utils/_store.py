# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""hypeman's VF health store (``<data_dir>/gpu/vf-health.json``), exactly as hypeman
handles it (standard library only).

Source of truth: hypeman ``lib/devices/vf_health.go`` (newest build: load
validation, ``ReportVFInitFailure``/``ReportVFInitSuccess``, threshold
re-evaluation, ``writeStateLocked``) and Go's ``encoding/json`` decoding and
encoding rules. Where this file matches Go behaviour that is easy to miss, a
comment says which.

Public API (other helpers import these names):

* :data:`STORE_RELPATH`, :data:`VF_ADDRESS_RE`, :func:`normalize_vf_address`
* :func:`load_store` -> :class:`HealthStore` (never raises for bad content)
* :class:`HealthStore` with :class:`Record` / :class:`Failure` values
* :func:`update_store` -- locked, validated, durable read-modify-write
* :func:`recover_records` -- what ``state: repaired`` keeps from a broken file
"""

from __future__ import annotations

import collections
import errno
import fcntl
import json
import os
import re
import stat
import time

from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.plugins.module_utils import _gotime

STORE_RELPATH = "gpu/vf-health.json"
STORE_VERSION = 1
TMP_SUFFIX = ".tmp"  # hypeman: tmp := s.path + ".tmp"
LOCK_SUFFIX = ".lock"

# hypeman's vfHealthAddressPattern: lowercase hex, 4-digit domain, function 0-7.
# Go's "$" matches only at the very end, hence "\Z" (Python's "$" would accept a trailing newline).
VF_ADDRESS_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\Z")
_INPUT_ADDRESS_RE = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{1,4}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})\.(?P<fn>[0-7])$"
)
# Anything that looks like a full PCI function address, for repair recovery.
_RECOVER_ADDRESS_RE = re.compile(r"(?<![0-9A-Za-z])([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])(?![0-9A-Za-z])")

FORMAT_V1 = "v1"
FORMAT_LEGACY = "legacy"
FORMAT_INVALID = "invalid"
FORMAT_MISSING = "missing"


def normalize_vf_address(text):
    """Canonical PCI function address ``dddd:bb:dd.f`` (lowercase, 4-digit domain).

    Accepts an optional or short domain and any letter case (``82:00.4``,
    ``0000:E3:00.5``). Raises :class:`VgpuError` naming the value and the
    expected form for anything that is not a PCI function address.
    """
    if not isinstance(text, str):
        raise VgpuError(
            "invalid VF address %r: expected a PCI function address like 0000:82:00.4 "
            "(domain:bus:device.function, hex, function 0-7)" % (text,)
        )
    match = _INPUT_ADDRESS_RE.match(text.strip())
    if not match:
        raise VgpuError(
            "invalid VF address %r: expected a PCI function address like 0000:82:00.4 "
            "(domain:bus:device.function, hex, function 0-7)" % (text,)
        )
    domain = (match.group("domain") or "0").lower().rjust(4, "0")
    return "%s:%s:%s.%s" % (domain, match.group("bus").lower(), match.group("dev").lower(), match.group("fn"))


# --- Go text helpers -------------------------------------------------------------


def go_quote(text):
    """Go's ``strconv.Quote`` (what ``%q`` prints) for a decoded string."""
    out = ['"']
    for char in text:
        code = ord(char)
        if char == '"' or char == "\\":
            out.append("\\" + char)
        elif 0xD800 <= code <= 0xDFFF:
            out.append("\\ufffd")
        elif code < 0x80:
            if 0x20 <= code < 0x7F:
                out.append(char)
            else:
                out.append(_GO_CONTROL_ESCAPES.get(char) or "\\x%02x" % code)
        elif char.isprintable():
            out.append(char)
        elif code < 0x10000:
            out.append("\\u%04x" % code)
        else:
            out.append("\\U%08x" % code)
    out.append('"')
    return "".join(out)


_GO_CONTROL_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


def _go_errno_text(err):
    """Go's syscall.Errno text: the C message with a lowercase first letter."""
    text = err.strerror or str(err)
    return text[:1].lower() + text[1:] if text[:1].isupper() and text[1:2].islower() else text


# --- Go encoding/json: syntax check (scanner.go) --------------------------------

_SPACE = b" \t\r\n"
_MAX_DEPTH = 10000


class _GoSyntaxError(Exception):
    pass


def _quote_char(byte):
    """Go's ``quoteChar``: the offending byte as a rune, quoted with single quotes."""
    if byte == 0x27:
        return "'\\''"
    if byte == 0x22:
        return "'\"'"
    inner = go_quote(chr(byte))[1:-1]
    return "'" + inner + "'"


def _syntax(byte, context):
    return _GoSyntaxError("invalid character %s %s" % (_quote_char(byte), context))


def _go_check_valid(data):
    """Go's ``checkValid``: byte-by-byte scanner with Go's exact error texts."""
    stack = []  # 'k' = in object expecting key/colon, 'v' = in object value, 'a' = in array
    n = len(data)
    i = 0

    def end_value(i):
        """Go's stateEndValue loop; returns the index after the value's container handling."""
        while True:
            if not stack:
                # stateEndTop: only spaces may follow.
                while i < n:
                    c = data[i]
                    if c not in _SPACE:
                        raise _syntax(c, "after top-level value")
                    i += 1
                return i, True
            if i >= n:
                return i, False
            c = data[i]
            if c in _SPACE:
                i += 1
                continue
            top = stack[-1]
            if top == "k":
                if c == 0x3A:  # ':'
                    stack[-1] = "v"
                    return i + 1, None
                raise _syntax(c, "after object key")
            if top == "v":
                if c == 0x2C:  # ','
                    stack[-1] = "k"
                    return i + 1, "key"
                if c == 0x7D:  # '}'
                    stack.pop()
                    i += 1
                    continue
                raise _syntax(c, "after object key:value pair")
            if c == 0x2C:
                return i + 1, None
            if c == 0x5D:  # ']'
                stack.pop()
                i += 1
                continue
            raise _syntax(c, "after array element")

    expect = "value"  # "value", "value_or_empty", "key", "key_or_empty"
    while True:
        # skip spaces
        while i < n and data[i] in _SPACE:
            i += 1
        if i >= n:
            break
        c = data[i]
        if expect in ("key", "key_or_empty"):
            if c == 0x7D and expect == "key_or_empty":
                stack.pop()
                i, state = end_value(i + 1)
                if state is True:
                    return
                expect = "key" if state == "key" else "value"
                continue
            if c != 0x22:
                raise _syntax(c, "looking for beginning of object key string")
            i = _scan_string(data, i + 1)
            if i is None:
                break
            i, state = end_value(i)
            if state is True:
                return
            expect = "key" if state == "key" else "value"
            continue
        if c == 0x5D and expect == "value_or_empty":
            stack.pop()
            i, state = end_value(i + 1)
            if state is True:
                return
            expect = "key" if state == "key" else "value"
            continue
        if c == 0x7B:  # '{'
            if len(stack) >= _MAX_DEPTH:
                raise _syntax(c, "exceeded max depth")
            stack.append("k")
            expect = "key_or_empty"
            i += 1
            continue
        if c == 0x5B:  # '['
            if len(stack) >= _MAX_DEPTH:
                raise _syntax(c, "exceeded max depth")
            stack.append("a")
            expect = "value_or_empty"
            i += 1
            continue
        if c == 0x22:
            i = _scan_string(data, i + 1)
            if i is None:
                break
        elif c == 0x2D or 0x30 <= c <= 0x39:
            i = _scan_number(data, i)
        elif c in (0x74, 0x66, 0x6E):  # t f n
            i = _scan_literal(data, i)
        else:
            raise _syntax(c, "looking for beginning of value")
        i, state = end_value(i)
        if state is True:
            return
        expect = "key" if state == "key" else "value"
        if state is False:
            break
    raise _GoSyntaxError("unexpected end of JSON input")


_HEX = b"0123456789abcdefABCDEF"


def _scan_string(data, i):
    """Scan a string body from ``i`` (after the quote); index after the closing quote or None at EOF."""
    n = len(data)
    while i < n:
        c = data[i]
        if c == 0x22:
            return i + 1
        if c == 0x5C:
            i += 1
            if i >= n:
                raise _syntax(0x20, "in string escape code")  # Go's eof() feeds a space
            c = data[i]
            if c in b'bfnrt\\/"':
                i += 1
                continue
            if c != 0x75:
                raise _syntax(c, "in string escape code")
            for _digit in range(4):
                i += 1
                if i >= n:
                    raise _syntax(0x20, "in \\u hexadecimal character escape")
                if data[i] not in _HEX:
                    raise _syntax(data[i], "in \\u hexadecimal character escape")
            i += 1
            continue
        if c < 0x20:
            raise _syntax(c, "in string literal")
        i += 1
    return None


def _scan_number(data, i):
    n = len(data)

    def at(j):
        return data[j] if j < n else 0x20  # EOF behaves as a space (Go's eof())

    if data[i] == 0x2D:
        i += 1
        c = at(i)
        if not 0x30 <= c <= 0x39:
            raise _syntax(c, "in numeric literal")
    if data[i] == 0x30:
        i += 1
    else:
        while 0x30 <= at(i) <= 0x39:
            i += 1
    if at(i) == 0x2E:
        i += 1
        if not 0x30 <= at(i) <= 0x39:
            raise _syntax(at(i), "after decimal point in numeric literal")
        while 0x30 <= at(i) <= 0x39:
            i += 1
    if at(i) in (0x65, 0x45):
        i += 1
        if at(i) in (0x2B, 0x2D):
            i += 1
        if not 0x30 <= at(i) <= 0x39:
            raise _syntax(at(i), "in exponent of numeric literal")
        while 0x30 <= at(i) <= 0x39:
            i += 1
    return i


_LITERALS = {0x74: b"true", 0x66: b"false", 0x6E: b"null"}


def _scan_literal(data, i):
    word = _LITERALS[data[i]]
    name = word.decode()
    n = len(data)
    for k in range(1, len(word)):
        c = data[i + k] if i + k < n else 0x20
        if c != word[k]:
            raise _syntax(c, "in literal %s (expecting %s)" % (name, _quote_char(word[k])))
    return i + len(word)


# --- JSON value tree (both decoding paths build the same shapes) ---------------------


class _Obj(list):
    """A JSON object as its (key, value) pairs in file order (duplicates kept)."""


class _Num(str):
    """A JSON number as its literal text (Go reports it, e.g. ``number 1.5``)."""


class _RawStr(str):
    """A decoded JSON string that also keeps its bytes as written (Go's time
    decoding parses the raw bytes between the quotes, escapes included)."""

    __slots__ = ("raw",)


def _raw_text(value):
    raw = getattr(value, "raw", None)
    return value if raw is None else raw


def _go_utf8(data):
    """Decode bytes as Go does: each invalid byte becomes U+FFFD."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    out = []
    pos = 0
    while pos < len(data):
        try:
            out.append(data[pos:].decode("utf-8"))
            break
        except UnicodeDecodeError as err:
            out.append(data[pos:pos + err.start].decode("utf-8"))
            out.append("\ufffd")
            pos += err.start + 1
    return "".join(out)


def _reject_constant(name):
    raise ValueError("not JSON: %s" % name)


def _fast_tree(data):
    """Python's C decoder, used only when it provably sees what Go sees:
    valid UTF-8, no escapes at all (so decoded == raw), no NaN/Infinity."""
    if b"\\" in data:
        return None
    try:
        text = data.decode("utf-8")
        return json.loads(text, object_pairs_hook=_Obj, parse_int=_Num, parse_float=_Num,
                          parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return None


def _unquote(raw):
    """Go's ``unquoteBytes`` on a string body already checked by the scanner."""
    if b"\\" not in raw:
        return _go_utf8(raw)
    out = []
    i = 0
    n = len(raw)
    start = 0
    while i < n:
        if raw[i] != 0x5C:
            i += 1
            continue
        out.append(_go_utf8(raw[start:i]))
        esc = raw[i + 1]
        if esc == 0x75:
            code = int(raw[i + 2:i + 6], 16)
            i += 6
            if 0xD800 <= code < 0xDC00 and raw[i:i + 2] == b"\\u":
                low = int(raw[i + 2:i + 6], 16)
                if 0xDC00 <= low < 0xE000:
                    out.append(chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)))
                    i += 6
                    start = i
                    continue
            out.append("\ufffd" if 0xD800 <= code < 0xE000 else chr(code))
        else:
            out.append({0x62: "\b", 0x66: "\f", 0x6E: "\n", 0x72: "\r", 0x74: "\t"}.get(esc, chr(esc)))
            i += 2
        start = i
    out.append(_go_utf8(raw[start:]))
    return "".join(out)


def _slow_tree(data):
    """Build the value tree from input the Go scanner accepted (iterative)."""
    n = len(data)
    i = 0
    root = []
    stack = [(root, None)]  # (container, pending key for objects)

    def add(value):
        container, _key = stack[-1]
        if isinstance(container, _Obj):
            container.append((stack[-1][1], value))
        else:
            container.append(value)

    expect_key = False
    while True:
        while i < n and data[i] in _SPACE:
            i += 1
        if i >= n:
            break
        c = data[i]
        if c in b",:":
            if c == 0x2C and isinstance(stack[-1][0], _Obj):
                expect_key = True
            i += 1
            continue
        if c in b"}]":
            container, _key = stack.pop()
            i += 1
            add(container)
            expect_key = False
            continue
        if c == 0x22:
            end = _scan_string(data, i + 1)
            raw = data[i + 1:end - 1]
            text = _RawStr(_unquote(raw))
            text.raw = raw.decode("utf-8", "surrogateescape")
            i = end
            if expect_key:
                stack[-1] = (stack[-1][0], str(text))
                expect_key = False
            else:
                add(text)
            continue
        if c == 0x7B:
            stack.append((_Obj(), None))
            expect_key = True
            i += 1
            continue
        if c == 0x5B:
            stack.append(([], None))
            i += 1
            continue
        if c in (0x74, 0x66, 0x6E):
            add({0x74: True, 0x66: False, 0x6E: None}[c])
            i += len(_LITERALS[c])
            continue
        end = _scan_number(data, i)
        add(_Num(data[i:end].decode("ascii")))
        i = end
    return root[0]


def _json_tree(data):
    """Go's syntax check plus a value tree; raises _GoSyntaxError with Go's text."""
    tree = _fast_tree(data)
    if tree is not None:
        return tree
    _go_check_valid(data)
    return _slow_tree(data)


# --- Go encoding/json: decoding into hypeman's structs (decode.go) ------------------

_PKG = "devices"


class _GoAbort(Exception):
    """An error Go returns immediately (Time.UnmarshalJSON), not saved."""


class _GoSlice(object):
    """A Go slice of structs: decoding reuses elements between len and cap
    (Go issue 21092), which matters when a key is repeated."""

    __slots__ = ("nil", "backing", "length")

    def __init__(self):
        self.nil = True
        self.backing = []
        self.length = 0

    def items(self):
        return self.backing[:self.length]


class _GoFailure(object):
    __slots__ = ("instance_id", "assigned_at", "reported_at")
    GO_NAME = "vfInitFailure"

    def __init__(self):
        self.instance_id = ""
        self.assigned_at = ""
        self.reported_at = _gotime.ZERO


class _GoRecord(object):
    __slots__ = ("vf_address", "failures", "quarantined_at")
    GO_NAME = "vfHealthRecord"

    def __init__(self):
        self.vf_address = ""
        self.failures = _GoSlice()
        self.quarantined_at = None


class _GoFile(object):
    __slots__ = ("version", "records")
    GO_NAME = "vfHealthFile"

    def __init__(self):
        self.version = 0
        self.records = _GoSlice()


_FOLD_TO_ASCII = {"\u017f": "S", "\u212a": "K"}  # the only non-ASCII runes whose fold orbit holds ASCII


_FOLD_CACHE = {}


def _go_fold(key):
    """Go's key folding (bytes.EqualFold): ASCII case-insensitive, plus long s and Kelvin sign."""
    folded = _FOLD_CACHE.get(key)
    if folded is None:
        if key.isascii():
            folded = key.upper()
        else:
            folded = "".join(char.upper() if char < "\x80" else _FOLD_TO_ASCII.get(char, char) for char in key)
        if len(_FOLD_CACHE) < 1024:  # keys repeat; unknown keys must not grow it without bound
            _FOLD_CACHE[key] = folded
    return folded


_FIELDS = {
    _GoFile: {"VERSION": ("version", "int"), "RECORDS": ("records", _GoRecord)},
    _GoRecord: {"VF_ADDRESS": ("vf_address", "string"), "FAILURES": ("failures", _GoFailure),
                "QUARANTINED_AT": ("quarantined_at", "*time"), },
    _GoFailure: {"INSTANCE_ID": ("instance_id", "string"), "ASSIGNED_AT": ("assigned_at", "string"),
                 "REPORTED_AT": ("reported_at", "time")},
}

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_INT_RE = re.compile(r"^-?[0-9]+$")


def _kind(node):
    if isinstance(node, _Obj):
        return "object"
    if isinstance(node, list):
        return "array"
    if isinstance(node, _Num):
        return "number"
    if isinstance(node, bool):
        return "bool"
    return "string"


class _GoDecoder(object):
    def __init__(self):
        self.saved = None

    def type_error(self, value, type_name, context):
        if self.saved is not None:
            return
        if context:
            struct, fields = context
            self.saved = "json: cannot unmarshal %s into Go struct field %s.%s of type %s" % (
                value, struct, ".".join(fields), type_name)
        else:
            self.saved = "json: cannot unmarshal %s into Go value of type %s" % (value, type_name)

    def struct(self, target, node, context):
        cls = type(target)
        if node is None:
            return
        if not isinstance(node, _Obj):
            self.type_error(_kind(node), "%s.%s" % (_PKG, cls.GO_NAME), context)
            return
        fields = _FIELDS[cls]
        stack = context[1] if context else []
        for key, value in node:
            field = fields.get(_go_fold(key))
            if field is None:
                continue  # unknown keys are ignored (and dropped on rewrite)
            name, kind = field
            sub_context = (cls.GO_NAME, stack + [name])
            if kind == "int":
                self.int_field(target, name, value, sub_context)
            elif kind == "string":
                if value is None:
                    continue
                if isinstance(value, str) and not isinstance(value, _Num):
                    setattr(target, name, str(value))
                else:
                    self.type_error(_kind(value), "string", sub_context)
            elif kind == "time":
                parsed = self.time_value(value)
                if parsed is not None:
                    setattr(target, name, parsed)
            elif kind == "*time":
                if value is None:
                    setattr(target, name, None)
                else:
                    setattr(target, name, self.time_value(value))
            else:
                self.slice(getattr(target, name), kind, value, sub_context)

    def int_field(self, target, name, value, context):
        if value is None:
            return
        if isinstance(value, _Num):
            if _INT_RE.match(value):
                number = int(value)
                if _INT64_MIN <= number <= _INT64_MAX:
                    setattr(target, name, number)
                    return
            self.type_error("number " + value, "int", context)
            return
        self.type_error(_kind(value), "int", context)

    @staticmethod
    def time_value(value):
        """Go's Time.UnmarshalJSON: null is a no-op (None), a non-string fails."""
        if value is None:
            return None
        if isinstance(value, _Num) or not isinstance(value, str):
            raise _GoAbort("Time.UnmarshalJSON: input is not a JSON string")
        try:
            return _gotime.parse_rfc3339(_raw_text(value))
        except ValueError as err:
            raise _GoAbort(str(err))

    def slice(self, target, elem_cls, node, context):
        if node is None:
            target.nil, target.backing, target.length = True, [], 0
            return
        if isinstance(node, _Obj) or not isinstance(node, list):
            self.type_error(_kind(node), "[]%s.%s" % (_PKG, elem_cls.GO_NAME), context)
            return
        if not node:
            target.nil, target.backing, target.length = False, [], 0
            return
        for index, item in enumerate(node):
            if index >= len(target.backing):
                target.backing.append(elem_cls())
            if index >= target.length:
                target.length = index + 1
            self.struct(target.backing[index], item, context)
        target.length = len(node)
        target.nil = False


def _go_unmarshal(data):
    """``json.Unmarshal(data, &vfHealthFile{})``: returns ``(go_file, tree)``;
    raises ``_UnmarshalError`` with Go's text (and the tree when it parsed)."""
    try:
        tree = _json_tree(data)
    except _GoSyntaxError as err:
        raise _UnmarshalError(str(err), None)
    decoder = _GoDecoder()
    result = _GoFile()
    try:
        decoder.struct(result, tree, None)
    except _GoAbort as err:
        raise _UnmarshalError(str(err), tree)
    if decoder.saved is not None:
        raise _UnmarshalError(decoder.saved, tree)
    return result, tree


class _UnmarshalError(ValueError):
    def __init__(self, msg, tree):
        super(_UnmarshalError, self).__init__(msg)
        self.tree = tree


# --- the store ---------------------------------------------------------------------

Failure = collections.namedtuple("Failure", "instance_id assigned_at reported_at")
Failure.__doc__ = "One failed assignment: (instance_id, assigned_at) is the dedup key; reported_at a GoTime."

Record = collections.namedtuple("Record", "vf_address failures quarantined_at")
Record.__doc__ = "A VF's record: failures is a tuple of Failure (oldest first); quarantined_at a GoTime or None."


def _validate(go_file):
    """hypeman's loadLocked checks, in hypeman's order and words."""
    if go_file.version != STORE_VERSION:
        raise ValueError("validate VF health state: unsupported version %d" % go_file.version)
    if go_file.records.nil:
        raise ValueError("validate VF health state: expected a records array")
    loaded = {}
    for index, raw in enumerate(go_file.records.items()):
        if not VF_ADDRESS_RE.match(raw.vf_address):
            raise ValueError("validate VF health state record %d: invalid VF address %s"
                             % (index, go_quote(raw.vf_address)))
        if raw.quarantined_at is not None and _gotime.is_zero(raw.quarantined_at):
            raise ValueError("validate VF health state record %d: missing quarantine timestamp" % index)
        failures = raw.failures.items()
        if raw.quarantined_at is None and not failures:
            raise ValueError("validate VF health state record %d: neither quarantined nor any recorded failures"
                             % index)
        seen = set()
        kept = []
        for findex, failure in enumerate(failures):
            if _gotime.is_zero(failure.reported_at):
                raise ValueError("validate VF health state record %d failure %d: missing report timestamp"
                                 % (index, findex))
            key = failure.instance_id + "\x00" + failure.assigned_at  # hypeman's key, collisions included
            if key in seen:
                raise ValueError("validate VF health state record %d: duplicate failure for instance %s assigned at %s"
                                 % (index, go_quote(failure.instance_id), go_quote(failure.assigned_at)))
            seen.add(key)
            kept.append(Failure(failure.instance_id, failure.assigned_at, failure.reported_at))
        if raw.vf_address in loaded:
            raise ValueError("validate VF health state record %d: duplicate VF address %s"
                             % (index, go_quote(raw.vf_address)))
        loaded[raw.vf_address] = Record(raw.vf_address, tuple(kept), raw.quarantined_at)
    return loaded


class HealthStore(object):
    """One load of the store.

    Attributes: ``path``; ``exists`` (the path exists); ``is_symlink`` (the
    store file itself is a symlink); ``format`` (``v1``, ``legacy``,
    ``invalid``, ``missing``); ``valid``; ``error`` (hypeman's load error text,
    None when valid); ``raw`` (the bytes read, None when missing or
    unreadable); ``records`` (dict address -> :class:`Record`; empty when invalid).

    Mutators follow hypeman's semantics and change only ``records``; they
    refuse to act on an invalid store (fail closed).
    """

    def __init__(self, path, exists=False, fmt=FORMAT_MISSING, valid=True, error=None, raw=None,
                 records=None, is_symlink=False):
        self.path = path
        self.exists = exists
        self.format = fmt
        self.valid = valid
        self.error = error
        self.raw = raw
        self.records = dict(records or {})
        self.is_symlink = is_symlink

    # -- queries ------------------------------------------------------------------

    def quarantined(self):
        """Sorted addresses of quarantined VFs."""
        return sorted(address for address, record in self.records.items() if record.quarantined_at is not None)

    def failure_count(self, vf):
        """Recorded failures (distinct assignments) for ``vf``; 0 without a record."""
        record = self.records.get(vf)
        return len(record.failures) if record else 0

    def would_quarantine(self, threshold):
        """Sorted addresses hypeman's load re-evaluation would quarantine at ``threshold``."""
        return sorted(address for address, record in self.records.items()
                      if record.quarantined_at is None and len(record.failures) >= threshold)

    def copy(self):
        return HealthStore(self.path, self.exists, self.format, self.valid, self.error, self.raw,
                           self.records, self.is_symlink)

    # -- mutations (hypeman's semantics) --------------------------------------------

    def _require_valid(self):
        if not self.valid:
            raise VgpuError("VF health store %s is unusable (%s): %s; refusing to change it "
                            "(use state=repaired to rewrite it)" % (self.path, self.format, self.error),
                            store_error=self.error, store_format=self.format)

    @staticmethod
    def _check_address(vf):
        if not isinstance(vf, str) or not VF_ADDRESS_RE.match(vf):
            raise VgpuError("invalid VF address %s" % go_quote(str(vf)))

    def report_failure(self, vf, instance_id, assigned_at, threshold, now=None):
        """hypeman's ReportVFInitFailure.

        Returns ``'unchanged'`` when the VF is already quarantined or this
        (instance_id, assigned_at) is already recorded; else appends the
        failure and returns ``'quarantined'`` when the count reaches
        ``threshold``, ``'recorded'`` otherwise.
        """
        self._require_valid()
        self._check_address(vf)
        previous = self.records.get(vf)
        failures = previous.failures if previous else ()
        if previous is not None and previous.quarantined_at is not None:
            return "unchanged"
        for failure in failures:
            if failure.instance_id == instance_id and failure.assigned_at == assigned_at:
                return "unchanged"
        failures = failures + (Failure(instance_id, assigned_at, now or _gotime.utc_now()),)
        quarantined_at = None
        outcome = "recorded"
        if len(failures) >= threshold:
            quarantined_at = now or _gotime.utc_now()
            outcome = "quarantined"
        self.records[vf] = Record(vf, failures, quarantined_at)
        return outcome

    def report_success(self, vf, instance_id, assigned_at):
        """hypeman's ReportVFInitSuccess.

        Clears the exactly matching failure and every older one; a record left
        without failures is deleted. A quarantined VF changes only when the
        match is its newest failure (so its record goes away and the
        quarantine is rescinded); a hand-made quarantine without failures
        never changes. Returns ``(outcome, cleared)`` with outcome
        ``'rescinded'`` (it was quarantined), ``'cleared'`` or ``'unchanged'``.
        """
        self._require_valid()
        self._check_address(vf)
        previous = self.records.get(vf)
        if previous is None or not previous.failures:
            return "unchanged", 0
        match = -1
        for index, failure in enumerate(previous.failures):
            if failure.instance_id == instance_id and failure.assigned_at == assigned_at:
                match = index
                break
        if match < 0 or (previous.quarantined_at is not None and match != len(previous.failures) - 1):
            return "unchanged", 0
        remaining = previous.failures[match + 1:]
        cleared = len(previous.failures) - len(remaining)
        if remaining:
            self.records[vf] = previous._replace(failures=remaining)
        else:
            del self.records[vf]
        return ("rescinded" if previous.quarantined_at is not None else "cleared"), cleared

    def quarantine(self, vf, now=None):
        """Manual quarantine (drain): keep failures, set quarantined_at if missing."""
        self._require_valid()
        self._check_address(vf)
        previous = self.records.get(vf)
        if previous is not None and previous.quarantined_at is not None:
            return "unchanged"
        failures = previous.failures if previous else ()
        self.records[vf] = Record(vf, failures, now or _gotime.utc_now())
        return "quarantined"

    def remove(self, vf):
        """Remove the VF's whole record: ``'cleared'`` or ``'unchanged'`` (no record)."""
        self._require_valid()
        self._check_address(vf)
        if vf in self.records:
            del self.records[vf]
            return "cleared"
        return "unchanged"

    def reevaluate(self, threshold, now=None):
        """hypeman's requarantineLocked: quarantine every unquarantined record
        with failures >= threshold; returns the sorted newly quarantined VFs."""
        self._require_valid()
        newly = self.would_quarantine(threshold)
        for address in newly:
            self.records[address] = self.records[address]._replace(quarantined_at=now or _gotime.utc_now())
        return newly

    def replace_records(self, records):
        """Make this a valid v1 store holding ``records`` (used by repair)."""
        self.records = dict(records)
        self.valid = True
        self.format = FORMAT_V1
        self.error = None

    # -- output -------------------------------------------------------------------------

    def sorted_records(self):
        return [self.records[address] for address in sorted(self.records)]

    def to_bytes(self):
        """hypeman's ``json.MarshalIndent(..., "", "  ")`` output, byte for byte."""
        self._require_valid()
        try:
            return serialize_records(self.sorted_records())
        except ValueError as err:  # a loaded offset Go cannot marshal either (e.g. +24:00)
            raise VgpuError("marshal VF health state %s: %s" % (self.path, err))

    def to_data(self):
        """JSON-able records for module results: every key present, sorted by address."""
        data = []
        for record in self.sorted_records():
            data.append({
                "vf_address": record.vf_address,
                "failures": [{"instance_id": f.instance_id, "assigned_at": f.assigned_at,
                              "reported_at": _gotime.format_rfc3339nano(f.reported_at)}
                             for f in record.failures],
                "quarantined_at": (_gotime.format_rfc3339nano(record.quarantined_at)
                                   if record.quarantined_at is not None else None),
            })
        return data


# --- serialization (Go encoding/json, HTML-safe, MarshalIndent two spaces) -----------

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


def serialize_records(records):
    """Bytes hypeman writes for ``records`` (already sorted by address)."""
    if not records:
        return b'{\n  "version": 1,\n  "records": []\n}'
    fmt = _gotime.format_rfc3339nano
    parts = ['{\n  "version": 1,\n  "records": [']
    first = True
    for record in records:
        parts.append("\n    {\n      \"vf_address\": " if first else ",\n    {\n      \"vf_address\": ")
        first = False
        parts.append(go_json_string(record.vf_address))
        if record.failures:
            parts.append(',\n      "failures": [')
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
            parts.append(fmt(record.quarantined_at))
            parts.append('"')
        parts.append("\n    }")
    parts.append("\n  ]\n}")
    return "".join(parts).encode("utf-8")


# --- loading -------------------------------------------------------------------------


def _read_error(path, err):
    if err.errno == errno.EISDIR:
        return "read VF health state: read %s: %s" % (path, _go_errno_text(err))
    return "read VF health state: open %s: %s" % (path, _go_errno_text(err))


def parse_store_bytes(path, data):
    """A :class:`HealthStore` for file content ``data`` (hypeman's load steps 3-6)."""
    try:
        go_file, _tree = _go_unmarshal(data)
    except _UnmarshalError as err:
        # The legacy L0 file is a bare JSON array: valid JSON hypeman cannot load.
        legacy = isinstance(err.tree, list) and not isinstance(err.tree, _Obj)
        return HealthStore(path, True, FORMAT_LEGACY if legacy else FORMAT_INVALID, False,
                           "unmarshal VF health state: %s" % err, data)
    try:
        records = _validate(go_file)
    except ValueError as err:
        return HealthStore(path, True, FORMAT_INVALID, False, str(err), data)
    return HealthStore(path, True, FORMAT_V1, True, None, data, records)


def load_store(path):
    """Load and validate the store like hypeman's loadLocked. Never raises for
    bad content: a missing file is an empty valid store (format ``missing``);
    anything hypeman would refuse gives ``valid=False`` with hypeman's error.
    Re-evaluation against a threshold is separate (:meth:`HealthStore.reevaluate`).
    """
    is_symlink = os.path.islink(path)
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except (IOError, OSError) as err:
        if err.errno == errno.ENOENT:  # hypeman: os.IsNotExist -> empty store, not an error
            return HealthStore(path, False, FORMAT_MISSING, True, None, None, {}, is_symlink)
        return HealthStore(path, os.path.lexists(path), FORMAT_INVALID, False, _read_error(path, err), None,
                           {}, is_symlink)
    store = parse_store_bytes(path, data)
    store.is_symlink = is_symlink
    return store


# --- repair ----------------------------------------------------------------------------


def recover_records(raw, now=None):
    """Records a repair keeps from unusable store content: every VF address
    found stays (or becomes) quarantined.

    Structured recovery first (v1 records or legacy array entries with a
    valid, lowercase address; their valid failures and quarantine time are
    kept), then any other PCI function address in the raw text is
    quarantined as of ``now`` -- erring on the side of keeping VFs out of
    placement.
    """
    now = now or _gotime.utc_now()
    records = {}
    tree = None
    if raw:
        try:
            tree = _json_tree(raw)
        except _GoSyntaxError:
            tree = None
    entries = []
    if isinstance(tree, _Obj):
        for key, value in tree:
            if _go_fold(key) == "RECORDS" and isinstance(value, list) and not isinstance(value, _Obj):
                entries.extend(value)
    elif isinstance(tree, list):
        entries = list(tree)
    for entry in entries:
        if not isinstance(entry, _Obj):
            continue
        fields = {}
        for key, value in entry:
            fields[_go_fold(key)] = value
        address = fields.get("VF_ADDRESS")
        if not isinstance(address, str) or isinstance(address, _Num):
            continue
        try:
            address = normalize_vf_address(str(address))
        except VgpuError:
            continue
        quarantined_at = _recover_time(fields.get("QUARANTINED_AT"))
        failures = list(records[address].failures) if address in records else []
        seen = set((f.instance_id, f.assigned_at) for f in failures)
        raw_failures = fields.get("FAILURES")
        if isinstance(raw_failures, list) and not isinstance(raw_failures, _Obj):
            for item in raw_failures:
                failure = _recover_failure(item)
                if failure is not None and (failure.instance_id, failure.assigned_at) not in seen:
                    seen.add((failure.instance_id, failure.assigned_at))
                    failures.append(failure)
        previous = records.get(address)
        if previous is not None and previous.quarantined_at is not None:
            quarantined_at = previous.quarantined_at
        records[address] = Record(address, tuple(failures), quarantined_at or now)
    if raw:
        text = raw.decode("utf-8", "replace")
        for match in _RECOVER_ADDRESS_RE.finditer(text):
            address = normalize_vf_address(match.group(1))
            if address not in records:
                records[address] = Record(address, (), now)
    return records


def _recover_time(value):
    if not isinstance(value, str) or isinstance(value, _Num):
        return None
    try:
        parsed = _gotime.parse_rfc3339(_raw_text(value))
        _gotime.format_rfc3339nano(parsed)
    except ValueError:
        return None
    return None if _gotime.is_zero(parsed) else parsed


def _recover_failure(item):
    if not isinstance(item, _Obj):
        return None
    fields = {}
    for key, value in item:
        fields[_go_fold(key)] = value
    reported_at = _recover_time(fields.get("REPORTED_AT"))
    if reported_at is None:
        return None
    strings = []
    for name in ("INSTANCE_ID", "ASSIGNED_AT"):
        value = fields.get(name)
        if value is None:
            value = ""
        if not isinstance(value, str) or isinstance(value, _Num):
            return None
        strings.append(str(value))
    return Failure(strings[0], strings[1], reported_at)


# --- durable, locked writes ---------------------------------------------------------------

UpdateResult = collections.namedtuple(
    "UpdateResult",
    "path changed before after result store loaded_format loaded_valid loaded_error backup_file",
)
UpdateResult.__doc__ = """Outcome of :func:`update_store`.

``before``: the file's bytes before (None when missing/unreadable);
``after``: the bytes now on disk, or that would be in check mode (None when
the store stays missing); ``changed``; ``result``: what ``mutate`` returned;
``store``: the store after ``mutate``; ``loaded_*``: the load result before
``mutate``; ``backup_file``: path of the backup made, or None.
"""


def _refuse_symlink(path, what):
    try:
        info = os.lstat(path)
    except (IOError, OSError) as err:
        if err.errno in (errno.ENOENT, errno.ENOTDIR):
            return
        raise VgpuError("cannot inspect %s %s: %s" % (what, path, err.strerror or err))
    if stat.S_ISLNK(info.st_mode):
        raise VgpuError("refusing to write the VF health store: %s %s is a symlink (possibly planted); "
                        "nothing was written. Remove it after checking where it points." % (what, path),
                        symlink=path)


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_error(path, step, err):
    return VgpuError("cannot write VF health store %s: %s: %s; the previous file is unchanged"
                     % (path, step, getattr(err, "strerror", None) or err), errno=getattr(err, "errno", None))


def _make_dirs(directory):
    """``os.MkdirAll(dir, 0755)``; a new directory gets exactly 0755."""
    missing = []
    current = directory
    while current and not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    os.makedirs(directory, mode=0o755, exist_ok=True)
    for created in missing:
        os.chmod(created, 0o755)


def write_store_bytes(path, data, owner=None):
    """hypeman's writeStateLocked procedure for ``data``.

    mkdir -p (0755), fsync the gpu dir's parent, create ``<path>.tmp`` (mode
    0644; never through a symlink or an existing file), write, fsync, close,
    rename over ``path``, fsync the gpu dir. Before the rename any failure
    removes the tmp file and leaves the old store untouched. ``owner`` is an
    optional (uid, gid) to keep the previous file's ownership.
    """
    directory = os.path.dirname(path) or "."
    tmp = path + TMP_SUFFIX
    try:
        _make_dirs(directory)
    except (IOError, OSError) as err:
        raise _write_error(path, "create VF health state dir", err)
    try:
        _fsync_dir(os.path.dirname(directory) or ".")
    except (IOError, OSError) as err:
        raise _write_error(path, "sync VF health state parent dir", err)
    _refuse_symlink(path, "store file")
    _refuse_symlink(tmp, "temporary file")
    try:
        os.unlink(tmp)  # a stale tmp (e.g. left by a killed writer); O_EXCL below must create anew
    except (IOError, OSError) as err:
        if err.errno != errno.ENOENT:
            raise _write_error(path, "remove stale VF health state tmp", err)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(tmp, flags, 0o644)
    except (IOError, OSError) as err:
        if err.errno in (errno.ELOOP, errno.EEXIST):
            raise VgpuError("refusing to write the VF health store: temporary file %s appeared while writing "
                            "(%s); nothing was written" % (tmp, err.strerror), symlink=tmp)
        raise _write_error(path, "create VF health state", err)
    try:
        try:
            os.fchmod(fd, 0o644)
            if owner is not None:
                os.fchown(fd, owner[0], owner[1])
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
        except (IOError, OSError) as err:
            raise _write_error(path, "write VF health state", err)
        try:
            os.fsync(fd)
        except (IOError, OSError) as err:
            raise _write_error(path, "sync VF health state", err)
    except VgpuError:
        os.close(fd)
        _remove_quietly(tmp)
        raise
    try:
        os.close(fd)
    except (IOError, OSError) as err:
        _remove_quietly(tmp)
        raise _write_error(path, "close VF health state", err)
    try:
        os.rename(tmp, path)
    except (IOError, OSError) as err:
        _remove_quietly(tmp)
        raise _write_error(path, "rename VF health state", err)
    try:
        _fsync_dir(directory)
    except (IOError, OSError) as err:
        raise VgpuError("VF health store %s was replaced, but syncing its directory failed: %s; the new "
                        "content is visible but may not survive a power loss" % (path, err.strerror or err),
                        errno=err.errno)


def _remove_quietly(path):
    try:
        os.unlink(path)
    except (IOError, OSError):
        pass


class _FileLock(object):
    """Exclusive ``flock`` on ``<store>.lock`` (created 0600, never through a symlink)."""

    def __init__(self, path, timeout):
        self.path = path
        self.timeout = timeout
        self.fd = None

    def __enter__(self):
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            self.fd = os.open(self.path, flags, 0o600)
        except (IOError, OSError) as err:
            if err.errno == errno.ELOOP:
                raise VgpuError("refusing to use lock file %s: it is a symlink" % self.path, symlink=self.path)
            raise VgpuError("cannot open lock file %s: %s" % (self.path, err.strerror or err))
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except (IOError, OSError) as err:
                if err.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    os.close(self.fd)
                    raise VgpuError("cannot lock %s: %s" % (self.path, err.strerror or err))
            if time.monotonic() >= deadline:
                os.close(self.fd)
                raise VgpuError("timed out after %ss waiting for the lock %s (another run of this "
                                "collection is editing the store)" % (self.timeout, self.path))
            time.sleep(0.05)

    def __exit__(self, *exc):
        os.close(self.fd)  # closing releases the flock
        return False


def _run_mutate(path, mutate, allow_invalid):
    store = load_store(path)
    loaded = (store.format, store.valid, store.error)
    if not store.valid and not allow_invalid:
        raise VgpuError("VF health store %s is unusable (%s): %s; nothing was changed "
                        "(state=repaired rewrites it, keeping a backup)" % (path, store.format, store.error),
                        store_error=store.error, store_format=store.format)
    before = dict(store.records)
    result = mutate(store)
    # Records are immutable values, so comparing them says whether the
    # serialized store changed (mutations never re-express a time in another offset).
    changed = store.valid and (not loaded[1] or store.records != before)
    after = store.to_bytes() if changed else None
    return store, loaded, result, changed, after


def update_store(path, mutate, check_mode=False, allow_invalid=False, backup=None, after_write=None,
                 lock_timeout=60.0):
    """Locked read-modify-write of the store at ``path``.

    Under an exclusive flock on ``<path>.lock``: load; fail closed with a
    :class:`VgpuError` naming the file and hypeman's reason when the store is
    invalid (unless ``allow_invalid``, for repair); call ``mutate(store)``;
    when the serialized store changed and not ``check_mode``, call
    ``backup(path)`` if given and the file exists (returns the backup path),
    write durably with :func:`write_store_bytes`, then call
    ``after_write(result)`` still under the lock (the ledger append, so that
    ownership decisions made under the lock see it). ``mutate`` runs twice
    when it changes something (unlocked, then under the lock), so it must
    depend on the store (and other locked state) only.

    Check mode, a refused (invalid) store and a mutation that changes nothing
    take no lock and create nothing. Returns an :class:`UpdateResult`.
    """
    _refuse_symlink(path, "store file")
    _refuse_symlink(path + TMP_SUFFIX, "temporary file")
    directory = os.path.dirname(path) or "."
    lock_path = path + LOCK_SUFFIX
    if check_mode or not os.path.exists(lock_path):
        # An unlocked pass first: check mode, refused stores and no-op
        # mutations end here, so they create nothing (not even the lock file).
        store, loaded, result, changed, after = _run_mutate(path, mutate, allow_invalid)
        if check_mode or not changed:
            return UpdateResult(path, changed, store.raw, after if changed else store.raw, result, store,
                                loaded[0], loaded[1], loaded[2], None)
        try:
            _make_dirs(directory)
        except (IOError, OSError) as err:
            raise _write_error(path, "create VF health state dir", err)
    with _FileLock(lock_path, lock_timeout):
        # (Again) under the lock: another run may have written in between.
        store, loaded, result, changed, after = _run_mutate(path, mutate, allow_invalid)
        backup_file = None
        if changed:
            owner = None
            try:
                info = os.stat(path)
                owner = (info.st_uid, info.st_gid)
            except (IOError, OSError):
                pass
            if backup is not None and os.path.lexists(path):
                backup_file = backup(path)
            write_store_bytes(path, after, owner)
        outcome = UpdateResult(path, changed, store.raw, after if changed else store.raw, result, store,
                               loaded[0], loaded[1], loaded[2], backup_file)
        if changed and after_write is not None:
            after_write(outcome)
        return outcome
