"""A loopback mock of an OpenAI-compatible model server, for running pi without a model.

    python scripts/mock_llm.py [--port 0] [--delay 0.1] [--slow-delay 0.1] [--log FILE]

It prints ``listening on http://127.0.0.1:PORT/v1`` and serves ``POST /v1/chat/completions``
streaming (SSE ``data:`` chunks over chunked transfer encoding, ``data: [DONE]``, a final
``usage`` chunk), the way the captures in tests/fixtures/pi-rpc were made (their README).
The tag in the last user message picks the reply:

    [text]   40 one-word chunks, finish_reason "stop"
    [tool]   3 reasoning chunks, "Running it now.", a call bash {"command": "echo hi"}
             (arguments in 4 chunks), "tool_calls"; after the tool's result, 10 chunks
    [slow]   80 chunks at --slow-delay each (to stop or kill mid-reply)
    [error]  10 chunks, then an error event and the end of the stream (no finish_reason)
    [retry]  the first request with that prompt as [error]; later ones 10 chunks, "stop"
    [drop]   10 chunks, then a TCP reset without the chunked terminator
    (none)   as [text]

Point pi at it with a ``models.json`` in pi's config folder (``PI_CODING_AGENT_DIR``):
:func:`pi_config` writes one (provider ``mock``, model ``mock-1``). Every request is kept
in ``MockLLM.requests`` (and appended to ``--log``): its tag, attempt and messages.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from outbox._agent import WORDS  # the captures' words

TAGS = ("[text]", "[tool]", "[slow]", "[error]", "[retry]", "[drop]")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


class MockLLM(ThreadingHTTPServer):
    """The server: ``start()`` in a thread, ``url`` to point pi at, ``requests`` seen."""

    daemon_threads = True

    def __init__(self, port: int = 0, delay: float = 0.1, slow_delay: float = 0.1) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.delay = delay
        self.slow_delay = slow_delay
        self.requests: list[dict[str, Any]] = []
        self.log_path: str | None = None
        self._lock = threading.Lock()
        self._attempts: dict[str, int] = {}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="mock-llm", daemon=True)
        thread.start()
        return thread

    def note(self, body: dict[str, Any]) -> dict[str, Any]:
        """Record a request; return what it is (tag, attempt, its messages)."""
        msgs = body.get("messages") or []
        users = [m for m in msgs if m.get("role") == "user"]
        prompt = _text(users[-1].get("content")) if users else ""
        tag = next((t for t in TAGS if t in prompt), "[text]")
        with self._lock:
            self._attempts[prompt] = self._attempts.get(prompt, 0) + 1
            seen = {
                "request": len(self.requests) + 1,
                "tag": tag,
                "attempt": self._attempts[prompt],
                "lastRole": msgs[-1].get("role") if msgs else None,
                "messages": [
                    {"role": m.get("role"), "text": _text(m.get("content"))} for m in msgs
                ],
            }
            self.requests.append(seen)
            if self.log_path:
                with open(self.log_path, "a") as f:
                    f.write(json.dumps(seen) + "\n")
        return seen


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: MockLLM

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        seen = self.server.note(body)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.rid = f"chatcmpl-mock-{seen['request']}"
        self.model = body.get("model", "mock-1")
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self._reply(seen)  # unless the client goes away (an abort, or pi killed)

    def _reply(self, seen: dict[str, Any]) -> None:
        tag, attempt, delay = seen["tag"], seen["attempt"], self.server.delay
        offset = 3 * (seen["request"] - 1)
        if tag == "[tool]" and seen["lastRole"] != "tool":
            return self._tool_call()
        if tag in ("[error]", "[drop]") or (tag == "[retry]" and attempt == 1):
            self._words(10, delay, offset)
            if tag == "[drop]":
                return self._reset()
            error = {"message": "mock: internal server error mid-stream", "type": "server_error"}
            self._event({"error": error})
            return self._end()
        n = {"[slow]": 80, "[text]": 40}.get(tag, 10)
        self._words(n, self.server.slow_delay if tag == "[slow]" else delay, offset)
        self._finish("stop")

    def _tool_call(self) -> None:
        delay = self.server.delay
        for part in ("The user wants ", "me to run ", "echo hi."):
            self._delta({"reasoning_content": part})
            time.sleep(delay)
        self._delta({"content": "Running it now."})
        call = {"index": 0, "id": "call_mock_1", "type": "function"}
        self._delta({"tool_calls": [{**call, "function": {"name": "bash", "arguments": ""}}]})
        for part in ('{"comm', 'and": "ec', 'ho hi"', "}"):
            time.sleep(delay)
            self._delta({"tool_calls": [{"index": 0, "function": {"arguments": part}}]})
        self._finish("tool_calls")

    def _words(self, n: int, delay: float, offset: int) -> None:
        for i in range(n):
            time.sleep(delay)
            word = WORDS[(offset + i) % len(WORDS)]
            self._delta({"content": word if i == 0 else " " + word})

    def _chunk(self, choices: list[Any], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.rid,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.model,
            "choices": choices,
            **extra,
        }

    def _delta(self, delta: dict[str, Any]) -> None:
        self._event(self._chunk([{"index": 0, "delta": delta, "finish_reason": None}]))

    def _finish(self, reason: str) -> None:
        self._event(self._chunk([{"index": 0, "delta": {}, "finish_reason": reason}]))
        usage = {"prompt_tokens": 120, "completion_tokens": 10, "total_tokens": 130}
        self._event(self._chunk([], usage=usage))
        self._write(b"data: [DONE]\n\n")
        self._end()

    def _event(self, obj: dict[str, Any]) -> None:
        self._write(b"data: " + json.dumps(obj).encode() + b"\n\n")

    def _write(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _end(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _reset(self) -> None:
        """Close with a TCP reset, the chunked body never terminated."""
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()
        self.close_connection = True


def pi_config(agent_dir: Path, url: str, *, retry_delay_ms: int = 500) -> None:
    """Write pi's ``models.json`` (provider ``mock``, model ``mock-1`` at ``url``) and a
    ``settings.json`` with a short auto-retry delay, as the captures were made."""
    agent_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    provider = {
        "baseUrl": url,
        "api": "openai-completions",
        "apiKey": "MOCK_API_KEY",
        "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
        "models": [{"id": "mock-1", "name": "Mock 1", "contextWindow": 32000, "maxTokens": 4096}],
    }
    (agent_dir / "models.json").write_text(json.dumps({"providers": {"mock": provider}}, indent=2))
    retry = {"enabled": True, "maxRetries": 3, "baseDelayMs": retry_delay_ms}
    (agent_dir / "settings.json").write_text(json.dumps({"retry": retry}, indent=2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay", type=float, default=0.1, help="seconds between chunks")
    parser.add_argument("--slow-delay", type=float, default=0.1, help="the same for [slow]")
    parser.add_argument("--log", help="append each request as a JSON line to this file")
    parser.add_argument("--pi-config", metavar="DIR", help="write pi's models.json there too")
    a = parser.parse_args(argv)
    server = MockLLM(a.port, a.delay, a.slow_delay)
    server.log_path = a.log
    if a.pi_config:
        pi_config(Path(a.pi_config), server.url)
    print(f"listening on {server.url}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
