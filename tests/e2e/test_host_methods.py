"""host.stats, host.shutdown, end of input and SIGTERM: in-flight work finishes, exit 0."""

from __future__ import annotations

import signal

from tests.conftest import (
    Client,
    HostProcess,
    StartHost,
    dumps,
    get_messages,
    make_session,
    msg,
    restart,
)


async def test_stats_count_calls_and_writes(client: Client) -> None:
    await make_session(client, "s", 3)
    await client.call("session.appendMessage", sessionId="s", message=msg("m0"))  # deduplicated
    await client.request("session.get", {"sessionId": "absent"})  # an error
    stats = await client.call("host.stats")
    assert stats["uptimeSeconds"] >= 0
    counters = stats["counters"]
    assert counters["appends"] == 3
    assert counters["appends.deduplicated"] == 1
    assert counters["fsyncs"] >= 3
    assert counters["locks.held"] == 0
    methods = stats["methods"]
    assert methods["session.appendMessage"]["count"] == 4
    assert methods["session.appendMessage"]["errors"] == 0
    assert methods["session.get"]["count"] == 1
    assert methods["session.get"]["errors"] == 1
    for entry in methods.values():
        assert 0 <= entry["p50Ms"] <= entry["p99Ms"] <= entry["maxMs"]


async def test_shutdown_answers_then_exits_zero(
    host: HostProcess, client: Client, start_host: StartHost
) -> None:
    await make_session(client, "s", 2)
    assert (await client.call("host.shutdown")) == {"shuttingDown": True}
    await client.wait_eof()
    assert await host.wait() == 0
    client2 = await restart(start_host, host)
    assert [m["id"] for m in await get_messages(client2, "s")] == ["m0", "m1"]


async def test_shutdown_finishes_the_calls_in_flight(
    host: HostProcess, client: Client, start_host: StartHost
) -> None:
    await client.call("session.create", sessionId="s")
    futs = []
    lines = []
    for i in range(20):
        rid = client.next_id()
        futs.append(client.expect(rid))
        params = {"sessionId": "s", "message": msg(f"m{i}")}
        lines.append(dumps(client.envelope("session.appendMessage", params, rid)))
    rid = client.next_id()
    futs.append(client.expect(rid))
    lines.append(dumps(client.envelope("host.shutdown", {}, rid)))
    await client.send_raw(b"\n".join(lines) + b"\n")
    replies = [await client.wait(f) for f in futs]
    assert [r["result"]["line"] for r in replies[:-1]] == list(range(20))
    assert replies[-1]["result"] == {"shuttingDown": True}
    assert await host.wait() == 0
    client2 = await restart(start_host, host)
    assert len(await get_messages(client2, "s")) == 20


async def test_end_of_input_finishes_in_flight_calls_and_exits_zero(
    host: HostProcess, client: Client, start_host: StartHost
) -> None:
    await client.call("session.create", sessionId="s")
    futs = []
    lines = []
    for i in range(20):
        rid = client.next_id()
        futs.append(client.expect(rid))
        params = {"sessionId": "s", "message": msg(f"m{i}", content="x" * 10_000)}
        lines.append(dumps(client.envelope("session.appendMessage", params, rid)))
    await client.send_raw(b"\n".join(lines) + b"\n")
    await client.close_input()  # EOF right behind the requests
    replies = [await client.wait(f) for f in futs]
    assert [r["result"]["line"] for r in replies] == list(range(20))
    await client.wait_eof()
    assert await host.wait() == 0
    client2 = await restart(start_host, host)
    assert len(await get_messages(client2, "s")) == 20


async def test_sigterm_exits_zero_and_keeps_the_data(
    host: HostProcess, client: Client, start_host: StartHost
) -> None:
    await make_session(client, "s", 3)
    host.proc.send_signal(signal.SIGTERM)
    await client.wait_eof()
    assert await host.wait() == 0
    client2 = await restart(start_host, host)
    assert len(await get_messages(client2, "s")) == 3


async def test_stdout_carries_only_protocol_lines(host: HostProcess, client: Client) -> None:
    await make_session(client, "s", 2)
    await client.request("no.such", {})
    await client.raw(b"{bad")
    assert await host.stop() == 0
    assert client.garbage == []  # every stdout line was JSON
    assert "host" in host.log  # the logging went to stderr


async def test_a_last_request_without_newline_is_answered_at_end_of_input(
    host: HostProcess, client: Client
) -> None:
    fut = client.expect(9)
    await client.send_raw(dumps(client.envelope("session.create", {"sessionId": "s"}, 9)))
    await client.close_input()
    assert (await client.wait(fut))["result"] == {"sessionId": "s", "created": True}
    assert await host.wait() == 0
