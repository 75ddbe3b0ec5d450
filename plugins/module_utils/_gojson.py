# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Go's ``encoding/json`` scanner for the VF health store (standard library only).

``_store`` decodes with Python's C decoder whenever that provably sees what
Go sees (valid UTF-8, no escapes, valid JSON). Everything else comes here:
:func:`check_valid` fails with Go's exact syntax error text (scanner.go) and
:func:`slow_tree` builds the same value tree from the text Go accepted,
decoding escapes and invalid UTF-8 as Go does.
"""

from __future__ import annotations

from ansible_collections.hypeman.vgpu.plugins.module_utils._govalues import (
    GoSyntaxError, JsonNumber, JsonObject, RawString, go_quote,
)

_SPACE = b" \t\r\n"
_MAX_DEPTH = 10000


def _quote_char(byte):
    """Go's ``quoteChar``: the offending byte as a rune, quoted with single quotes."""
    if byte == 0x27:
        return "'\\''"
    if byte == 0x22:
        return "'\"'"
    inner = go_quote(chr(byte))[1:-1]
    return "'" + inner + "'"


def _syntax(byte, context):
    return GoSyntaxError("invalid character %s %s" % (_quote_char(byte), context))


def check_valid(data):
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
        if c == 0x7B or c == 0x5B:  # '{' or '['
            if len(stack) >= _MAX_DEPTH:
                raise _syntax(c, "exceeded max depth")
            stack.append("k" if c == 0x7B else "a")
            expect = "key_or_empty" if c == 0x7B else "value_or_empty"
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
    raise GoSyntaxError("unexpected end of JSON input")


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


def slow_tree(data):
    """Build the value tree from input the Go scanner accepted (iterative)."""
    n = len(data)
    i = 0
    root = []
    stack = [(root, None)]  # (container, pending key for objects)

    def add(value):
        container, _key = stack[-1]
        if isinstance(container, JsonObject):
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
            if c == 0x2C and isinstance(stack[-1][0], JsonObject):
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
            text = RawString(_unquote(raw))
            text.raw = raw.decode("utf-8", "surrogateescape")
            i = end
            if expect_key:
                stack[-1] = (stack[-1][0], str(text))
                expect_key = False
            else:
                add(text)
            continue
        if c == 0x7B:
            stack.append((JsonObject(), None))
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
        add(JsonNumber(data[i:end].decode("ascii")))
        i = end
    return root[0]
