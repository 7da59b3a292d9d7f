"""Lone UTF-16 surrogates decode as JSON.parse reads them (``host._surrogates``).

Python's ``json.dumps`` escapes a string the way JavaScript's well-formed
``JSON.stringify`` does (``\\uXXXX``, lower-case hex, for every lone surrogate; a pair
as one character, here escaped as two), so for any text, lone surrogates and all, the
host's decode must give back the caller's bytes wherever it keeps bytes (``Raw``), read a
half pair as U+FFFD where it only looks, and refuse one where it would keep a string.
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec import Raw

from host._surrogates import MAX_ESCAPES, decode

FIELDS = msgspec.json.Decoder(dict[str, Raw])
ANY = msgspec.json.Decoder()

# Code units, the surrogates and the private-use characters the host masks with often.
units = st.one_of(
    st.integers(0xD800, 0xDFFF),
    st.integers(0xE000, 0xE00F),
    st.sampled_from([0x22, 0x5C, 0x41, 0x75, 0x0A, 0x1F600]),
    st.integers(0, 0x10FFFF),
)
texts = st.lists(units, max_size=12).map(lambda us: "".join(map(chr, us)))


def _read(text: str) -> str:
    """``text`` as the host shows it: each lone surrogate as U+FFFD."""
    return re.sub("[\ud800-\udfff]", "\ufffd", text)


@settings(max_examples=400, deadline=None)
@given(values=st.lists(texts, min_size=1, max_size=4), ascii_only=st.booleans())
def test_every_value_comes_back_as_the_callers_bytes(values: list[str], ascii_only: bool) -> None:
    body = {f"k{i}": {"t": v, "l": [v, 1]} for i, v in enumerate(values)}
    data = json.dumps(body, ensure_ascii=ascii_only, separators=(",", ":"))
    if not ascii_only and any("\ud800" <= c <= "\udfff" for v in values for c in v):
        return  # raw UTF-8 cannot carry a lone surrogate: only its escape can
    raw = data.encode()
    parsed = json.loads(raw)  # as JSON.parse reads it (two escaped halves make one pair)
    fields = decode(FIELDS, raw)
    assert {k: json.loads(bytes(v)) for k, v in fields.items()} == parsed
    stored = b",".join(b'"%s":%s' % (k.encode(), bytes(v)) for k, v in fields.items())
    assert b"{" + stored + b"}" == raw
    assert bytes(decode(msgspec.json.Decoder(Raw), raw)) == raw
    shown = decode(ANY, raw, read=True)
    assert shown == {k: {"t": _read(v["t"]), "l": [_read(v["t"]), 1]} for k, v in parsed.items()}


@pytest.mark.parametrize(
    "data",
    [
        b'{"\\ud83d":1}',  # a key
        b'{"t":"Trip \\ud83d"}',  # a string the decoder makes a str
    ],
)
def test_a_half_pair_in_a_string_the_host_would_keep_is_refused(data: bytes) -> None:
    with pytest.raises(msgspec.ValidationError, match="lone UTF-16 surrogate"):
        decode(msgspec.json.Decoder(dict[str, Any]), data)


@pytest.mark.parametrize(
    "data",
    [
        b'{"t":"\\ud83d"',  # cut short
        b'{"t":"\\ud83"}',  # no escape
        b'{"t":\\ud83d}',  # an escape outside a string
        b'{"t":"\\\\\\ud83d\\x"}',  # a bad escape after it
    ],
)
def test_what_is_no_json_stays_no_json(data: bytes) -> None:
    with pytest.raises(msgspec.DecodeError):
        decode(msgspec.json.Decoder(Raw), data)


def test_text_without_a_half_pair_is_decoded_once_as_given() -> None:
    pair = b'{"t":"\\ud83d\\ude00 \\\\ud83d"}'  # a pair, and an escaped backslash
    assert bytes(decode(msgspec.json.Decoder(Raw), pair)) == pair
    assert decode(ANY, pair) == {"t": "\U0001f600 \\ud83d"}


@pytest.mark.parametrize(
    "data",
    [
        b'"\\ud83d' + b"\\u00e9" * (MAX_ESCAPES - 1) + b'"',  # as many escapes as allowed
        b'"' + b"".join(b"\\u%04x" % (0xD800 + i) for i in range(0, 2048, 2)) + b'"',
        b'"\\ud83d\\\\\\ud83d\\\\ud83d"',  # escaped backslashes either side
    ],
)
def test_within_the_bounds_every_half_pair_is_read(data: bytes) -> None:
    parsed = json.loads(data)
    assert bytes(decode(msgspec.json.Decoder(Raw), data)) == data
    assert decode(ANY, b"[" + data + b"]", read=True) == [_read(parsed)]


@pytest.mark.parametrize(
    "data",
    [
        b'"\\ud83d' + b"\\u00e9" * MAX_ESCAPES + b'"',  # more escapes than JSON.stringify writes
        b'"\\ud83d \xf4\x80\x80\x80"',  # a character of plane 16, where the masks come from
    ],
)
def test_past_the_bounds_a_half_pair_is_not_json_to_the_host(data: bytes) -> None:
    json.loads(data)  # JSON all the same
    with pytest.raises(msgspec.DecodeError):
        decode(msgspec.json.Decoder(Raw), data)
