"""An intent left by an older hostcore (the format before the change engine of issue 33).

That host finished its changes by other rules: a cut checked against the SHA-256 of the
bytes it removes, a stamp replayed at start. One it left (it died mid-change, or its disk
failed past the record) is neither guessed at nor dropped: the session answers
``STORAGE_ERROR`` saying what to do, its files stay as they are, every other session is
served, and once the file is moved away the session is served from its files.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.conftest import RpcError, StartHost, get_messages, msg


async def test_an_older_hosts_intent_is_kept_and_its_session_not_served_until_it_goes(
    start_host: StartHost, data_dir: Path
) -> None:
    host = await start_host()
    c = host.client
    assert c is not None
    await c.handshake()
    for sid in ("s", "o"):
        await c.call("session.create", sessionId=sid)
    for m in (msg("u1"), msg("a1", "assistant"), msg("u2"), msg("b1", "assistant")):
        await c.call("session.appendMessage", sessionId="s", message=m)
    await c.call("session.appendMessage", sessionId="o", message=msg("o1"))
    assert await host.stop() == 0

    # What 86ff206 wrote for a regenerate of b1 (host/_intents.py there): the cut of b1's
    # bytes, the restamped root u2 written at its offset.
    sessions = data_dir / "sessions"
    transcript = (sessions / "s.jsonl").read_bytes()
    lines = transcript.splitlines(keepends=True)
    offset = len(b"".join(lines[:2]))
    intent = sessions / "s.intent.json"
    intent.write_text(
        json.dumps(
            {
                "sessionId": "s",
                "cut": {
                    "offset": offset,
                    "before": len(transcript),
                    "cutSha256": hashlib.sha256(transcript[offset:]).hexdigest(),
                    "append": lines[2].decode().rstrip("\n"),
                },
            }
        )
    )
    planted = intent.read_bytes()

    host = await start_host()
    c = host.client
    assert c is not None
    await c.handshake()
    with pytest.raises(RpcError) as refused:
        await c.call("session.get", sessionId="s")
    assert refused.value.name == "STORAGE_ERROR"
    assert "older hostcore" in str(refused.value)
    with pytest.raises(RpcError):  # no write either
        await c.call("session.appendMessage", sessionId="s", message=msg("u3"))
    assert [m["id"] for m in await get_messages(c, "o")] == ["o1"]
    assert intent.read_bytes() == planted
    assert (sessions / "s.jsonl").read_bytes() == transcript

    intent.rename(data_dir / "kept-aside.intent.json")  # the person's choice
    assert [m["id"] for m in await get_messages(c, "s")] == ["u1", "a1", "u2", "b1"]
    assert await host.stop() == 0
