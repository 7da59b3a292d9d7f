"""The pi process edge: what pi (or a broken install of it) prints, and how it fails to start.

Stand-ins are small Python programs that print what the case needs on real pipes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from outbox._pi import PiAgent, PiError, PiProcess, Unreadable


def program(code: str) -> list[str]:
    return [sys.executable, "-c", code]


async def lines_of(proc: PiProcess) -> list[object]:
    out = []
    while (ev := await proc.next()) is not None:
        out.append("(unreadable)" if isinstance(ev, Unreadable) else ev.get("type"))
    return out


async def test_an_event_over_the_limit_holds_its_place_stray_output_is_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("outbox._pi.LINE_LIMIT", 4096)  # 256 MiB, made small
    code = (
        "import sys; w = sys.stdout.write\n"
        'w(\'{"type": "before"}\\n\')\n'
        'w(\'{"type": "huge", "pad": "\' + \'x\' * 50000 + \'"}\\n\')\n'
        "w('not json\\n')\n"  # some library's warning: not an event, passed over
        'w(\'{"type": "message_end", "message": {"ro\\n\')\n'  # an event, cut
        "w('[1, 2]\\n')\n"  # JSON, but no event either
        'w(\'{"type": "text", "s": "a\\u2028b"}\\n\')\n'  # U+2028 is no line break
        'w(\'{"type": "after"}\\n\')\n'
    )
    proc = await PiProcess.start(program(code), cwd=str(tmp_path), env={}, stderr_path=None)
    events = ["before", "(unreadable)", "(unreadable)", "text", "after"]
    assert await lines_of(proc) == events
    assert await proc.close() == 0


async def test_a_pi_that_is_not_installed_is_a_clear_error(tmp_path: Path) -> None:
    agent = PiAgent(
        str(tmp_path / "s.jsonl"),
        command=["no-such-pi-here", "--mode", "rpc"],
        workdir=str(tmp_path),
    )
    with pytest.raises(PiError, match=r"cannot start pi .*no-such-pi-here"):
        await agent.start([])


async def test_a_pi_that_exits_at_start_is_reported_with_its_stderr(tmp_path: Path) -> None:
    code = "import sys; sys.stderr.write('Error: unknown option --bogus\\n'); sys.exit(1)"
    agent = PiAgent(
        str(tmp_path / "s.jsonl"),
        command=program(code),
        workdir=str(tmp_path),
        stderr_path=str(tmp_path / "pi.log"),
    )
    with pytest.raises(PiError, match=r"exited before it answered get_state.*unknown option"):
        await agent.start([])
    assert agent.needs_start


@pytest.mark.parametrize("flag", ["--no-session", "--continue", "--session"])
def test_a_pi_command_that_picks_its_own_session_is_refused(tmp_path: Path, flag: str) -> None:
    with pytest.raises(PiError, match="must not choose pi's session"):
        PiAgent(str(tmp_path / "s.jsonl"), command=["pi", "--mode", "rpc", flag], workdir="w")
