# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Go's text forms shared by the store's two JSON decoding paths (standard library only).

``_store`` (Python's C decoder when it provably sees what Go sees) and
``_gojson`` (Go's scanner, loaded only for other text) build the same JSON
value shapes and quote values as Go's ``%q`` does. Both import them from here,
so the helpers import one way (``_store`` -> ``_gojson`` -> here). Go's key
folding (:func:`go_fold`) is here too: ``_hypeman`` decodes instance metadata
with it.
"""

from __future__ import annotations


_FOLD_TO_ASCII = {"\u017f": "S", "\u212a": "K"}  # the only non-ASCII runes whose fold orbit holds ASCII


_FOLD_CACHE = {}


def go_fold(key):
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


# --- JSON value tree (both decoding paths build the same shapes) ---------------------


class GoSyntaxError(Exception):
    """Go's json syntax error, with Go's text."""


class JsonObject(list):
    """A JSON object as its (key, value) pairs in file order (duplicates kept)."""


class JsonNumber(str):
    """A JSON number as its literal text (Go reports it, e.g. ``number 1.5``)."""


class RawString(str):
    """A decoded JSON string that also keeps its bytes as written (Go's time
    decoding parses the raw bytes between the quotes, escapes included)."""

    __slots__ = ("raw",)


def raw_text(value):
    raw = getattr(value, "raw", None)
    return value if raw is None else raw
