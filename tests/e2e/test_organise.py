"""Issue 35 through the real host: session.search, paged session.list, session.update,
session.fork, and their bad input (a clear error, nothing changed)."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import (
    REPO,
    Client,
    RpcError,
    StartHost,
    everything,
    get_messages,
    msg,
    restart,
    run_cli,
    transcript,
)

MAX_TITLE = 1_000
MAX_META = 16_384


async def _chat(client: Client, sid: str, texts: list[Any], **create: Any) -> None:
    await client.call("session.create", sessionId=sid, **create)
    for i, text in enumerate(texts):
        role = "user" if i % 2 == 0 else "assistant"
        await client.call(
            "session.appendMessage", sessionId=sid, message=msg(f"{sid}-m{i}", role, text)
        )


async def _refused(client: Client, method: str, name: str, **params: Any) -> RpcError:
    with pytest.raises(RpcError) as info:
        await client.call(method, **params)
    assert info.value.name == name, info.value
    return info.value


# -- session.search -------------------------------------------------------------------------


async def test_search_finds_words_prefixes_and_cjk_with_ranges(client: Client) -> None:
    await _chat(
        client,
        "a",
        [
            "How do I organise my photos?",
            [{"type": "text", "text": "Organisation starts with folders."}, {"type": "image"}],
            "東京都に住んでいます",
            "한국어 텍스트",
        ],
    )
    await _chat(client, "b", ["def organise(x): return x"])
    got = await client.call("session.search", query="organis")
    assert {(h["sessionId"], h["messageId"]) for h in got["hits"]} == {
        ("a", "a-m0"),
        ("a", "a-m1"),
        ("b", "b-m0"),
    }
    assert got["partial"] is False and "cursor" not in got
    for hit in got["hits"]:
        text, ranges = hit["snippet"]["text"], hit["snippet"]["ranges"]
        assert ranges and all(text[a:b].lower() == "organis" for a, b in ranges), hit
        assert hit["score"] > 0 and hit["line"] >= 0 and hit["role"] in ("user", "assistant")
    one = (await client.call("session.search", query="東"))["hits"]
    assert [(h["messageId"], h["snippet"]["ranges"]) for h in one] == [("a-m2", [[0, 1]])]
    two = (await client.call("session.search", query="東京"))["hits"]
    assert [h["messageId"] for h in two] == ["a-m2"]
    assert [
        h["messageId"] for h in (await client.call("session.search", query="국어"))["hits"]
    ] == ["a-m3"]
    only_b = await client.call("session.search", query="organise", sessionId="b")
    assert [h["sessionId"] for h in only_b["hits"]] == ["b"]
    without = await client.call("session.search", query="organis -photos")
    assert "a-m0" not in {h["messageId"] for h in without["hits"]}


async def test_tool_results_are_searched_only_when_asked(client: Client) -> None:
    await client.call("session.create", sessionId="s")
    tool = {"id": "t1", "role": "tool", "content": "grep output: needle"}
    await client.call("session.appendMessage", sessionId="s", message=tool)
    await client.call("session.appendMessage", sessionId="s", message=msg("u1", content="a needle"))
    plain = await client.call("session.search", query="needle")
    assert [h["messageId"] for h in plain["hits"]] == ["u1"]
    both = await client.call("session.search", query="needle", tools=True)
    assert sorted(h["messageId"] for h in both["hits"]) == ["t1", "u1"]


async def test_search_pages_with_its_cursor(client: Client) -> None:
    await _chat(client, "p", ["a common word"] * 25)
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"query": "common word", "limit": 10}
        if cursor:
            params["cursor"] = cursor
        page = await client.call("session.search", **params)
        seen += [h["messageId"] for h in page["hits"]]
        cursor = page.get("cursor")
        if not cursor:
            break
    assert sorted(seen) == sorted(f"p-m{i}" for i in range(25))
    # recent first on ties: every message scores the same
    assert seen[0] == "p-m24"


async def test_search_follows_changes_and_deletes(client: Client) -> None:
    await _chat(client, "c", ["alpha beta", "gamma delta", "alpha omega"])
    await client.call("session.updateMessage", sessionId="c", message=msg("c-m0", content="zeta"))
    await client.call("session.deleteMessages", sessionId="c", messageIds=["c-m2"])
    assert (await client.call("session.search", query="alpha"))["hits"] == []
    (hit,) = (await client.call("session.search", query="zeta"))["hits"]
    assert (hit["messageId"], hit["line"]) == ("c-m0", 0)
    await client.call("session.truncateFrom", sessionId="c", fromMessageId="c-m1")
    assert (await client.call("session.search", query="gamma"))["hits"] == []
    await client.call("session.delete", sessionId="c")
    assert (await client.call("session.search", query="zeta"))["hits"] == []


@pytest.mark.parametrize(
    ("query", "name"),
    [
        ("", "INVALID_PARAMS"),
        ("   ", "INVALID_PARAMS"),
        ("AND NOT -", "INVALID_PARAMS"),  # only operators
        ("-alpha", "INVALID_PARAMS"),  # nothing to find
        ("cats OR dogs", "INVALID_PARAMS"),
        ('():^* "" - + {}', "INVALID_PARAMS"),  # FTS syntax, no word
        ("x" * 10_000_000, "LIMIT_EXCEEDED"),  # a 10 MB query
        (" ".join(f"term{i}" for i in range(17)), "LIMIT_EXCEEDED"),
    ],
)
async def test_bad_queries_are_refused_clearly(
    client: Client, data_dir: Path, query: str, name: str
) -> None:
    await _chat(client, "s", ["alpha beta"])
    before = await everything(client, data_dir)
    err = await _refused(client, "session.search", name, query=query)
    assert err.error["message"] and len(err.error["message"]) < 200
    assert await everything(client, data_dir) == before


async def test_fts_syntax_is_searched_as_text(client: Client) -> None:
    await _chat(client, "s", ['call f(x): "quoted" ^ NEAR(a b) *star* col:val', "plain"])
    for query in ["f(x):", "NEAR(a", "*star*", "col:val", '"quoted"', '"quot']:
        got = await client.call("session.search", query=query)
        assert [h["messageId"] for h in got["hits"]] == ["s-m0"], query


async def test_search_bad_params(client: Client) -> None:
    await _refused(client, "session.search", "INVALID_PARAMS", query="alpha", limit=0)
    await _refused(client, "session.search", "INVALID_PARAMS", query="alpha", limit=101)
    await _refused(client, "session.search", "INVALID_PARAMS", query="alpha", cursor="nope")
    await _refused(client, "session.search", "INVALID_PARAMS", query="alpha", tools="yes")
    await _refused(client, "session.search", "INVALID_PARAMS", query="alpha", sessionId="../x")


async def test_archived_revisions_are_searched_with_scope_all(client: Client) -> None:
    await client.call("session.create", sessionId="r")
    await client.call("session.appendMessage", sessionId="r", message=msg("u1", content="ask"))
    old = msg("a1", "assistant", "first answer about walruses")
    await client.call("session.appendMessage", sessionId="r", message=old)
    await client.call("session.truncateFrom", sessionId="r", fromMessageId="a1")
    new = msg("a2", "assistant", "second answer about otters")
    await client.call("session.appendMessage", sessionId="r", message=new)
    assert (await client.call("session.search", query="walrus"))["hits"] == []
    (hit,) = (await client.call("session.search", query="walrus", scope="all"))["hits"]
    assert (hit["messageId"], hit["rootId"], hit["revision"]) == ("a1", "u1", 0)
    saved = msg("a3", "assistant", "a third answer about seals")
    await client.call("session.saveRevision", sessionId="r", rootId="u1", messages=[saved])
    (hit,) = (await client.call("session.search", query="seals", scope="all"))["hits"]
    assert (hit["messageId"], hit["rootId"], hit["line"]) == ("a3", "u1", 0), hit
    await client.call("session.delete", sessionId="r")
    assert (await client.call("session.search", query="walrus", scope="all"))["hits"] == []


async def test_search_command_line(client: Client, data_dir: Path) -> None:
    await _chat(client, "s", ["the cli finds needles"])
    await client.call("session.search", query="needle")  # indexed
    code, out, _ = await run_cli("search", str(data_dir), "needle")
    assert code == 0 and "s  line 0  user" in out and "[needle]s" in out, out
    code, out, err = await run_cli("search", str(data_dir), "()")
    assert code == 2 and "no word" in err, err
    code, out, err = await run_cli("search", str(data_dir), "absent")
    assert code == 1 and "0 hit(s)" in out, out
    read, write = os.pipe()  # a reader that stopped before the hits came (`| head`)
    os.close(read)
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "host", "search", str(data_dir), "needle",
            stdout=write, stderr=asyncio.subprocess.PIPE, cwd=REPO,
        )  # fmt: skip
    finally:
        os.close(write)
    _, err_bytes = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1 and b"Traceback" not in err_bytes, err_bytes


async def test_an_old_data_dir_builds_its_search_index(
    start_host: StartHost, data_dir: Path
) -> None:
    host = await start_host(data_dir)
    assert host.client is not None
    client = host.client
    await client.handshake()
    await _chat(client, "old", [f"message {i} about rivers" for i in range(50)])
    assert await host.stop() == 0
    # as an index from before issue 35 has it: no search tables, no meta columns
    conn = sqlite3.connect(data_dir / "index.sqlite3", isolation_level=None)
    for kind, name in conn.execute(
        "SELECT type, name FROM sqlite_master WHERE type IN ('trigger', 'index', 'table')"
        " AND (name LIKE 'search%' OR name LIKE 'sessions_%') AND name NOT LIKE '%_data'"
        " AND name NOT LIKE '%_idx' AND name NOT LIKE '%_config' AND name NOT LIKE '%_docsize'"
    ).fetchall():
        conn.execute(f"DROP {kind} IF EXISTS {name}")
    for column in ("meta", "pinned", "meta_dirty"):
        conn.execute(f"ALTER TABLE sessions DROP COLUMN {column}")
    conn.execute("DELETE FROM migrations WHERE name = '0003-search-meta'")
    conn.close()
    client = await restart(start_host, host)
    got = await client.call("session.search", query="rivers", limit=100)
    assert len(got["hits"]) == 50 and got["partial"] is False
    stats = (await client.call("host.stats"))["counters"]
    assert stats["search.pending"] == 0 and stats["search.indexed"] >= 50


# -- session.list ---------------------------------------------------------------------------


async def test_list_pages_in_both_orders_and_pinned_first(client: Client) -> None:
    for i in range(7):
        await _chat(client, f"s{i}", [f"hello {i}"], title=f"chat {i}")
    await client.call("session.appendMessage", sessionId="s0", message=msg("late"))
    await client.call("session.update", sessionId="s3", meta={"pinned": True})

    async def walk(**params: Any) -> list[str]:
        out: list[str] = []
        cursor = None
        while True:
            page = await client.call(
                "session.list", limit=3, **params, **({"cursor": cursor} if cursor else {})
            )
            assert len(page["sessions"]) <= 3
            out += [s["sessionId"] for s in page["sessions"]]
            cursor = page.get("cursor")
            if not cursor:
                return out

    rows = (await client.call("session.list", limit=1000))["sessions"]
    by_updated = [
        r["sessionId"]
        for r in sorted(rows, key=lambda r: (r["updatedAt"], r["sessionId"]), reverse=True)
    ]
    by_created = [
        r["sessionId"]
        for r in sorted(rows, key=lambda r: (r["createdAt"], r["sessionId"]), reverse=True)
    ]
    assert by_updated[0] == "s0" or rows[0]["updatedAt"] == rows[1]["updatedAt"]  # same ms
    assert await walk() == by_updated == [r["sessionId"] for r in rows]
    assert await walk(order="created") == by_created
    assert await walk(pinnedFirst=True) == ["s3", *(s for s in by_updated if s != "s3")]
    first = next(r for r in rows if r["sessionId"] == "s0")
    assert first["title"] == "chat 0" and first["messageCount"] == 2 and first["meta"] is None
    assert first["createdAt"] <= first["updatedAt"]
    page = await client.call("session.list", limit=2, order="created")
    await _refused(client, "session.list", "INVALID_PARAMS", cursor=page["cursor"])  # other order
    await _refused(client, "session.list", "INVALID_PARAMS", cursor="garbage")
    await _refused(client, "session.list", "INVALID_PARAMS", limit=0)
    await _refused(client, "session.list", "INVALID_PARAMS", limit=1001)


async def test_titles_are_bounded_and_old_huge_titles_keep_the_list_pageable(
    client: Client, data_dir: Path, start_host: StartHost, host: Any
) -> None:
    """The outside case: titles of 33 MiB made every session.list LIMIT_EXCEEDED."""
    before = await everything(client, data_dir)
    err = await _refused(
        client, "session.create", "INVALID_PARAMS", sessionId="big", title="x" * (MAX_TITLE + 1)
    )
    assert "length <= 1000" in err.error["message"]
    assert await everything(client, data_dir) == before
    await client.call("session.create", sessionId="ok", title="é" * MAX_TITLE)
    # Titles an older host accepted: two of 33 MiB, as the outside pass made them.
    for sid in ("huge1", "huge2"):
        await client.call("session.create", sessionId=sid)
    await client.call("session.list")
    conn = sqlite3.connect(data_dir / "index.sqlite3", isolation_level=None, timeout=10)
    conn.execute("UPDATE sessions SET title = ? WHERE session_id LIKE 'huge%'", ("t" * (33 << 20),))
    conn.close()
    page = await client.call("session.list")
    titles = {s["sessionId"]: s["title"] for s in page["sessions"]}
    assert len(titles["huge1"]) == MAX_TITLE and titles["ok"] == "é" * MAX_TITLE


async def test_many_sessions_page_whatever_their_number(client: Client) -> None:
    for i in range(600):
        await client.call("session.create", sessionId=f"n{i:04d}", title="t" * MAX_TITLE)
    first = await client.call("session.list")
    assert len(first["sessions"]) == 100 and "cursor" in first
    total, cursor = 0, None
    while True:
        page = await client.call(
            "session.list", limit=1000, **({"cursor": cursor} if cursor else {})
        )
        total += len(page["sessions"])
        cursor = page.get("cursor")
        if not cursor:
            break
    assert total == 600


# -- session.update -------------------------------------------------------------------------


async def test_update_sets_title_and_merges_meta_durably(
    client: Client, data_dir: Path, start_host: StartHost, host: Any
) -> None:
    await _chat(client, "s", ["hi"], title="old")
    got = await client.call(
        "session.update", sessionId="s", title="new", meta={"a": 1, "b": [1, 2]}
    )
    assert got == {"sessionId": "s", "title": "new", "meta": {"a": 1, "b": [1, 2]}, "changed": True}
    got = await client.call("session.update", sessionId="s", meta={"a": None, "c": {"d": "e"}})
    assert got["meta"] == {"b": [1, 2], "c": {"d": "e"}} and got["title"] == "new"
    again = await client.call("session.update", sessionId="s", meta={"c": {"d": "e"}})
    assert again["changed"] is False
    on_disk = json.loads((data_dir / "sessions" / "s.meta.json").read_bytes())
    assert on_disk["title"] == "new" and on_disk["meta"] == {"b": [1, 2], "c": {"d": "e"}}
    client = await restart(start_host, host, kill=True)
    (row,) = (await client.call("session.list"))["sessions"]
    assert (row["title"], row["meta"]) == ("new", {"b": [1, 2], "c": {"d": "e"}})
    cleared = await client.call("session.update", sessionId="s", title=None)
    assert cleared["title"] is None


async def test_update_bad_input_changes_nothing(client: Client, data_dir: Path) -> None:
    await _chat(client, "s", ["hi"], title="keep")
    await client.call("session.update", sessionId="s", meta={"k": "v"})
    before = await everything(client, data_dir)
    err = await _refused(
        client, "session.update", "LIMIT_EXCEEDED", sessionId="s", meta={"big": "x" * MAX_META}
    )
    assert err.data["limit"] == MAX_META
    await _refused(client, "session.update", "INVALID_PARAMS", sessionId="s", title="t" * 1001)
    await _refused(client, "session.update", "INVALID_PARAMS", sessionId="s", meta=[1, 2])
    await _refused(client, "session.update", "INVALID_PARAMS", sessionId="s", meta="x")
    await _refused(client, "session.update", "NOT_FOUND", sessionId="nope", title="x")
    assert await everything(client, data_dir) == before


# -- session.fork ---------------------------------------------------------------------------


async def test_fork_copies_the_lines_byte_for_byte(client: Client, data_dir: Path) -> None:
    await _chat(client, "src", ["one", "two", "three", "four"], title="the chat")
    got = await client.call("session.fork", sessionId="src", atMessageId="src-m1", newSessionId="f")
    assert got == {"sessionId": "f", "created": True, "messageCount": 2}
    src_bytes = transcript(data_dir, "src").read_bytes()
    assert transcript(data_dir, "f").read_bytes() == b"".join(src_bytes.splitlines(True)[:2])
    assert [m["id"] for m in await get_messages(client, "f")] == ["src-m0", "src-m1"]
    row = next(s for s in (await client.call("session.list"))["sessions"] if s["sessionId"] == "f")
    assert row["meta"] == {"forkedFrom": {"sessionId": "src", "messageId": "src-m1"}}
    assert row["title"] == "the chat"
    again = await client.call(
        "session.fork", sessionId="src", atMessageId="src-m1", newSessionId="f"
    )
    assert again == {"sessionId": "f", "created": False, "messageCount": 2}
    await client.call("session.appendMessage", sessionId="f", message=msg("x", content="only in f"))
    hits = (await client.call("session.search", query="only in f"))["hits"]
    assert [h["sessionId"] for h in hits] == ["f"]
    named = await client.call("session.fork", sessionId="src", atMessageId="src-m3")
    assert named["created"] and len(named["sessionId"]) == 32


async def test_fork_bad_input_changes_nothing(client: Client, data_dir: Path) -> None:
    await _chat(client, "src", ["one", "two"])
    await client.call("session.create", sessionId="Other")
    before = await everything(client, data_dir)
    await _refused(client, "session.fork", "NOT_FOUND", sessionId="src", atMessageId="zz")
    await _refused(client, "session.fork", "NOT_FOUND", sessionId="no", atMessageId="src-m0")
    err = await _refused(
        client,
        "session.fork",
        "CONFLICT",
        sessionId="src",
        atMessageId="src-m0",
        newSessionId="other",
    )
    assert err.data["sessionId"] == "Other"
    await _refused(
        client,
        "session.fork",
        "CONFLICT",
        sessionId="src",
        atMessageId="src-m0",
        newSessionId="src",
    )
    await _refused(
        client,
        "session.fork",
        "INVALID_PARAMS",
        sessionId="src",
        atMessageId="src-m0",
        newSessionId="../x",
    )
    assert await everything(client, data_dir) == before
