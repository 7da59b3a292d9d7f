"""``on_thread``'s cancel: raised after the thread's work, and that work's own failure is
retrieved then, never left for the garbage collector to log as a "Future exception was
never retrieved" with its traceback (the CI break of stop 40: the search indexer,
cancelled at stop while its thread failed on a linked folder)."""

from __future__ import annotations

import asyncio
import gc
import threading
from typing import Any

from host._fs import on_thread


async def test_a_cancelled_calls_failed_thread_is_retrieved_not_logged() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    started, go = threading.Event(), threading.Event()
    ended: list[str] = []

    def work() -> None:
        started.set()
        go.wait(10)
        ended.append("thread")
        raise OSError("the disk failed after its call was cancelled")

    call = asyncio.create_task(on_thread(work))
    await asyncio.to_thread(started.wait, 10)
    call.cancel()
    await asyncio.sleep(0)  # the cancel is delivered while the thread still works
    assert not call.done()
    go.set()
    try:
        await call
    except asyncio.CancelledError:
        ended.append("call")
    assert ended == ["thread", "call"]
    del call
    gc.collect()
    await asyncio.sleep(0)
    assert reported == []
