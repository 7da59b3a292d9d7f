"""Messages as opaque bytes: the caller's values kept, the host's fields owned by the host."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec import Raw

from host._errors import Conflict, InvalidParams
from host._messages import display_capped, parse_incoming, parse_stored

ODD = (
    b'{ "id" : "m1", "role":"assistant",  "content":"caf\\u00e9 \\ud83d\\ude00 \xe2\x82\xac",'
    b'"n":1.50, "big":123456789012345678901234567890, "e":1E+3,'
    b'"nested":{"b": 1, "a": [ true , null ]} }'
)


def test_stored_line_keeps_the_callers_bytes_of_every_value() -> None:
    line = parse_incoming(ODD).stored_line(turn_id=None, pager={})
    assert line == (
        b'{"id":"m1","role":"assistant","content":"caf\\u00e9 \\ud83d\\ude00 \xe2\x82\xac",'
        b'"n":1.50,"big":123456789012345678901234567890,"e":1E+3,'
        b'"nested":{"b": 1, "a": [ true , null ]}}'
    )


def test_stored_line_writes_the_turn_id() -> None:
    m = parse_incoming(b'{"id":"a","role":"user","turnId":"old","content":"x"}')
    assert m.turn_id == "old"
    # Replaced where it stands, so the rest of the line keeps its order.
    assert m.stored_line(turn_id="t2", pager={}) == (
        b'{"id":"a","role":"user","turnId":"t2","content":"x"}'
    )
    m = parse_incoming(b'{"id":"a","role":"user","content":"x"}')
    assert m.stored_line(turn_id="t1", pager={}) == (
        b'{"id":"a","role":"user","content":"x","turnId":"t1"}'
    )
    assert m.stored_line(turn_id=None, pager={}) == b'{"id":"a","role":"user","content":"x"}'


def test_stored_line_drops_caller_pager_fields_for_the_stored_ones() -> None:
    m = parse_incoming(
        b'{"id":"u","role":"user","revisionRootId":"x","revisionCount":9,'
        b'"activeRevision":8,"content":"q"}'
    )
    assert m.stored_line(turn_id=None, pager={}) == b'{"id":"u","role":"user","content":"q"}'
    pager = {"revisionRootId": Raw(b'"u"'), "revisionCount": Raw(b"2"), "activeRevision": Raw(b"1")}
    assert json.loads(m.stored_line(turn_id=None, pager=pager)) == {
        "id": "u",
        "role": "user",
        "content": "q",
        "revisionRootId": "u",
        "revisionCount": 2,
        "activeRevision": 1,
    }


@pytest.mark.parametrize(
    "raw",
    [
        b'{"role":"user"}',
        b'{"id":"a"}',
        b'{"id":"a","role":"robot"}',
        b'{"id":"a/b","role":"user"}',
        b'{"id":"","role":"user"}',
        b'{"id":"a","role":"user","status":"finished"}',
        b'{"id":"a","role":"user","turnId":"../t"}',
        b'{"id":"a","role":"user","capped":"yes"}',
        b'"a string"',
        b"[1]",
    ],
)
def test_invalid_messages_are_invalid_params(raw: bytes) -> None:
    with pytest.raises(InvalidParams):
        parse_incoming(raw)
    assert parse_stored(raw) is None  # a stored line like this is quarantined


def test_a_capped_copy_cannot_be_written() -> None:
    with pytest.raises(Conflict):
        parse_incoming(b'{"id":"a","role":"user","capped":true}')
    assert parse_incoming(b'{"id":"a","role":"user","capped":false}').id == "a"


def test_parse_stored_rejects_what_is_not_json() -> None:
    for line in (b"", b"not json", b'{"id":"a","role":"user"', b"\x00\x00"):
        assert parse_stored(line) is None


LONG = {
    "id": "m1",
    "role": "assistant",
    "turnId": "turn-1",
    "status": "aborted",
    "revisionRootId": "u1",
    "revisionCount": 3,
    "activeRevision": 2,
    "content": [
        {"type": "text", "text": "lorem ipsum " * 500},
        {"type": "tool_use", "name": "search", "input": {"query": "q" * 2000}},
    ],
    "createdAt": "2024-01-01T00:00:00.000Z",
    "usage": {"input": 1000, "output": 20},
}


def test_display_capped_is_a_valid_marked_message_within_the_cap() -> None:
    line = msgspec.json.encode(LONG)
    for cap in (400, 500, 1000, 4000):
        out = display_capped(line, cap)
        assert len(out) <= cap, cap
        value = json.loads(out)
        assert value["capped"] is True
        for key in ("id", "role", "turnId", "status", "revisionRootId", "revisionCount"):
            assert value[key] == LONG[key]
        assert value["activeRevision"] == 2
        assert value["usage"] == LONG["usage"]
        assert [b["type"] for b in value["content"]] == ["text", "tool_use"]
        assert LONG["content"][0]["text"].startswith(value["content"][0]["text"].rstrip("…"))
    # A bigger cap keeps more of the text.
    small = json.loads(display_capped(line, 500))["content"][0]["text"]
    big = json.loads(display_capped(line, 4000))["content"][0]["text"]
    assert len(big) > len(small)


@settings(max_examples=100, deadline=None)
@given(text=st.text(min_size=1, max_size=3000), cap=st.integers(min_value=120, max_value=3000))
def test_display_capped_of_any_text_stays_valid_json_within_the_cap(text: str, cap: int) -> None:
    line = msgspec.json.encode({"id": "m", "role": "user", "content": text})
    out = display_capped(line, cap)
    value = json.loads(out)
    assert value["capped"] is True and value["id"] == "m"
    assert len(out) <= cap
    assert text.startswith(value["content"].removesuffix("…"))


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**30), 10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=120),
    lambda inner: (
        st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner, max_size=6)
    ),
    max_leaves=40,
)


def _within(copy: object, orig: object) -> bool:
    """Whether ``copy`` is ``orig`` with strings cut ("…"), and arrays and objects ended early."""
    if isinstance(orig, str) and isinstance(copy, str):
        return copy == orig or (copy.endswith("…") and orig.startswith(copy[:-1]))
    if isinstance(orig, list) and isinstance(copy, list):
        return len(copy) <= len(orig) and all(map(_within, copy, orig))
    if isinstance(orig, dict) and isinstance(copy, dict):
        return all(k in orig and _within(v, orig[k]) for k, v in copy.items())
    return copy == orig


@settings(max_examples=300, deadline=None)
@given(
    fields=st.dictionaries(st.sampled_from(["content", "usage", "meta", "x", "turnId"]), _JSON),
    ascii_only=st.booleans(),
    cap=st.integers(min_value=1, max_value=1500),
)
def test_display_capped_of_any_message_is_a_cut_down_copy_within_the_cap(
    fields: dict[str, object], ascii_only: bool, cap: int
) -> None:
    """Whatever the message holds: a valid message, capped, host fields kept, every value
    a cut-down copy of the stored one, and no longer than the cap when that leaves room
    for the host's own fields."""
    message = {"id": "m", "role": "tool", **{k: v for k, v in fields.items() if k != "turnId"}}
    if isinstance(fields.get("turnId"), str):
        message["turnId"] = "t1"
    line = json.dumps(message, ensure_ascii=ascii_only).encode()  # \\u escapes, pairs too
    host = {k: json.dumps(v).encode() for k, v in message.items() if k in ("id", "role", "turnId")}
    out = display_capped(line, cap, host)
    value = json.loads(out)
    assert value.pop("capped") is True
    assert (value["id"], value["role"], value.get("turnId")) == ("m", "tool", message.get("turnId"))
    assert _within(value, json.loads(line))
    least = len(display_capped(line, 1, host))  # the host's fields alone
    assert len(out) <= max(cap, least)


def test_a_capped_copy_of_a_huge_message_costs_what_it_returns() -> None:
    """25 MB of tiny strings (issue 26): the copy is cut to its cap, the host's fields
    come from the index's copy when they come after the cut, and the walk stops early."""
    tiny = b",".join([b'"ab"'] * 5_000_000)
    line = b'{"content":[' + tiny + b'],"id":"m1","role":"tool","turnId":"t9"}'
    host = {"id": b'"m1"', "role": b'"tool"', "turnId": b'"t9"', "status": b'"complete"'}
    out = display_capped(line, 1000, host)
    assert len(out) <= 1000
    value = json.loads(out)
    assert (value["id"], value["role"], value["turnId"]) == ("m1", "tool", "t9")
    assert value["capped"] is True
    assert 0 < len(value["content"]) < 1000 and set(value["content"]) == {"ab"}
