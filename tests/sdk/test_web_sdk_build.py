"""The web client runs on the TypeScript client compiled into ``im_server/web/sdk/``
(``npm run build:web``: plain ES modules, no source maps, no .d.ts). That output is
committed, so the server needs no Node; this test compiles the sources again into a
temporary directory with the same settings and fails when the committed copy differs
(run ``npm run build:web`` in sdk/typescript and commit the result)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.sdk.test_typescript_sdk import ROOT, SDK, _major, _run, node_for_tests

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
