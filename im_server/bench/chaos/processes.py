"""The persister as a process of its own (the scenarios that kill it), and log tails that
stay readable when one warning repeats thousands of times."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from im_server.bench.cluster import FAST_HASH_ENV

_TS = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ")
_NOISE = ("uvicorn.error: connection open", '"WebSocket /v1/ws?token=', "connection closed")


def tail_log(path: Path | None, n: int = 40) -> str:
    """The last ``n`` lines, with runs of the same message (timestamps aside) collapsed
    and WebSocket open/close chatter left out, so that a storm of one warning does not
    hide what came before it."""
    if path is None or not path.exists():
        return ""
    out: list[str] = []
    last_key, repeats = None, 0
    for line in path.read_text(errors="replace").splitlines():
        if any(x in line for x in _NOISE):
            continue
        key = _TS.sub("", line)
        if key == last_key:
            repeats += 1
            continue
        if repeats:
            out.append(f"    ... the same {repeats} more time(s)")
        out.append(line)
        last_key, repeats = key, 0
    if repeats:
        out.append(f"    ... the same {repeats} more time(s)")
    return "\n".join(out[-n:])


class PersisterProcess:
    """``python -m im_server persister`` in its own session (kill -9 = a real crash)."""

    def __init__(self, env: dict[str, str], node: str, log_dir: Path) -> None:
        self.env = {**os.environ, **FAST_HASH_ENV, **env, "IM_NODE_NAME": node}
        self.node = node
        self.log_path = log_dir / f"persister-{node}-{uuid.uuid4().hex[:6]}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> PersisterProcess:
        log = open(self.log_path, "ab")  # owned by the child
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "im_server", "persister"],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while "running as consumer" not in self.log_path.read_text(errors="replace"):
            if self.proc.poll() is not None:
                raise RuntimeError(f"persister exited {self.proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"persister not running after {timeout} s:\n{self.log_tail()}")
            time.sleep(0.02)
        return self

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill9()

    def log_tail(self, n: int = 60) -> str:
        return tail_log(self.log_path, n)
