"""A big request's message split off its line (``host._endpoint._split``).

The split decodes everything but the message now and leaves the message's bytes to its
handler, which proves them JSON (``incoming_head``) on a thread while it writes them. So
the split must never change an answer: whenever the handler's scan does not refuse the
bytes as JSON, the line must be exactly the request the split read, as the two-phase
decode reads it. (When the scan refuses them, the endpoint decides the line whole, as if
never split: the end-to-end tests in test_big_checkpoints check those answers.)
"""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from host._endpoint import _split
from host._errors import Conflict, InvalidParams, ParseError
from host._messages import incoming_head
from tests.e2e.test_fuzz import json_values
from tests.host.test_one_pass import two_phase

METHOD = "session.saveInflightMessage"


def j(value: Any) -> str:
    return msgspec.json.encode(value).decode()


def obj(pairs: list[tuple[str, str]]) -> str:
    """A JSON object from (key as written, value text) pairs, in that order."""
    return "{" + ",".join(f"{k}:{v}" for k, v in pairs) + "}"


good_message = st.builds(
    lambda mid, role, text, extra: {"id": mid, "role": role, "content": text, **extra},
    st.sampled_from(["a1", "m.2", "x" * 128]),
    st.sampled_from(["assistant", "user", "robot"]),
    st.text(max_size=30),
    st.dictionaries(st.sampled_from(["turnId", "capped", "status", "zz"]), json_values, max_size=2),
)

# What may follow a message inside the bytes the split takes for it: nothing, or what makes
# them more (or less) than one JSON value.
tails = [
    " ",
    ',"extra":1',
    ',"message":{"id":"b2","role":"assistant","content":"later"}',
    ',"mess\\u0061ge":{"id":"b3","role":"user","content":"escaped"}',
    "}",
    ",",
    "]",
]


def mostly(usual: Any, *others: Any) -> st.SearchStrategy[Any]:
    """``usual`` five times in six, else one of ``others``."""
    return st.sampled_from([usual] * 5 * len(others) + list(others))


@st.composite
def message_text(draw: st.DrawFn) -> str:
    """A message's bytes as a client might send them, or broken in one of many ways."""
    base = j(draw(good_message if draw(mostly(True, False)) else json_values))
    how = draw(st.integers(0, 12))
    if how == 0 and len(base) > 1:  # cut short
        base = base[: draw(st.integers(1, len(base) - 1))]
    elif how == 1:  # a raw control character or a bad escape inside a string
        bad = draw(st.sampled_from(["\x01", "\\q", "\\u12"]))
        base = base.replace('"content":"', '"content":"' + bad, 1)
    elif how == 2:  # nested past any decoder's depth
        base = '{"id":"a1","role":"user","content":' + "[" * 5000 + "]" * 5000 + "}"
    elif how == 3:  # a bad field first, then not JSON
        base = '{"id":5,"role":"user","content":"x'
    return base + draw(mostly("", *tails))


@st.composite
def lines(draw: st.DrawFn) -> bytes:
    """A saveInflightMessage line, mostly in the shape the split takes, often not."""
    params = [
        (j("sessionId"), j(draw(mostly("s", "s1", "a b", "x" * 129)))),
        (j("turnId"), j(draw(mostly("t", "message", '"message":')))),
    ]
    if draw(mostly(False, True)):
        params.append((j(draw(st.sampled_from(["extra", "message", "mess\\u0061ge"]))), "null"))
    if draw(mostly(False, True)):
        params = draw(st.permutations(params))
    params.append((j("message"), draw(message_text())))
    if draw(mostly(False, True)):  # the message is not last after all
        params = draw(st.permutations(params))
    env = [
        (j("jsonrpc"), j(draw(mostly("2.0", "1.0")))),
        (j("id"), j(draw(mostly(7, "r", None, 1.5, 2**70)))),
        (j("method"), j(draw(mostly(METHOD, "session.appendMessage")))),
    ]
    if draw(mostly(False, True)):
        env.pop(1)  # a notification
    if draw(mostly(False, True)):
        env = draw(st.permutations(env))
    env.append((j("params"), obj(params)))
    return obj(env).encode()


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(line=lines())
def test_what_the_split_reads_is_the_request_whenever_its_message_proves_json(
    line: bytes,
) -> None:
    req = _split(line)
    if req is None:
        return
    method, params, rid = req
    assert rid is not msgspec.UNSET  # a notification is never split: its error has no id
    try:
        incoming_head(params.message)
    except ParseError:
        return  # decided whole by the endpoint
    except (InvalidParams, Conflict):
        pass  # the same error the whole line's params get
    assert two_phase(line) == (method, params, rid), line


@given(message=good_message, rid=st.integers(0, 2**40) | st.sampled_from(["r", "a-b"]))
def test_a_valid_snapshot_sent_message_last_is_split(message: dict[str, Any], rid: Any) -> None:
    """The outbox's shape (and the bench's): ids, method, then params ending in message."""
    params = {"sessionId": "s", "turnId": "t", "message": message}
    line = msgspec.json.encode({"jsonrpc": "2.0", "id": rid, "method": METHOD, "params": params})
    req = _split(line)
    assert req is not None and req == two_phase(line)
    assert msgspec.json.decode(req[1].message) == message
