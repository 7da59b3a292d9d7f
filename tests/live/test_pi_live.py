"""pi itself, against a loopback mock model (scripts/mock_llm.py): ``make test-pi`` (issue 29).

Opt-in: ``make test-pi`` installs pi with npm into ``.cache/pi`` (about 200 MB, git-ignored)
and runs these with ``HOSTCORE_PI`` naming its binary; without it they are skipped. pi runs
offline with a config folder of its own per test (``models.json`` naming the mock), as the
captures in tests/fixtures/pi-rpc were made. The mock records every request pi makes, so
a test can see what the model was told, not only what was stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from outbox import Outbox
from outbox._drive import KILL_AFTER
from outbox._driver import TurnDriver
from outbox._pi import PiAgent
from scripts.mock_llm import MockLLM, pi_config
from tests.conftest import REPO, run_cli, run_view
from tests.outbox.kit import WAIT, spawned, stored

PI = os.environ.get("HOSTCORE_PI")
pytestmark = pytest.mark.skipif(not PI, reason="pi is not installed here: run `make test-pi`")


@pytest.fixture
def mock(tmp_path: Path) -> Iterator[MockLLM]:
    server = MockLLM(delay=0.01, slow_delay=0.05)
    thread = server.start()
    pi_config(tmp_path / "agent", server.url)
    yield server
    server.shutdown()
    server.server_close()
    thread.join(WAIT)


def pi_env(tmp_path: Path, agent_dir: str = "agent") -> dict[str, str]:
    """pi offline, with its own home and config folder under ``tmp_path``."""
    (tmp_path / "home").mkdir(exist_ok=True)
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path / "home"),
        "PI_CODING_AGENT_DIR": str(tmp_path / agent_dir),
        "PI_OFFLINE": "1",
        "PI_TELEMETRY": "0",
        "MOCK_API_KEY": "dummy-key",
        "TERM": "dumb",
    }


PI_MOCK = [str(PI), "--mode", "rpc", "--provider", "mock", "--model", "mock-1"]


def texts(row: dict[str, Any]) -> str:
    return " ".join(b.get("text", "") for b in row["content"] if b.get("type") == "text")


@contextlib.asynccontextmanager
async def live(tmp_path: Path, command: list[str] = PI_MOCK) -> AsyncIterator[Any]:
    """A real host, outbox and driver, and a real pi for session ``s``."""
    async with (
        Outbox.open(str(tmp_path / "app" / "outbox.jsonl")) as box,
        spawned(tmp_path / "host") as client,
    ):
        await client.call("session.create", {"sessionId": "s"})
        box.attach(client)
        agent = PiAgent(
            str(tmp_path / "app" / "pi" / "s.jsonl"),
            command=command,
            workdir=str(tmp_path / "work"),
            env=pi_env(tmp_path),
            stderr_path=str(tmp_path / "pi.log"),
        )
        try:
            yield client, box, TurnDriver(client, box), agent
        finally:
            await agent.close()


async def turn(
    driver: TurnDriver,
    agent: PiAgent,
    turn_id: str,
    words: str,
    *,
    new: bool = True,
    on_event: Callable[[dict[str, Any]], None] | None = None,
) -> str:
    prompt = {"id": f"{turn_id}:u", "role": "user", "content": [{"type": "text", "text": words}]}
    st = await driver.begin("s", turn_id, prompt if new else None)

    async def watched() -> AsyncIterator[dict[str, Any]]:
        async for ev in agent.events(turn_id, words):
            yield ev
            if on_event is not None:
                on_event(ev)

    outcome = await driver.run(st, watched(), regenerate=not new)
    await driver.outbox.drain(WAIT)
    return outcome


async def test_pi_retries_a_failed_reply_inside_the_turn(tmp_path: Path, mock: MockLLM) -> None:
    async with live(tmp_path) as (client, _box, driver, agent):
        await agent.start([])
        assert await turn(driver, agent, "t1", "[retry] Fail once, then succeed.") == "completed"
        rows = await stored(client, "s")
    assert [(m["id"], m.get("status")) for m in rows] == [
        ("t1:u", None),
        ("t1:a0", "error"),  # the failed attempt the user saw
        ("t1:a1", "complete"),  # pi's own retry, in the same turn
    ]
    assert rows[1]["errorMessage"] == "mock: internal server error mid-stream"
    assert [r["attempt"] for r in mock.requests] == [1, 2]


async def test_a_stop_in_pi_s_retry_delay_ends_the_turn_stopped(
    tmp_path: Path, mock: MockLLM
) -> None:
    pi_config(tmp_path / "agent", mock.url, retry_delay_ms=5000)  # time to press Stop
    async with live(tmp_path) as (client, _box, driver, agent):
        await agent.start([])

        def stop_when_it_failed(ev: dict[str, Any]) -> None:
            if ev["type"] == "message_end" and ev["message"].get("status") == "error":
                agent.stop()

        outcome = await turn(driver, agent, "t1", "[retry] Stop me.", on_event=stop_when_it_failed)
        assert outcome == "stopped"
        rows = await stored(client, "s")
        assert await agent.messages()  # pi is still there, and answers
    assert [(m["id"], m.get("status")) for m in rows] == [("t1:u", None), ("t1:a0", "error")]
    assert len(mock.requests) == 1, "the retry was cancelled, never sent"


async def test_regenerate_leaves_pi_without_the_cut_branch(tmp_path: Path, mock: MockLLM) -> None:
    async with live(tmp_path) as (client, _box, driver, agent):
        await agent.start([])
        assert await turn(driver, agent, "t1", "[text] Say something.") == "completed"
        assert await turn(driver, agent, "t2", "[text] Say more.") == "completed"
        cut_text = texts((await stored(client, "s"))[-1])
        assert await driver.truncate_last_reply("s") == ("t2:u", ["t2:a0"])
        agent.forget()
        kept = await stored(client, "s")
        await agent.start(kept[:-1])
        own = await agent.messages()
        assert await turn(driver, agent, "t3", "[text] Say more.", new=False) == "completed"
        after = await agent.messages()
        rows = await stored(client, "s")
    assert [m["role"] for m in own] == ["user", "assistant"], "pi holds t1 only"
    assert cut_text not in json.dumps(after), "pi no longer holds the cut reply"
    assert [m["id"] for m in rows] == ["t1:u", "t1:a0", "t2:u", "t3:a0"]
    asked = [m["text"] for m in mock.requests[-1]["messages"] if m["role"] != "system"]
    assert asked == ["[text] Say something.", texts(rows[1]), "[text] Say more."]


async def test_a_prompt_pi_refuses_stops_drive_with_pi_s_reason(tmp_path: Path) -> None:
    env = {**os.environ, **pi_env(tmp_path, agent_dir="empty")}  # pi without any model
    data = tmp_path / "data"
    proc = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "outbox", "drive", "--agent", "pi", "--json"],
        *["--data-dir", str(data), "--sessions", "1", "--pi-command", f"{PI} --mode rpc"],
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(WAIT):
        _out, err = await proc.communicate()
    assert proc.returncode == 2, err.decode()
    assert "pi refused the prompt" in err.decode() and "No API key" in err.decode()
    _, out, _ = await run_view("inspect", "--data-dir", str(data / "host"), "s0", "--json")
    seen = json.loads(out)
    assert [(t["status"]) for t in seen["turns"]] == ["error"]
    assert [m["role"] for m in seen["messages"]] == ["user"]


async def test_drive_with_pi_stores_every_turn_then_verify_finds_nothing_wrong(
    tmp_path: Path, mock: MockLLM
) -> None:
    data = tmp_path / "data"
    proc = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "outbox", "drive", "--agent", "pi", "--json", "--sessions", "1"],
        *["--data-dir", str(data), "--pi-command", " ".join(PI_MOCK)],
        cwd=REPO,
        env={**os.environ, **pi_env(tmp_path)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(WAIT * 2):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    facts = [json.loads(line) for line in out.decode().splitlines()]
    done = facts[-1]
    assert done["outcomes"] == {
        "completed": 4,
        "stopped": 1,
        "regenerate completed": 1,
        "crashed": 1,
    }, done
    assert done["model"] == "mock/mock-1" and done["outboxPending"] == 0
    code, report, _ = await run_cli("verify", "--data-dir", str(data / "host"))
    assert code == 0, report
    code, out_md, _ = await run_view(
        "export", "--data-dir", str(data / "host"), "s0", "--format", "markdown"
    )
    assert code == 0
    print(f"\n{report}\n{out_md}")  # make test-pi shows one live session as stored
    code, dump, _ = await run_view("export", "--data-dir", str(data / "host"), "s0")
    rows = [json.loads(line) for line in dump.splitlines()]
    by_turn: dict[str, list[tuple[str, str, str]]] = {}
    for m in rows:
        by_turn.setdefault(m["turnId"][-2:], []).append(
            (m["id"].split(":", 1)[1], m["role"], m.get("status", "complete"))
        )
    assert by_turn == {
        "t0": [("u", "user", "complete"), ("a0", "assistant", "complete")],
        "t1": [
            ("u", "user", "complete"),
            ("a0", "assistant", "complete"),
            ("tool:call_mock_1", "tool", "complete"),
            ("a1", "assistant", "complete"),
        ],
        "t2": [("u", "user", "complete"), ("a0", "assistant", "aborted")],  # Stop
        "t3": [("u", "user", "complete")],  # its reply regenerated, by t4
        "t4": [("a0", "assistant", "complete")],
        "t5": [("u", "user", "complete"), ("a0", "assistant", "aborted")],  # pi killed
        "t6": [("u", "user", "complete"), ("a0", "assistant", "complete")],
    }
    assert next(m for m in rows if m["role"] == "tool")["content"][0]["text"] == "hi\n"
    killed = next(m for m in rows if m["turnId"].endswith("t5") and m["role"] == "assistant")
    assert len(texts(killed).split()) >= KILL_AFTER - 1, "what streamed before the kill"
    # After the kill a new pi was started from the host's history: the model saw it all.
    last = [m["text"] for m in mock.requests[-1]["messages"] if m["role"] == "user"]
    assert last[0] == "[text] Say something short about durable stores." and len(last) == 6
    # From the regenerate on, no request carried the reply it replaced.
    code, revs, _ = await run_view(
        "export", "--data-dir", str(data / "host"), "s0", "--with-revisions"
    )
    archived = [json.loads(line) for line in revs.splitlines() if '"revisionOf"' in line]
    cut_text = " ".join(b["text"] for b in archived[0]["message"]["content"])
    root = "[text] Say one thing about checkpoints."
    asks = [n for n, r in enumerate(mock.requests) if r["messages"][-1]["text"] == root]
    assert len(asks) == 2, "asked, then asked again by the regenerate"
    again = asks[1]
    assert all(cut_text not in json.dumps(r) for r in mock.requests[again:])
