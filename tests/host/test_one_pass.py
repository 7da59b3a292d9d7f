"""The one-pass decode of a valid request (``host._endpoint._one_pass``).

It is a shortcut past the two-phase decode (envelope, then the method's params), which
alone decides every error. So whatever the shortcut accepts, the two-phase decode must
accept and read the same way: the same method, equal params, the same id. And it must
accept a valid request with ``method`` before ``params``, or a 1 MB snapshot is scanned
twice again.
"""

from __future__ import annotations

import random
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from host._endpoint import _one_pass
from host._wire import DECODERS, ENVELOPE, METHODS
from tests.e2e.test_fuzz import Ids, envelope, json_values

SERVED = set(METHODS) - {"handshake"}


def two_phase(line: bytes) -> tuple[str, Any, Any] | None:
    """What the two-phase decode reads in ``line`` when it would run a call, else ``None``."""
    try:
        env = ENVELOPE.decode(line)
    except (msgspec.MsgspecError, RecursionError):
        return None
    if env.jsonrpc != "2.0" or env.method not in SERVED:
        return None
    raw = b"{}" if env.params is msgspec.UNSET else env.params
    try:
        return env.method, DECODERS[env.method].decode(raw), env.id
    except msgspec.MsgspecError:
        return None


def encode(obj: dict[str, Any], order: list[str], dup: tuple[str, Any] | None) -> bytes:
    """``obj`` as a JSON object with its keys in ``order``, a duplicate key first if any."""
    parts = [
        f"{msgspec.json.encode(k).decode()}:{msgspec.json.encode(obj[k]).decode()}" for k in order
    ]
    if dup is not None:
        key, value = dup
        parts.insert(
            0, f"{msgspec.json.encode(key).decode()}:{msgspec.json.encode(value).decode()}"
        )
    return ("{" + ",".join(parts) + "}").encode()


@st.composite
def request_lines(draw: st.DrawFn) -> bytes:
    env, _ = draw(envelope(Ids()))
    order = list(env)
    random.Random(draw(st.integers(0, 2**32))).shuffle(order)  # method after params, too
    dup = None
    if env and draw(st.integers(0, 4)) == 0:  # a repeated key: the last one counts
        dup = (
            draw(st.sampled_from(sorted(env))),
            draw(json_values | st.sampled_from(sorted(METHODS))),
        )
    return encode(env, order, dup)


@pytest.mark.slow
@pytest.mark.timeout(300)  # 1,500 examples: ~4 s alone, far more on a loaded machine
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(line=request_lines())
def test_what_the_shortcut_accepts_the_two_phase_decode_reads_the_same(line: bytes) -> None:
    fast = _one_pass(line)
    if fast is not None:
        assert fast == two_phase(line), line


@settings(max_examples=300, deadline=None)
@given(line=request_lines())
def test_a_valid_request_with_method_first_takes_the_shortcut(line: bytes) -> None:
    slow = two_phase(line)
    env = msgspec.json.decode(line)
    if slow is None or "params" not in env or list(env).index("method") > list(env).index("params"):
        return
    if line.count(b'"method"') + line.count(b'"params"') > 2:
        return  # a repeated key: the shortcut may leave it to the two-phase decode
    assert _one_pass(line) == slow, line


@pytest.mark.parametrize(
    "line",
    [
        b'{"jsonrpc":"2.0","id":1,"method":"session.get","method":"session.list","params":{}}',
        b'{"jsonrpc":"2.0","id":1,"method":"session.list","params":{},"params":[]}',
        b'{"jsonrpc":"2.0","id":1,"method":"session.list","params":null}',
        b'{"jsonrpc":"2.0","id":1,"method":"session.list"}',
        b'{"jsonrpc":"1.0","id":1,"method":"session.list","params":{}}',
        b'{"jsonrpc":"2.0","id":1,"method":"handshake","params":{"protocolVersion":11}}',
        b'{"jsonrpc":"2.0","id":1.5,"method":"session.list","params":{}}',
        b'{"jsonrpc":"2.0","id":1,"method":"$/cancelRequest","params":{"id":2}}',
    ],
)
def test_the_shortcut_leaves_these_to_the_two_phase_decode(line: bytes) -> None:
    """Repeated keys, missing or null params, another version, a handshake, a bad id."""
    assert _one_pass(line) is None


def test_a_1_mb_snapshot_is_read_the_same_either_way() -> None:
    message = {"id": "a1", "role": "assistant", "content": "x" * (1 << 20)}
    params = {"sessionId": "s", "turnId": "t", "message": message}
    req = {"jsonrpc": "2.0", "id": 7, "method": "session.saveInflightMessage", "params": params}
    line = msgspec.json.encode(req)
    fast = _one_pass(line)
    assert fast is not None and fast == two_phase(line)
    assert msgspec.json.decode(fast[1].message) == message
