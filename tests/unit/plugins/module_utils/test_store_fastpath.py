# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The store's one-pass fast decoder against the Go-exact decoder, driven by hypothesis.

``_store._fast_records`` may decline any file (None: the exact path decides) but
when it answers, its records must be exactly what Go's decoding rules
(``_go_unmarshal``) plus hypeman's validation (``_validate``) give: same
addresses, failures, instants, offsets and texts. The generator writes
store-shaped JSON with the traps the fast path must notice: repeated keys at
every level (with and without colons in the lost values), keys in other case
or folding to a field through long s, unknown keys, nulls and wrong types,
``{}`` for ``[]``, invalid, zero and offset times, duplicate addresses and
failures, versions other than the integer 1, escapes, invalid UTF-8, colons
in strings and whitespace around colons.

Bounded for ``make test``; ``HYPOTHESIS_PROFILE=fuzz`` runs many more examples.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.hypeman.vgpu.plugins.module_utils import _gotime, _store

FUZZ = os.environ.get("HYPOTHESIS_PROFILE") == "fuzz"
SETTINGS = settings(max_examples=3000 if FUZZ else 150, deadline=None, derandomize=not FUZZ, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

BASE_NS = 1787411045 * 10 ** 9  # 2026-08-22

# --- a JSON text generator that can repeat keys --------------------------------------
# Nodes: ("obj", [(key, node), ...]) keeps repeated keys; ("arr", [...]); ("str", text);
# ("raw", literal text: numbers, true/false/null, invalid UTF-8 strings).


def _render_string(text):
    out = ['"']
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif char < " ":
            out.append("\\u%04x" % ord(char))
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def _render(node, style, depth=0):
    kind, value = node
    if kind == "str":
        return _render_string(value).encode("utf-8", "surrogatepass")
    if kind == "raw":
        return value
    pad, colon = (b"\n" + b"  " * (depth + 1), b": ") if style == "indent" else (b"", b":" if style == "compact" else b" : ")
    close = (b"\n" + b"  " * depth) if style == "indent" else b""
    if kind == "arr":
        if not value:
            return b"[]"
        return b"[" + b",".join(pad + _render(item, style, depth + 1) for item in value) + close + b"]"
    if not value:
        return b"{}"
    return b"{" + b",".join(pad + _render(("str", key), style) + colon + _render(item, style, depth + 1)
                            for key, item in value) + close + b"}"


def _time_texts():
    canonical = st.integers(min_value=0, max_value=10 ** 18).map(
        lambda ns: _gotime.format_rfc3339nano(_gotime.from_unix_ns(BASE_NS + ns)))
    return st.one_of(
        canonical, canonical, canonical,
        st.sampled_from([
            "0001-01-01T00:00:00Z", "0001-01-01T02:00:00+02:00", "0000-12-31T23:00:00-01:00",
            "0001-01-01T00:00:00.000Z", "2026-08-22T10:00:00+02:00", "2026-08-22T10:00:00+24:00",
            "2026-08-22T10:00:00.500000000Z", "2026-08-22T10:00:00,5Z", "2026-02-30T00:00:00Z",
            "2024-02-29T23:59:59Z", "2026-13-01T00:00:00Z", "2026-08-22T24:00:00Z", "2026-08-22t10:00:00z",
            "2026-08-22T10:00:00", "2026-08-22T1:00:00Z", "garbage", "", ":", "2026-08-22T10:00:00.1234567891Z",
        ]))


def _strings():
    return st.one_of(st.sampled_from(["", "inst-1", "inst-2", ":", ":x", "a:b:c", "<&>", "\u2028", "é", "K"]),
                     st.text(alphabet=":ab\"\\\x01é<\u017f", max_size=6))


_FOLDED = {"vf_address": ["VF_ADDRESS", "Vf_Address"], "failures": ["FAILURES", "failure\u017f"],
           "quarantined_at": ["Quarantined_At"], "instance_id": ["in\u017ftance_id", "INSTANCE_ID"],
           "assigned_at": ["ASSIGNED_AT", "a\u017f\u017figned_at"], "reported_at": ["Reported_At"],
           "version": ["VERSION", "Version"], "records": ["RECORDS", "record\u017f"]}


def _wrong_value():
    return st.one_of(
        st.sampled_from([("raw", b"null"), ("raw", b"true"), ("raw", b"1"), ("raw", b"1.0"), ("raw", b"-0"),
                         ("obj", []), ("arr", []), ("str", "x"), ("raw", b'"\xff\xfe"'), ("raw", b'"a\\u003ab"')]),
        _strings().map(lambda text: ("str", text)))


def _valid_time():
    return st.integers(min_value=0, max_value=10 ** 18).map(
        lambda ns: ("str", _gotime.format_rfc3339nano(_gotime.from_unix_ns(BASE_NS + ns))))


def _plain_strings():
    return st.sampled_from(["", "inst-1", "inst-2", ":", ":x", "a:b:c", "<&>", "\u2028", "\u00e9", "K"]).map(
        lambda text: ("str", text))


def _valid_failure():
    return st.tuples(_plain_strings(), st.one_of(_valid_time(), _plain_strings()), _valid_time()).map(
        lambda parts: ("obj", [("instance_id", parts[0]), ("assigned_at", parts[1]), ("reported_at", parts[2])]))


def _valid_record():
    address = st.sampled_from(["0000:82:00.4", "0000:82:00.5", "0000:e3:00.1", "0000:e3:00.2"])
    return st.tuples(address, st.lists(_valid_failure(), min_size=1, max_size=3),
                     st.one_of(st.none(), _valid_time())).map(
        lambda parts: ("obj", [("vf_address", ("str", parts[0])), ("failures", ("arr", parts[1]))]
                       + ([] if parts[2] is None else [("quarantined_at", parts[2])])))


def _objects(node, found):
    """Every object node in the tree (the top one first)."""
    if node[0] == "obj":
        found.append(node)
        for _key, value in node[1]:
            _objects(value, found)
    elif node[0] == "arr":
        for item in node[1]:
            _objects(item, found)
    return found


def _any_value():
    return st.one_of(_wrong_value(), _valid_time(), st.sampled_from(
        [("arr", []), ("str", "0000:82:00.4"), ("str", "1970-01-01T00:00:00Z")]))


@st.composite
def _perturbed_store(draw):
    """A valid store's tree with a few of the changes the fast path must notice, rendered."""
    records = draw(st.lists(_valid_record(), max_size=4, unique_by=lambda node: node[1][0][1][1]))
    top = ("obj", [("version", ("raw", b"1")), ("records", ("arr", records))])
    for _change in range(draw(st.sampled_from([0, 1, 1, 1, 1, 2]))):
        objects = _objects(top, [])
        pairs = draw(st.sampled_from(objects))[1]
        change = draw(st.sampled_from(["repeat"] * 5 + ["fold", "unknown", "value", "drop", "time", "swap"]))
        if not pairs:
            continue
        index = draw(st.integers(0, len(pairs) - 1))
        key, value = pairs[index]
        if change == "repeat":  # before or after, maybe folded, maybe another value
            if draw(st.booleans()) and key in _FOLDED:
                key = draw(st.sampled_from(_FOLDED[key]))
            other = draw(_any_value()) if draw(st.booleans()) else value
            pairs.insert(index + draw(st.integers(0, 1)), (key, other))
        elif change == "fold" and key in _FOLDED:
            pairs[index] = (draw(st.sampled_from(_FOLDED[key])), value)
        elif change == "unknown":
            pairs.insert(index, (draw(st.sampled_from(["extra", "a:b", ":", "vf_address_"])), draw(_any_value())))
        elif change == "value":
            pairs[index] = (key, draw(_any_value()))
        elif change == "drop":
            del pairs[index]
        elif change == "time":
            pairs[index] = (key, draw(_time_texts().map(lambda t: ("str", t))))
        elif change == "swap" and len(pairs) > 1:
            pairs.reverse()
    return _render(top, draw(st.sampled_from(["indent", "compact", "spaced"])))


@st.composite
def _object(draw, fields):
    """An object holding ``fields`` (key -> strategy of nodes), some left out, perturbed."""
    pairs = []
    for key, strategy in fields:
        if draw(st.integers(0, 9)) == 0:
            continue  # left out
        name = key
        if draw(st.integers(0, 15)) == 0:
            name = draw(st.sampled_from(_FOLDED[key]))
        value = draw(_wrong_value()) if draw(st.integers(0, 15)) == 0 else draw(strategy)
        pairs.append((name, value))
    if pairs and draw(st.integers(0, 9)) == 0:  # a repeated key, maybe folded, maybe a different value
        key, value = draw(st.sampled_from(pairs))
        if draw(st.booleans()):
            value = draw(_wrong_value())
        if draw(st.booleans()) and key in _FOLDED:
            key = draw(st.sampled_from(_FOLDED[key]))
        pairs.insert(draw(st.integers(0, len(pairs))), (key, value))
    if draw(st.integers(0, 15)) == 0:
        pairs.append((draw(st.sampled_from(["extra", "a:b", ":"])), draw(_wrong_value())))
    if draw(st.integers(0, 7)) == 0:
        pairs = draw(st.permutations(pairs))
    return ("obj", pairs)


def _addresses():
    return st.one_of(st.sampled_from(["0000:82:00.4", "0000:82:00.5", "0000:e3:00.1"]),
                     st.sampled_from(["0000:82:00.8", "82:00.4", "0000:82:00.4\n", "0000:E3:00.1", ""]))


def _failure():
    return _object([("instance_id", _strings().map(lambda t: ("str", t))),
                    ("assigned_at", st.one_of(_time_texts(), _strings()).map(lambda t: ("str", t))),
                    ("reported_at", _time_texts().map(lambda t: ("str", t)))])


def _record():
    return _object([("vf_address", _addresses().map(lambda t: ("str", t))),
                    ("failures", st.lists(_failure(), max_size=3).map(lambda items: ("arr", items))),
                    ("quarantined_at", st.one_of(_time_texts().map(lambda t: ("str", t)), st.just(("raw", b"null"))))])


def _store_text():
    """Random store-shaped files, and valid ones with a few changes."""
    version = st.one_of(st.just(("raw", b"1")), st.just(("raw", b"1")), _wrong_value())
    records = st.lists(_record(), max_size=4).map(lambda items: ("arr", items))
    random = st.tuples(_object([("version", version), ("records", records)]),
                       st.sampled_from(["indent", "compact", "spaced"])).map(lambda pair: _render(*pair))
    return st.one_of(random, _perturbed_store(), _perturbed_store())


def _exact(data):
    """What the Go-exact decoder and hypeman's validation make of ``data``: records, or None when refused."""
    try:
        go_file, _tree = _store._go_unmarshal(data)  # pylint: disable=protected-access
    except _store._UnmarshalError:  # pylint: disable=protected-access
        return None
    try:
        return _store._validate(go_file)  # pylint: disable=protected-access
    except ValueError:
        return None


def _shown(records):
    """Everything a record holds, times with their instant, offset and text."""
    def time(value):
        if value is None:
            return None
        return (value.sec, value.nsec, value.offset, _gotime.format_rfc3339nano(value, strict=False))
    return sorted((address, record.vf_address, time(record.quarantined_at),
                   [(f.instance_id, f.assigned_at, time(f.reported_at)) for f in record.failures])
                  for address, record in records.items())


@settings(SETTINGS, max_examples=4000 if FUZZ else 400)
@given(_perturbed_store())
def test_fast_path_answers_only_what_the_exact_decoder_answers(data):
    fast = _store._fast_records(data)  # pylint: disable=protected-access
    if fast is not None:
        exact = _exact(data)
        assert exact is not None, data
        assert _shown(fast) == _shown(exact), data


@SETTINGS
@given(_store_text())
def test_loading_is_unchanged_by_the_fast_path(data):
    store = _store.parse_store_bytes("/x/gpu/vf-health.json", data)
    exact = _exact(data)
    assert store.valid == (exact is not None)
    if exact is not None:
        assert _shown(store.records) == _shown(exact)


def _valid_records():
    failure = st.builds(lambda iid, assigned, ns: _store.Failure(iid, assigned, _gotime.from_unix_ns(BASE_NS + ns)),
                        st.text(max_size=8), st.text(max_size=8), st.integers(0, 10 ** 15))
    record = st.tuples(st.integers(0, 0xffff), st.lists(failure, max_size=3, unique_by=lambda f: f[:2]),
                       st.one_of(st.none(), st.integers(0, 10 ** 15)))
    return st.lists(record, max_size=6, unique_by=lambda r: r[0])


@SETTINGS
@given(_valid_records())
def test_every_file_hypeman_writes_takes_the_fast_path_unless_escaped(raw):
    records = {}
    for number, failures, quarantine_ns in raw:
        address = "0000:%02x:%02x.%d" % (number >> 8, (number >> 3) & 0x1f, number & 7)
        quarantined_at = None if quarantine_ns is None and failures else _gotime.from_unix_ns(BASE_NS + (quarantine_ns or 0))
        records[address] = _store.Record(address, tuple(failures), quarantined_at)
    data = _store.HealthStore("/x/gpu/vf-health.json", records=records).to_bytes()
    fast = _store._fast_records(data)  # pylint: disable=protected-access
    if b"\\" in data:
        assert fast is None  # escapes: only Go's own scanner decodes them
        return
    assert fast is not None, data
    assert _shown(fast) == _shown(records) == _shown(_exact(data))


def test_a_repeated_key_is_caught_by_the_colon_count():
    data = (b'{"version": 1, "records": [{"vf_address": "0000:82:00.4", "quarantined_at": "2026-08-22T10:00:00Z",'
            b' "quarantined_at": "2026-08-22T11:00:00Z"}]}')
    assert _store._fast_records(data) is None  # pylint: disable=protected-access
    assert _store.parse_store_bytes("/x", data).records["0000:82:00.4"].quarantined_at == \
        _gotime.parse_rfc3339("2026-08-22T11:00:00Z")


_ONE = ('{"version": 1, "records": [{"vf_address": "0000:82:00.4", "failures": [{"instance_id": "a", '
        '"assigned_at": "b", "reported_at": "2026-08-22T10:00:00Z"}], "quarantined_at": "2026-08-22T11:00:00Z"}]}')


@pytest.mark.parametrize("old, new", [
    ('"version": 1', '"version": "1", "version": 1'),
    ('"records": [', '"records": {}, "records": ['),
    ('"vf_address": "0000:82:00.4"', '"vf_address": 5, "vf_address": "0000:82:00.4"'),
    ('"failures": [', '"failures": "x", "failures": ['),
    ('"instance_id": "a"', '"instance_id": 1, "instance_id": "a"'),
    ('"reported_at": "2026', '"reported_at": "garbage", "reported_at": "2026'),
    ('"quarantined_at": "2026', '"quarantined_at": 1, "quarantined_at": "2026'),
    # Go decodes a repeated slice into the same elements: the first instance_id survives.
    ('"failures": [', '"failures": [{"instance_id": "zz", "reported_at": "2026-08-22T09:00:00Z"}], "failures": ['),
    ('"instance_id": "a"', '"instance_id": "a", "in\u017ftance_id": "c"'),
    ('"instance_id": "a"', '"INSTANCE_ID": "a"'),
    ('"instance_id": "a"', '"instance_id": "a", "extra": 1'),
    ('"failures": [', '"failures": null, "failures": ['),
    ('"version": 1', '"version": 1.0'),
])
def test_a_file_go_reads_differently_from_a_plain_dict_is_left_to_the_exact_decoder(old, new):
    assert _store._fast_records(_ONE.encode()) is not None  # pylint: disable=protected-access
    data = _ONE.replace(old, new, 1).encode("utf-8")
    assert data != _ONE.encode()
    assert _store._fast_records(data) is None  # pylint: disable=protected-access
