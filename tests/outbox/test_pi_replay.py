"""Every capture of pi 0.73.1 replayed through the pi runtime into a real host (issue 29).

``fake_pi.py`` prints each capture of ``tests/fixtures/pi-rpc`` (pi's stdout, verbatim) as
a process on real pipes; :class:`~outbox._pi.PiAgent` reads it, the real ``TurnDriver``
checkpoints and enqueues, the real outbox journal drains into ``python -m host serve``.
What is asserted is what a user would find stored: each row's id, role, status and text,
the turn's outcome and status, no checkpoint left over, and a replay of the same turn
changing nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from outbox import HostClient, Journal, Outbox
from outbox._driver import TurnDriver
from outbox._pi import PiAgent
from tests.conftest import REPO, run_view
from tests.outbox.kit import WAIT, spawned, stored

FIXTURES = REPO / "tests" / "fixtures" / "pi-rpc"
FAKE = REPO / "tests" / "outbox" / "fake_pi.py"

PROMPTS = {
    "text": "[text] Say something about stores.",
    "tool": "[tool] Run echo hi in bash.",
    "abort": "[slow] Write a long answer.",
    "error": "[error] Fail halfway.",
    "retry": "[retry] Fail once, then succeed.",
    "drop": "[drop] Lose the connection.",
    "sigterm": "[slow] Write a long answer.",
}
W10 = "the store keeps every line the user was shown as"
W15 = f"{W10} saved durable across crashes quits"
W40 = f"{W15} and restarts while replies stream for minutes and get regenerated {W15}"

# fixture -> (the driver's outcome, the turn's stored status, rows after the prompt as
# (id, role, status, text)); the text of a row is its text blocks, joined.
EXPECTED: dict[str, tuple[str, str, list[tuple[str, str, str, str]]]] = {
    "text": ("completed", "completed", [("t1:a0", "assistant", "complete", W40)]),
    "tool": (
        "completed",
        "completed",
        [
            ("t1:a0", "assistant", "complete", "Running it now."),
            ("t1:tool:call_mock_1", "tool", "complete", "hi\n"),
            ("t1:a1", "assistant", "complete", W10),
        ],
    ),
    "abort": ("stopped", "aborted", [("t1:a0", "assistant", "aborted", W15)]),
    "error": ("error", "error", [("t1:a0", "assistant", "error", W10)]),
    "retry": (
        "completed",
        "completed",
        [("t1:a0", "assistant", "error", W10), ("t1:a1", "assistant", "complete", W10)],
    ),
    "drop": ("error", "error", [("t1:a0", "assistant", "error", W10)]),
    # pi killed mid-reply: the last snapshot, checkpointed at the crash, promoted
    "sigterm": ("crashed", "aborted", [("t1:a0", "assistant", "aborted", W10)]),
}


def text(row: dict[str, Any]) -> str:
    return " ".join(b["text"] for b in row["content"] if b.get("type") == "text")


def fake(name: str) -> list[str]:
    return [sys.executable, str(FAKE), "--fixture", str(FIXTURES / name), "--mode", "rpc"]


def prompt_row(turn_id: str, words: str) -> dict[str, Any]:
    return {"id": f"{turn_id}:u", "role": "user", "content": [{"type": "text", "text": words}]}


@dataclass
class Rig:
    """A real host, outbox and driver, and fake pis that log what they were told."""

    tmp: Path
    client: HostClient
    box: Outbox
    driver: TurnDriver

    def agent(self, fixture: str, session: str = "s") -> PiAgent:
        return PiAgent(
            str(self.tmp / "app" / "pi" / f"{session}.jsonl"),
            command=fake(fixture),
            workdir=str(self.tmp / "app" / "pi-work"),
            env={**os.environ, "FAKE_PI_LOG": str(self.tmp / "fake-pi.log")},
            stderr_path=str(self.tmp / "pi.log"),
        )

    def told(self) -> list[list[dict[str, Any]]]:
        """What each fake pi started was told, in order of their starts."""
        runs: list[list[dict[str, Any]]] = []
        for line in (self.tmp / "fake-pi.log").read_text().splitlines():
            fact = json.loads(line)
            if "start" in fact:
                runs.append([])
            runs[-1].append(fact)
        return runs

    async def turn(
        self,
        agent: PiAgent,
        turn_id: str,
        words: str,
        *,
        new: bool = True,
        on_update: Callable[[int], None] | None = None,
        session: str = "s",
    ) -> str:
        if agent.needs_start:
            await agent.start([])
        row = prompt_row(turn_id, words) if new else None
        st = await self.driver.begin(session, turn_id, row)
        outcome = await self.driver.run(
            st, watched(agent.events(turn_id, words), on_update), regenerate=not new
        )
        await self.box.drain(WAIT)
        return outcome

    async def inspect(self) -> dict[str, Any]:
        code, out, err = await run_view(
            "inspect", "--data-dir", str(self.tmp / "host"), "s", "--json"
        )
        assert code == 0, err
        return dict(json.loads(out))


async def watched(
    events: AsyncIterator[dict[str, Any]], on_update: Callable[[int], None] | None
) -> AsyncIterator[dict[str, Any]]:
    """Pass the driver's events through, calling ``on_update`` with each snapshot's count."""
    n = 0
    async for ev in events:
        yield ev
        if ev["type"] == "message_update" and on_update is not None:
            n += 1
            on_update(n)


@contextlib.asynccontextmanager
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with (
        Outbox.open(str(tmp_path / "app" / "outbox.jsonl")) as box,
        spawned(tmp_path / "host") as client,
    ):
        await client.call("session.create", {"sessionId": "s"})
        box.attach(client)
        yield Rig(tmp_path, client, box, TurnDriver(client, box))


async def replay(r: Rig, name: str, session: str = "s") -> str:
    """Turn t1 of ``session`` from capture ``name`` (Stop pressed as the abort capture did)."""
    agent = r.agent(name, session)

    def on_update(n: int) -> None:
        if name == "abort":
            agent.stop()

    try:
        return await r.turn(agent, "t1", PROMPTS[name], on_update=on_update, session=session)
    finally:
        await agent.close()


@pytest.mark.parametrize("name", sorted(EXPECTED))
async def test_every_capture_is_stored_with_its_ids_roles_statuses_and_text(
    tmp_path: Path, name: str
) -> None:
    outcome, status, rows = EXPECTED[name]
    async with rig(tmp_path) as r:
        assert await replay(r, name) == outcome
        got = await stored(r.client, "s")
        assert (await r.client.call("session.recoverInflightMessages"))["recovered"] == []
    assert got[0] == {**prompt_row("t1", PROMPTS[name]), "turnId": "t1"}, "the echo is dropped"
    assert [(m["id"], m["role"], m.get("status", "complete"), text(m)) for m in got[1:]] == rows
    assert all(m["turnId"] == "t1" for m in got)
    seen = await r.inspect()
    assert [(t["turnId"], t["status"]) for t in seen["turns"]] == [("t1", status)]
    assert seen["checkpoint"] is None
    ends = [fact["end"] for run in r.told() for fact in run if "end" in fact]
    assert ends == (["sigterm-capture"] if name == "sigterm" else ["eof"]), "never a signal"


async def test_rows_keep_pi_s_fields_and_lose_its_scratch(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        await replay(r, "tool")
        calling, tool, answer = (await stored(r.client, "s"))[1:]
    assert [b["type"] for b in calling["content"]] == ["thinking", "text", "toolCall"]
    call = calling["content"][2]
    assert call == {
        "type": "toolCall",
        "id": "call_mock_1",
        "name": "bash",
        "arguments": {"command": "echo hi"},
    }
    assert calling["stopReason"] == "toolUse" and calling["responseId"] == "chatcmpl-mock-2"
    assert calling["usage"]["totalTokens"] == 132
    assert tool["toolCallId"] == "call_mock_1" and tool["toolName"] == "bash"
    assert tool["isError"] is False
    assert answer["timestamp"] == 1796516206789


async def test_a_replayed_turn_is_deduplicated(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        for name in sorted(EXPECTED):  # each its own session: one turn t1 each
            await r.client.call("session.create", {"sessionId": name})
        first: dict[str, list[dict[str, Any]]] = {}
        for attempt in range(2):
            for name in sorted(EXPECTED):
                await replay(r, name, session=name)
            now = {name: await stored(r.client, name) for name in EXPECTED}
            if attempt == 0:
                first = now
                before = (await r.client.call("host.stats"))["counters"]
        after = (await r.client.call("host.stats"))["counters"]
    assert now == first, "the replay stored nothing new and changed nothing"
    replayed = sum(len(rows) for _, _, rows in EXPECTED.values()) - 1  # sigterm's is promoted
    dedup = after.get("appends.deduplicated", 0) - before.get("appends.deduplicated", 0)
    assert dedup == replayed


async def test_regenerate_restarts_pi_with_the_kept_history(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        agent = r.agent("tool")
        assert await r.turn(agent, "t1", PROMPTS["tool"]) == "completed"
        # A second turn on a new pi, started from what the host stored.
        agent.forget()
        agent.command = fake("text")
        await agent.start(await stored(r.client, "s"))
        assert await r.turn(agent, "t2", PROMPTS["text"]) == "completed"
        # Regenerate the reply of t2: the host cuts it, pi must not keep it.
        assert await r.driver.truncate_last_reply("s") == ("t2:u", ["t2:a0"])
        agent.forget()
        assert agent.needs_start
        kept = await stored(r.client, "s")
        await agent.start(kept[:-1])  # the root is sent again as the prompt
        assert await r.turn(agent, "t3", PROMPTS["text"], new=False) == "completed"
        await agent.close()
        got = await stored(r.client, "s")
        revs = await r.client.call(
            "session.listRevisions", {"sessionId": "s", "rootId": "t2:u", "includeMessages": True}
        )
    assert [m["id"] for m in got] == [
        "t1:u",
        "t1:a0",
        "t1:tool:call_mock_1",
        "t1:a1",
        "t2:u",
        "t3:a0",
    ]
    archived = [[m["id"] for m in rev["messages"]] for rev in revs["revisions"]]
    assert archived == [["t2:a0"], ["t3:a0"]], "the cut reply, then the regenerated one"
    first, second, third = r.told()
    # What pi had of turn t1 (its own get_messages in the capture) is what pi 2 and 3 got.
    own = _capture_response("tool", "g1")["messages"]
    for run in (second, third):
        history = run[0]["history"]
        assert history[1:] == own[1:] and history[0]["content"] == own[0]["content"]
    prompts = [
        f["command"]["message"] for f in third if f.get("command", {}).get("type") == "prompt"
    ]
    assert prompts == [PROMPTS["text"]], "the root's text, sent again"
    assert [run[-1]["end"] for run in (first, second, third)] == ["eof", "eof", "eof"]


def _capture_response(name: str, rid: str) -> Any:
    for line in (FIXTURES / f"{name}.jsonl").read_text().splitlines():
        ev = json.loads(line)
        if ev.get("type") == "response" and ev.get("id") == rid:
            return ev["data"]
    raise AssertionError(f"no response {rid} in {name}")


async def test_quit_aborts_pi_so_it_writes_its_final_rows(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        agent = r.agent("abort")
        await agent.start([])
        st = await r.driver.begin("s", "t1", prompt_row("t1", PROMPTS["abort"]))
        streaming = asyncio.Event()
        running = asyncio.ensure_future(
            r.driver.run(
                st, watched(agent.events("t1", PROMPTS["abort"]), lambda n: streaming.set())
            )
        )
        await streaming.wait()
        await r.driver.quit(agent.stop)  # flush, abort, wait (2 s at most) for the rows
        assert running.done() and running.result() == "stopped"
        await agent.close()
        got = await stored(r.client, "s")
    assert [(m["id"], m.get("status"), text(m)) for m in got[1:]] == [("t1:a0", "aborted", W15)]
    (run,) = r.told()
    commands = [f["command"]["type"] for f in run if "command" in f]
    assert commands == ["get_state", "prompt", "abort"] and run[-1]["end"] == "eof"


async def test_pi_s_raw_events_never_reach_the_journal(tmp_path: Path) -> None:
    """Fed to the driver unmapped (what issue 29 found), pi's echo is refused at enqueue."""
    lines = (FIXTURES / "text.jsonl").read_text().splitlines()

    async def raw() -> AsyncIterator[dict[str, Any]]:
        for line in lines:
            yield msgspec.json.decode(line)

    async with rig(tmp_path) as r:
        st = await r.driver.begin("s", "t1", prompt_row("t1", PROMPTS["text"]))
        with pytest.raises(ValueError, match="missing required field `id`"):
            await r.driver.run(st, raw())
    async with Journal.open(str(tmp_path / "app" / "outbox.jsonl")) as journal:
        assert not journal.pending, "nothing the host would refuse was journaled"
