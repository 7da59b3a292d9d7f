"""The handshake: protocol 11 exactly, and nothing but framing errors before it."""

from __future__ import annotations

import pytest

from tests.conftest import PROTOCOL_VERSION, Client, HostProcess, RpcError

ISSUE_2_METHODS = {
    "handshake",
    "session.create",
    "session.list",
    "session.delete",
    "session.get",
    "session.appendMessage",
    "session.updateMessage",
    "session.deleteMessages",
    "session.replaceMessages",
    "host.stats",
    "host.shutdown",
    "$/cancelRequest",
}


async def test_handshake_answers_version_and_methods(host: HostProcess) -> None:
    assert host.client is not None
    res = await host.client.handshake(client={"name": "tests", "version": "0"})
    assert res["protocolVersion"] == PROTOCOL_VERSION
    assert isinstance(res["hostVersion"], str) and res["hostVersion"]
    assert set(res["methods"]) >= ISSUE_2_METHODS


async def test_wrong_version_is_protocol_mismatch(host: HostProcess) -> None:
    c = host.client
    assert c is not None
    # Found at 09c70a8: "11" and 11.0 were INVALID_PARAMS; they are not exactly 11 either.
    for version in (10, 12, 0, -11, 110, "11", 11.0, None, True, [11]):
        with pytest.raises(RpcError) as err:
            await c.handshake(version)
        assert err.value.code == -32001
        assert err.value.name == "PROTOCOL_MISMATCH"
        assert err.value.data["expected"] == PROTOCOL_VERSION
        assert err.value.data["got"] == version
        # The failed handshake did not count: the connection is still not handshaken.
        with pytest.raises(RpcError) as err:
            await c.call("session.list")
        assert err.value.name == "NOT_HANDSHAKEN"
    for params in ({}, {"protocolVersion": 11, "extra": 1}):  # no version, unknown field
        response = await c.request("handshake", params)
        assert response["error"]["code"] == -32602, response
    # A good one afterwards works.
    assert (await c.handshake())["protocolVersion"] == PROTOCOL_VERSION
    assert (await c.call("session.list")) == {"sessions": []}


@pytest.mark.parametrize(
    "method", ["session.list", "session.create", "host.stats", "host.shutdown", "no.such.method"]
)
async def test_methods_before_handshake_are_not_handshaken(host: HostProcess, method: str) -> None:
    c = host.client
    assert c is not None
    with pytest.raises(RpcError) as err:
        await c.call(method)
    assert err.value.code == -32002
    assert err.value.name == "NOT_HANDSHAKEN"
    await c.handshake()
    assert (await c.call("session.list")) == {"sessions": []}  # nothing was created


async def test_framing_errors_before_handshake_are_answered_as_usual(host: HostProcess) -> None:
    c = host.client
    assert c is not None
    await c.send_raw(b"{not json\n")
    reply = await c.next_unmatched()
    assert reply["id"] is None and reply["error"]["code"] == -32700
    resp = await c.raw(b'{"id": 3, "method": "session.list"}', 3)
    assert resp["error"]["code"] == -32600
    resp = await c.raw(b"[]")
    assert resp["error"]["code"] == -32600


async def test_handshake_in_a_batch_lets_the_rest_of_the_batch_through(
    host: HostProcess,
) -> None:
    c = host.client
    assert c is not None
    out = await c.batch(
        [
            c.envelope("handshake", {"protocolVersion": PROTOCOL_VERSION}, 1),
            c.envelope("session.create", {"sessionId": "s"}, 2),
        ]
    )
    by_id = {r["id"]: r for r in out}
    assert by_id[1]["result"]["protocolVersion"] == PROTOCOL_VERSION
    assert by_id[2]["result"] == {"sessionId": "s", "created": True}


async def test_a_handshaken_client_can_call(client: Client) -> None:
    assert (await client.call("session.list")) == {"sessions": []}
