"""`im-server chat`, the terminal client: it sends what is typed and prints what arrives."""

from __future__ import annotations

import asyncio
import sys

from tests.support import PASSWORD, befriend, new_user


async def test_terminal_chat_sends_and_receives(url: str) -> None:
    alice, bob = await new_user(url, "tty"), await new_user(url, "peer")
    conv = await befriend(alice, bob)
    me = await alice.me()
    cb = await bob.connect()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "im_server",
        "chat",
        "--url",
        url,
        "--user",
        me["username"],
        "--password",
        PASSWORD,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={"COLUMNS": "200", "TERM": "dumb", "PATH": "/usr/bin:/bin"},
    )
    assert proc.stdin is not None and proc.stdout is not None
    out = b""

    async def read_until(marker: bytes, timeout: float = 10.0) -> None:
        nonlocal out

        async def _read() -> None:
            nonlocal out
            while marker not in out:
                chunk = await proc.stdout.read(4096)  # type: ignore[union-attr]
                if not chunk:
                    raise AssertionError(
                        f"chat exited; output so far:\n{out.decode(errors='replace')}"
                    )
                out += chunk

        await asyncio.wait_for(_read(), timeout)

    await read_until(b"signed in as")
    proc.stdin.write(f"/open {bob.user_id}\nhello from the terminal\n".encode())
    await proc.stdin.drain()
    ev = await cb.next_event("message", timeout=10)
    assert (
        ev["message"]["content"] == {"text": "hello from the terminal"}
        and ev["message"]["conv_id"] == conv
    )
    await cb.send(conv, "hello back")
    await read_until(b"hello back")
    proc.stdin.write(b"/list\n")
    await proc.stdin.drain()
    await read_until(conv.encode())
    proc.stdin.write(b"/quit\n")
    await proc.stdin.drain()
    assert await asyncio.wait_for(proc.wait(), 10) == 0
    await cb.close()
